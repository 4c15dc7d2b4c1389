// A call that waits on its peer holds the server's resources meanwhile:
// a "streamed unary" method (Push, Replicate, SparsePush, SparseReplicate)
// holds one of gRPC's sync threads from when it starts, before its request
// has come; an answer that its caller does not read holds a sync call's
// thread, or a pull's bytes, until the caller's deadline, which it need not
// set (a caller that announces a one-byte HTTP/2 window reads nothing); a
// WatchJob update that its watcher does not read holds a thread and one of
// the scheduler's waiting places. A CallWatch cancels a call whose Scope is
// still alive when its wait is over: the Read or Write the call waits in
// ends (a callback call is done), and what it held is free. Each use has a
// watch of its own and its wait.
#ifndef FULCRUM_COMMON_CALL_WATCH_H_
#define FULCRUM_COMMON_CALL_WATCH_H_

#include <grpc/grpc.h>
#include <grpcpp/server_context.h>
#include <prometheus/counter.h>

#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/sync.h"

namespace fulcrum {

class CallWatch {
 public:
  // How long a request may take to come by default: 8 MiB (the largest
  // message) at well under a megabyte a second. Fulcrum's callers of the
  // streamed methods set deadlines of 10 s, so none of them meets it.
  static constexpr absl::Duration kDefaultWait = absl::Seconds(30);
  // How long an answer may take to be sent by default: it may queue behind
  // the server's other answers (up to 1 GiB of pulls in flight, 86 s at
  // 100 Mbit/s), so longer than a request.
  static constexpr absl::Duration kDefaultAnswerWait = absl::Minutes(2);

  // `waiting_for` ends the log line of a cancelled call: "its request to
  // come", for example.
  explicit CallWatch(std::string waiting_for, absl::Duration wait = kDefaultWait);
  ~CallWatch();
  CallWatch(const CallWatch&) = delete;
  CallWatch& operator=(const CallWatch&) = delete;

  // Sets how long calls may wait from now on.
  void set_wait(absl::Duration wait) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls cancelled so far, for tests.
  int64_t cancelled() const ABSL_LOCKS_EXCLUDED(mu_);
  // A counter to count each cancelled call in too (it must outlive the
  // watch), for /metrics.
  void set_counter(prometheus::Counter* counter) ABSL_LOCKS_EXCLUDED(mu_);

  // Watches `context`'s call until the Scope ends: cancelled if the Scope
  // is still alive when the wait is over. The Scope holds a reference to
  // the call's core object, so it may outlive the context (as an
  // interceptor, which the context destroys, does).
  class Scope {
   public:
    Scope(CallWatch* watch, grpc::ServerContextBase* context);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CallWatch* watch_;
    grpc_call* call_;
    std::pair<absl::Duration, uint64_t> key_;  // (when its wait is over, on Steady(); serial)
  };

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // The steady clock's time: a wall clock set forward must not end waits.
  static absl::Duration Steady();

  const std::string waiting_for_;
  mutable Mutex mu_;
  // By (when its wait is over, on Steady(); a serial number); each holds a
  // reference of its Scope's.
  std::map<std::pair<absl::Duration, uint64_t>, grpc_call*> watched_ ABSL_GUARDED_BY(mu_);
  absl::Duration wait_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  prometheus::Counter* counter_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // When Run wakes next (at the latest): a call whose wait ends before it
  // wakes it (earlier_).
  absl::Duration sleeping_until_ ABSL_GUARDED_BY(mu_) = -absl::InfiniteDuration();
  bool earlier_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_CALL_WATCH_H_
