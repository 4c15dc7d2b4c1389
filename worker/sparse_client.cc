#include "worker/sparse_client.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/payload_wire.h"
#include "common/rpc.h"
#include "common/shard_map.h"
#include "common/status_macros.h"
#include "common/sync.h"
#include "common/tensor_codec.h"
#include "fulcrum/v1/parameter.pb.h"

namespace fulcrum {
namespace {

std::string KeyBytes(const std::vector<uint64_t>& keys, const std::vector<uint32_t>& positions) {
  std::string bytes(positions.size() * sizeof(uint64_t), '\0');
  for (size_t i = 0; i < positions.size(); ++i) {
    absl::little_endian::Store64(bytes.data() + i * sizeof(uint64_t), keys[positions[i]]);
  }
  return bytes;
}

}  // namespace

SparseClient::SparseClient(const v1::ShardMap& map, std::string job_id, std::string worker_id,
                           ParameterTransport* transport)
    : map_(map),
      job_id_(std::move(job_id)),
      worker_id_(std::move(worker_id)),
      own_transport_(transport == nullptr ? std::make_unique<GrpcParameterTransport>() : nullptr),
      transport_(transport == nullptr ? own_transport_.get() : transport) {}

std::vector<SparseClient::Request> SparseClient::Plan(const std::vector<std::vector<uint64_t>>& keys,
                                                     bool every_shard) const {
  // By shard, then table: the positions of its keys, by bucket (a counting
  // sort; runs of a bucket the server reads in place), ascending within one.
  const auto shards = static_cast<size_t>(map_.shards_size());
  std::vector<std::vector<std::vector<uint32_t>>> by_shard(
      shards, std::vector<std::vector<uint32_t>>(static_cast<size_t>(num_tables())));
  std::vector<bool> holds_buckets(shards, false);
  std::vector<int32_t> bucket_of;
  std::vector<uint32_t> next;
  std::vector<uint32_t> sorted;
  for (int t = 0; t < num_tables(); ++t) {
    const v1::TableLayout& table = map_.tables(t);
    for (int32_t shard : table.bucket_shards()) {
      if (shard >= 0 && static_cast<size_t>(shard) < shards) holds_buckets[static_cast<size_t>(shard)] = true;
    }
    const std::vector<uint64_t>& table_keys = keys[static_cast<size_t>(t)];
    const auto buckets = static_cast<size_t>(table.buckets());
    bucket_of.resize(table_keys.size());
    next.assign(buckets + 1, 0);
    for (size_t i = 0; i < table_keys.size(); ++i) {
      bucket_of[i] = BucketOf(table_keys[i], table.buckets());
      ++next[static_cast<size_t>(bucket_of[i]) + 1];
    }
    for (size_t b = 1; b <= buckets; ++b) next[b] += next[b - 1];
    sorted.resize(table_keys.size());
    for (size_t i = 0; i < table_keys.size(); ++i) sorted[next[static_cast<size_t>(bucket_of[i])]++] = static_cast<uint32_t>(i);
    for (uint32_t i : sorted) {
      by_shard[static_cast<size_t>(table.bucket_shards(bucket_of[i]))][static_cast<size_t>(t)].push_back(i);
    }
  }
  // Requests per shard, to its primary (a server leading two shards gets
  // two): a shard's replicas each count the shard's parts, whoever leads it.
  std::vector<Request> requests;
  for (size_t shard = 0; shard < shards; ++shard) {
    Request request{map_.shards(static_cast<int>(shard)).address(), static_cast<int32_t>(shard),
                    std::vector<std::vector<uint32_t>>(static_cast<size_t>(num_tables()))};
    const size_t first = requests.size();
    int64_t bytes = 0;
    for (int t = 0; t < num_tables(); ++t) {
      // A key's bytes count too: with rows of one float they are two thirds
      // of a push (3 MiB of rows alone came with 6 MiB of keys, past gRPC's
      // 8 MiB message limit).
      const int64_t row_bytes =
          int64_t{dim(t)} * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(sizeof(uint64_t));
      for (uint32_t position : by_shard[shard][static_cast<size_t>(t)]) {
        if (bytes + row_bytes > kMaxRequestBytes && bytes > 0) {
          requests.push_back(request);
          for (auto& positions : request.positions) positions.clear();
          bytes = 0;
        }
        request.positions[static_cast<size_t>(t)].push_back(position);
        bytes += row_bytes;
      }
    }
    if (bytes > 0 || (every_shard && holds_buckets[shard] && requests.size() == first)) {
      requests.push_back(std::move(request));
    }
  }
  return requests;
}

absl::Status SparseClient::Send(ParameterTransport::Method method, const std::vector<Request>& requests,
                                std::vector<grpc::ByteBuffer> messages, absl::Duration timeout,
                                const std::function<absl::Status(size_t, const grpc::ByteBuffer&)>& answer) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<size_t> which(requests.size());
  for (size_t i = 0; i < which.size(); ++i) which[i] = i;
  BusyBackoff backoff;
  while (true) {
    std::vector<size_t> busy;
    absl::Status busy_error;
    RETURN_IF_ERROR(SendRound(method, requests, messages, which, deadline, answer, &busy, &busy_error));
    if (busy.empty()) return absl::OkStatus();
    if (!backoff.WaitBefore(deadline)) return BusyUntilTheDeadline(busy_error);
    which = std::move(busy);
  }
}

absl::Status SparseClient::SendRound(
    ParameterTransport::Method method, const std::vector<Request>& requests,
    const std::vector<grpc::ByteBuffer>& messages, const std::vector<size_t>& which, absl::Time deadline,
    const std::function<absl::Status(size_t, const grpc::ByteBuffer&)>& answer, std::vector<size_t>* busy,
    absl::Status* busy_error) {
  struct Call {
    size_t index = 0;
    std::unique_ptr<ParameterTransport::Call> call;
    grpc::ByteBuffer request;
    grpc::ByteBuffer response;
  };
  std::vector<Call> calls(which.size());
  Mutex mu;
  CondVar done_cv;
  size_t pending = calls.size();
  absl::Status first_error;
  for (size_t k = 0; k < calls.size(); ++k) {
    Call& call = calls[k];
    call.index = which[k];
    call.request = messages[call.index];  // shares the slices
    call.call = transport_->NewCall(requests[call.index].address, method);
  }
  for (size_t k = 0; k < calls.size(); ++k) {
    if (!calls_.Track(calls[k].call.get())) {
      for (size_t j = 0; j < k; ++j) calls_.Untrack(calls[j].call.get());
      return calls_.Outcome(absl::CancelledError(), map_.version());
    }
  }
  const absl::Duration timeout = std::max(deadline - absl::Now(), absl::ZeroDuration());
  for (Call& call : calls) {
    call.call->Start(
        &call.request, &call.response, timeout,
        [&, index = call.index, &response = call.response](grpc::Status status) {
          absl::Status result = calls_.Outcome(FromGrpcStatus(status), map_.version());
          // Pushes too: every replica applies a (partition, step, shard,
          // part) once, so one sent again is never applied twice.
          const bool refused_busy = IsServerBusy(result);
          if (result.ok()) result = answer(index, response);
          MutexLock lock(&mu);
          if (refused_busy) {
            busy->push_back(index);
            *busy_error = absl::Status(
                result.code(), absl::StrCat("server ", requests[index].address, ": ", result.message()));
          } else if (!result.ok() && first_error.ok()) {
            first_error = absl::Status(
                result.code(), absl::StrCat("server ", requests[index].address, ": ", result.message()));
          }
          if (--pending == 0) done_cv.SignalAll();
        });
  }
  {
    MutexLock lock(&mu);
    while (pending > 0) done_cv.Wait(&mu);
  }
  for (const Call& call : calls) calls_.Untrack(call.call.get());
  return first_error;
}

void SparseClient::Supersede() { calls_.Supersede(); }

absl::Status SparseClient::Pull(const std::vector<std::vector<uint64_t>>& keys, std::vector<std::vector<float>>* rows,
                                absl::Duration timeout) {
  return PullRows(keys, rows, std::nullopt, timeout);
}

absl::Status SparseClient::PullAtStep(const std::vector<std::vector<uint64_t>>& keys,
                                      std::vector<std::vector<float>>* rows, int64_t step, absl::Duration timeout) {
  return PullRows(keys, rows, step, timeout);
}

absl::Status SparseClient::PullRows(const std::vector<std::vector<uint64_t>>& keys,
                                    std::vector<std::vector<float>>* rows, std::optional<int64_t> step,
                                    absl::Duration timeout) {
  if (static_cast<int>(keys.size()) != num_tables()) {
    return absl::InvalidArgumentError(absl::StrCat("sparse pull of ", keys.size(), " tables; the job has ",
                                                   num_tables()));
  }
  rows->resize(keys.size());
  for (int t = 0; t < num_tables(); ++t) {
    (*rows)[static_cast<size_t>(t)].resize(keys[static_cast<size_t>(t)].size() * static_cast<size_t>(dim(t)));
  }
  const std::vector<Request> requests = Plan(keys, /*every_shard=*/false);
  std::vector<grpc::ByteBuffer> messages;
  for (const Request& request : requests) {
    v1::SparsePullRequest pull;
    pull.set_job_id(job_id_);
    pull.set_map_version(map_.version());
    if (step.has_value()) pull.set_step(*step);
    for (int t = 0; t < num_tables(); ++t) {
      const std::vector<uint32_t>& positions = request.positions[static_cast<size_t>(t)];
      if (positions.empty()) continue;
      v1::SparseKeys* table = pull.add_tables();
      table->set_table(t);
      table->set_keys(KeyBytes(keys[static_cast<size_t>(t)], positions));
    }
    messages.push_back(SerializeMessage(pull));
  }
  return Send(ParameterTransport::Method::kSparsePull, requests, std::move(messages), timeout,
              [&](size_t i, const grpc::ByteBuffer& bytes) {
                // The rows go from the received slices straight into place.
                v1::SparsePullResponse header;
                SparsePayloadReader answer;
                RETURN_IF_ERROR(answer.Parse(bytes, v1::SparsePullResponse::kTablesFieldNumber, &header));
                for (int part = 0; part < answer.chunks(); ++part) {
                  const int t = answer.chunk(part).table();
                  if (t < 0 || t >= num_tables()) return absl::InternalError("sparse pull answered another table");
                  const absl::Span<const uint32_t> positions = requests[i].positions[static_cast<size_t>(t)];
                  const size_t row_bytes = static_cast<size_t>(dim(t)) * sizeof(float);
                  if (static_cast<size_t>(answer.payload_size(part)) != positions.size() * row_bytes) {
                    return absl::InvalidArgumentError(absl::StrCat(
                        "rows of table ", t, ": payload has ", answer.payload_size(part), " bytes, expected ",
                        positions.size() * row_bytes, " (", positions.size() * static_cast<size_t>(dim(t)),
                        " float32 values)"));
                  }
                  float* out = (*rows)[static_cast<size_t>(t)].data();
                  answer.ForEachRows(part, row_bytes, [&](size_t first, const char* run, size_t n) {
                    ScatterFloatRows(run, positions.subspan(first, n), dim(t), out);
                  });
                }
                return absl::OkStatus();
              });
}

absl::Status SparseClient::Push(int32_t partition, int64_t step, const std::vector<std::vector<uint64_t>>& keys,
                                const std::vector<std::vector<float>>& grads, absl::Duration timeout) {
  if (static_cast<int>(keys.size()) != num_tables() || grads.size() != keys.size()) {
    return absl::InvalidArgumentError(absl::StrCat("sparse push of ", keys.size(), " tables; the job has ",
                                                   num_tables()));
  }
  for (int t = 0; t < num_tables(); ++t) {
    const size_t expected = keys[static_cast<size_t>(t)].size() * static_cast<size_t>(dim(t));
    if (grads[static_cast<size_t>(t)].size() != expected) {
      return absl::InvalidArgumentError(absl::StrCat("sparse push of ", grads[static_cast<size_t>(t)].size(),
                                                     " gradient values for table ", t, "; its keys take ", expected));
    }
  }
  const std::vector<Request> requests = Plan(keys, synchronous_);
  std::vector<grpc::ByteBuffer> messages;
  std::map<int32_t, int32_t> parts;  // requests by shard
  for (const Request& request : requests) ++parts[request.shard];
  std::map<int32_t, int32_t> sent;
  for (const Request& request : requests) {
    v1::SparsePushRequest push;
    push.set_shard(request.shard);
    push.set_part(sent[request.shard]++);
    push.set_parts(parts[request.shard]);
    push.set_job_id(job_id_);
    push.set_worker_id(worker_id_);
    push.set_partition(partition);
    push.set_step(step);
    push.set_map_version(map_.version());
    // Each table's gradients are gathered straight into a slice of their own.
    PayloadWriter writer(push, v1::SparsePushRequest::kTablesFieldNumber);
    for (int t = 0; t < num_tables(); ++t) {
      const std::vector<uint32_t>& positions = request.positions[static_cast<size_t>(t)];
      if (positions.empty()) continue;
      v1::SparseKeys table;
      table.set_table(t);
      table.set_keys(KeyBytes(keys[static_cast<size_t>(t)], positions));
      char* rows = nullptr;
      grpc::Slice slice = NewPayloadSlice(positions.size() * static_cast<size_t>(dim(t)) * sizeof(float), &rows);
      GatherFloatRows(grads[static_cast<size_t>(t)].data(), positions, dim(t), rows);
      writer.AddPart(table, {std::move(slice)});
    }
    messages.push_back(writer.Finish());
  }
  return Send(ParameterTransport::Method::kSparsePush, requests, std::move(messages), timeout,
              [](size_t, const grpc::ByteBuffer& bytes) {
                v1::SparsePushResponse response;
                return ParseMessage(bytes, &response);
              });
}

}  // namespace fulcrum
