#include "worker/sparse_client.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
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

std::string RowBytes(const std::vector<float>& rows, const std::vector<uint32_t>& positions, int32_t dim) {
  std::vector<float> gathered(positions.size() * static_cast<size_t>(dim));
  for (size_t i = 0; i < positions.size(); ++i) {
    std::copy_n(rows.data() + static_cast<size_t>(positions[i]) * dim, dim, gathered.data() + i * dim);
  }
  std::string bytes;
  EncodeFloats(gathered.data(), static_cast<int64_t>(gathered.size()), &bytes);
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

std::vector<SparseClient::Request> SparseClient::Plan(const std::vector<std::vector<uint64_t>>& keys) const {
  // By server, then table: the positions of its keys, with their buckets.
  std::map<std::string, std::vector<std::vector<std::pair<int32_t, uint32_t>>>> by_server;
  for (int t = 0; t < num_tables(); ++t) {
    const v1::TableLayout& table = map_.tables(t);
    for (size_t i = 0; i < keys[static_cast<size_t>(t)].size(); ++i) {
      const int32_t bucket = BucketOf(keys[static_cast<size_t>(t)][i], table.buckets());
      const int32_t shard = table.bucket_shards(bucket);
      auto& tables = by_server[map_.shards(shard).address()];
      tables.resize(static_cast<size_t>(num_tables()));
      tables[static_cast<size_t>(t)].emplace_back(bucket, static_cast<uint32_t>(i));
    }
  }
  std::vector<Request> requests;
  for (auto& [address, tables] : by_server) {
    Request request{address, std::vector<std::vector<uint32_t>>(static_cast<size_t>(num_tables()))};
    int64_t bytes = 0;
    for (int t = 0; t < num_tables(); ++t) {
      auto& entries = tables[static_cast<size_t>(t)];
      std::sort(entries.begin(), entries.end());  // by bucket: runs the server reads in place
      const int64_t row_bytes = int64_t{dim(t)} * static_cast<int64_t>(sizeof(float));
      for (const auto& [bucket, position] : entries) {
        if (bytes + row_bytes > kMaxRequestBytes && bytes > 0) {
          requests.push_back(request);
          for (auto& positions : request.positions) positions.clear();
          bytes = 0;
        }
        request.positions[static_cast<size_t>(t)].push_back(position);
        bytes += row_bytes;
      }
    }
    if (bytes > 0) requests.push_back(std::move(request));
  }
  return requests;
}

absl::Status SparseClient::Send(ParameterTransport::Method method, const std::vector<Request>& requests,
                                const std::vector<std::string>& payloads, absl::Duration timeout,
                                const std::function<absl::Status(size_t, const grpc::ByteBuffer&)>& answer) {
  struct Call {
    std::unique_ptr<ParameterTransport::Call> call;
    grpc::ByteBuffer request;
    grpc::ByteBuffer response;
  };
  std::vector<Call> calls(requests.size());
  Mutex mu;
  CondVar done_cv;
  size_t pending = requests.size();
  absl::Status first_error;
  for (size_t i = 0; i < requests.size(); ++i) {
    Call& call = calls[i];
    call.request = grpc::ByteBuffer(std::vector<grpc::Slice>{grpc::Slice(payloads[i])}.data(), 1);
    call.call = transport_->NewCall(requests[i].address, method);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    Call& call = calls[i];
    call.call->Start(&call.request, &call.response, timeout, [&, i](grpc::Status status) {
      absl::Status result = FromGrpcStatus(status);
      if (result.ok()) result = answer(i, calls[i].response);
      MutexLock lock(&mu);
      if (!result.ok() && first_error.ok()) {
        first_error = absl::Status(result.code(), absl::StrCat("server ", requests[i].address, ": ", result.message()));
      }
      if (--pending == 0) done_cv.SignalAll();
    });
  }
  MutexLock lock(&mu);
  while (pending > 0) done_cv.Wait(&mu);
  return first_error;
}

absl::Status SparseClient::Pull(const std::vector<std::vector<uint64_t>>& keys, std::vector<std::vector<float>>* rows,
                                absl::Duration timeout) {
  if (static_cast<int>(keys.size()) != num_tables()) {
    return absl::InvalidArgumentError(absl::StrCat("sparse pull of ", keys.size(), " tables; the job has ",
                                                   num_tables()));
  }
  rows->resize(keys.size());
  for (int t = 0; t < num_tables(); ++t) {
    (*rows)[static_cast<size_t>(t)].resize(keys[static_cast<size_t>(t)].size() * static_cast<size_t>(dim(t)));
  }
  const std::vector<Request> requests = Plan(keys);
  std::vector<std::string> payloads;
  for (const Request& request : requests) {
    v1::SparsePullRequest pull;
    pull.set_job_id(job_id_);
    pull.set_map_version(map_.version());
    for (int t = 0; t < num_tables(); ++t) {
      const std::vector<uint32_t>& positions = request.positions[static_cast<size_t>(t)];
      if (positions.empty()) continue;
      v1::SparseKeys* table = pull.add_tables();
      table->set_table(t);
      table->set_keys(KeyBytes(keys[static_cast<size_t>(t)], positions));
    }
    payloads.push_back(pull.SerializeAsString());
  }
  return Send(ParameterTransport::Method::kSparsePull, requests, payloads, timeout,
              [&](size_t i, const grpc::ByteBuffer& bytes) {
                v1::SparsePullResponse response;
                RETURN_IF_ERROR(ParseMessage(bytes, &response));
                for (const v1::SparseKeys& answer : response.tables()) {
                  const int t = answer.table();
                  if (t < 0 || t >= num_tables()) return absl::InternalError("sparse pull answered another table");
                  const std::vector<uint32_t>& positions = requests[i].positions[static_cast<size_t>(t)];
                  const int32_t d = dim(t);
                  std::vector<float> values(positions.size() * static_cast<size_t>(d));
                  RETURN_IF_ERROR(DecodeFloats(answer.rows(), static_cast<int64_t>(values.size()), values.data(),
                                               absl::StrCat("rows of table ", t)));
                  float* out = (*rows)[static_cast<size_t>(t)].data();
                  for (size_t k = 0; k < positions.size(); ++k) {
                    std::copy_n(values.data() + k * d, d, out + static_cast<size_t>(positions[k]) * d);
                  }
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
  const std::vector<Request> requests = Plan(keys);
  std::vector<std::string> payloads;
  std::map<std::string, int32_t> parts;  // requests so far by server
  for (const Request& request : requests) {
    v1::SparsePushRequest push;
    push.set_part(parts[request.address]++);
    push.set_job_id(job_id_);
    push.set_worker_id(worker_id_);
    push.set_partition(partition);
    push.set_step(step);
    push.set_map_version(map_.version());
    for (int t = 0; t < num_tables(); ++t) {
      const std::vector<uint32_t>& positions = request.positions[static_cast<size_t>(t)];
      if (positions.empty()) continue;
      v1::SparseKeys* table = push.add_tables();
      table->set_table(t);
      table->set_keys(KeyBytes(keys[static_cast<size_t>(t)], positions));
      table->set_rows(RowBytes(grads[static_cast<size_t>(t)], positions, dim(t)));
    }
    payloads.push_back(push.SerializeAsString());
  }
  return Send(ParameterTransport::Method::kSparsePush, requests, payloads, timeout,
              [](size_t, const grpc::ByteBuffer& bytes) {
                v1::SparsePushResponse response;
                return ParseMessage(bytes, &response);
              });
}

}  // namespace fulcrum
