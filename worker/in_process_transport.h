// A ParameterTransport to parameter services in this process: a worker's
// requests reach ParameterServiceImpl (and so the real parameter store,
// deduplication, held pulls and fencing) as the same bytes gRPC would carry,
// without sockets. For tests of the training loops; a fault hook stands in
// for a network that fails calls or loses answers.
#ifndef FULCRUM_WORKER_IN_PROCESS_TRANSPORT_H_
#define FULCRUM_WORKER_IN_PROCESS_TRANSPORT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/sync.h"
#include "server/parameter_service.h"
#include "worker/parameter_transport.h"

namespace fulcrum {

// A copy of the bytes `buffer` holds.
std::string BufferBytes(const grpc::ByteBuffer& buffer);

class InProcessTransport final : public ParameterTransport {
 public:
  // Where a call is when the fault hook sees it.
  enum class Stage {
    kBeforeServer,  // the server has not seen the call
    kAfterServer,   // the server answered (a push is applied)
  };
  // Sees each call at both stages; a non-OK status ends the call with it
  // instead: before the server, the server never sees the call; after it,
  // the server's answer is lost (a connection that broke after a push was
  // applied).
  using Fault = std::function<absl::Status(const std::string& address, Method method, Stage stage)>;

  // Calls to `address` go to `service` (not owned; it outlives every call to
  // it); nullptr: no server there any more (UNAVAILABLE).
  void Serve(const std::string& address, ParameterServiceImpl* service);
  void set_fault(Fault fault);
  // Keeps a reference to the request of each call `keep` picks, as gRPC does
  // while a write is stuck on a paused peer, until TakeKept hands them over
  // with a copy of their bytes as the call started.
  struct Kept {
    grpc::ByteBuffer request;  // shares the caller's slices
    std::string sent;
  };
  void set_keep(std::function<bool(Method)> keep);
  std::vector<Kept> TakeKept();

  std::unique_ptr<Call> NewCall(const std::string& address, Method method) override;

 private:
  class InProcessCall;
  // The service at `address` (nullptr: none) and the fault hook.
  ParameterServiceImpl* Find(const std::string& address, Fault* fault);
  void MaybeKeep(Method method, const grpc::ByteBuffer& request);

  Mutex mu_;
  std::map<std::string, ParameterServiceImpl*> services_ ABSL_GUARDED_BY(mu_);
  Fault fault_ ABSL_GUARDED_BY(mu_);
  std::function<bool(Method)> keep_ ABSL_GUARDED_BY(mu_);
  std::vector<Kept> kept_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fulcrum

#endif  // FULCRUM_WORKER_IN_PROCESS_TRANSPORT_H_
