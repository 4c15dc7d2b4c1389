// How a ParameterClient's requests reach the parameter servers: serialized
// Push and Pull requests go out, serialized responses come back. The client
// does the encoding, routing, retries and cancellation; a transport only
// carries one call at a time. GrpcParameterTransport is the real one;
// InProcessTransport (worker/in_process_transport.h) hands the bytes to
// parameter services in the same process, so that the training loops are
// tested against the real parameter store without sockets.
#ifndef FULCRUM_WORKER_PARAMETER_TRANSPORT_H_
#define FULCRUM_WORKER_PARAMETER_TRANSPORT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include "absl/base/thread_annotations.h"
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
