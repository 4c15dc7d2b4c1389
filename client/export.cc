#include "client/export.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "absl/base/internal/endian.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/checkpoint_read.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/table_spec.h"
#include "common/table_state.h"
#include "common/tensor_codec.h"
#include "fulcrum/v1/cluster.grpc.pb.h"
#include "fulcrum/v1/job.grpc.pb.h"
#include "fulcrum/v1/parameter.grpc.pb.h"

namespace fulcrum {
namespace {

constexpr int kConsistentReadAttempts = 20;

class Stubs {
 public:
  v1::ParameterService::Stub* For(const std::string& address) {
    auto& stub = stubs_[address];
    if (stub == nullptr) stub = v1::ParameterService::NewStub(MakeChannel(address));
    return stub.get();
  }

 private:
  std::map<std::string, std::unique_ptr<v1::ParameterService::Stub>> stubs_;
};

// Empty tensors shaped as the map says.
std::vector<SafetensorsTensor> EmptyTensors(const v1::ShardMap& map) {
  std::vector<SafetensorsTensor> tensors;
  for (const v1::TensorLayout& layout : map.tensors()) {
    SafetensorsTensor& t = tensors.emplace_back();
    t.name = layout.name();
    t.shape.assign(layout.shape().begin(), layout.shape().end());
    t.data.assign(layout.size(), 0.0f);
  }
  return tensors;
}

absl::Status Place(const v1::ChunkLocation& chunk, const std::string& bytes, std::vector<SafetensorsTensor>* tensors) {
  if (chunk.tensor() < 0 || chunk.tensor() >= static_cast<int>(tensors->size()) ||
      chunk.offset() + chunk.length() > static_cast<int64_t>((*tensors)[chunk.tensor()].data.size())) {
    return absl::DataLossError(absl::StrCat("chunk ", chunk.chunk_id(), " lies outside its tensor"));
  }
  return DecodeFloats(bytes, chunk.length(), (*tensors)[chunk.tensor()].data.data() + chunk.offset(),
                      absl::StrCat("chunk ", chunk.chunk_id()));
}

// The ids and values (the first dim floats of each row) of one table bucket's
// checkpointed state, appended.
absl::Status AddTableRows(const v1::TableLayout& table, const std::string& state, std::vector<uint64_t>* ids,
                          std::vector<float>* rows) {
  const auto dim = static_cast<size_t>(table.dim());
  // The row width (values and optimizer state) leads the state; the values come first.
  const int32_t stride = state.size() >= 4 ? static_cast<int32_t>(absl::little_endian::Load32(state.data())) : 0;
  if (table.dim() <= 0 || stride < table.dim() || stride % table.dim() != 0) {
    return absl::DataLossError(absl::StrCat("table ", table.name(), ": a bucket's rows are ", stride,
                                            " floats wide, not a multiple of its dim ", table.dim()));
  }
  absl::flat_hash_set<uint64_t> seen;  // (a bucket's keys are its own: no other bucket holds them)
  TableStateVisitor visit;
  visit.begin = [&](uint64_t count, const TableStateCounters&) {
    ids->reserve(ids->size() + count);
    rows->reserve(rows->size() + count * dim);
    seen.reserve(count);
    return absl::OkStatus();
  };
  visit.row = [&](uint64_t key, int64_t, absl::Span<const float> floats) {
    if (!seen.insert(key).second) {
      return absl::DataLossError(absl::StrCat("table ", table.name(), ": a bucket lists key ", key, " twice"));
    }
    ids->push_back(key);
    rows->insert(rows->end(), floats.begin(), floats.begin() + static_cast<std::ptrdiff_t>(dim));
    return absl::OkStatus();
  };
  return ParseTableState(state, table.name(), stride, visit);
}

// By table: each row's id and values, gathered from the buckets.
struct Gathered {
  std::vector<uint64_t> ids;
  std::vector<float> rows;
};

// The tables' tensors: table.NAME.ids (U64, ascending) and table.NAME.rows
// (F32, rows x dim) for each table of the map.
std::vector<SafetensorsTensor> TableTensors(const v1::ShardMap& map, std::vector<Gathered> gathered) {
  std::vector<SafetensorsTensor> tensors;
  for (size_t t = 0; t < gathered.size(); ++t) {
    const v1::TableLayout& table = map.tables(static_cast<int>(t));
    const size_t dim = static_cast<size_t>(table.dim());
    std::vector<size_t> order(gathered[t].ids.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return gathered[t].ids[a] < gathered[t].ids[b]; });
    std::vector<uint64_t> ids(order.size());
    std::vector<float> rows(order.size() * dim);
    for (size_t i = 0; i < order.size(); ++i) {
      ids[i] = gathered[t].ids[order[i]];
      std::copy_n(gathered[t].rows.begin() + static_cast<std::ptrdiff_t>(order[i] * dim), dim,
                  rows.begin() + static_cast<std::ptrdiff_t>(i * dim));
    }
    const auto n = static_cast<int64_t>(ids.size());
    tensors.push_back(SafetensorsTensor::Ids(absl::StrCat("table.", table.name(), ".ids"), {n}, std::move(ids)));
    tensors.emplace_back(absl::StrCat("table.", table.name(), ".rows"),
                         std::vector<int64_t>{n, static_cast<int64_t>(dim)}, std::move(rows));
  }
  return tensors;
}

// Table `t`'s bucket `b` as its server holds it now (CopyChunk: a live
// capture, in slices), appended to *into. A capture the server dropped
// between two slices is copied again.
absl::Status CopyBucket(v1::ParameterService::Stub* stub, const std::string& address, const std::string& job_id,
                        const v1::TableLayout& table, int32_t t, int32_t b, double timeout, Gathered* into) {
  const int32_t chunk_id = TableChunkId(t, b);
  auto copy = [&](int64_t offset, uint64_t capture) -> absl::StatusOr<v1::ChunkState> {
    v1::CopyChunkRequest request;
    request.set_job_id(job_id);
    request.set_chunk_id(chunk_id);
    request.set_table_state_offset(offset);
    request.set_capture(capture);
    v1::ChunkState response;
    grpc::ClientContext context;
    SetDeadline(&context, timeout);
    absl::Status status = FromGrpcStatus(stub->CopyChunk(&context, request, &response));
    if (!status.ok()) return status;
    return response;
  };
  for (int attempt = 0; attempt < kConsistentReadAttempts; ++attempt) {
    absl::StatusOr<v1::ChunkState> state = ReadSlicedChunk(chunk_id, copy);
    if (absl::IsAborted(state.status())) {  // the capture was dropped, or the server is busy: copy it again
      absl::SleepFor(absl::Milliseconds(20) * (attempt + 1));
      continue;
    }
    if (!state.ok()) {
      return absl::Status(state.status().code(), absl::StrCat("copying table ", table.name(), " bucket ", b,
                                                              " from ", address, ": ", state.status().message()));
    }
    return AddTableRows(table, state->table_state(), &into->ids, &into->rows);
  }
  return absl::UnavailableError(absl::StrCat("table ", table.name(), " bucket ", b, " on ", address,
                                             " kept being dropped while it was read; try again"));
}

// The live parameters: every chunk pulled from its primary; retried until
// all chunks are at one version (a BSP job between two steps). Then every
// table bucket, copied from its shard's primary: each bucket as it is at
// the moment it is read (a finished job's are final; a running job's are
// read one after the other while it trains).
absl::StatusOr<ExportResult> PullLive(const v1::JobStatus& job, double timeout) {
  const v1::ShardMap& map = job.shard_map();
  if (map.chunks_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job.job_id(), " (", v1::JobState_Name(job.state()),
                                                      ") holds no parameters yet"));
  }
  // Each shard's servers, its primary first, then its backups: a replicated
  // job's backups hold what its primary holds (a finished job's final
  // parameters), so a primary that cannot be reached (killed, paused) is
  // read from them. One found unreachable is tried last after that.
  std::map<int32_t, std::vector<std::string>> holders;
  for (const v1::ShardLocation& shard : map.shards()) {
    std::vector<std::string>& servers = holders[shard.shard()];
    servers.push_back(shard.address());
    servers.insert(servers.end(), shard.backup_addresses().begin(), shard.backup_addresses().end());
  }
  std::set<std::string> unreachable;
  auto from_holders = [&](int32_t shard, const std::function<absl::Status(const std::string&)>& read) {
    std::vector<std::string> servers = holders[shard];
    std::stable_partition(servers.begin(), servers.end(),
                          [&](const std::string& address) { return unreachable.count(address) == 0; });
    if (servers.empty())
      return absl::NotFoundError(absl::StrCat("the shard map names no server for shard ", shard));
    std::vector<std::string> failures;
    absl::Status status;
    for (const std::string& address : servers) {
      status = read(address);
      if (status.ok() || !(absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status))) return status;
      unreachable.insert(address);
      failures.emplace_back(status.message());
    }
    return absl::Status(status.code(), absl::StrJoin(failures, "; "));
  };
  Stubs stubs;
  for (int attempt = 0; attempt < kConsistentReadAttempts; ++attempt) {
    ExportResult result;
    result.tensors = EmptyTensors(map);
    int64_t low = INT64_MAX, high = 0;
    int64_t clock = INT64_MAX;  // ASP, SSP: the steps every partition has in every chunk
    for (const v1::ChunkLocation& chunk : map.chunks()) {
      v1::PullRequest request;
      request.set_job_id(job.job_id());
      request.add_chunk_ids(chunk.chunk_id());
      request.set_map_version(map.version());
      v1::PullResponse response;
      RETURN_IF_ERROR(from_holders(chunk.shard(), [&](const std::string& address) {
        // A busy server's refusal is sent again after a backoff, within the
        // timeout; still refused then, the next holder is asked.
        const absl::Time deadline = absl::Now() + absl::Seconds(timeout);
        BusyBackoff backoff;
        absl::Status status;
        while (true) {
          grpc::ClientContext context;
          context.set_deadline(absl::ToChronoTime(deadline));
          status = FromGrpcStatus(stubs.For(address)->Pull(&context, request, &response));
          if (!IsServerBusy(status) || !backoff.WaitBefore(deadline)) break;
        }
        if (IsServerBusy(status)) status = BusyUntilTheDeadline(status);
        if (status.ok()) return status;
        return absl::Status(status.code(), absl::StrCat("pulling chunk ", chunk.chunk_id(), " from ", address,
                                                        ": ", status.message()));
      }));
      if (response.chunks_size() != 1) return absl::DataLossError("pull answered with the wrong chunks");
      RETURN_IF_ERROR(Place(chunk, response.chunks(0).data(), &result.tensors));
      low = std::min(low, response.chunks(0).version());
      high = std::max(high, response.chunks(0).version());
      clock = std::min(clock, response.chunks(0).clock());
    }
    const bool synchronous = job.spec().mode() == v1::BSP || job.spec().mode() == v1::MODE_UNSPECIFIED;
    if (!synchronous || low == high) {
      // A BSP chunk's version is its steps; an asynchronous one's counts
      // every partition's pushes.
      result.step = synchronous ? high : clock;
      std::vector<Gathered> gathered(static_cast<size_t>(map.tables_size()));
      for (int32_t t = 0; t < map.tables_size(); ++t) {
        const v1::TableLayout& table = map.tables(t);
        for (int32_t b = 0; b < table.bucket_shards_size(); ++b) {
          RETURN_IF_ERROR(from_holders(table.bucket_shards(b), [&](const std::string& address) {
            return CopyBucket(stubs.For(address), address, job.job_id(), table, t, b, timeout,
                              &gathered[static_cast<size_t>(t)]);
          }));
        }
      }
      result.tables = TableTensors(map, std::move(gathered));
      return result;
    }
  }
  return absl::UnavailableError(absl::StrCat("job ", job.job_id(), " kept moving while it was read; ",
                                             "export one of its checkpoints instead (--checkpoint ID)"));
}

absl::StatusOr<ExportResult> ReadCheckpoint(const v1::CheckpointManifest& manifest,
                                            const std::map<std::string, std::string>& live, double timeout) {
  ExportResult result;
  result.tensors = EmptyTensors(manifest.shard_map());
  result.step = manifest.info().step();
  result.checkpoint_id = manifest.info().id();
  std::map<int32_t, const v1::ChunkLocation*> locations;
  for (const v1::ChunkLocation& chunk : manifest.shard_map().chunks()) locations[chunk.chunk_id()] = &chunk;
  Stubs stubs;
  // A stored chunk of checkpoint `checkpoint_id` from the first holder that
  // answers.
  auto read = [&](int64_t checkpoint_id, const v1::CheckpointChunk& chunk) -> absl::StatusOr<v1::ChunkState> {
    std::vector<std::string> failures;
    for (const std::string& server : chunk.server_ids()) {
      auto address = live.find(server);
      if (address == live.end()) {
        failures.push_back(absl::StrCat(server, ": not a live member"));
        continue;
      }
      v1::ReadCheckpointRequest request;
      request.set_job_id(manifest.job_id());
      request.set_checkpoint_id(checkpoint_id);
      request.set_chunk_id(chunk.chunk_id());
      request.set_checksum(chunk.checksum());
      absl::StatusOr<v1::ChunkState> state = ReadCheckpointChunkFrom(stubs.For(address->second), request, timeout);
      if (state.ok()) return state;
      failures.push_back(absl::StrCat(server, ": ", state.status().message()));
    }
    return absl::UnavailableError(absl::StrCat("checkpoint ", checkpoint_id, " of job ", manifest.job_id(),
                                               ": chunk ", chunk.chunk_id(), " could not be read (",
                                               absl::StrJoin(failures, "; "), ")"));
  };
  std::vector<Gathered> gathered(static_cast<size_t>(manifest.shard_map().tables_size()));
  for (const v1::CheckpointChunk& chunk : manifest.chunks()) {
    const v1::TableLayout* table = nullptr;
    Gathered* into = nullptr;
    auto location = locations.find(chunk.chunk_id());
    if (chunk.chunk_id() >= kTableChunkBase) {
      const int32_t t = TableBucketOf(chunk.chunk_id()).table;
      if (t >= manifest.shard_map().tables_size()) {
        return absl::DataLossError(absl::StrCat("manifest: chunk ", chunk.chunk_id(), " is of no table"));
      }
      table = &manifest.shard_map().tables(t);
      into = &gathered[static_cast<size_t>(t)];
    } else if (location == locations.end()) {
      return absl::DataLossError(absl::StrCat("manifest: unknown chunk ", chunk.chunk_id()));
    }
    ASSIGN_OR_RETURN(v1::ChunkState state, read(manifest.info().id(), chunk));
    if (table == nullptr) {
      RETURN_IF_ERROR(Place(*location->second, state.values(), &result.tensors));
      continue;
    }
    // A bucket stored incrementally is composed with the checkpoints it is on.
    ASSIGN_OR_RETURN(std::string rows,
                     WholeTableState(std::move(*state.mutable_table_state()), chunk,
                                     [&](int64_t base, const v1::CheckpointChunk& entry) -> absl::StatusOr<std::string> {
                                       ASSIGN_OR_RETURN(v1::ChunkState stored, read(base, entry));
                                       return std::move(*stored.mutable_table_state());
                                     }));
    RETURN_IF_ERROR(AddTableRows(*table, rows, &into->ids, &into->rows));
  }
  result.tables = TableTensors(manifest.shard_map(), std::move(gathered));
  return result;
}

}  // namespace

absl::StatusOr<ExportResult> GatherParameters(const std::string& scheduler, const std::string& job_id,
                                              int64_t checkpoint_id, double timeout) {
  auto channel = MakeChannel(scheduler);
  auto jobs = v1::JobService::NewStub(channel);
  if (checkpoint_id == 0) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::JobStatus job;
    grpc::ClientContext context;
    SetDeadline(&context, timeout);
    RETURN_IF_ERROR(FromGrpcStatus(jobs->GetJob(&context, request, &job)));
    if (job.state() == v1::CANCELLED || job.state() == v1::FAILED || job.parameters_released_unix_ms() > 0) {
      // Its servers dropped the parameters when it ended (only a job that
      // succeeded keeps them) or retention released them.
      std::vector<std::string> complete;
      for (const v1::CheckpointInfo& info : job.checkpoints()) {
        if (info.state() == v1::CheckpointInfo::COMPLETE) complete.push_back(absl::StrCat(info.id()));
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job.job_id(), " (", v1::JobState_Name(job.state()), ") holds no live parameters: ",
          job.parameters_released_unix_ms() > 0
              ? "the servers released them (retention, or every server holding a "
                "shard of them restarted; fulcrum get says which)"
              : "the servers dropped them when it ended (only a job that "
                "succeeded keeps them)",
          complete.empty() ? "; it has no complete checkpoint to export either"
                           : absl::StrCat("; export one of its checkpoints instead (--checkpoint ",
                                          absl::StrJoin(complete, ", "), ")")));
    }
    return PullLive(job, timeout);
  }
  v1::GetCheckpointRequest request;
  request.set_job_id(job_id);
  request.set_checkpoint_id(checkpoint_id);
  v1::CheckpointManifest manifest;
  {
    grpc::ClientContext context;
    SetDeadline(&context, timeout);
    RETURN_IF_ERROR(FromGrpcStatus(jobs->GetCheckpoint(&context, request, &manifest)));
  }
  std::map<std::string, std::string> live;
  {
    auto cluster = v1::ClusterService::NewStub(channel);
    v1::ListMembersResponse members;
    grpc::ClientContext context;
    SetDeadline(&context, timeout);
    RETURN_IF_ERROR(FromGrpcStatus(cluster->ListMembers(&context, v1::ListMembersRequest(), &members)));
    for (const v1::MemberInfo& m : members.members()) {
      if (m.role() == v1::SERVER) live[m.member_id()] = m.address();
    }
  }
  return ReadCheckpoint(manifest, live, timeout);
}

}  // namespace fulcrum
