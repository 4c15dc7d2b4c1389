// A worker's view of a job's parameters: pushes gradients to and pulls
// parameters from the servers named by the shard map. Requests to different
// servers (and batches of chunks up to kMaxBatchBytes) run in parallel;
// UNAVAILABLE is retried with backoff, which (worker, seq) deduplication on
// the servers makes safe for pushes.
#ifndef FULCRUM_WORKER_PARAMETER_CLIENT_H_
#define FULCRUM_WORKER_PARAMETER_CLIENT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "fulcrum/v1/parameter.grpc.pb.h"
#include "fulcrum/v1/shard_map.pb.h"

namespace fulcrum {

class ParameterClient {
 public:
  // Payload bytes per request: below gRPC's 4 MiB default, so that any peer
  // with default limits could take them, and well below our 8 MiB limit.
  static constexpr int64_t kMaxBatchBytes = 3 << 20;

  // `superseded` (optional) says whether a newer shard map than `map` is
  // known: retries of UNAVAILABLE stop as soon as it is, so that a worker
  // moves to the new map at once rather than backing off on a dead server.
  ParameterClient(const v1::ShardMap& map, std::string job_id, std::string worker_id,
                  std::function<bool()> superseded = nullptr);

  // One float buffer per tensor of the map, sized to the tensor.
  std::vector<std::vector<float>> MakeBuffers() const;

  // The chunks' update counts seen by a pull.
  struct Versions {
    int64_t min = 0;
    int64_t max = 0;
    int64_t clock = 0;  // the slowest data partition's steps, over all chunks
  };

  // Fills `params` once every chunk has at least `min_version` updates.
  // DEADLINE_EXCEEDED after `timeout`; `params` is untouched on error.
  absl::Status Pull(int64_t min_version, absl::Duration timeout, std::vector<std::vector<float>>* params,
                    Versions* versions = nullptr, int64_t min_clock = 0);

  // Sends `grads` (same layout as MakeBuffers), computed on data partition
  // `partition` at `step`, as this worker's push number `seq`.
  // `examples` and `examples_digest` describe the batch behind the gradient
  // (see ExampleDigest in worker/trainer.h); servers sum them as an audit.
  absl::Status Push(int64_t seq, int32_t partition, int64_t step, const std::vector<std::vector<float>>& grads,
                    absl::Duration timeout, int64_t examples = 0, uint64_t examples_digest = 0);

  int64_t total_bytes() const { return total_bytes_; }
  int64_t map_version() const { return map_.version(); }

 private:
  struct Batch {
    std::string address;
    std::vector<int> chunks;  // indices into map_.chunks()
  };
  template <typename Request, typename Response>
  absl::Status RunAll(const std::vector<Request>& requests, std::vector<Response>* responses,
                      bool pull, absl::Duration timeout);
  v1::ParameterService::Stub* Stub(const std::string& address);

  const v1::ShardMap map_;
  const std::function<bool()> superseded_;
  const std::string job_id_;
  const std::string worker_id_;
  std::vector<Batch> batches_;
  std::map<std::string, std::unique_ptr<v1::ParameterService::Stub>> stubs_;
  int64_t total_bytes_ = 0;
};

}  // namespace fulcrum

#endif  // FULCRUM_WORKER_PARAMETER_CLIENT_H_
