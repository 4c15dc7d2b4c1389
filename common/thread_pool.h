// A fixed pool of threads running posted tasks in FIFO order (several at
// once, so tasks posted together may finish in any order). Stop() (and the
// destructor) runs what is queued, then joins.
#ifndef FULCRUM_COMMON_THREAD_POOL_H_
#define FULCRUM_COMMON_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/sync.h"

namespace fulcrum {

class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~ThreadPool() { Stop(); }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Post(std::function<void()> task) {
    MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }

  void Stop() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
  }

 private:
  void Run() {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); };
    while (true) {
      std::function<void()> task;
      {
        MutexLock lock(&mu_);
        mu_.Await(absl::Condition(&ready));
        if (tasks_.empty()) return;  // stopping, and nothing left
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_THREAD_POOL_H_
