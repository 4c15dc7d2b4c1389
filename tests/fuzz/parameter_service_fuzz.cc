// libFuzzer: every ParameterService handler fed mutated requests, in any
// order, against one server's state (its jobs, chunks, checkpoints). Job ids
// are folded onto four, and addresses are cleared (so that the server never
// calls out: no backups to forward to, no chunk to copy from a peer), which
// keeps the state bounded and the run hermetic. Properties: no crash, no
// hang, nothing beyond the memory budget, every refusal a status.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "common/kv_store.h"
#include "common/metrics.h"
#include "server/checkpoint_store.h"
#include "server/parameter_service.h"
#include "tests/fuzz/fuzz_input.h"

namespace fulcrum {
namespace {

struct Server {
  Server()
      : metrics(*MetricsEndpoint::Start("127.0.0.1", 0)),
        store(64 << 20),
        kv(NewMemoryStore()),
        checkpoints(kv.get()),
        service(&store, metrics.get(), [] { return true; }, &checkpoints) {}
  std::unique_ptr<MetricsEndpoint> metrics;
  ParameterStore store;
  std::unique_ptr<KvStore> kv;
  CheckpointStore checkpoints;
  ParameterServiceImpl service;
};

std::string FoldJob(const std::string& job_id) {
  return std::string("job-") + static_cast<char>('a' + (job_id.empty() ? 0 : job_id[0] & 3));
}

void ClearAddresses(v1::ShardMap* map) {
  for (v1::ShardLocation& shard : *map->mutable_shards()) {
    shard.clear_backup_addresses();
    shard.clear_address();
  }
}

template <typename Request>
bool Parse(const std::string& bytes, Request* request) {
  if (!request->ParseFromString(bytes)) return false;
  request->set_job_id(FoldJob(request->job_id()));
  return true;
}

}  // namespace
}  // namespace fulcrum

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fulcrum;
  static Server* server = new Server();
  ParameterServiceImpl& service = server->service;
  FuzzInput input(data, size);
  uint8_t command = 0;
  std::string bytes;
  while (input.Next(&command, &bytes)) {
    grpc::ServerContext context;
    if (command >= 240) {  // the sparse tables' RPCs (commands below keep their meaning)
      // The bytes as received, in two slices (rows may straddle them).
      const size_t half = bytes.size() / 2;
      grpc::Slice slices[2] = {grpc::Slice(bytes.data(), half), grpc::Slice(bytes.data() + half, bytes.size() - half)};
      const grpc::ByteBuffer request(slices, 2);
      if (command % 2 == 0) {
        grpc::ByteBuffer response;
        (void)service.HandleSparsePull(request, &response);
      } else {
        v1::SparsePushResponse response;
        // 241, 245, ...: a worker's push; 243, 247, ...: a primary's forward.
        (void)service.HandleSparsePush(request, /*from_worker=*/command % 4 == 1, &response);
      }
      if (server->store.bytes() > server->store.memory_budget()) std::abort();
      continue;
    }
    switch (command % 10) {
      case 0: {
        v1::SetupJobRequest request;
        if (!Parse(bytes, &request)) break;
        request.clear_copy_from();
        request.clear_restore();
        for (v1::ChunkSetup& chunk : *request.mutable_chunks()) chunk.clear_copy_from();
        ClearAddresses(request.mutable_shard_map());
        v1::SetupJobResponse response;
        (void)service.SetupJob(&context, &request, &response);
        break;
      }
      case 1: {
        v1::DropJobRequest request;
        if (!Parse(bytes, &request)) break;
        v1::DropJobResponse response;
        (void)service.DropJob(&context, &request, &response);
        break;
      }
      case 2:
      case 3: {
        // The bytes as received, in two slices (a payload may straddle them).
        const size_t half = bytes.size() / 2;
        grpc::Slice slices[2] = {grpc::Slice(bytes.data(), half),
                                 grpc::Slice(bytes.data() + half, bytes.size() - half)};
        grpc::ByteBuffer request(slices, 2);
        v1::PushResponse response;
        (void)service.HandlePush(request, /*from_worker=*/command % 10 == 2, &response);
        break;
      }
      case 4: {
        v1::PullRequest request;
        if (!Parse(bytes, &request)) break;
        v1::PullResponse response;
        absl::Status finished = absl::UnknownError("not finished");
        auto pull = service.StartPull(request, &response, absl::Now(),
                                      [&finished](const absl::Status& status) { finished = status; });
        // A pull that would be held: its deadline is now.
        if (pull.ok() && *pull != nullptr) (*pull)->Fail(absl::DeadlineExceededError("fuzz"));
        break;
      }
      case 5: {
        v1::ReconfigureRequest request;
        if (!Parse(bytes, &request)) break;
        ClearAddresses(request.mutable_shard_map());
        v1::ReconfigureResponse response;
        (void)service.Reconfigure(&context, &request, &response);
        break;
      }
      case 6: {
        v1::CopyChunkRequest request;
        if (!Parse(bytes, &request)) break;
        v1::ChunkState response;
        (void)service.CopyChunk(&context, &request, &response);
        break;
      }
      case 7: {
        v1::CheckpointRequest request;
        if (!Parse(bytes, &request)) break;
        // (0 means the server's default wait, a minute: too long to fuzz.)
        request.set_timeout_ms(std::max<int64_t>(1, std::min<int64_t>(request.timeout_ms(), 5)));
        v1::CheckpointResponse response;
        (void)service.Checkpoint(&context, &request, &response);
        break;
      }
      case 8: {
        v1::ReadCheckpointRequest request;
        if (!Parse(bytes, &request)) break;
        v1::ChunkState response;
        (void)service.ReadCheckpoint(&context, &request, &response);
        break;
      }
      case 9: {
        v1::DeleteCheckpointRequest request;
        if (!Parse(bytes, &request)) break;
        v1::DeleteCheckpointResponse response;
        (void)service.DeleteCheckpoint(&context, &request, &response);
        break;
      }
    }
    if (server->store.bytes() > server->store.memory_budget()) std::abort();
  }
  return 0;
}
