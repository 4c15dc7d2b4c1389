#include "server/replication.h"

#include <grpcpp/support/slice.h>
#include <prometheus/counter.h>
#include <prometheus/histogram.h>

#include <algorithm>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checkpoint_read.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace fulcrum {

void ToChunkState(const ChunkSnapshot& snapshot, int32_t chunk_id, v1::ChunkState* state) {
  state->set_chunk_id(chunk_id);
  EncodeFloats(snapshot.values.data(), snapshot.values.size(), state->mutable_values());
  for (const auto& slot : snapshot.optimizer_state) EncodeFloats(slot.data(), slot.size(), state->add_optimizer_state());
  state->set_version(snapshot.version);
  for (const auto& gradient : snapshot.pending) EncodeFloats(gradient.data(), gradient.size(), state->add_pending());
  EncodeFloats(snapshot.previous_values.data(), snapshot.previous_values.size(), state->mutable_previous_values());
  for (const auto& [worker, seq] : snapshot.watermarks) (*state->mutable_watermarks())[worker] = seq;
  for (int64_t s : snapshot.partition_steps) state->add_partition_steps(s);
  state->set_examples_seen(snapshot.examples_seen);
  state->set_examples_digest(snapshot.examples_digest);
  state->set_table_changes(snapshot.table_changes);
  if (snapshot.lamb_last.step >= 0) {
    v1::LambPartial* last = state->mutable_lamb_last();
    last->set_step(snapshot.lamb_last.step);
    last->set_weight_sq(snapshot.lamb_last.weight_sq);
    last->set_update_sq(snapshot.lamb_last.update_sq);
  }
}

absl::StatusOr<ChunkSnapshot> FromChunkState(const v1::ChunkState& state) {
  auto decode = [](const std::string& bytes, std::vector<float>* out) {
    out->resize(bytes.size() / 4);
    return DecodeFloats(bytes, static_cast<int64_t>(out->size()), out->data(), "chunk state");
  };
  ChunkSnapshot snapshot;
  RETURN_IF_ERROR(decode(state.values(), &snapshot.values));
  for (const std::string& slot : state.optimizer_state()) {
    RETURN_IF_ERROR(decode(slot, &snapshot.optimizer_state.emplace_back()));
  }
  snapshot.version = state.version();
  for (const std::string& gradient : state.pending()) RETURN_IF_ERROR(decode(gradient, &snapshot.pending.emplace_back()));
  RETURN_IF_ERROR(decode(state.previous_values(), &snapshot.previous_values));
  snapshot.watermarks.assign(state.watermarks().begin(), state.watermarks().end());
  snapshot.partition_steps.assign(state.partition_steps().begin(), state.partition_steps().end());
  snapshot.examples_seen = state.examples_seen();
  snapshot.examples_digest = state.examples_digest();
  snapshot.table_changes = state.table_changes();
  if (state.has_lamb_last()) {
    snapshot.lamb_last = {state.lamb_last().step(), state.lamb_last().weight_sq(), state.lamb_last().update_sq()};
  }
  return snapshot;
}

Replicator::Replicator(ReplicaPeers* peers, Options options) : peers_(peers), options_(std::move(options)) {}

void Replicator::Refused() const {
  if (options_.refused != nullptr) options_.refused->Increment();
}

absl::Status Replicator::CheckFence(const std::string& job_id, int64_t request_version, int64_t held) const {
  if (options_.lease_valid && !options_.lease_valid()) {
    Refused();
    return absl::UnavailableError("this server lost its lease with the scheduler: it takes no writes until it has one");
  }
  if (request_version < held) {
    Refused();
    return absl::AbortedError(absl::StrCat("job ", job_id, ": request made with shard map version ", request_version,
                                           ", this server is at ", held, ": refresh the map and retry"));
  }
  if (request_version > held) {
    return absl::UnavailableError(absl::StrCat("job ", job_id, ": this server has not received shard map version ",
                                               request_version, " yet (at ", held, "): retry"));
  }
  return absl::OkStatus();
}

absl::Status Replicator::CheckWrite(const JobShard& shard, const v1::PushRequest& header, const PayloadReader& chunks,
                                    bool as_primary) const {
  const int64_t held = shard.map_version();
  RETURN_IF_ERROR(CheckFence(header.job_id(), header.map_version(), held));
  const std::vector<int32_t> ids = ChunkIdsOf(chunks);
  if (std::optional<int32_t> twice = ListedTwice(ids)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", header.job_id(), ": push lists chunk ", *twice, " more than once"));
  }
  ASSIGN_OR_RETURN(JobShard::ChunkRoles roles, shard.RolesOf(ids));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (roles.roles.at(roles.shard_of[i]).primary != as_primary) {
      return absl::AbortedError(
          absl::StrCat("chunk ", ids[i], " of job ", header.job_id(),
                       as_primary ? ": this server is not its primary" : ": this server is not its backup",
                       " in shard map version ", held));
    }
  }
  return absl::OkStatus();
}

absl::Status Replicator::Forward(const JobShard& shard, const v1::PushRequest& header, const PayloadReader& chunks) {
  // Per backup, the chunks it replicates: their payloads as slices of the
  // received message (a chunk with two backups goes to both, still uncopied).
  std::map<std::string, PayloadWriter> messages;
  ASSIGN_OR_RETURN(JobShard::ChunkRoles roles, shard.RolesOf(ChunkIdsOf(chunks)));
  for (int i = 0; i < chunks.chunks(); ++i) {
    for (const std::string& backup :
         roles.roles.at(roles.shard_of[static_cast<size_t>(i)]).backup_addresses) {
      auto message = messages.try_emplace(backup, header, v1::PushRequest::kChunksFieldNumber).first;
      std::vector<grpc::Slice> payload;
      chunks.AppendPayloadSlices(i, &payload);
      message->second.AddPart(chunks.chunk(i), std::move(payload));
    }
  }
  std::map<std::string, grpc::ByteBuffer> finished;
  for (auto& [address, message] : messages) finished.emplace(address, message.Finish());
  return SendAll(header.job_id(), ReplicaPeers::Method::kReplicate, std::move(finished));
}

absl::Status Replicator::CheckSparseWrite(const JobShard& shard, const std::string& job_id, int64_t map_version,
                                          int32_t shard_id, bool as_primary) const {
  const int64_t held = shard.map_version();
  RETURN_IF_ERROR(CheckFence(job_id, map_version, held));
  ASSIGN_OR_RETURN(JobShard::ShardRole role, shard.RoleOfShard(shard_id));
  if (role.primary != as_primary) {
    return absl::AbortedError(absl::StrCat("shard ", shard_id, " of job ", job_id,
                                           as_primary ? ": this server is not its primary"
                                                      : ": this server is not its backup",
                                           " in shard map version ", held));
  }
  return absl::OkStatus();
}

absl::Status Replicator::ForwardSparse(const JobShard& shard, int32_t shard_id, const std::string& job_id,
                                       const grpc::ByteBuffer& request) {
  ASSIGN_OR_RETURN(JobShard::ShardRole role, shard.RoleOfShard(shard_id));
  if (role.backup_addresses.empty()) return absl::OkStatus();
  // (A ByteBuffer's copy takes references to its slices, not the bytes.)
  std::map<std::string, grpc::ByteBuffer> messages;
  for (const std::string& backup : role.backup_addresses) messages.emplace(backup, request);
  return SendAll(job_id, ReplicaPeers::Method::kSparseReplicate, std::move(messages));
}

absl::Status Replicator::SendAll(const std::string& job_id, ReplicaPeers::Method method,
                                 std::map<std::string, grpc::ByteBuffer> messages) {
  if (messages.empty()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  std::map<std::string, std::unique_ptr<ReplicaPeers::Forward>> forwards;
  {
    // Registered as they start, under the lock CancelForwards takes, so a
    // role change either sees a forward or comes before it starts.
    MutexLock lock(&mu_);
    for (auto& [address, message] : messages) {
      auto& forward = forwards[address];
      forward = peers_->Replicate(address, method, std::move(message), options_.forward_timeout);
      in_flight_.emplace(job_id, forward.get());
    }
  }
  std::map<std::string, absl::Status> outcomes;
  for (auto& [address, forward] : forwards) outcomes[address] = forward->Wait();
  {
    MutexLock lock(&mu_);
    auto [begin, end] = in_flight_.equal_range(job_id);
    for (auto it = begin; it != end;) {
      const bool ours = std::any_of(forwards.begin(), forwards.end(),
                                    [&](const auto& forward) { return forward.second.get() == it->second; });
      it = ours ? in_flight_.erase(it) : std::next(it);
    }
  }
  if (options_.replication_seconds != nullptr) {
    options_.replication_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  // The answer is the most telling failure among the backups' (the first
  // by address among equals), whatever order their addresses sort in:
  // - a backup that moved to a newer map fences this primary: ABORTED makes
  //   the worker refresh its map;
  // - a backup whose tables are full cannot take the push, however often
  //   it is sent (RESOURCE_EXHAUSTED);
  // - anything else (a backup away, a deadline) is retried: UNAVAILABLE;
  // - a busy backup (its threads all taken): the push is refused as busy
  //   here too, and sent again.
  auto rank = [](const absl::Status& status) {
    if (status.ok()) return 0;
    if (IsServerBusy(status)) return 1;
    if (status.code() == absl::StatusCode::kAborted) return 4;
    if (status.code() == absl::StatusCode::kResourceExhausted) return 3;
    return 2;
  };
  const std::pair<const std::string, absl::Status>* worst = nullptr;
  for (const auto& outcome : outcomes) {
    if (rank(outcome.second) > (worst == nullptr ? 0 : rank(worst->second))) worst = &outcome;
  }
  if (worst == nullptr) return absl::OkStatus();
  const auto& [address, status] = *worst;
  switch (rank(status)) {
    case 1:
      return absl::ResourceExhaustedError(
          absl::StrCat(kServerBusy, ": replicating to backup ", address, ": ", status.message()));
    case 2:
      return absl::UnavailableError(absl::StrCat("replicating to backup ", address, ": ", status.message()));
    default:
      return absl::Status(status.code(),
                          absl::StrCat("replicating to backup ", address, ": ", status.message()));
  }
}

void Replicator::CancelForwards(const std::string& job_id) {
  MutexLock lock(&mu_);
  auto [begin, end] = in_flight_.equal_range(job_id);
  for (auto it = begin; it != end; ++it) it->second->Cancel();
}

absl::StatusOr<std::vector<ChunkSnapshot>> Replicator::FetchChunks(const JobShardConfig& config,
                                                                  const std::string& default_source,
                                                                  const std::map<int32_t, std::string>& sources) {
  std::vector<ChunkSnapshot> snapshots;
  for (const ChunkConfig& chunk : config.chunks) {
    auto source = sources.find(chunk.chunk_id);
    const std::string& address = source != sources.end() ? source->second : default_source;
    v1::CopyChunkRequest request;
    request.set_job_id(config.job_id);
    request.set_chunk_id(chunk.chunk_id);
    absl::StatusOr<v1::ChunkState> state = peers_->CopyChunk(address, request, options_.copy_timeout);
    if (!state.ok()) {
      return absl::UnavailableError(absl::StrCat("copying chunk ", chunk.chunk_id, " of job ", config.job_id, " from ",
                                                 address, ": ", state.status().message()));
    }
    ASSIGN_OR_RETURN(ChunkSnapshot snapshot, FromChunkState(*state));
    snapshots.push_back(std::move(snapshot));  // its shape is checked as it is adopted
  }
  return snapshots;
}

absl::StatusOr<v1::ChunkState> Replicator::CopySliced(const std::string& address, v1::CopyChunkRequest request) {
  return ReadSlicedChunk(request.chunk_id(), [&](int64_t offset, uint64_t capture) {
    request.set_table_state_offset(offset);
    request.set_capture(capture);
    return peers_->CopyChunk(address, request, options_.copy_timeout);
  });
}

absl::Status Replicator::CopyTables(SparseShard* dest, const std::string& job_id, int32_t shard,
                                    const std::string& address) {
  const std::vector<int32_t> buckets = dest->chunk_ids();
  // The bookkeeping, every bucket, the bookkeeping again: consistent when
  // the source's rows of the shard did not change meanwhile (its pushes
  // fail while this server refuses them; an expiry can still change them:
  // copied again).
  for (int attempt = 0; attempt < kCopyAttempts; ++attempt) {
    v1::CopyChunkRequest request;
    request.set_job_id(job_id);
    request.set_table_shard(shard);
    ASSIGN_OR_RETURN(v1::ChunkState first, CopySliced(address, request));
    bool consistent = true;
    for (int32_t chunk_id : buckets) {
      v1::CopyChunkRequest bucket;
      bucket.set_job_id(job_id);
      bucket.set_chunk_id(chunk_id);
      ASSIGN_OR_RETURN(v1::ChunkState state, CopySliced(address, bucket));
      if (state.table_changes() != first.table_changes()) {
        consistent = false;
        break;
      }
      RETURN_IF_ERROR(dest->AdoptBucket(chunk_id, state.table_state()));
    }
    if (!consistent) continue;
    ASSIGN_OR_RETURN(v1::ChunkState last, CopySliced(address, request));
    if (last.table_changes() != first.table_changes()) continue;
    return dest->AdoptShardState(first.table_state());
  }
  return absl::UnavailableError(absl::StrCat("the tables of shard ", shard, " kept changing on ", address,
                                             " while they were copied (", kCopyAttempts, " attempts)"));
}

absl::Status Replicator::AdoptTables(SparseTables* tables, const std::set<int32_t>& shards,
                                     const std::string& job_id, const std::string& address) {
  for (int32_t shard : shards) {
    if (tables->Holds(shard)) continue;
    absl::StatusOr<std::unique_ptr<SparseShard>> copy = tables->NewShard(shard);
    if (absl::IsFailedPrecondition(copy.status())) continue;  // no bucket of it
    RETURN_IF_ERROR(copy.status());
    absl::Status copied = CopyTables(copy->get(), job_id, shard, address);
    if (!copied.ok()) {
      // A source gone or slow is retried (by the scheduler, from the shard's
      // primary then); a copy that does not fit is not.
      const auto code = copied.code() == absl::StatusCode::kResourceExhausted ? copied.code()
                                                                              : absl::StatusCode::kUnavailable;
      return absl::Status(code, absl::StrCat("copying the tables of shard ", shard, " of job ", job_id, " from ",
                                             address, ": ", copied.message()));
    }
    RETURN_IF_ERROR(tables->AddShard(shard, *std::move(copy)));
  }
  return absl::OkStatus();
}

absl::Status Replicator::AdoptCopies(ParameterStore* store, JobShardConfig config, int64_t map_version,
                                     std::map<int32_t, JobShard::ShardRole> roles,
                                     std::map<int32_t, int32_t> chunk_shards,
                                     const std::string& default_source,
                                     const std::map<int32_t, std::string>& sources,
                                     std::optional<int32_t> joined_shard) {
  RETURN_IF_ERROR(store->CheckFits(config.job_id, JobShard::ConfigBytes(config), /*replacing=*/false));
  auto existing = store->Find(config.job_id);
  // The shards whose tables this server holds in the new map: those it does
  // not hold yet are copied from `default_source` (the primary of the shard
  // it joins), into tables built aside and added when whole.
  const std::set<int32_t> table_shards = std::move(config.table_shards);
  config.table_shards.clear();
  MutexLockMaybe adopting(existing.ok() ? &(*existing)->adopt_mu() : nullptr);
  if (existing.ok()) {
    std::vector<int32_t> ids;
    for (const ChunkConfig& chunk : config.chunks) ids.push_back(chunk.chunk_id);
    (*existing)->BeginCopy(ids);
  }
  ASSIGN_OR_RETURN(std::vector<ChunkSnapshot> snapshots, FetchChunks(config, default_source, sources));
  if (existing.ok()) {
    RETURN_IF_ERROR((*existing)->AdoptChunks(config.chunks, snapshots));
    if ((*existing)->sparse() != nullptr) {
      // The joined shard's tables, if this server still holds them from
      // under an older map, are from before it left the shard's group: they
      // missed pushes since. Not under this map or a newer one: a retry of
      // this copy (the first finished past the scheduler's deadline) finds
      // them live, taking the shard's writes, or this request is stale. Only
      // a shard it joins as a backup: what it leads is never dropped.
      auto joined = joined_shard.has_value() ? roles.find(*joined_shard) : roles.end();
      if (joined != roles.end() && !joined->second.primary && (*existing)->map_version() < map_version) {
        (*existing)->DropTables({*joined_shard}, "its copy is stale: copied again");
      }
      // Tables copied here before a failure (or a newer map taken meanwhile
      // that leaves this server out of their shard) are not kept beside
      // the others: they would miss the shard's pushes from then on.
      absl::Status adopted = AdoptTables((*existing)->sparse(), table_shards, config.job_id, default_source);
      if (!adopted.ok()) (*existing)->DropTablesWithoutRole();
      RETURN_IF_ERROR(adopted);
    }
    if (absl::Status configured =
            (*existing)->Configure(map_version, std::move(roles), std::move(chunk_shards));
        !configured.ok()) {
      (*existing)->DropTablesWithoutRole();
      return configured;
    }
    // A DropJob that came during the copy (the scheduler telling this server
    // to drop the stale copy it adopted into) took the job away: the setup
    // failed, and the scheduler sets it up again, instead of believing this
    // server replicates a job it no longer holds.
    if (auto now = store->Find(config.job_id); !now.ok() || now->get() != existing->get()) {
      return absl::UnavailableError(
          absl::StrCat("job ", config.job_id,
                       " was dropped on this server while its chunks were copied here; "
                       "set it up again"));
    }
    return absl::OkStatus();
  }
  std::vector<ChunkConfig> chunks = config.chunks;
  const std::string job_id = config.job_id;
  ASSIGN_OR_RETURN(std::unique_ptr<JobShard> shard, JobShard::Create(std::move(config)));
  RETURN_IF_ERROR(shard->AdoptChunks(chunks, snapshots));
  if (shard->sparse() != nullptr)
    RETURN_IF_ERROR(AdoptTables(shard->sparse(), table_shards, job_id, default_source));
  RETURN_IF_ERROR(shard->Configure(map_version, std::move(roles)));
  return store->InstallCopy(std::move(shard));
}

}  // namespace fulcrum
