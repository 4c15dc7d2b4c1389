#include "server/held_pulls.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc.h"
#include "common/sync.h"

namespace fulcrum {

HeldPulls::HeldPulls(Options options) : options_(options) {
  checker_ = std::thread([this] { CheckLoop(); });
  for (int i = 0; i < std::max(1, options_.threads); ++i) pool_.emplace_back([this] { PoolLoop(); });
}

HeldPulls::~HeldPulls() {
  std::list<std::shared_ptr<HeldPull>> held;
  std::deque<std::shared_ptr<HeldPull>> ready;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    held.swap(held_);
    ready.swap(ready_);
  }
  checker_.join();
  for (std::thread& thread : pool_) thread.join();
  const absl::Status stopping = absl::UnavailableError("the server is stopping");
  for (auto& pull : held) pull->Fail(stopping);
  for (auto& pull : ready) pull->Fail(stopping);
}

absl::Status HeldPulls::Hold(std::shared_ptr<HeldPull> pull) {
  MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the server is stopping");
  if (static_cast<int>(held_.size()) >= options_.max_held) {
    return absl::ResourceExhaustedError(absl::StrCat(kServerBusy, ": this server already holds ",
                                                     held_.size(),
                                                     " waiting pulls (its bound): send it again later"));
  }
  held_.push_back(std::move(pull));
  poked_ = true;  // it may have become ready meanwhile
  return absl::OkStatus();
}

void HeldPulls::Poke() {
  MutexLock lock(&mu_);
  poked_ = true;
}

size_t HeldPulls::held() const {
  MutexLock lock(&mu_);
  return held_.size();
}

void HeldPulls::CheckLoop() {
  auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return poked_ || stopping_; };
  while (true) {
    std::vector<std::shared_ptr<HeldPull>> pulls;
    {
      MutexLock lock(&mu_);
      absl::Time wake = absl::Now() + options_.recheck;
      for (const auto& pull : held_) wake = std::min(wake, pull->deadline());
      mu_.AwaitWithDeadline(absl::Condition(&woken), wake);
      if (stopping_) return;
      poked_ = false;
      pulls.assign(held_.begin(), held_.end());
    }
    // Decide outside the lock (Ready takes the chunks' locks), then move the
    // decided ones out of held_.
    const absl::Time now = absl::Now();
    std::vector<std::shared_ptr<HeldPull>> done, failed_deadline, failed_cancel;
    for (auto& pull : pulls) {
      if (pull->cancelled()) {
        failed_cancel.push_back(pull);
      } else if (pull->Ready()) {
        done.push_back(pull);
      } else if (now >= pull->deadline()) {
        failed_deadline.push_back(pull);
      }
    }
    if (done.empty() && failed_deadline.empty() && failed_cancel.empty()) continue;
    {
      MutexLock lock(&mu_);
      auto leaving = [&](const std::shared_ptr<HeldPull>& pull) {
        for (auto* group : {&done, &failed_deadline, &failed_cancel}) {
          if (std::find(group->begin(), group->end(), pull) != group->end()) return true;
        }
        return false;
      };
      held_.remove_if(leaving);
      ready_.insert(ready_.end(), done.begin(), done.end());
    }
    for (auto& pull : failed_cancel) pull->Fail(absl::CancelledError("the caller cancelled the pull"));
    for (auto& pull : failed_deadline) {
      pull->Fail(absl::DeadlineExceededError("the chunks did not reach the version the pull waits for in time "
                                             "(a worker is missing?)"));
    }
  }
}

void HeldPulls::PoolLoop() {
  auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !ready_.empty() || stopping_; };
  while (true) {
    std::shared_ptr<HeldPull> pull;
    {
      MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&work));
      if (stopping_) return;
      pull = std::move(ready_.front());
      ready_.pop_front();
    }
    pull->Complete();
  }
}

}  // namespace fulcrum
