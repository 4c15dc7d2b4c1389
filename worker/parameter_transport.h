// How a ParameterClient's requests reach the parameter servers: serialized
// Push and Pull requests go out, serialized responses come back. The client
// does the encoding, routing, retries and cancellation; a transport only
// carries one call at a time. GrpcParameterTransport is the real one;
// InProcessTransport (worker/in_process_transport.h) hands the bytes to
// parameter services in the same process, so that the training loops are
// tested against the real parameter store without sockets.
#ifndef FULCRUM_WORKER_PARAMETER_TRANSPORT_H_
#define FULCRUM_WORKER_PARAMETER_TRANSPORT_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/sync.h"

namespace fulcrum {

class ParameterTransport {
 public:
  enum class Method { kPush, kPull, kSparsePull, kSparsePush };

  // One call: made by NewCall, started at most once. Cancel() may come from
  // any thread at any time; a call cancelled before it starts ends CANCELLED
  // as soon as it is started.
  class Call {
   public:
    virtual ~Call() = default;
    // Sends `request`; `done` runs exactly once, on any thread (possibly
    // before Start returns), after `*response` holds the answer. `request`
    // and `response` must outlive `done`; so must the call itself.
    virtual void Start(const grpc::ByteBuffer* request, grpc::ByteBuffer* response, absl::Duration timeout,
                       std::function<void(grpc::Status)> done) = 0;
    virtual void Cancel() = 0;
  };

  virtual ~ParameterTransport() = default;
  // A call of `method` to the server at `address`. Thread-safe.
  virtual std::unique_ptr<Call> NewCall(const std::string& address, Method method) = 0;
};

// The calls a client (ParameterClient, SparseClient) has in flight under one
// shard map, so that when the map is superseded (a failover) they are all
// cancelled at once instead of waiting out their deadline on a server that
// may be paused, and later ones are refused. Thread-safe.
class CallSet {
 public:
  // Registers a call before it starts; false once superseded (do not start
  // it).
  bool Track(ParameterTransport::Call* call) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets a call that is over. Never called while holding a lock the
  // call's callback takes.
  void Untrack(ParameterTransport::Call* call) ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels every call in flight and refuses later ones.
  void Supersede() ABSL_LOCKS_EXCLUDED(mu_);
  bool superseded() const ABSL_LOCKS_EXCLUDED(mu_);
  // ABORTED, which tells the caller to refresh its map, for a call that
  // ended CANCELLED because the map (of `map_version`) was superseded; else
  // `status` as it is.
  absl::Status Outcome(absl::Status status, int64_t map_version) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable Mutex mu_;
  std::set<ParameterTransport::Call*> calls_ ABSL_GUARDED_BY(mu_);
  bool superseded_ ABSL_GUARDED_BY(mu_) = false;
};

// Calls over gRPC, through a generic stub per address (one channel each, kept
// for the transport's life) so that tensor bytes never pass through protobuf
// messages.
class GrpcParameterTransport final : public ParameterTransport {
 public:
  std::unique_ptr<Call> NewCall(const std::string& address, Method method) override;

 private:
  Mutex mu_;
  std::map<std::string, std::unique_ptr<grpc::GenericStub>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fulcrum

#endif  // FULCRUM_WORKER_PARAMETER_TRANSPORT_H_
