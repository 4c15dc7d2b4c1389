#include "server/request_watch.h"

#include <chrono>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/logging.h"

namespace fulcrum {

RequestWatch::RequestWatch() : thread_([this] { Run(); }) {}

RequestWatch::~RequestWatch() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void RequestWatch::set_wait(absl::Duration wait) {
  MutexLock lock(&mu_);
  wait_ = wait;
}

int64_t RequestWatch::cancelled() const {
  MutexLock lock(&mu_);
  return cancelled_;
}

RequestWatch::Scope::Scope(RequestWatch* watch, grpc::ServerContext* context) : watch_(watch) {
  MutexLock lock(&watch_->mu_);
  key_ = {Steady() + watch_->wait_, watch_->next_++};
  watch_->watched_.emplace(key_, context);
  if (watch_->watched_.begin()->first == key_) watch_->earlier_ = true;
}

RequestWatch::Scope::~Scope() {
  // Under the lock that Run cancels under: once this returns, the context
  // is never touched again.
  MutexLock lock(&watch_->mu_);
  watch_->watched_.erase(key_);
}

absl::Duration RequestWatch::Steady() {
  return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

void RequestWatch::Run() {
  auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || earlier_; };
  std::vector<std::string> peers;  // of the calls cancelled, logged outside the lock
  while (true) {
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      earlier_ = false;
      const absl::Duration now = Steady();
      // Cancelled under the lock: a call's Scope ends under it, so its
      // context is alive here.
      while (!watched_.empty() && watched_.begin()->first.first <= now) {
        peers.push_back(watched_.begin()->second->peer());
        watched_.begin()->second->TryCancel();
        watched_.erase(watched_.begin());
        ++cancelled_;
      }
      if (peers.empty()) {
        // Until the first wait is over, a call whose wait ends before it,
        // or a stop (the steady clock's wait, not the wall clock's).
        const absl::Duration wait =
            watched_.empty() ? absl::InfiniteDuration() : watched_.begin()->first.first - now;
        mu_.AwaitWithTimeout(absl::Condition(&woken), wait);
      }
    }
    for (const std::string& peer : peers) {
      FLOG(WARNING) << "cancelled a call from " << peer << ": its request did not come within its wait";
    }
    peers.clear();
  }
}

}  // namespace fulcrum
