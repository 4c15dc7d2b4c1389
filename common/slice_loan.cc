#include "common/slice_loan.h"

#include "absl/base/thread_annotations.h"
#include "common/sync.h"

namespace fulcrum {

// One generation of lent memory: counted by its owner (the loan, until it
// moves on) and by every slice alive; whoever drops the last count frees it
// and the buffers it keeps.
struct SliceLoan::Generation {
  Mutex mu;
  int refs ABSL_GUARDED_BY(mu) = 1;  // the loan's
  std::vector<std::shared_ptr<void>> kept ABSL_GUARDED_BY(mu);

  static void Unref(void* arg) {
    auto* generation = static_cast<Generation*>(arg);
    bool last = false;
    {
      MutexLock lock(&generation->mu);
      last = --generation->refs == 0;
    }
    if (last) delete generation;  // no one else can reach it any more
  }
};

SliceLoan::SliceLoan() : current_(new Generation) {}

SliceLoan::~SliceLoan() { Generation::Unref(current_); }

grpc::Slice SliceLoan::Lend(const void* data, size_t size) {
  {
    MutexLock lock(&current_->mu);
    ++current_->refs;
  }
  // grpc::Slice's external-memory constructor takes a mutable pointer; gRPC
  // only reads what it sends.
  return grpc::Slice(const_cast<void*>(data), size, &Generation::Unref, current_);
}

bool SliceLoan::AwaitReturned(absl::Duration timeout) {
  MutexLock lock(&current_->mu);
  return current_->mu.AwaitWithTimeout(
      absl::Condition(+[](int* refs) { return *refs == 1; }, &current_->refs), timeout);
}

int SliceLoan::Outstanding() {
  MutexLock lock(&current_->mu);
  return current_->refs - 1;
}

void SliceLoan::Renew(std::vector<std::shared_ptr<void>> kept) {
  Generation* old = current_;
  {
    MutexLock lock(&old->mu);
    old->kept = std::move(kept);
  }
  current_ = new Generation;
  Generation::Unref(old);
}

}  // namespace fulcrum
