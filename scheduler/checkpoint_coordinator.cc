#include "scheduler/checkpoint_coordinator.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checkpoint_read.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/table_spec.h"

namespace fulcrum {
namespace {

constexpr char kManifestPrefix[] = "ckpt/";
constexpr int kMaxAttempts = 5;  // BSP: retries when the job outran the cut
constexpr int64_t kCaptureTimeoutMs = 60000;

}  // namespace

std::string CheckpointManifestKey(const std::string& job_id, int64_t id) {
  return absl::StrFormat("%s%s/%020d", kManifestPrefix, job_id, id);
}

std::map<std::string, std::vector<int32_t>> BaseChunksByServer(const v1::CheckpointManifest& base,
                                                               const v1::ShardMap& now) {
  std::map<int32_t, std::vector<std::string>> replicas;  // by shard
  for (const v1::ShardLocation& shard : now.shards()) {
    std::vector<std::string>& of = replicas[shard.shard()];
    of.push_back(shard.server_id());
    of.insert(of.end(), shard.backup_ids().begin(), shard.backup_ids().end());
  }
  std::map<std::string, std::vector<int32_t>> chunks;
  for (const v1::CheckpointChunk& chunk : base.chunks()) {
    if (chunk.chunk_id() < kTableChunkBase) continue;
    const auto [t, b] = TableBucketOf(chunk.chunk_id());
    if (t >= now.tables_size() || b >= now.tables(t).bucket_shards_size()) continue;
    auto group = replicas.find(now.tables(t).bucket_shards(b));
    if (group == replicas.end()) continue;
    const std::set<std::string> holders(chunk.server_ids().begin(), chunk.server_ids().end());
    bool all = true;
    for (const std::string& server : group->second) all = all && holders.count(server) > 0;
    if (!all) continue;
    for (const std::string& server : group->second) chunks[server].push_back(chunk.chunk_id());
  }
  return chunks;
}

namespace {

// The parts of a base's entry a reader of the chain needs (not its
// versions or steps, which a chain would otherwise repeat at every link).
v1::CheckpointChunk ChainEntry(const v1::CheckpointChunk& entry) {
  v1::CheckpointChunk link;
  link.set_chunk_id(entry.chunk_id());
  link.set_checksum(entry.checksum());
  link.set_bytes(entry.bytes());
  *link.mutable_server_ids() = entry.server_ids();
  link.set_base_checkpoint_id(entry.base_checkpoint_id());
  if (entry.has_base()) *link.mutable_base() = entry.base();
  return link;
}

}  // namespace

bool ChainsOnto(const v1::CheckpointManifest& latest, int full_every) {
  return latest.info().state() == v1::CheckpointInfo::COMPLETE && latest.info().chain() + 1 < full_every &&
         latest.ByteSizeLong() <= kMaxChainedManifestBytes;
}

absl::Status AssembleManifest(bool synchronous, int64_t cut,
                              const std::map<std::string, v1::CheckpointResponse>& responses,
                              v1::CheckpointManifest* manifest, const v1::CheckpointManifest* base) {
  std::map<int32_t, const v1::CheckpointChunk*> base_entries;
  if (base != nullptr) {
    for (const v1::CheckpointChunk& chunk : base->chunks()) base_entries[chunk.chunk_id()] = &chunk;
  }
  bool incremental = false;
  std::map<int32_t, std::string> primary_of;
  for (const v1::ShardLocation& shard : manifest->shard_map().shards()) {
    for (const v1::ChunkLocation& chunk : manifest->shard_map().chunks()) {
      if (chunk.shard() == shard.shard()) primary_of[chunk.chunk_id()] = shard.server_id();
    }
  }
  // Each server's answered chunks by id, with their partition steps (listed,
  // or the same as the chunk before).
  struct Answered {
    const v1::CheckpointChunk* chunk;
    const google::protobuf::RepeatedField<int64_t>* steps;
  };
  std::map<std::string, std::map<int32_t, Answered>> by_server;
  int64_t bytes = 0;
  for (const auto& [id, response] : responses) {
    const auto steps = PartitionStepsOf(response);
    for (int i = 0; i < response.chunks_size(); ++i) {
      const v1::CheckpointChunk& chunk = response.chunks(i);
      by_server[id][chunk.chunk_id()] = {&chunk, steps[static_cast<size_t>(i)]};
      bytes += chunk.bytes();
    }
  }
  const int32_t partitions = std::max(0, manifest->num_partitions());
  std::vector<int64_t> positions(partitions, synchronous ? cut : INT64_MAX);
  // The entry of a chunk: the primary's copy, held also by the replicas
  // whose copy has the same checksum. Each partition's lowest step goes into
  // the manifest's partition_steps; the entries carry none (a manifest of
  // 8192 buckets of 512 partitions would take megabytes).
  auto add_entry = [&](const std::string& primary, const Answered& answered) {
    v1::CheckpointChunk* chunk = manifest->add_chunks();
    *chunk = *answered.chunk;
    chunk->clear_server_ids();
    chunk->clear_base();  // the scheduler's to set, from its own manifests
    chunk->clear_partition_steps();
    chunk->clear_same_partition_steps();
    chunk->add_server_ids(primary);
    for (const auto& [server, chunks] : by_server) {
      auto other = chunks.find(chunk->chunk_id());
      if (server != primary && other != chunks.end() &&
          other->second.chunk->checksum() == chunk->checksum()) {
        chunk->add_server_ids(server);
      }
    }
    const google::protobuf::RepeatedField<int64_t>& steps = *answered.steps;
    for (int p = 0; !synchronous && p < steps.size() && p < partitions; ++p) {
      positions[p] = std::min(positions[p], steps[p]);
    }
    return chunk;
  };
  for (const v1::ChunkLocation& location : manifest->shard_map().chunks()) {
    const std::string& primary = primary_of[location.chunk_id()];
    auto found = by_server[primary].find(location.chunk_id());
    if (found == by_server[primary].end()) {
      return absl::InternalError(absl::StrCat("chunk ", location.chunk_id(), " is missing from its primary ",
                                              primary, "'s checkpoint"));
    }
    add_entry(primary, found->second)->clear_base_checkpoint_id();  // dense chunks are always whole
  }
  // Table buckets: each on the primary of its shard (and on the backups
  // whose copy is the same), with the steps from which each partition must
  // run again for its pushes to be in.
  std::map<int32_t, std::string> primary_of_shard;
  for (const v1::ShardLocation& shard : manifest->shard_map().shards()) primary_of_shard[shard.shard()] = shard.server_id();
  for (int t = 0; t < manifest->shard_map().tables_size(); ++t) {
    const v1::TableLayout& table = manifest->shard_map().tables(t);
    for (int b = 0; b < table.bucket_shards_size(); ++b) {
      const int32_t chunk_id = TableChunkId(t, b);
      const std::string& primary = primary_of_shard[table.bucket_shards(b)];
      auto found = by_server[primary].find(chunk_id);
      if (found == by_server[primary].end()) {
        return absl::InternalError(absl::StrCat("bucket ", b, " of table ", table.name(), " is missing from ",
                                                primary, "'s checkpoint"));
      }
      v1::CheckpointChunk* chunk = add_entry(primary, found->second);
      if (chunk->base_checkpoint_id() != 0) {
        // Stored as its changes since `base`: the entry says where that is.
        auto entry = base_entries.find(chunk_id);
        if (base == nullptr || chunk->base_checkpoint_id() != base->info().id() || entry == base_entries.end()) {
          return absl::InternalError(absl::StrCat("bucket ", b, " of table ", table.name(), " is stored on ",
                                                  primary, " as the changes since checkpoint ",
                                                  chunk->base_checkpoint_id(), ", which is not this one's base"));
        }
        *chunk->mutable_base() = ChainEntry(*entry->second);
        incremental = true;
      }
    }
  }
  if (incremental) {
    // The base's holders may have left since: their addresses come along.
    for (const auto& [id, address] : base->server_addresses()) manifest->mutable_server_addresses()->insert({id, address});
    manifest->mutable_info()->set_base_id(base->info().id());
    manifest->mutable_info()->set_chain(base->info().chain() + 1);
  } else {
    manifest->mutable_info()->set_base_id(0);
    manifest->mutable_info()->set_chain(0);
  }
  for (int64_t& p : positions) p = p == INT64_MAX ? 0 : p;
  manifest->mutable_partition_steps()->Assign(positions.begin(), positions.end());
  const int64_t step =
      synchronous ? cut : (positions.empty() ? 0 : *std::min_element(positions.begin(), positions.end()));
  manifest->mutable_info()->set_step(step);
  manifest->mutable_info()->set_bytes(bytes);
  return absl::OkStatus();
}

CheckpointCoordinator::CheckpointCoordinator(ServerControl* servers, KvStore* store, Hooks hooks)
    : servers_(servers), store_(store), hooks_(std::move(hooks)) {}

CheckpointCoordinator::~CheckpointCoordinator() { Stop(); }

void CheckpointCoordinator::Start() { thread_ = std::thread([this] { Loop(); }); }

void CheckpointCoordinator::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void CheckpointCoordinator::Enqueue(CheckpointTask task) {
  MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

bool CheckpointCoordinator::Next(CheckpointTask* task, bool wait) {
  MutexLock lock(&mu_);
  if (wait) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
    mu_.Await(absl::Condition(&ready));
  }
  if (stopping_ || queue_.empty()) return false;
  *task = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

void CheckpointCoordinator::Loop() {
  CheckpointTask task;
  while (Next(&task, /*wait=*/true)) Take(task);
}

void CheckpointCoordinator::RunQueued() {
  CheckpointTask task;
  while (Next(&task, /*wait=*/false)) Take(task);
}

absl::Status CheckpointCoordinator::CheckpointAll(const std::map<std::string, std::string>& servers,
                                                  const v1::CheckpointRequest& request,
                                                  std::map<std::string, v1::CheckpointResponse>* responses,
                                                  const std::map<std::string, std::vector<int32_t>>* base_chunks) {
  std::vector<std::string> ids;
  for (const auto& [id, address] : servers) ids.push_back(id);
  std::vector<absl::StatusOr<v1::CheckpointResponse>> results(ids.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  threads.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    threads.emplace_back([&, i] {
      v1::CheckpointRequest mine = request;
      if (base_chunks != nullptr) {
        auto chunks = base_chunks->find(ids[i]);
        if (chunks != base_chunks->end()) mine.mutable_base_chunks()->Assign(chunks->second.begin(), chunks->second.end());
      }
      results[i] = servers_->Checkpoint(servers.at(ids[i]), mine);
    });
  }
  for (std::thread& t : threads) t.join();
  absl::Status first;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (results[i].ok()) {
      (*responses)[ids[i]] = *std::move(results[i]);
    } else if (first.ok() || absl::IsAborted(results[i].status())) {
      // ABORTED wins: it is the retryable one (the job outran the cut).
      first = absl::Status(results[i].status().code(),
                           absl::StrCat("server ", ids[i], ": ", results[i].status().message()));
    }
  }
  return first;
}

void CheckpointCoordinator::DeleteEverywhere(const std::map<std::string, std::string>& holders,
                                             const std::string& job_id, int64_t id) {
  for (const auto& [server, address] : holders) IgnoreError(servers_->DeleteCheckpoint(address, job_id, id));
}

void CheckpointCoordinator::Take(const CheckpointTask& task) {
  const absl::Time started = absl::Now();
  absl::StatusOr<CheckpointPlan> planned = hooks_.plan(task);
  if (!planned.ok()) {
    hooks_.finish(task, planned.status(), v1::CheckpointManifest(), absl::Now() - started);
    return;
  }
  CheckpointPlan& plan = *planned;
  v1::CheckpointManifest& manifest = plan.manifest;
  v1::CheckpointRequest request;
  request.set_job_id(task.job_id);
  request.set_checkpoint_id(task.id);
  request.set_timeout_ms(kCaptureTimeoutMs);
  std::map<std::string, std::vector<int32_t>> base_chunks;
  if (plan.base.has_value()) {
    request.set_base_checkpoint_id(plan.base->info().id());
    base_chunks = BaseChunksByServer(*plan.base, manifest.shard_map());
  }
  std::map<std::string, v1::CheckpointResponse> responses;
  absl::Status status;
  int64_t cut = 0;
  if (!plan.synchronous) {
    status = CheckpointAll(plan.servers, request, &responses, &base_chunks);
  } else {
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
      v1::CheckpointRequest probe = request;
      probe.set_at_version(-1);
      probe.clear_base_checkpoint_id();
      std::map<std::string, v1::CheckpointResponse> versions;
      status = CheckpointAll(plan.servers, probe, &versions);
      if (!status.ok()) break;
      int64_t highest = 0;
      for (const auto& [id, response] : versions) highest = std::max(highest, response.max_version());
      cut = highest + 2 + 8 * attempt;  // further ahead after each miss
      if (cut >= plan.total_steps) {
        status = absl::OutOfRangeError(absl::StrCat("the job is within ", plan.total_steps - highest,
                                                    " steps of its end (its final parameters are kept anyway)"));
        break;
      }
      request.set_at_version(cut);
      responses.clear();
      status = CheckpointAll(plan.servers, request, &responses, &base_chunks);
      if (!absl::IsAborted(status)) break;
      FLOG(INFO) << "job " << task.job_id << ": checkpoint " << task.id << " missed step " << cut << "; retrying";
      DeleteEverywhere(plan.servers, task.job_id, task.id);
    }
  }
  if (status.ok()) {
    status = AssembleManifest(plan.synchronous, cut, responses, &manifest, plan.base.has_value() ? &*plan.base : nullptr);
  }
  if (status.ok()) {
    manifest.mutable_info()->set_state(v1::CheckpointInfo::COMPLETE);
    manifest.mutable_info()->set_duration_seconds(absl::ToDoubleSeconds(absl::Now() - started));
    // The commit point: the manifest in the scheduler's own store.
    if (store_ != nullptr) {
      absl::Status committed = store_->Put(CheckpointManifestKey(task.job_id, task.id), manifest.SerializeAsString());
      if (!committed.ok()) {
        status = absl::Status(committed.code(), absl::StrCat("committing the manifest: ", committed.message()));
      }
    }
  }
  const std::vector<ExpiredCheckpoint> expired = hooks_.finish(task, status, manifest, absl::Now() - started);
  if (!status.ok()) DeleteEverywhere(plan.servers, task.job_id, task.id);
  for (const ExpiredCheckpoint& old : expired) {
    if (store_ != nullptr) IgnoreError(store_->Delete(CheckpointManifestKey(task.job_id, old.id)));
    DeleteEverywhere(old.holders, task.job_id, old.id);
  }
}

}  // namespace fulcrum
