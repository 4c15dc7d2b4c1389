#include "worker/example_audit.h"

#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "fulcrum/v1/parameter.grpc.pb.h"

namespace fulcrum {

ExampleAudit ExpectedExampleAudit(const v1::JobSpec& spec, int64_t num_examples) {
  return DataPartitioning::For(spec, num_examples).ExpectedAudit(spec.data().shuffle_seed(), spec.data().epochs());
}

absl::StatusOr<std::vector<ChunkAudit>> ReadChunkAudits(const v1::JobStatus& job) {
  std::vector<ChunkAudit> audits;
  for (const v1::ChunkLocation& chunk : job.shard_map().chunks()) {
    ChunkAudit& audit = audits.emplace_back();
    audit.chunk_id = chunk.chunk_id();
    for (const v1::ShardLocation& shard : job.shard_map().shards()) {
      if (shard.shard() == chunk.shard()) audit.address = shard.address();
    }
    auto stub = v1::ParameterService::NewStub(MakeChannel(audit.address));
    grpc::ClientContext context;
    SetDeadline(&context, 10);
    v1::CopyChunkRequest request;
    request.set_job_id(job.job_id());
    request.set_chunk_id(chunk.chunk_id());
    v1::ChunkState state;
    absl::Status status = FromGrpcStatus(stub->CopyChunk(&context, request, &state));
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("audit of chunk ", chunk.chunk_id(), " at ", audit.address,
                                                      ": ", status.message()));
    }
    audit.audit.examples = state.examples_seen();
    audit.audit.digest = state.examples_digest();
  }
  return audits;
}

}  // namespace fulcrum
