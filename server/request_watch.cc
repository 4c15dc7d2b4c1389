#include "server/request_watch.h"

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
  key_ = {absl::Now() + watch_->wait_, watch_->next_++};
  watch_->watched_.emplace(key_, context);
  if (watch_->watched_.begin()->first == key_) watch_->earlier_ = true;
}

RequestWatch::Scope::~Scope() {
  // Under the lock that Run cancels under: once this returns, the context
  // is never touched again.
  MutexLock lock(&watch_->mu_);
  watch_->watched_.erase(key_);
}

void RequestWatch::Run() {
  MutexLock lock(&mu_);
  auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || earlier_; };
  while (!stopping_) {
    earlier_ = false;
    const absl::Time now = absl::Now();
    while (!watched_.empty() && watched_.begin()->first.first <= now) {
      FLOG(WARNING) << "cancelled a call from " << watched_.begin()->second->peer()
                    << ": its request did not come within its wait";
      watched_.begin()->second->TryCancel();
      watched_.erase(watched_.begin());
      ++cancelled_;
    }
    // Until the first wait is over, a call whose wait ends before it, or a
    // stop.
    const absl::Time next = watched_.empty() ? absl::InfiniteFuture() : watched_.begin()->first.first;
    mu_.AwaitWithDeadline(absl::Condition(&woken), next);
  }
}

}  // namespace fulcrum
