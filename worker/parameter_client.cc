#include "worker/parameter_client.h"

#include "absl/time/clock.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/payload_wire.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "common/sync.h"

namespace fulcrum {
namespace {

constexpr int kMaxAttempts = 5;

// Waits, holding `mu` only while waiting, until `finished()`. Once
// `failed()` (read under `mu`) says the outcome is decided while calls still
// run, calls `cancel()` without `mu` (a cancelled call's callback takes it)
// and then waits only for the cancelled calls to wind up.
template <typename Finished, typename Failed, typename Cancel>
void AwaitCalls(Mutex* mu, Finished finished, Failed failed, Cancel cancel) {
  auto settled = [&] { return finished() || failed(); };
  mu->Lock();
  mu->Await(absl::Condition(&settled));
  if (!finished()) {
    mu->Unlock();
    cancel();
    mu->Lock();
  }
  mu->Await(absl::Condition(&finished));
  mu->Unlock();
}

}  // namespace

std::vector<ParameterClient::Batch> ParameterClient::GroupByServer(const v1::ShardMap& map,
                                                                   const std::vector<int>& chunks, int element_bytes) {
  // The servers in address order, and each shard's (a server may lead
  // several shards): the chunks are grouped by an index, not by looking up
  // an address string for each chunk of every step.
  std::map<std::string, size_t> servers;
  for (const v1::ShardLocation& shard : map.shards()) servers.emplace(shard.address(), 0);
  std::vector<const std::string*> addresses;
  for (auto& [address, index] : servers) {
    index = addresses.size();
    addresses.push_back(&address);
  }
  std::vector<size_t> server_of_shard(static_cast<size_t>(map.shards_size()));
  for (int s = 0; s < map.shards_size(); ++s) server_of_shard[s] = servers.at(map.shards(s).address());
  std::vector<std::vector<int>> by_server(addresses.size());
  for (int chunk : chunks) by_server[server_of_shard[map.chunks(chunk).shard()]].push_back(chunk);
  std::vector<ParameterClient::Batch> batches;
  for (size_t server = 0; server < addresses.size(); ++server) {
    const std::vector<int>& indices = by_server[server];
    ParameterClient::Batch batch{*addresses[server], {}};
    int64_t bytes = 0;
    for (int chunk : indices) {
      const int64_t chunk_bytes = map.chunks(chunk).length() * element_bytes;
      if (!batch.chunks.empty() && bytes + chunk_bytes > ParameterClient::kMaxBatchBytes) {
        batches.push_back(batch);
        batch.chunks.clear();
        bytes = 0;
      }
      batch.chunks.push_back(chunk);
      bytes += chunk_bytes;
    }
    if (!batch.chunks.empty()) batches.push_back(batch);
  }
  return batches;
}

ParameterClient::ParameterClient(const v1::ShardMap& map, std::string job_id, std::string worker_id,
                                 std::function<bool()> superseded, v1::WireFormat format,
                                 ParameterTransport* transport)
    : map_(map),
      superseded_(std::move(superseded)),
      format_(format == v1::WIRE_FORMAT_UNSPECIFIED ? v1::WIRE_FP32 : format),
      job_id_(std::move(job_id)),
      worker_id_(std::move(worker_id)),
      own_transport_(transport == nullptr ? std::make_unique<GrpcParameterTransport>() : nullptr),
      transport_(transport == nullptr ? own_transport_.get() : transport) {
  const int element_bytes = std::max(1, WireBytes(format_));
  std::vector<int> all(map_.chunks_size());
  tensor_chunks_.resize(map_.tensors_size());
  for (int i = 0; i < map_.chunks_size(); ++i) {
    all[i] = i;
    const int tensor = map_.chunks(i).tensor();
    if (tensor >= 0 && tensor < map_.tensors_size()) tensor_chunks_[tensor].push_back(i);
    total_bytes_ += map_.chunks(i).length() * element_bytes;
  }
  // By offset: SettleLamb sums a tensor's norms in this order.
  for (std::vector<int>& chunks : tensor_chunks_) {
    std::sort(chunks.begin(), chunks.end(),
              [this](int a, int b) { return map_.chunks(a).offset() < map_.chunks(b).offset(); });
  }
  batches_ = GroupByServer(map_, all, element_bytes);
}

void ParameterClient::Supersede() {
  calls_.Supersede();
  if (also_supersede_) also_supersede_();
}

bool ParameterClient::superseded() const { return calls_.superseded(); }

bool ParameterClient::Track(ParameterTransport::Call* call) { return calls_.Track(call); }

void ParameterClient::Untrack(ParameterTransport::Call* call) { calls_.Untrack(call); }

absl::Status ParameterClient::Outcome(const grpc::Status& status, absl::string_view what) const {
  const absl::Status outcome = calls_.Outcome(FromGrpcStatus(status), map_.version());
  return absl::Status(outcome.code(), absl::StrCat(what, ": ", outcome.message()));
}

absl::Status ParameterClient::RunAll(const std::vector<grpc::ByteBuffer>& requests,
                                     const std::vector<std::string>& addresses,
                                     std::vector<grpc::ByteBuffer>* responses, bool pull,
                                     absl::Duration timeout, int first_attempt, absl::Status last,
                                     bool busy_first) {
  responses->assign(requests.size(), grpc::ByteBuffer());
  std::vector<size_t> todo(requests.size());
  for (size_t i = 0; i < todo.size(); ++i) todo[i] = i;
  // Waits `wait` unless a newer map is out meanwhile (false).
  // A busy server's backoff asks only whether this client was superseded:
  // superseded_ also hurries the worker's heartbeats, as after a failure.
  auto back_off = [this](absl::Duration wait, bool busy_server) {
    const absl::Time until = absl::Now() + wait;
    for (absl::Time now = absl::Now(); now < until; now = absl::Now()) {
      if (busy_server ? superseded() : superseded_ && superseded_()) return false;
      absl::SleepFor(std::min(until - now, absl::Milliseconds(10)));
    }
    return true;
  };
  // Rounds after UNAVAILABLE count as attempts; a round whose failures are
  // all busy servers' refusals (kServerBusy) does not, and is sent again
  // after a shorter backoff, within `timeout` from now. A refusal still
  // there at the deadline (or when a newer map is out) is answered as a
  // slow step (BusyUntilTheDeadline).
  const absl::Time deadline = absl::Now() + timeout;
  BusyBackoff busy_backoff;
  bool busy = busy_first;  // the last round's failures were all busy refusals
  auto give_up = [&] { return busy ? BusyUntilTheDeadline(last) : last; };
  for (int attempt = first_attempt; !todo.empty(); attempt += busy ? 0 : 1) {
    absl::Duration round_timeout = timeout;
    if (busy) {
      const absl::Duration wait = busy_backoff.Next();
      if (absl::Now() + wait >= deadline || !back_off(wait, /*busy_server=*/true)) return give_up();
      round_timeout = std::max(deadline - absl::Now(), absl::Milliseconds(1));
    } else if (attempt >= kMaxAttempts) {
      break;
    } else if (attempt > 0 && !back_off(absl::Milliseconds(100 << attempt), /*busy_server=*/false)) {
      return give_up();
    }
    std::vector<std::unique_ptr<ParameterTransport::Call>> calls;
    for (size_t i : todo) calls.push_back(NewCall(addresses[i], pull));
    std::vector<grpc::Status> results(todo.size());
    Mutex mu;
    size_t remaining = todo.size();
    std::optional<size_t> first_failure;  // by completion time
    for (const auto& call : calls) {
      if (!Track(call.get())) {
        for (const auto& tracked : calls) Untrack(tracked.get());
        return Outcome(grpc::Status(grpc::StatusCode::CANCELLED, ""), pull ? "pull" : "push");
      }
    }
    for (size_t k = 0; k < todo.size(); ++k) {
      size_t i = todo[k];
      auto done = [&, k](grpc::Status status) {
        MutexLock lock(&mu);
        results[k] = std::move(status);
        if (!results[k].ok() && !first_failure.has_value()) first_failure = k;
        --remaining;
      };
      calls[k]->Start(&requests[i], &(*responses)[i], round_timeout, done);
    }
    // A pull that waits for a version is held by its server until the step
    // is complete; once another part of the same pull has failed, the pull
    // cannot succeed, so the held parts are cancelled rather than waited out
    // (a dead server must not cost the deadline of its live peers). Pushes
    // run to the end: each is applied on its own.
    AwaitCalls(
        &mu, [&] { return remaining == 0; }, [&] { return pull && first_failure.has_value(); },
        [&] {
          for (const auto& call : calls) call->Cancel();
        });
    for (const auto& call : calls) Untrack(call.get());
    std::vector<size_t> retry;
    bool unavailable = false;
    for (size_t k = 0; k < todo.size(); ++k) {
      if (results[k].ok()) continue;
      const bool cancelled_here = pull && k != *first_failure && results[k].error_code() == grpc::StatusCode::CANCELLED;
      if (!cancelled_here || superseded()) {
        const bool refused_busy = IsServerBusy(FromGrpcStatus(results[k]));
        if (results[k].error_code() != grpc::StatusCode::UNAVAILABLE && !refused_busy) {
          return Outcome(results[k], absl::StrCat(pull ? "pull from " : "push to ", addresses[todo[k]]));
        }
        // A server away is the round's outcome rather than a busy one.
        if (!refused_busy || !unavailable) {
          last = Outcome(results[k], absl::StrCat(pull ? "pull from " : "push to ", addresses[todo[k]]));
        }
        unavailable = unavailable || !refused_busy;
      }
      retry.push_back(todo[k]);
    }
    busy = !retry.empty() && !unavailable;
    todo.swap(retry);
  }
  return todo.empty() ? absl::OkStatus() : give_up();
}

namespace {

// The wire's values are little-endian: on such a host, float32 and 16-bit
// buffers hold the wire bytes of WIRE_FP32 and the 16-bit formats.
constexpr bool kLittleEndian =
#if defined(ABSL_IS_BIG_ENDIAN)
    false;
#else
    true;
#endif

// Chunk payloads into and out of host buffers: float32 ones convert to and
// from the wire format, 16-bit ones (packed or unpacked on a device) are the
// wire values themselves.
absl::Status DecodeChunk(v1::WireFormat format, absl::string_view bytes, int64_t n, float* out,
                         absl::string_view what) {
  return DecodeValues(format, bytes, n, out, what);
}
absl::Status DecodeChunk(v1::WireFormat, absl::string_view bytes, int64_t n, uint16_t* out, absl::string_view what) {
  return DecodeHalves(bytes, n, out, what);
}
void EncodeChunk(v1::WireFormat format, const float* values, int64_t n, std::string* out) {
  EncodeValues(format, values, n, out);
}
void EncodeChunk(v1::WireFormat, const uint16_t* values, int64_t n, std::string* out) { EncodeHalves(values, n, out); }

// 16-bit host buffers need a 16-bit wire format.
template <typename T>
absl::Status CheckBufferType(v1::WireFormat format, const char* what) {
  if (std::is_same_v<T, uint16_t> && !IsHalfWire(format)) {
    return absl::FailedPreconditionError(absl::StrCat(what, " of 16-bit values, but the wire format is ",
                                                      WireFormatName(format)));
  }
  return absl::OkStatus();
}

// fp16 holds |x| <= 65504: a larger gradient would arrive as inf, which the
// servers refuse; say so here, naming the tensor, and send nothing of it.
// float32 values: 65520 and beyond round to inf.
absl::Status Fp16Overflow(const std::string& tensor, size_t i, float value) {
  if (std::fabs(value) < 65520.0f || !std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("gradient of ", tensor, " has ", value, " at element ", i,
                                                 ", beyond fp16's range (wireFormat WIRE_FP16): use WIRE_BF16 "
                                                 "or lower optimizer.lr"));
}
// Packed on a device: the overflow is already an infinity.
absl::Status Fp16Overflow(const std::string& tensor, size_t i, uint16_t value) {
  if ((value & 0x7FFF) != 0x7C00) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("gradient of ", tensor, " overflowed fp16 at element ", i,
                                                 " (|g| > 65504; wireFormat WIRE_FP16): use WIRE_BF16 or lower "
                                                 "optimizer.lr"));
}

template <typename T>
absl::Status CheckFp16Range(const v1::ShardMap& map, const std::vector<int>& tensors,
                            const std::vector<std::vector<T>>& grads) {
  for (int t : tensors) {
    for (size_t i = 0; i < grads[t].size(); ++i) RETURN_IF_ERROR(Fp16Overflow(map.tensors(t).name(), i, grads[t][i]));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParameterClient::Pull(int64_t min_version, absl::Duration timeout, std::vector<std::vector<float>>* params,
                                   Versions* versions, int64_t min_clock, bool exact) {
  return PullInto(min_version, timeout, params, versions, min_clock, exact);
}

absl::Status ParameterClient::Pull(int64_t min_version, absl::Duration timeout,
                                   std::vector<std::vector<uint16_t>>* params, Versions* versions, int64_t min_clock,
                                   bool exact) {
  return PullInto(min_version, timeout, params, versions, min_clock, exact);
}

template <typename T>
absl::Status ParameterClient::PushAll(int64_t seq, int32_t partition, int64_t step,
                                      const std::vector<std::vector<T>>& grads, absl::Duration timeout,
                                      int64_t examples, uint64_t examples_digest) {
  std::unique_ptr<PushStream> stream = StartPush(seq, partition, step, timeout, examples, examples_digest);
  std::vector<int> all(map_.tensors_size());
  for (int t = 0; t < map_.tensors_size(); ++t) all[t] = t;
  stream->Send(all, grads);
  return stream->Finish();
}

absl::Status ParameterClient::Push(int64_t seq, int32_t partition, int64_t step,
                                   const std::vector<std::vector<float>>& grads, absl::Duration timeout,
                                   int64_t examples, uint64_t examples_digest) {
  return PushAll(seq, partition, step, grads, timeout, examples, examples_digest);
}

absl::Status ParameterClient::Push(int64_t seq, int32_t partition, int64_t step,
                                   const std::vector<std::vector<uint16_t>>& grads, absl::Duration timeout,
                                   int64_t examples, uint64_t examples_digest) {
  return PushAll(seq, partition, step, grads, timeout, examples, examples_digest);
}

// --- PushStream ----------------------------------------------------------------

struct ParameterClient::PushStream::Call {
  grpc::ByteBuffer request;  // a PushRequest whose payloads are slices of their own
  grpc::ByteBuffer response;
  std::unique_ptr<ParameterTransport::Call> rpc;
  grpc::Status status;
  std::string address;
};

std::unique_ptr<ParameterClient::PushStream> ParameterClient::StartPush(int64_t seq, int32_t partition, int64_t step,
                                                                        absl::Duration timeout, int64_t examples,
                                                                        uint64_t examples_digest,
                                                                        SliceLoan* loan) {
  v1::PushRequest header;
  header.set_job_id(job_id_);
  header.set_map_version(map_.version());
  header.set_worker_id(worker_id_);
  header.set_partition(partition);
  header.set_seq(seq);
  header.set_step(step);
  header.set_examples(examples);
  header.set_examples_digest(examples_digest);
  return std::unique_ptr<PushStream>(new PushStream(this, std::move(header), timeout, loan));
}

ParameterClient::PushStream::PushStream(ParameterClient* client, v1::PushRequest header, absl::Duration timeout,
                                        SliceLoan* loan)
    : client_(client),
      header_(std::move(header)),
      timeout_(timeout),
      loan_(loan),
      sent_(client->map_.tensors_size(), false) {}

ParameterClient::PushStream::~PushStream() {
  {
    MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](int* n) { return *n == 0; }, &in_flight_));
  }
  for (const auto& call : calls_) client_->Untrack(call->rpc.get());
}

void ParameterClient::PushStream::Send(const std::vector<int>& tensors, const std::vector<std::vector<float>>& grads) {
  SendTensors(tensors, grads);
}

void ParameterClient::PushStream::Send(const std::vector<int>& tensors,
                                       const std::vector<std::vector<uint16_t>>& grads) {
  SendTensors(tensors, grads);
}

template <typename T>
void ParameterClient::PushStream::SendTensors(const std::vector<int>& tensors,
                                              const std::vector<std::vector<T>>& grads) {
  if (!error_.ok()) return;
  const v1::ShardMap& map = client_->map_;
  const v1::WireFormat format = client_->format_;
  error_ = CheckBufferType<T>(format, "push");
  std::vector<bool> sent = sent_;  // and this call's tensors, so one listed twice is caught
  for (int t : tensors) {
    if (!error_.ok()) break;
    if (t < 0 || t >= map.tensors_size() || sent[t] || static_cast<int64_t>(grads.size()) <= t ||
        static_cast<int64_t>(grads[t].size()) != map.tensors(t).size()) {
      error_ = absl::InternalError(absl::StrCat("push of seq ", header_.seq(), ": tensor ", t,
                                                " is out of range, sent twice or of the wrong size"));
      break;
    }
    sent[t] = true;
  }
  if (error_.ok() && format == v1::WIRE_FP16) error_ = CheckFp16Range(map, tensors, grads);
  if (!error_.ok()) return;
  sent_.swap(sent);
  std::vector<int> chunks;
  for (int t : tensors) {
    chunks.insert(chunks.end(), client_->tensor_chunks_[t].begin(), client_->tensor_chunks_[t].end());
  }
  // Payloads that are the buffers' bytes as they are go out as slices over them.
  const bool lend = loan_ != nullptr && kLittleEndian && client_->compressor_ == nullptr &&
                    (std::is_same_v<T, uint16_t> || format == v1::WIRE_FP32);
  // Batches of at most float32's bytes, or of what a compressor sends when
  // more (top-k above a ratio of 1/2).
  const int element_bytes = std::is_same_v<T, float> && client_->compressor_ != nullptr
                                ? std::max(WireBytes(format), client_->compressor_->WireBytesPerValue())
                                : WireBytes(format);
  for (const Batch& batch : GroupByServer(map, chunks, element_bytes)) {
    auto call = std::make_unique<Call>();
    call->address = batch.address;
    if (lend) {
      call->request = LentRequest(batch, grads);
    } else {
      absl::StatusOr<grpc::ByteBuffer> encoded = EncodedRequest(batch, grads);
      if (!encoded.ok()) {
        error_ = encoded.status();
        return;
      }
      call->request = *std::move(encoded);
    }
    StartCall(call.get());
    calls_.push_back(std::move(call));
  }
}

template <typename T>
grpc::ByteBuffer ParameterClient::PushStream::LentRequest(const Batch& batch,
                                                          const std::vector<std::vector<T>>& grads) {
  PayloadWriter writer(header_, v1::PushRequest::kChunksFieldNumber);
  for (int index : batch.chunks) {
    const v1::ChunkLocation& chunk = client_->map_.chunks(index);
    v1::ChunkData fields;
    fields.set_chunk_id(chunk.chunk_id());
    fields.set_format(client_->format_);
    const T* values = grads[chunk.tensor()].data() + chunk.offset();
    writer.AddPart(fields, {loan_->Lend(values, static_cast<size_t>(chunk.length()) * sizeof(T))});
  }
  return writer.Finish();
}

template <typename T>
absl::StatusOr<grpc::ByteBuffer> ParameterClient::PushStream::EncodedRequest(
    const Batch& batch, const std::vector<std::vector<T>>& grads) {
  v1::PushRequest request = header_;
  for (int index : batch.chunks) {
    const v1::ChunkLocation& chunk = client_->map_.chunks(index);
    v1::ChunkData* data = request.add_chunks();
    data->set_chunk_id(chunk.chunk_id());
    const T* values = grads[chunk.tensor()].data() + chunk.offset();
    if constexpr (std::is_same_v<T, float>) {
      if (GradientCompressor* compressor = client_->compressor_; compressor != nullptr) {
        data->set_format(compressor->format());
        RETURN_IF_ERROR(compressor->Encode(header_.partition(), chunk.tensor(), chunk.offset(), values,
                                           chunk.length(), data->mutable_data()));
        continue;
      }
    }
    data->set_format(client_->format_);
    EncodeChunk(client_->format_, values, chunk.length(), data->mutable_data());
  }
  return SerializeMovingPayloads(&request);  // the encoded bytes go to gRPC as they are
}

void ParameterClient::PushStream::StartCall(Call* call) {
  call->rpc = client_->NewCall(call->address, /*pull=*/false);
  if (!client_->Track(call->rpc.get())) {
    call->status = grpc::Status(grpc::StatusCode::CANCELLED, "the shard map changed");
    return;
  }
  {
    MutexLock lock(&mu_);
    ++in_flight_;
  }
  call->rpc->Start(&call->request, &call->response, timeout_,
                   [this, call](grpc::Status status) { Done(call, std::move(status)); });
}

void ParameterClient::PushStream::Done(Call* call, grpc::Status status) {
  MutexLock lock(&mu_);
  call->status = std::move(status);
  --in_flight_;
}

absl::Status ParameterClient::PushStream::Finish() {
  {
    MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](int* n) { return *n == 0; }, &in_flight_));
  }
  RETURN_IF_ERROR(error_);
  for (int t = 0; t < static_cast<int>(sent_.size()); ++t) {
    if (!sent_[t]) {
      return absl::FailedPreconditionError(absl::StrCat("push of seq ", header_.seq(), ": tensor ",
                                                        client_->map_.tensors(t).name(), " was never sent"));
    }
  }
  std::vector<grpc::ByteBuffer> retry;
  std::vector<std::string> addresses;
  absl::Status last;
  bool all_busy = true;
  for (const auto& call : calls_) {
    if (call->status.ok()) continue;
    const absl::Status outcome = client_->Outcome(call->status, absl::StrCat("push to ", call->address));
    // A server away or busy: RunAll sends the push again (each server
    // applies a seq once). A server away is the outcome over a busy one.
    const bool busy = IsServerBusy(FromGrpcStatus(call->status));
    if (call->status.error_code() != grpc::StatusCode::UNAVAILABLE && !busy) return outcome;
    if (!busy || all_busy) last = outcome;
    all_busy = all_busy && busy;
    retry.push_back(std::move(call->request));
    addresses.push_back(call->address);
  }
  if (retry.empty()) return absl::OkStatus();
  std::vector<grpc::ByteBuffer> responses;
  // Busy refusals only: sent again as RunAll sends busy ones (no attempt
  // spent, no hurry, DEADLINE_EXCEEDED at the end).
  return client_->RunAll(retry, addresses, &responses, /*pull=*/false, timeout_,
                         /*first_attempt=*/all_busy ? 0 : 1, last, /*busy_first=*/all_busy);
}

v1::PullRequest ParameterClient::MakePullRequest(const Batch& batch, int64_t min_version, int64_t min_clock,
                                                 bool exact) const {
  v1::PullRequest request;
  request.set_job_id(job_id_);
  request.set_min_version(min_version);
  request.set_map_version(map_.version());
  request.set_min_clock(min_clock);
  request.set_format(format_);
  request.set_exact_version(exact);
  for (int chunk : batch.chunks) request.add_chunk_ids(map_.chunks(chunk).chunk_id());
  return request;
}

template <typename T>
absl::Status ParameterClient::DecodePull(const Batch& batch, const grpc::ByteBuffer& buffer,
                                         std::vector<std::vector<T>>* params, Versions* seen) const {
  PayloadReader response;
  v1::PullResponse header;
  if (absl::Status parsed = response.Parse(buffer, v1::PullResponse::kChunksFieldNumber, &header); !parsed.ok()) {
    return absl::InternalError(absl::StrCat("pull from ", batch.address, ": ", parsed.message()));
  }
  if (response.chunks() != static_cast<int>(batch.chunks.size())) {
    return absl::InternalError(absl::StrCat("pull from ", batch.address, " returned ", response.chunks(),
                                            " chunks, asked for ", batch.chunks.size()));
  }
  std::string staged;  // payloads that need converting
  for (size_t c = 0; c < batch.chunks.size(); ++c) {
    const v1::ChunkLocation& chunk = map_.chunks(batch.chunks[c]);
    const v1::ChunkData& data = response.chunk(static_cast<int>(c));
    const v1::WireFormat got = data.format() == v1::WIRE_FORMAT_UNSPECIFIED ? v1::WIRE_FP32 : data.format();
    if (got != format_) {  // a server that ignores PullRequest.format
      return absl::InternalError(absl::StrCat("pull from ", batch.address, " returned chunk ", chunk.chunk_id(),
                                              " in ", WireFormatName(got), ", asked for ", WireFormatName(format_)));
    }
    if (data.chunk_id() != chunk.chunk_id()) {
      return absl::InternalError(absl::StrCat("pull from ", batch.address, " returned chunk ", data.chunk_id(),
                                              " where chunk ", chunk.chunk_id(), " was asked for"));
    }
    T* out = (*params)[chunk.tensor()].data() + chunk.offset();
    const int64_t size = response.payload_size(static_cast<int>(c));
    // The host's own layout (little-endian float32 from fp32, 16-bit values
    // into 16-bit buffers): straight from gRPC's buffers into place.
    const bool as_is = kLittleEndian && (std::is_same_v<T, uint16_t> || !IsHalfWire(format_));
    if (as_is && size == chunk.length() * static_cast<int64_t>(sizeof(T))) {
      response.CopyPayload(static_cast<int>(c), reinterpret_cast<char*>(out));
    } else {
      staged.resize(static_cast<size_t>(size));
      response.CopyPayload(static_cast<int>(c), staged.data());
      RETURN_IF_ERROR(DecodeChunk(format_, staged, chunk.length(), out, absl::StrCat("pulled chunk ", chunk.chunk_id())));
    }
    seen->min = std::min(seen->min, data.version());
    seen->max = std::max(seen->max, data.version());
    seen->clock = std::min(seen->clock, data.clock());
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status ParameterClient::PullInto(int64_t min_version, absl::Duration timeout,
                                       std::vector<std::vector<T>>* params, Versions* versions, int64_t min_clock,
                                       bool exact) {
  RETURN_IF_ERROR(CheckBufferType<T>(format_, "pull"));
  if (lamb_ && min_version > 0 && min_clock == 0) RETURN_IF_ERROR(SettleLamb(min_version - 1, timeout));
  std::vector<grpc::ByteBuffer> requests;
  std::vector<std::string> addresses;
  for (const Batch& batch : batches_) {
    requests.push_back(SerializeMessage(MakePullRequest(batch, min_version, min_clock, exact)));
    addresses.push_back(batch.address);
  }
  std::vector<grpc::ByteBuffer> responses;
  RETURN_IF_ERROR(RunAll(requests, addresses, &responses, /*pull=*/true, timeout));
  Versions seen{INT64_MAX, 0, INT64_MAX};
  for (size_t i = 0; i < batches_.size(); ++i) RETURN_IF_ERROR(DecodePull(batches_[i], responses[i], params, &seen));
  if (versions != nullptr) *versions = batches_.empty() ? Versions() : seen;
  return absl::OkStatus();
}

absl::Status ParameterClient::SettleLamb(int64_t step, absl::Duration timeout) {
  // Every chunk's norms of the step (or that it is settled).
  std::vector<grpc::ByteBuffer> requests;
  std::vector<std::string> addresses;
  for (const Batch& batch : batches_) {
    v1::PullRequest request = MakePullRequest(batch, 0, 0, /*exact=*/false);
    request.set_lamb_step(step);
    requests.push_back(SerializeMessage(request));
    addresses.push_back(batch.address);
  }
  std::vector<grpc::ByteBuffer> responses;
  RETURN_IF_ERROR(RunAll(requests, addresses, &responses, /*pull=*/true, timeout));
  std::vector<v1::ChunkData> seen(map_.chunks_size());
  for (size_t b = 0; b < batches_.size(); ++b) {
    v1::PullResponse response;
    RETURN_IF_ERROR(ParseMessage(responses[b], &response));
    const Batch& batch = batches_[b];
    if (response.chunks_size() != static_cast<int>(batch.chunks.size())) {
      return absl::InternalError(absl::StrCat("LAMB norms from ", batch.address, ": ", response.chunks_size(),
                                              " chunks for ", batch.chunks.size(), " asked"));
    }
    for (size_t k = 0; k < batch.chunks.size(); ++k) {
      const v1::ChunkData& chunk = response.chunks(static_cast<int>(k));
      if (chunk.chunk_id() != map_.chunks(batch.chunks[k]).chunk_id()) {
        return absl::InternalError(absl::StrCat("LAMB norms from ", batch.address, ": chunk ", chunk.chunk_id(),
                                                " where ", map_.chunks(batch.chunks[k]).chunk_id(), " was asked"));
      }
      seen[batch.chunks[k]] = chunk;
    }
  }
  // Per tensor whose chunks wait: the sums over its chunks by offset.
  v1::PushRequest norms;
  std::vector<int> waiting;
  for (size_t t = 0; t < tensor_chunks_.size(); ++t) {
    const std::vector<int>& chunks = tensor_chunks_[t];  // by offset
    bool settled = false;
    std::vector<int> wait;
    double weight_sq = 0, update_sq = 0;
    for (int c : chunks) {
      settled |= seen[c].lamb().settled();
      weight_sq += seen[c].lamb().weight_sq();
      update_sq += seen[c].lamb().update_sq();
      if (seen[c].version() == step) wait.push_back(c);
    }
    if (settled || wait.empty()) continue;
    v1::LambNorm* norm = norms.add_lamb_norms();
    norm->set_tensor(static_cast<int32_t>(t));
    norm->set_weight_sq(weight_sq);
    norm->set_update_sq(update_sq);
    waiting.insert(waiting.end(), wait.begin(), wait.end());
  }
  if (waiting.empty()) return absl::OkStatus();
  norms.set_job_id(job_id_);
  norms.set_worker_id(worker_id_);
  norms.set_step(step);
  norms.set_map_version(map_.version());
  requests.clear();
  addresses.clear();
  for (const Batch& batch : GroupByServer(map_, waiting, /*element_bytes=*/0)) {
    v1::PushRequest request = norms;
    for (int c : batch.chunks) request.add_chunks()->set_chunk_id(map_.chunks(c).chunk_id());
    requests.push_back(SerializeMessage(request));
    addresses.push_back(batch.address);
  }
  return RunAll(requests, addresses, &responses, /*pull=*/false, timeout);
}

// --- PullStream ----------------------------------------------------------------

struct ParameterClient::PullStream::Call {
  Batch batch;
  grpc::ByteBuffer request;   // a PullRequest
  grpc::ByteBuffer response;  // a PullResponse, read by DecodePull
  std::unique_ptr<ParameterTransport::Call> rpc;
  grpc::Status status;
};

template <typename T>
std::unique_ptr<ParameterClient::PullStream> ParameterClient::StartPullInto(int64_t min_version, absl::Duration timeout,
                                                                           std::vector<std::vector<T>>* params) {
  if (!CheckBufferType<T>(format_, "pull").ok()) return nullptr;
  return std::unique_ptr<PullStream>(
      new PullStream(this, min_version, timeout, [this, params](const Batch& batch, const grpc::ByteBuffer& response,
                                                                Versions* seen) {
        return DecodePull(batch, response, params, seen);
      }));
}

std::unique_ptr<ParameterClient::PullStream> ParameterClient::StartPull(int64_t min_version, absl::Duration timeout,
                                                                       std::vector<std::vector<float>>* params) {
  return StartPullInto(min_version, timeout, params);
}

std::unique_ptr<ParameterClient::PullStream> ParameterClient::StartPull(int64_t min_version, absl::Duration timeout,
                                                                       std::vector<std::vector<uint16_t>>* params) {
  return StartPullInto(min_version, timeout, params);
}

ParameterClient::PullStream::PullStream(ParameterClient* client, int64_t min_version, absl::Duration timeout,
                                        Decoder decode)
    : client_(client),
      min_version_(min_version),
      timeout_(timeout),
      deadline_(absl::Now() + timeout),
      decode_(std::move(decode)),
      fetched_(client->map_.tensors_size(), false) {}

ParameterClient::PullStream::~PullStream() {
  for (const auto& call : calls_) call->rpc->Cancel();
  {
    MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](int* n) { return *n == 0; }, &in_flight_));
  }
  for (const auto& call : calls_) client_->Untrack(call->rpc.get());
}

void ParameterClient::PullStream::Fetch(const std::vector<int>& tensors) {
  if (!error_.ok()) return;
  const v1::ShardMap& map = client_->map_;
  std::vector<int> chunks;
  std::vector<bool> fetched = fetched_;  // with this call's tensors
  for (int t : tensors) {
    if (t < 0 || t >= map.tensors_size() || fetched[t]) {
      error_ = absl::InternalError(absl::StrCat("prefetch of version ", min_version_, ": tensor ", t,
                                                " is out of range or fetched twice"));
      return;
    }
    fetched[t] = true;
  }
  fetched_.swap(fetched);
  for (int t : tensors) {
    chunks.insert(chunks.end(), client_->tensor_chunks_[t].begin(), client_->tensor_chunks_[t].end());
  }
  for (Batch& batch : GroupByServer(map, chunks, WireBytes(client_->format_))) {
    auto call = std::make_unique<Call>();
    call->request = SerializeMessage(client_->MakePullRequest(batch, min_version_, /*min_clock=*/0, /*exact=*/false));
    call->rpc = client_->NewCall(batch.address, /*pull=*/true);
    call->batch = std::move(batch);
    Call* raw = call.get();
    calls_.push_back(std::move(call));
    if (!client_->Track(raw->rpc.get())) {
      MutexLock lock(&mu_);
      raw->status = grpc::Status(grpc::StatusCode::CANCELLED, "the shard map changed");
      if (first_failure_ == nullptr) first_failure_ = raw;
      continue;
    }
    {
      MutexLock lock(&mu_);
      ++in_flight_;
    }
    raw->rpc->Start(&raw->request, &raw->response, timeout_,
                    [this, raw](grpc::Status status) { Done(raw, std::move(status)); });
  }
}

void ParameterClient::PullStream::Done(Call* call, grpc::Status status) {
  MutexLock lock(&mu_);
  call->status = std::move(status);
  if (!call->status.ok() && first_failure_ == nullptr) first_failure_ = call;
  --in_flight_;
}

absl::Status ParameterClient::PullStream::Finish(Versions* versions) {
  absl::Status incomplete = error_;
  for (int t = 0; incomplete.ok() && t < static_cast<int>(fetched_.size()); ++t) {
    if (!fetched_[t]) {
      incomplete = absl::FailedPreconditionError(absl::StrCat("prefetch of version ", min_version_, ": tensor ",
                                                              client_->map_.tensors(t).name(), " was never fetched"));
    }
  }
  // As in RunAll: once one part failed (or the stream is incomplete), the
  // held parts are cancelled.
  // (AwaitCalls calls the first two with mu_ held.)
  AwaitCalls(
      &mu_, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return in_flight_ == 0; },
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !incomplete.ok() || first_failure_ != nullptr; },
      [this] {
        for (const auto& call : calls_) call->rpc->Cancel();
      });
  Call* failed = nullptr;
  {
    MutexLock lock(&mu_);
    failed = first_failure_;
  }
  RETURN_IF_ERROR(incomplete);
  if (failed != nullptr && !IsServerBusy(FromGrpcStatus(failed->status))) {
    return client_->Outcome(failed->status, absl::StrCat("pull from ", failed->batch.address));
  }
  if (failed != nullptr) {
    // A busy server refused a part, and the parts held were cancelled: they
    // are sent again as RunAll sends them, within the stream's deadline.
    // Another failure is the answer.
    std::vector<Call*> again;
    std::vector<grpc::ByteBuffer> requests;
    std::vector<std::string> addresses;
    {
      MutexLock lock(&mu_);
      for (const auto& call : calls_) {
        if (call->status.ok()) continue;
        if (call->status.error_code() != grpc::StatusCode::CANCELLED &&
            !IsServerBusy(FromGrpcStatus(call->status))) {
          failed = call.get();
          break;
        }
        again.push_back(call.get());
        requests.push_back(call->request);
        addresses.push_back(call->batch.address);
      }
    }
    if (!IsServerBusy(FromGrpcStatus(failed->status))) {  // Outcome takes the client's lock: not under mu_
      return client_->Outcome(failed->status, absl::StrCat("pull from ", failed->batch.address));
    }
    std::vector<grpc::ByteBuffer> responses;
    RETURN_IF_ERROR(client_->RunAll(requests, addresses, &responses, /*pull=*/true,
                                    std::max(deadline_ - absl::Now(), absl::Milliseconds(1))));
    for (size_t i = 0; i < again.size(); ++i) again[i]->response = std::move(responses[i]);
  }
  Versions seen{INT64_MAX, 0, INT64_MAX};
  for (const auto& call : calls_) RETURN_IF_ERROR(decode_(call->batch, call->response, &seen));
  if (versions != nullptr) *versions = calls_.empty() ? Versions() : seen;
  return absl::OkStatus();
}

}  // namespace fulcrum
