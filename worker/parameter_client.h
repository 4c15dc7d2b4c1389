// A worker's view of a job's parameters: pushes gradients to and pulls
// parameters from the servers named by the shard map. Requests to different
// servers (and batches of chunks up to kMaxBatchBytes) run in parallel;
// UNAVAILABLE is retried with backoff, which (worker, seq) deduplication on
// the servers makes safe for pushes. A push can also go out tensor by tensor
// while the backward pass still runs (PushStream).
#ifndef FULCRUM_WORKER_PARAMETER_CLIENT_H_
#define FULCRUM_WORKER_PARAMETER_CLIENT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/slice_loan.h"
#include "common/sync.h"
#include "fulcrum/v1/parameter.grpc.pb.h"
#include "fulcrum/v1/shard_map.pb.h"
#include "worker/gradient_compressor.h"
#include "worker/parameter_transport.h"

namespace fulcrum {

class ParameterClient {
 private:
  struct Batch {
    std::string address;
    std::vector<int> chunks;  // indices into map_.chunks()
  };

 public:
  // Payload bytes per request: below gRPC's 4 MiB default, so that any peer
  // with default limits could take them, and well below our 8 MiB limit.
  static constexpr int64_t kMaxBatchBytes = 3 << 20;

  // `superseded` (optional) says whether a newer shard map than `map` is
  // known: retries of UNAVAILABLE stop as soon as it is, so that a worker
  // moves to the new map at once rather than backing off on a dead server.
  // Pushes and pulls travel in `format` (a job's JobSpec.wire_format), by
  // `transport` (not owned; it outlives the client), or over gRPC when it is
  // nullptr.
  ParameterClient(const v1::ShardMap& map, std::string job_id, std::string worker_id,
                  std::function<bool()> superseded = nullptr, v1::WireFormat format = v1::WIRE_FP32,
                  ParameterTransport* transport = nullptr);

  // One buffer per tensor of the map, sized to the tensor.
  template <typename T = float>
  std::vector<std::vector<T>> MakeBuffers() const {
    std::vector<std::vector<T>> buffers;
    for (const auto& tensor : map_.tensors()) buffers.emplace_back(tensor.size(), T{});
    return buffers;
  }
  const std::string& tensor_name(int tensor) const { return map_.tensors(tensor).name(); }

  // The chunks' update counts seen by a pull.
  struct Versions {
    int64_t min = 0;
    int64_t max = 0;
    int64_t clock = 0;  // the slowest data partition's steps, over all chunks
  };

  // Fills `params` once every chunk has at least `min_version` updates.
  // DEADLINE_EXCEEDED after `timeout`; `params` is untouched on error. When
  // the request to one server fails, those its peers hold for the version
  // are cancelled (and retried with it if it was UNAVAILABLE) rather than
  // waited out.
  // float32 buffers take any wire format (16-bit values are widened);
  // 16-bit buffers get the raw values of a 16-bit format (for a device to
  // unpack; FAILED_PRECONDITION with a float32 format).
  // `exact` (BSP): the values at exactly `min_version`, also from chunks one
  // step past it (PullRequest.exact_version).
  //
  // LAMB (set_lamb): a pull of min_version v > 0 first settles step v - 1
  // (SettleLamb).
  absl::Status Pull(int64_t min_version, absl::Duration timeout, std::vector<std::vector<float>>* params,
                    Versions* versions = nullptr, int64_t min_clock = 0, bool exact = false);
  absl::Status Pull(int64_t min_version, absl::Duration timeout, std::vector<std::vector<uint16_t>>* params,
                    Versions* versions = nullptr, int64_t min_clock = 0, bool exact = false);

  // Sends `grads` (same layout as MakeBuffers), computed on data partition
  // `partition` at `step`, as this worker's push number `seq`.
  // `examples` and `examples_digest` describe the batch behind the gradient
  // (see ExampleDigest in common/data_partition.h); servers sum them as an audit.
  // float32 gradients are rounded to a 16-bit format here (fp16: a value
  // beyond its range is INVALID_ARGUMENT naming the tensor, nothing is
  // sent); 16-bit ones (packed on a device) are sent as they are, with a
  // 16-bit format only.
  absl::Status Push(int64_t seq, int32_t partition, int64_t step, const std::vector<std::vector<float>>& grads,
                    absl::Duration timeout, int64_t examples = 0, uint64_t examples_digest = 0);
  absl::Status Push(int64_t seq, int32_t partition, int64_t step, const std::vector<std::vector<uint16_t>>& grads,
                    absl::Duration timeout, int64_t examples = 0, uint64_t examples_digest = 0);

  // One push, sent in parts as its gradients become final: each Send()
  // encodes the chunks of the tensors it names and starts their requests
  // (one per server, split at kMaxBatchBytes) without waiting, so that they
  // travel while the caller computes the next layer's gradients. Finish()
  // waits for every request and retries those that met UNAVAILABLE or a
  // busy server, as Push does. Every request carries the push's (worker, seq), partition, step and
  // example audit: servers deduplicate and audit per chunk. The client must
  // outlive the stream; the destructor waits for requests in flight.
  //
  // With a `loan`, payloads that go out as the buffers hold them (float32
  // with WIRE_FP32 and no compression, or 16-bit values with a 16-bit
  // format, on a little-endian host) are not copied: gRPC is lent slices
  // over `grads` themselves. The caller must then not write those buffers
  // until loan->AwaitReturned says gRPC let go of them (at once after a
  // finished call, or never while a write to a paused peer is stuck), or
  // else give them to the loan with Abandon and use fresh ones.
  class PushStream {
   public:
    ~PushStream();
    PushStream(const PushStream&) = delete;
    PushStream& operator=(const PushStream&) = delete;

    // Sends `tensors` of `grads` (MakeBuffers layout; float32, or 16-bit
    // values with a 16-bit format, as Push takes). A tensor must be sent
    // once. Errors (a buffer of the wrong type, an fp16 overflow) are kept
    // for Finish, and the tensors concerned are not sent; tensors sent by
    // earlier calls are already on their way (servers apply each chunk once
    // per partition and step, and the step fails with the error).
    void Send(const std::vector<int>& tensors, const std::vector<std::vector<float>>& grads);
    void Send(const std::vector<int>& tensors, const std::vector<std::vector<uint16_t>>& grads);
    // Waits for every request; the first error, or FAILED_PRECONDITION if a
    // tensor of the map was never sent (a partial push). Call once.
    absl::Status Finish();

   private:
    friend class ParameterClient;
    struct Call;
    PushStream(ParameterClient* client, v1::PushRequest header, absl::Duration timeout, SliceLoan* loan);
    template <typename T>
    void SendTensors(const std::vector<int>& tensors, const std::vector<std::vector<T>>& grads);
    // A batch's request with its payloads lent from `grads` (loan_), or
    // encoded from them (the wire format, or the compressor).
    template <typename T>
    grpc::ByteBuffer LentRequest(const Batch& batch, const std::vector<std::vector<T>>& grads);
    template <typename T>
    absl::StatusOr<grpc::ByteBuffer> EncodedRequest(const Batch& batch, const std::vector<std::vector<T>>& grads);
    // Starts `call` (its address and request set) unless the map changed.
    void StartCall(Call* call);
    void Done(Call* call, grpc::Status status);

    ParameterClient* const client_;
    const v1::PushRequest header_;  // every field but the chunks
    const absl::Duration timeout_;
    SliceLoan* const loan_;         // null: payloads are copied
    std::vector<bool> sent_;        // by tensor
    absl::Status error_;            // the first Send error
    std::vector<std::unique_ptr<Call>> calls_;
    Mutex mu_;
    int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  };
  std::unique_ptr<PushStream> StartPush(int64_t seq, int32_t partition, int64_t step, absl::Duration timeout,
                                        int64_t examples = 0, uint64_t examples_digest = 0,
                                        SliceLoan* loan = nullptr);

  // A pull issued in parts before its values are due (BSP prefetch): each
  // Fetch() starts, without waiting, the requests for the chunks of the
  // tensors it names, asking for at least `min_version` updates (servers
  // hold each request until its chunks get there, or the deadline), so the
  // caller can issue the pull of a layer for the next step as soon as it has
  // pushed that layer, while the layers below are still being computed.
  // Finish() waits for every request and decodes the values into `params`
  // (the buffers StartPull was given, MakeBuffers layout; the caller must not
  // touch them meanwhile). Nothing is retried: a prefetch that met an error
  // reports it and the caller pulls again the ordinary way. The destructor
  // cancels requests still in flight and waits for them.
  class PullStream {
   public:
    ~PullStream();
    PullStream(const PullStream&) = delete;
    PullStream& operator=(const PullStream&) = delete;

    // Starts the requests for `tensors` (each at most once over the stream).
    void Fetch(const std::vector<int>& tensors);
    // Waits for every request. OK once every tensor of the map was fetched
    // and decoded (*versions as Pull reports them); else the first error
    // (FAILED_PRECONDITION for a tensor never fetched, INTERNAL for one
    // fetched twice, or the first request to fail: the others, which servers
    // may be holding for the version, are then cancelled, not waited out),
    // and `params` may hold part of the values. Requests a busy server
    // refused are sent again as RunAll sends them, with those cancelled,
    // until `timeout` from the stream's start.
    absl::Status Finish(Versions* versions);

   private:
    friend class ParameterClient;
    struct Call;
    using Decoder = std::function<absl::Status(const Batch&, const grpc::ByteBuffer&, Versions*)>;
    PullStream(ParameterClient* client, int64_t min_version, absl::Duration timeout, Decoder decode);
    void Done(Call* call, grpc::Status status);

    ParameterClient* const client_;
    const int64_t min_version_;
    const absl::Duration timeout_;
    const absl::Time deadline_;  // of requests sent again (timeout_ from the stream's start)
    const Decoder decode_;
    std::vector<bool> fetched_;  // by tensor
    absl::Status error_;         // a tensor fetched twice or out of range
    std::vector<std::unique_ptr<Call>> calls_;
    Mutex mu_;
    int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
    Call* first_failure_ ABSL_GUARDED_BY(mu_) = nullptr;  // the first call to fail
  };
  // `params`: float32 buffers (any format), or 16-bit ones with a 16-bit
  // format; nullptr (FAILED_PRECONDITION from CheckBufferType) otherwise.
  std::unique_ptr<PullStream> StartPull(int64_t min_version, absl::Duration timeout,
                                        std::vector<std::vector<float>>* params);
  std::unique_ptr<PullStream> StartPull(int64_t min_version, absl::Duration timeout,
                                        std::vector<std::vector<uint16_t>>* params);

  // LAMB (OptimizerSpec.LAMB, BSP): each chunk applies a step only once it
  // has its tensor's norms (v1::LambPartial). SettleLamb asks every chunk
  // for its squared norms of `step` (servers hold the request until the
  // chunk has every partition's gradient of it: DEADLINE_EXCEEDED after
  // `timeout`, as a pull), sums them per tensor in chunk order (offsets
  // ascending), and pushes the sums to the chunks that wait for them. Any
  // worker may do it, and each computes the same sums: chunks that applied
  // the step already take them as duplicates. OK at once when no chunk
  // waits.
  absl::Status SettleLamb(int64_t step, absl::Duration timeout);
  void set_lamb(bool lamb) { lamb_ = lamb; }
  bool lamb() const { return lamb_; }
  // The shard map this client routes by is superseded (a failover moved a
  // shard): cancels every request in flight (one held by a stopped server
  // would otherwise run to its deadline) and makes later ones fail at once.
  // Those requests end ABORTED, which tells the caller to refresh its map.
  // Thread-safe; may be called from any thread while the client is used.
  void Supersede();
  bool superseded() const;
  // Supersede calls `also` too (a job's SparseClient, routing by the same
  // map). Set before the client is shared.
  void set_also_supersede(std::function<void()> also) { also_supersede_ = std::move(also); }

  // Payload bytes of one whole push or pull in the wire format.
  int64_t total_bytes() const { return total_bytes_; }
  int64_t map_version() const { return map_.version(); }
  v1::WireFormat format() const { return format_; }
  // Float32 gradients are pushed compressed by `compressor` (JobSpec
  // .compression; nullptr: as `format`). Not owned; it outlives the client
  // (its residuals outlive clients replaced with the shard map).
  void set_compressor(GradientCompressor* compressor) { compressor_ = compressor; }

 private:
  // Chunks (indices into map.chunks()) grouped by the server leading them,
  // in batches of at most kMaxBatchBytes of payload (or one bigger chunk).
  static std::vector<Batch> GroupByServer(const v1::ShardMap& map, const std::vector<int>& chunks,
                                          int element_bytes);
  // Push of every tensor: one PushStream.
  template <typename T>
  absl::Status PushAll(int64_t seq, int32_t partition, int64_t step, const std::vector<std::vector<T>>& grads,
                       absl::Duration timeout, int64_t examples, uint64_t examples_digest);
  v1::PullRequest MakePullRequest(const Batch& batch, int64_t min_version, int64_t min_clock, bool exact) const;
  // Decodes a pull response for `batch` into `params`; widens *seen to
  // cover its chunks' versions and clocks.
  // The response's chunk payloads are copied from gRPC's buffers straight
  // into `params` (see common/payload_wire.h).
  template <typename T>
  absl::Status DecodePull(const Batch& batch, const grpc::ByteBuffer& response, std::vector<std::vector<T>>* params,
                          Versions* seen) const;
  template <typename T>
  std::unique_ptr<PullStream> StartPullInto(int64_t min_version, absl::Duration timeout,
                                            std::vector<std::vector<T>>* params);
  template <typename T>
  absl::Status PullInto(int64_t min_version, absl::Duration timeout, std::vector<std::vector<T>>* params,
                        Versions* versions, int64_t min_clock, bool exact);
  // Runs `requests` (serialized PushRequests, or PullRequests if `pull`;
  // request i to addresses[i]) in parallel, retrying those that meet
  // UNAVAILABLE with backoff; attempts start at `first_attempt` (1: the
  // requests already failed once, with `last`). Those a busy server refused
  // (IsServerBusy) are sent again after a shorter backoff (BusyBackoff)
  // until `timeout` from the start, without counting as attempts;
  // `busy_first`: the requests were all refused so already, with `last`.
  absl::Status RunAll(const std::vector<grpc::ByteBuffer>& requests,
                      const std::vector<std::string>& addresses, std::vector<grpc::ByteBuffer>* responses,
                      bool pull, absl::Duration timeout, int first_attempt = 0,
                      absl::Status last = absl::OkStatus(), bool busy_first = false);
  // A Push (or Pull) call of serialized messages to `address`.
  std::unique_ptr<ParameterTransport::Call> NewCall(const std::string& address, bool pull) {
    return transport_->NewCall(address, pull ? ParameterTransport::Method::kPull : ParameterTransport::Method::kPush);
  }
  // Calls are registered before they start (false: superseded, do not
  // start) and their owners release them once the calls are over, never
  // while holding a lock a call's callback takes.
  bool Track(ParameterTransport::Call* call);
  void Untrack(ParameterTransport::Call* call);
  // ABORTED for a call that ended CANCELLED because the map was superseded;
  // else `status` as it is.
  absl::Status Outcome(const grpc::Status& status, absl::string_view what) const;

  const v1::ShardMap map_;
  CallSet calls_;  // in flight
  std::function<void()> also_supersede_;
  const std::function<bool()> superseded_;
  const v1::WireFormat format_;
  GradientCompressor* compressor_ = nullptr;
  const std::string job_id_;
  const std::string worker_id_;
  std::vector<Batch> batches_;               // every chunk: by server, split at kMaxBatchBytes
  std::vector<std::vector<int>> tensor_chunks_;  // indices into map_.chunks() by tensor, by offset
  bool lamb_ = false;
  std::unique_ptr<ParameterTransport> own_transport_;  // gRPC, when none was given
  ParameterTransport* const transport_;
  int64_t total_bytes_ = 0;
};

}  // namespace fulcrum

#endif  // FULCRUM_WORKER_PARAMETER_CLIENT_H_
