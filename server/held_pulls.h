// Pulls that wait for their chunks (a BSP step not yet complete, an SSP
// bound not yet reached) are held here without a thread each: one thread
// re-checks them whenever a chunk changes (Poke) and at their deadlines, and
// a small pool completes the ones that became ready. So a server holds any
// number of waiting pulls (up to a bound) on a fixed number of threads, and a
// client that holds pulls it never lets complete costs memory, not threads.
// No gRPC here: a HeldPull is whatever the service makes of a call.
#ifndef FULCRUM_SERVER_HELD_PULLS_H_
#define FULCRUM_SERVER_HELD_PULLS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/sync.h"

namespace fulcrum {

// One waiting pull. Ready, deadline and cancelled are called on the
// checking thread; exactly one of Complete (once ready) or Fail ends it, on a
// pool thread or the checking thread. Implementations are thread-safe.
class HeldPull {
 public:
  virtual ~HeldPull() = default;
  // Whether every chunk it waits for is there (cheap: no encoding).
  virtual bool Ready() = 0;
  // Reads the chunks and answers the call.
  virtual void Complete() = 0;
  // Answers the call with `status` (deadline passed, cancelled, stopping).
  virtual void Fail(const absl::Status& status) = 0;
  virtual absl::Time deadline() const = 0;
  // The caller gave up (checked at every round).
  virtual bool cancelled() const = 0;
};

class HeldPulls {
 public:
  struct Options {
    int threads = 2;       // the pool completing ready pulls
    int max_held = 4096;   // beyond it Hold refuses
    // Longest a held pull goes unchecked without a Poke (a cancellation the
    // caller did not Poke about is noticed within it).
    absl::Duration recheck = absl::Milliseconds(100);
  };
  explicit HeldPulls(Options options);
  // Fails every held pull (UNAVAILABLE: the server is stopping).
  ~HeldPulls();

  // Holds `pull` until it is ready, cancelled or past its deadline.
  // RESOURCE_EXHAUSTED (and `pull` untouched) when max_held are held.
  absl::Status Hold(std::shared_ptr<HeldPull> pull);
  // Something changed (a chunk advanced, a job was dropped, a call was
  // cancelled): re-check the held pulls soon. Cheap; never blocks on them.
  void Poke();
  size_t held() const;

 private:
  void CheckLoop();
  void PoolLoop();

  const Options options_;
  mutable Mutex mu_;
  std::list<std::shared_ptr<HeldPull>> held_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<HeldPull>> ready_ ABSL_GUARDED_BY(mu_);  // for the pool
  bool poked_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread checker_;
  std::vector<std::thread> pool_;
};

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_HELD_PULLS_H_
