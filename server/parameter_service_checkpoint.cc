// ParameterService: checkpoints. A checkpoint is cut in memory (each chunk
// snapshotted under its own lock at the step boundary, or at once in
// ASP/SSP), written to this server's RocksDB by a background thread, and
// acknowledged once durable; the scheduler commits the manifest after every
// server has acknowledged. A job started from a checkpoint reads each chunk
// back here (or from another server that wrote it), checksum verified.
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/checkpoint_read.h"
#include "common/logging.h"
#include "common/memory_budget.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/sync.h"
#include "common/table_spec.h"
#include "server/parameter_service.h"

namespace fulcrum {
namespace {

constexpr absl::Duration kDefaultCaptureWait = absl::Seconds(60);
constexpr double kReadDeadlineSeconds = 60.0;

absl::Status NoStore() {
  return absl::FailedPreconditionError(
      "this server keeps no checkpoints: start fulcrum-server with --data-dir to take them");
}

// The bytes a captured chunk holds.
int64_t SnapshotBytes(const ChunkSnapshot& snapshot) {
  auto floats = [](const std::vector<std::vector<float>>& vectors) {
    size_t n = 0;
    for (const auto& v : vectors) n += v.size();
    return n;
  };
  const size_t n = snapshot.values.size() + snapshot.previous_values.size() +
                   floats(snapshot.optimizer_state) + floats(snapshot.pending);
  return static_cast<int64_t>(n * sizeof(float) + snapshot.table_state.size());
}

}  // namespace

grpc::Status ParameterServiceImpl::Checkpoint(grpc::ServerContext* /*context*/, const v1::CheckpointRequest* request,
                                              v1::CheckpointResponse* response) {
  const int64_t received = request->ByteSizeLong();
  auto shard = store_->Find(request->job_id());
  if (!shard.ok()) return Finish("Checkpoint", shard.status(), received, 0);
  auto [low, high] = (*shard)->VersionRange();
  response->set_min_version(low);
  response->set_max_version(high);
  if (request->at_version() < 0) return Finish("Checkpoint", absl::OkStatus(), received, response->ByteSizeLong());
  if (checkpoints_ == nullptr) return Finish("Checkpoint", NoStore(), received, 0);
  if (request->base_checkpoint_id() < 0 ||
      (request->base_checkpoint_id() > 0 && request->base_checkpoint_id() >= request->checkpoint_id()) ||
      request->base_chunks_size() > kMaxTables * kMaxTableBuckets) {
    return Finish("Checkpoint",
                  absl::InvalidArgumentError(absl::StrCat(
                      "checkpoint ", request->checkpoint_id(), " cannot be incremental on checkpoint ",
                      request->base_checkpoint_id(), " for ", request->base_chunks_size(),
                      " buckets (an earlier checkpoint, at most ", kMaxTables * kMaxTableBuckets, " buckets)")),
                  received, 0);
  }
  IncrementalBase base;
  base.checkpoint_id = request->base_checkpoint_id();
  base.chunks.insert(request->base_chunks().begin(), request->base_chunks().end());

  const absl::Time start = absl::Now();
  // A request may not hold this thread longer than kDefaultCaptureWait.
  const absl::Duration wait =
      request->timeout_ms() > 0 ? std::min(absl::Milliseconds(request->timeout_ms()), kDefaultCaptureWait)
                                : kDefaultCaptureWait;
  const std::string what =
      absl::StrCat("checkpoint ", request->checkpoint_id(), " of job ", request->job_id());
  if (base.checkpoint_id == 0) {
    // A whole capture copies the job's state here: refused before it is
    // made when even that does not fit.
    auto room = store_->HoldTransient((*shard)->bytes(), what);
    if (!room.ok()) return Finish("Checkpoint", room.status(), received, 0);
  }
  auto snapshots = (*shard)->CaptureAll(request->checkpoint_id(), request->at_version(), start + wait, base);
  if (!snapshots.ok()) return Finish("Checkpoint", snapshots.status(), received, 0);
  // The captured state, then its encoded records, the database's batch and
  // memtable stay until the write is done (about three times the state at
  // the most): counted against the budget meanwhile, or the checkpoint fails
  // here.
  int64_t captured = 0;
  for (const auto& [chunk_id, snapshot] : *snapshots) captured += SnapshotBytes(snapshot);
  auto hold = store_->HoldTransient(3 * captured, what);
  if (!hold.ok()) return Finish("Checkpoint", hold.status(), received, 0);
  const std::vector<int64_t>* previous = nullptr;
  for (const auto& [chunk_id, snapshot] : *snapshots) {
    v1::CheckpointChunk* chunk = response->add_chunks();
    chunk->set_chunk_id(chunk_id);
    chunk->set_version(snapshot.version);
    chunk->set_base_checkpoint_id(snapshot.table_base);
    if (previous != nullptr && *previous == snapshot.partition_steps) {
      chunk->set_same_partition_steps(true);
    } else {
      for (int64_t s : snapshot.partition_steps) chunk->add_partition_steps(s);
    }
    previous = &snapshot.partition_steps;
  }
  // The request path only waits here; the write itself runs on the writer
  // thread, so pushes and pulls of every job go on meanwhile.
  Notification written;
  absl::StatusOr<std::vector<CheckpointStore::ChunkRecordInfo>> result;
  writer_->Enqueue(request->job_id(), request->checkpoint_id(), *std::move(snapshots),
                   [&](absl::StatusOr<std::vector<CheckpointStore::ChunkRecordInfo>> r) {
                     result = std::move(r);
                     written.Notify();
                   });
  written.WaitForNotification();
  hold->reset();
  // What the write freed goes back to the kernel instead of staying in the
  // heap beside the budget (checkpoints are far apart; this takes a few ms).
  ReleaseFreedMemory();
  if (!result.ok()) {
    return Finish("Checkpoint",
                  absl::Status(result.status().code(),
                               absl::StrCat("writing checkpoint ", request->checkpoint_id(), " of job ",
                                            request->job_id(), ": ", result.status().message())),
                  received, 0);
  }
  std::map<int32_t, const CheckpointStore::ChunkRecordInfo*> infos;
  int64_t bytes = 0;
  for (const auto& info : *result) {
    infos[info.chunk_id] = &info;
    bytes += info.bytes;
  }
  for (v1::CheckpointChunk& chunk : *response->mutable_chunks()) {
    auto it = infos.find(chunk.chunk_id());
    if (it == infos.end()) continue;
    chunk.set_checksum(it->second->checksum);
    chunk.set_bytes(it->second->bytes);
  }
  checkpoint_bytes_->Increment(static_cast<double>(bytes));
  checkpoint_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  FLOG(INFO) << "job " << request->job_id() << ": checkpoint " << request->checkpoint_id() << " written ("
             << response->chunks_size() << " chunks, " << bytes << " bytes, at version " << high << ")";
  return Finish("Checkpoint", absl::OkStatus(), received, response->ByteSizeLong());
}

absl::StatusOr<bool> AnswerTableStateSlice(const ChunkSnapshot& snapshot, int32_t chunk_id, int64_t offset,
                                           const char* what, v1::ChunkState* response) {
  const auto size = static_cast<int64_t>(snapshot.table_state.size());
  if (offset < 0 || offset > size) {
    return absl::OutOfRangeError(
        absl::StrCat("table state offset ", offset, " is outside the ", what, "'s ", size, " bytes"));
  }
  response->set_table_state_size(size);
  response->set_table_state(snapshot.table_state.substr(static_cast<size_t>(offset), kTableStateSlice));
  ToChunkState(snapshot, chunk_id, response);
  return offset + static_cast<int64_t>(kTableStateSlice) >= size;
}

grpc::Status ParameterServiceImpl::ReadCheckpoint(grpc::ServerContext* /*context*/, const v1::ReadCheckpointRequest* request,
                                                  v1::ChunkState* response) {
  const int64_t received = request->ByteSizeLong();
  if (checkpoints_ == nullptr) return Finish("ReadCheckpoint", NoStore(), received, 0);
  // A later slice of the chunk served last comes from memory; anything else
  // is read (and verified) from the store.
  std::shared_ptr<const ChunkSnapshot> snapshot;
  if (request->table_state_offset() > 0) {
    MutexLock lock(&sliced_mu_);
    if (sliced_.snapshot != nullptr && sliced_.job_id == request->job_id() &&
        sliced_.checkpoint_id == request->checkpoint_id() && sliced_.chunk_id == request->chunk_id() &&
        (request->checksum() == 0 || request->checksum() == sliced_.checksum)) {
      snapshot = sliced_.snapshot;
    }
  }
  if (snapshot == nullptr) {
    auto read = checkpoints_->Read(request->job_id(), request->checkpoint_id(), request->chunk_id(), request->checksum());
    if (!read.ok()) return Finish("ReadCheckpoint", read.status(), received, 0);
    snapshot = std::make_shared<const ChunkSnapshot>(*std::move(read));
    if (snapshot->table_state.size() > kTableStateSlice && request->checksum() != 0) {
      MutexLock lock(&sliced_mu_);
      sliced_ = SlicedChunk{request->job_id(), request->checkpoint_id(), request->chunk_id(), request->checksum(),
                            snapshot};
    }
  }
  absl::StatusOr<bool> last =
      AnswerTableStateSlice(*snapshot, request->chunk_id(), request->table_state_offset(), "chunk", response);
  if (!last.ok()) return Finish("ReadCheckpoint", last.status(), received, 0);
  if (*last) {
    MutexLock lock(&sliced_mu_);  // its last slice: not kept any longer
    if (sliced_.snapshot == snapshot) sliced_ = SlicedChunk();
  }
  return Finish("ReadCheckpoint", absl::OkStatus(), received, response->ByteSizeLong());
}

grpc::Status ParameterServiceImpl::DeleteCheckpoint(grpc::ServerContext* /*context*/, const v1::DeleteCheckpointRequest* request,
                                                    v1::DeleteCheckpointResponse*) {
  const int64_t received = request->ByteSizeLong();
  if (checkpoints_ == nullptr) return Finish("DeleteCheckpoint", absl::OkStatus(), received, 0);
  {
    MutexLock lock(&sliced_mu_);
    if (sliced_.job_id == request->job_id()) sliced_ = SlicedChunk();
  }
  absl::Status status = request->checkpoint_id() == 0
                            ? checkpoints_->DeleteJob(request->job_id())
                            : checkpoints_->Delete(request->job_id(), request->checkpoint_id());
  if (status.ok()) {
    FLOG(INFO) << "job " << request->job_id() << ": deleted "
               << (request->checkpoint_id() == 0 ? std::string("every checkpoint")
                                                 : absl::StrCat("checkpoint ", request->checkpoint_id()));
  }
  return Finish("DeleteCheckpoint", status, received, 0);
}

absl::StatusOr<ChunkSnapshot> ParameterServiceImpl::ReadCheckpointChunk(const v1::RestoreSource& restore,
                                                                         int64_t checkpoint_id,
                                                                         const v1::CheckpointChunk& chunk) {
  std::vector<std::string> failures;
  bool data_loss = false;
  auto note = [&](const std::string& where, const absl::Status& status) {
    data_loss |= absl::IsDataLoss(status);
    failures.push_back(absl::StrCat(where, ": ", status.message()));
  };
  if (checkpoints_ != nullptr) {
    auto local = checkpoints_->Read(restore.job_id(), checkpoint_id, chunk.chunk_id(), chunk.checksum());
    if (local.ok()) return local;
    if (!absl::IsNotFound(local.status())) note("this server", local.status());
  }
  for (const std::string& server_id : chunk.server_ids()) {
    auto address = restore.server_addresses().find(server_id);
    if (address == restore.server_addresses().end()) continue;
    v1::ReadCheckpointRequest request;
    request.set_job_id(restore.job_id());
    request.set_checkpoint_id(checkpoint_id);
    request.set_chunk_id(chunk.chunk_id());
    request.set_checksum(chunk.checksum());
    absl::StatusOr<v1::ChunkState> state =
        ReadCheckpointChunkFrom(peers_.Stub(address->second), request, kReadDeadlineSeconds);
    absl::StatusOr<ChunkSnapshot> read = state.ok() ? FromChunkState(*state) : state.status();
    if (read.ok()) {
      read->table_state = std::move(*state->mutable_table_state());
      return read;
    }
    note(absl::StrCat(server_id, " (", address->second, ")"), read.status());
  }
  std::string what = absl::StrCat("checkpoint ", checkpoint_id, " of job ", restore.job_id(), ": chunk ",
                                  chunk.chunk_id(), " ");
  if (failures.empty()) {
    return absl::NotFoundError(absl::StrCat(what, "is on no reachable server (written by ",
                                            absl::StrJoin(chunk.server_ids(), ", "), ")"));
  }
  return absl::Status(data_loss ? absl::StatusCode::kDataLoss : absl::StatusCode::kUnavailable,
                      absl::StrCat(what, data_loss ? "is corrupt: " : "could not be read: ",
                                   absl::StrJoin(failures, "; ")));
}

absl::Status ParameterServiceImpl::RestoreChunks(JobShard* shard, const v1::RestoreSource& restore) {
  std::map<int32_t, const v1::CheckpointChunk*> stored;
  for (const v1::CheckpointChunk& chunk : restore.chunks()) stored[chunk.chunk_id()] = &chunk;
  for (int32_t chunk_id : shard->chunk_ids()) {
    auto it = stored.find(chunk_id);
    if (it == stored.end()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint ", restore.checkpoint_id(), " of job ",
                                                     restore.job_id(), " has no chunk ", chunk_id,
                                                     " (a different model?)"));
    }
    ASSIGN_OR_RETURN(ChunkSnapshot snapshot, ReadCheckpointChunk(restore, restore.checkpoint_id(), *it->second));
    RETURN_IF_ERROR(shard->RestoreCheckpoint(chunk_id, std::move(snapshot), restore.repartition(), restore.version(),
                                             restore.version()));
  }
  int64_t buckets = 0;
  if (SparseTables* sparse = shard->sparse(); sparse != nullptr) {
    for (int32_t chunk_id : sparse->chunk_ids()) {
      auto it = stored.find(chunk_id);
      if (it == stored.end()) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint ", restore.checkpoint_id(), " of job ",
                                                       restore.job_id(), " has no table bucket chunk ", chunk_id,
                                                       " (other tables or bucket counts?)"));
      }
      ASSIGN_OR_RETURN(ChunkSnapshot snapshot, ReadCheckpointChunk(restore, restore.checkpoint_id(), *it->second));
      const std::optional<int64_t> repartitioned_at =
          restore.repartition() ? std::optional<int64_t>(restore.version()) : std::nullopt;
      // Stored incrementally or not: the chain's whole end is loaded (with
      // the checkpoint's positions), then each later link's changes applied
      // on it, one link in memory at a time (besides the newest, read first
      // for its positions).
      std::string newest = std::move(snapshot.table_state);
      RETURN_IF_ERROR(ReplayTableChain(
          std::move(newest), restore.checkpoint_id(), *it->second,
          [&](int64_t base, const v1::CheckpointChunk& entry) -> absl::StatusOr<std::string> {
            ASSIGN_OR_RETURN(ChunkSnapshot read, ReadCheckpointChunk(restore, base, entry));
            return std::move(read.table_state);
          },
          [&](std::string state, bool whole) -> absl::Status {
            if (!whole) return sparse->ApplyRestoredChanges(chunk_id, state);
            snapshot.table_state = std::move(state);
            absl::Status restored = sparse->Restore(chunk_id, snapshot, repartitioned_at);
            snapshot.table_state = std::string();
            return restored;
          }));
      // A checkpoint of this same job: the next ones may build on it.
      if (restore.job_id() == shard->config().job_id) sparse->MarkRestored(chunk_id, restore.checkpoint_id());
      ++buckets;
    }
  }
  FLOG(INFO) << "job " << shard->config().job_id << ": restored " << shard->chunk_ids().size() << " chunks and "
             << buckets << " table buckets from checkpoint " << restore.checkpoint_id() << " of job " << restore.job_id();
  return absl::OkStatus();
}

}  // namespace fulcrum
