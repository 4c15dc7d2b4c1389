#include "client/export.h"

#include "common/table_spec.h"

#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc.h"
#include "common/status_macros.h"
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

// The live parameters: every chunk pulled from its primary; retried until
// all chunks are at one version (a BSP job between two steps).
absl::StatusOr<ExportResult> PullLive(const v1::JobStatus& job, double timeout) {
  const v1::ShardMap& map = job.shard_map();
  if (map.chunks_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job.job_id(), " (", v1::JobState_Name(job.state()),
                                                      ") holds no parameters yet"));
  }
  std::map<int32_t, std::string> primary;
  for (const v1::ShardLocation& shard : map.shards()) primary[shard.shard()] = shard.address();
  Stubs stubs;
  for (int attempt = 0; attempt < kConsistentReadAttempts; ++attempt) {
    ExportResult result;
    result.tensors = EmptyTensors(map);
    int64_t low = INT64_MAX, high = 0;
    for (const v1::ChunkLocation& chunk : map.chunks()) {
      v1::PullRequest request;
      request.set_job_id(job.job_id());
      request.add_chunk_ids(chunk.chunk_id());
      request.set_map_version(map.version());
      v1::PullResponse response;
      grpc::ClientContext context;
      SetDeadline(&context, timeout);
      absl::Status status = FromGrpcStatus(stubs.For(primary[chunk.shard()])->Pull(&context, request, &response));
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat("pulling chunk ", chunk.chunk_id(), " from ",
                                                        primary[chunk.shard()], ": ", status.message()));
      }
      if (response.chunks_size() != 1) return absl::DataLossError("pull answered with the wrong chunks");
      RETURN_IF_ERROR(Place(chunk, response.chunks(0).data(), &result.tensors));
      low = std::min(low, response.chunks(0).version());
      high = std::max(high, response.chunks(0).version());
    }
    const bool synchronous = job.spec().mode() == v1::BSP || job.spec().mode() == v1::MODE_UNSPECIFIED;
    if (!synchronous || low == high) {
      result.step = high;
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
  for (const v1::CheckpointChunk& chunk : manifest.chunks()) {
    if (chunk.chunk_id() >= kTableChunkBase) continue;  // a table bucket: the dense tensors only
    auto location = locations.find(chunk.chunk_id());
    if (location == locations.end()) return absl::DataLossError(absl::StrCat("manifest: unknown chunk ", chunk.chunk_id()));
    std::vector<std::string> failures;
    bool read = false;
    for (const std::string& server : chunk.server_ids()) {
      auto address = live.find(server);
      if (address == live.end()) {
        failures.push_back(absl::StrCat(server, ": not a live member"));
        continue;
      }
      v1::ReadCheckpointRequest request;
      request.set_job_id(manifest.job_id());
      request.set_checkpoint_id(manifest.info().id());
      request.set_chunk_id(chunk.chunk_id());
      request.set_checksum(chunk.checksum());
      v1::ChunkState state;
      grpc::ClientContext context;
      SetDeadline(&context, timeout);
      absl::Status status = FromGrpcStatus(stubs.For(address->second)->ReadCheckpoint(&context, request, &state));
      if (!status.ok()) {
        failures.push_back(absl::StrCat(server, ": ", status.message()));
        continue;
      }
      RETURN_IF_ERROR(Place(*location->second, state.values(), &result.tensors));
      read = true;
      break;
    }
    if (!read) {
      return absl::UnavailableError(absl::StrCat("checkpoint ", manifest.info().id(), " of job ", manifest.job_id(),
                                                 ": chunk ", chunk.chunk_id(), " could not be read (",
                                                 absl::StrJoin(failures, "; "), ")"));
    }
  }
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
