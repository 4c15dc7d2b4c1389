// Work done ahead on a thread of its own: the result for a key (a data
// partition and a step) that a loop will most likely ask for next, made while
// the loop does the rest of its current step. A click run makes its next
// batch this way while a step pulls, computes and pushes (a batch depends on
// the data and its (partition, step) only, never on the parameters).
#ifndef FULCRUM_WORKER_WORK_AHEAD_H_
#define FULCRUM_WORKER_WORK_AHEAD_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/data_partition.h"
#include "common/sync.h"

namespace fulcrum {

// Every result is made on the owned thread, so what making one touches (a
// generator's cache, an index's reads) is never shared between threads. A
// guess that proves wrong costs one result made for nothing. Start and Take
// come from one thread; the destructor waits for a result being made.
template <typename T>
class WorkAhead {
 public:
  using Make = std::function<absl::StatusOr<T>(int32_t partition, int64_t step, ExampleAudit* audit)>;
  explicit WorkAhead(Make make) : make_(std::move(make)), thread_([this] { Loop(); }) {}
  ~WorkAhead() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  WorkAhead(const WorkAhead&) = delete;
  WorkAhead& operator=(const WorkAhead&) = delete;

  // Makes (partition, step)'s result next, instead of one asked for before
  // and not begun.
  void Start(int32_t partition, int64_t step) {
    MutexLock lock(&mu_);
    wanted_ = Key{partition, step};
  }
  // The result of (partition, step) (a status as `make` returned it) and
  // its audit: the one made ahead, or made now.
  absl::StatusOr<T> Take(int32_t partition, int64_t step, ExampleAudit* audit) {
    MutexLock lock(&mu_);
    taking_ = Key{partition, step};
    if (!Made()) wanted_ = taking_;
    mu_.Await(absl::Condition(this, &WorkAhead::Made));
    absl::StatusOr<T> result = std::move(made_->result);
    *audit = made_->audit;
    made_.reset();
    if (wanted_ == taking_) wanted_.reset();
    return result;
  }
  // How many results were made, taken or not.
  int64_t made() const {
    MutexLock lock(&mu_);
    return made_count_;
  }

 private:
  struct Key {
    int32_t partition = 0;
    int64_t step = 0;
    bool operator==(const Key& other) const { return partition == other.partition && step == other.step; }
  };
  struct Result {
    Key key;
    ExampleAudit audit;
    absl::StatusOr<T> result;
  };
  bool Made() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return made_.has_value() && made_->key == taking_; }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || (wanted_.has_value() && !(made_.has_value() && made_->key == *wanted_));
  }
  void Loop() {
    while (true) {
      Result result;
      {
        MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &WorkAhead::HasWork));
        if (stop_) return;
        result.key = *wanted_;
      }
      result.result = make_(result.key.partition, result.key.step, &result.audit);
      MutexLock lock(&mu_);
      made_ = std::move(result);
      ++made_count_;
    }
  }

  const Make make_;
  mutable Mutex mu_;
  std::optional<Key> wanted_ ABSL_GUARDED_BY(mu_);  // the result to make next
  Key taking_ ABSL_GUARDED_BY(mu_);                 // the result Take waits for
  std::optional<Result> made_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t made_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: it starts once the members above are made
};

}  // namespace fulcrum

#endif  // FULCRUM_WORKER_WORK_AHEAD_H_
