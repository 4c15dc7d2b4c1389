// Calls of a "streamed unary" method (Push, Replicate, SparsePush,
// SparseReplicate) hold one of gRPC's sync threads from when they start,
// before their request has come. A caller that starts such calls and never
// sends their requests, without a deadline, would hold those threads for
// good, and with them every sync call of the server (ServerLimits in
// common/rpc.h bounds the threads). RequestWatch cancels a call whose
// request has not come within its wait: its handler's Read then ends, and
// the thread is free.
#ifndef FULCRUM_SERVER_REQUEST_WATCH_H_
#define FULCRUM_SERVER_REQUEST_WATCH_H_

#include <grpcpp/server_context.h>

#include <cstdint>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/sync.h"

namespace fulcrum {

class RequestWatch {
 public:
  // How long a request may take to come: 8 MiB (the largest message) at
  // well under a megabyte a second. Callers' deadlines for these calls are
  // shorter (10 s), so no caller that sends its request meets it.
  static constexpr absl::Duration kDefaultWait = absl::Seconds(30);

  RequestWatch();
  ~RequestWatch();
  RequestWatch(const RequestWatch&) = delete;
  RequestWatch& operator=(const RequestWatch&) = delete;

  // Sets how long requests may take from now on.
  void set_wait(absl::Duration wait) ABSL_LOCKS_EXCLUDED(mu_);
  // Requests cancelled so far, for metrics and tests.
  int64_t cancelled() const ABSL_LOCKS_EXCLUDED(mu_);

  // Watches `context`'s call until its Scope ends: cancelled if the Scope
  // is still alive when the wait is over. The context must outlive it.
  class Scope {
   public:
    Scope(RequestWatch* watch, grpc::ServerContext* context);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    RequestWatch* watch_;
    std::pair<absl::Duration, uint64_t> key_;  // (when its wait is over, on Steady(); serial)
  };

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // The steady clock's time: a wall clock set forward must not end waits.
  static absl::Duration Steady();

  mutable Mutex mu_;
  // By (when its wait is over, on Steady(); a serial number).
  std::map<std::pair<absl::Duration, uint64_t>, grpc::ServerContext*> watched_ ABSL_GUARDED_BY(mu_);
  absl::Duration wait_ ABSL_GUARDED_BY(mu_) = kDefaultWait;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool earlier_ ABSL_GUARDED_BY(mu_) = false;  // a call came whose wait ends first
  std::thread thread_;
};

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_REQUEST_WATCH_H_
