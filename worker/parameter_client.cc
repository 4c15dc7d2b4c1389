#include "worker/parameter_client.h"

#include "absl/time/clock.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace fulcrum {
namespace {

constexpr int kMaxAttempts = 5;

}  // namespace

ParameterClient::ParameterClient(const v1::ShardMap& map, std::string job_id, std::string worker_id,
                                 std::function<bool()> superseded)
    : map_(map), superseded_(std::move(superseded)), job_id_(std::move(job_id)), worker_id_(std::move(worker_id)) {
  std::map<std::string, std::vector<int>> by_server;
  for (int i = 0; i < map_.chunks_size(); ++i) {
    by_server[map_.shards(map_.chunks(i).shard()).address()].push_back(i);
  }
  for (auto& [address, chunks] : by_server) {
    Batch batch{address, {}};
    int64_t bytes = 0;
    for (int chunk : chunks) {
      int64_t chunk_bytes = map_.chunks(chunk).length() * 4;
      if (!batch.chunks.empty() && bytes + chunk_bytes > kMaxBatchBytes) {
        batches_.push_back(batch);
        batch.chunks.clear();
        bytes = 0;
      }
      batch.chunks.push_back(chunk);
      bytes += chunk_bytes;
    }
    if (!batch.chunks.empty()) batches_.push_back(batch);
    stubs_[address] = v1::ParameterService::NewStub(MakeChannel(address));
  }
  for (const auto& chunk : map_.chunks()) total_bytes_ += chunk.length() * 4;
}

std::vector<std::vector<float>> ParameterClient::MakeBuffers() const {
  std::vector<std::vector<float>> buffers;
  for (const auto& tensor : map_.tensors()) buffers.emplace_back(tensor.size(), 0.0f);
  return buffers;
}

v1::ParameterService::Stub* ParameterClient::Stub(const std::string& address) {
  return stubs_.at(address).get();
}

template <typename Request, typename Response>
absl::Status ParameterClient::RunAll(const std::vector<Request>& requests,
                                     std::vector<Response>* responses, bool pull,
                                     absl::Duration timeout) {
  responses->assign(requests.size(), Response());
  std::vector<size_t> todo(requests.size());
  for (size_t i = 0; i < todo.size(); ++i) todo[i] = i;
  absl::Status last;
  for (int attempt = 0; attempt < kMaxAttempts && !todo.empty(); ++attempt) {
    if (attempt > 0) {  // backoff before retrying UNAVAILABLE, unless a newer map is out
      const absl::Time until = absl::Now() + absl::Milliseconds(100 << attempt);
      while (absl::Now() < until) {
        if (superseded_ && superseded_()) return last;
        absl::SleepFor(absl::Milliseconds(10));
      }
    }
    std::vector<grpc::ClientContext> contexts(todo.size());
    std::vector<grpc::Status> results(todo.size());
    absl::Mutex mu;
    size_t remaining = todo.size();
    for (size_t k = 0; k < todo.size(); ++k) {
      size_t i = todo[k];
      SetDeadline(&contexts[k], absl::ToDoubleSeconds(timeout));
      auto done = [&, k](grpc::Status status) {
        absl::MutexLock lock(&mu);
        results[k] = std::move(status);
        --remaining;
      };
      auto* async = Stub(batches_[i].address)->async();
      if constexpr (std::is_same_v<Request, v1::PullRequest>) {
        async->Pull(&contexts[k], &requests[i], &(*responses)[i], done);
      } else {
        async->Push(&contexts[k], &requests[i], &(*responses)[i], done);
      }
    }
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(
          +[](size_t* r) { return *r == 0; }, &remaining));
    }
    std::vector<size_t> retry;
    for (size_t k = 0; k < todo.size(); ++k) {
      if (results[k].ok()) continue;
      last = absl::Status(FromGrpcStatus(results[k]).code(),
                          absl::StrCat(pull ? "pull from " : "push to ", batches_[todo[k]].address,
                                       ": ", results[k].error_message()));
      if (results[k].error_code() != grpc::StatusCode::UNAVAILABLE) return last;
      retry.push_back(todo[k]);
    }
    todo.swap(retry);
  }
  return todo.empty() ? absl::OkStatus() : last;
}

absl::Status ParameterClient::Pull(int64_t min_version, absl::Duration timeout,
                                   std::vector<std::vector<float>>* params, Versions* versions,
                                   int64_t min_clock) {
  std::vector<v1::PullRequest> requests(batches_.size());
  for (size_t i = 0; i < batches_.size(); ++i) {
    requests[i].set_job_id(job_id_);
    requests[i].set_min_version(min_version);
    requests[i].set_map_version(map_.version());
    requests[i].set_min_clock(min_clock);
    for (int chunk : batches_[i].chunks) requests[i].add_chunk_ids(map_.chunks(chunk).chunk_id());
  }
  std::vector<v1::PullResponse> responses;
  RETURN_IF_ERROR(RunAll(requests, &responses, /*pull=*/true, timeout));
  Versions seen{INT64_MAX, 0, INT64_MAX};
  for (size_t i = 0; i < batches_.size(); ++i) {
    if (responses[i].chunks_size() != static_cast<int>(batches_[i].chunks.size())) {
      return absl::InternalError(absl::StrCat("pull from ", batches_[i].address, " returned ",
                                              responses[i].chunks_size(), " chunks, asked for ",
                                              batches_[i].chunks.size()));
    }
    for (size_t c = 0; c < batches_[i].chunks.size(); ++c) {
      const v1::ChunkLocation& chunk = map_.chunks(batches_[i].chunks[c]);
      float* out = (*params)[chunk.tensor()].data() + chunk.offset();
      RETURN_IF_ERROR(DecodeFloats(responses[i].chunks(c).data(), chunk.length(), out,
                                   absl::StrCat("pulled chunk ", chunk.chunk_id())));
      seen.min = std::min(seen.min, responses[i].chunks(c).version());
      seen.max = std::max(seen.max, responses[i].chunks(c).version());
      seen.clock = std::min(seen.clock, responses[i].chunks(c).clock());
    }
  }
  if (versions != nullptr) *versions = batches_.empty() ? Versions() : seen;
  return absl::OkStatus();
}

absl::Status ParameterClient::Push(int64_t seq, int32_t partition, int64_t step,
                                   const std::vector<std::vector<float>>& grads, absl::Duration timeout,
                                   int64_t examples, uint64_t examples_digest) {
  std::vector<v1::PushRequest> requests(batches_.size());
  for (size_t i = 0; i < batches_.size(); ++i) {
    v1::PushRequest& request = requests[i];
    request.set_job_id(job_id_);
    request.set_map_version(map_.version());
    request.set_worker_id(worker_id_);
    request.set_partition(partition);
    request.set_seq(seq);
    request.set_step(step);
    request.set_examples(examples);
    request.set_examples_digest(examples_digest);
    for (int index : batches_[i].chunks) {
      const v1::ChunkLocation& chunk = map_.chunks(index);
      v1::ChunkData* data = request.add_chunks();
      data->set_chunk_id(chunk.chunk_id());
      EncodeFloats(grads[chunk.tensor()].data() + chunk.offset(), chunk.length(), data->mutable_data());
    }
  }
  std::vector<v1::PushResponse> responses;
  return RunAll(requests, &responses, /*pull=*/false, timeout);
}

}  // namespace fulcrum
