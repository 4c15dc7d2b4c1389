#include "common/call_watch.h"

#include <grpc/support/alloc.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "common/logging.h"

namespace fulcrum {

CallWatch::CallWatch(std::string waiting_for, absl::Duration wait)
    : waiting_for_(std::move(waiting_for)), wait_(wait), thread_([this] { Run(); }) {}

CallWatch::~CallWatch() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void CallWatch::set_wait(absl::Duration wait) {
  MutexLock lock(&mu_);
  wait_ = wait;
}

int64_t CallWatch::cancelled() const {
  MutexLock lock(&mu_);
  return cancelled_;
}

void CallWatch::set_counter(prometheus::Counter* counter) {
  MutexLock lock(&mu_);
  counter_ = counter;
}

CallWatch::Scope::Scope(CallWatch* watch, grpc::ServerContextBase* context)
    : watch_(watch), call_(context->c_call()) {
  grpc_call_ref(call_);
  MutexLock lock(&watch_->mu_);
  key_ = {Steady() + watch_->wait_, watch_->next_++};
  watch_->watched_.emplace(key_, call_);
  if (key_.first < watch_->sleeping_until_) watch_->earlier_ = true;
}

CallWatch::Scope::~Scope() {
  {
    MutexLock lock(&watch_->mu_);
    watch_->watched_.erase(key_);
  }
  grpc_call_unref(call_);
}

absl::Duration CallWatch::Steady() {
  return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

void CallWatch::Run() {
  auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || earlier_; };
  while (true) {
    grpc_call* call = nullptr;
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      earlier_ = false;
      const absl::Duration now = Steady();
      if (watched_.empty() || watched_.begin()->first.first > now) {
        // Until the first wait is over, a call whose wait ends before it,
        // or a stop. Waits end on the steady clock; Mutex's timeout is the
        // wall clock's, so it wakes at least every second to look again
        // (a wall clock set back delays nothing more than that).
        sleeping_until_ = watched_.empty() ? absl::InfiniteDuration()
                                           : std::min(watched_.begin()->first.first, now + absl::Seconds(1));
        mu_.AwaitWithTimeout(absl::Condition(&woken), sleeping_until_ - now);
        sleeping_until_ = -absl::InfiniteDuration();
        continue;
      }
      // A reference of its own, taken while the Scope's holds the call:
      // cancelled outside the lock (a callback call's OnCancel may run on
      // this thread and take locks of its own).
      call = watched_.begin()->second;
      grpc_call_ref(call);
      watched_.erase(watched_.begin());
      ++cancelled_;
      if (counter_ != nullptr) counter_->Increment();
    }
    char* peer = grpc_call_get_peer(call);
    grpc_call_cancel_with_status(call, GRPC_STATUS_CANCELLED,
                                 "cancelled by the server: its peer kept it waiting", nullptr);
    grpc_call_unref(call);
    FLOG(WARNING) << "cancelled a call from " << peer << ": it waited past its wait for " << waiting_for_;
    gpr_free(peer);
  }
}

}  // namespace fulcrum
