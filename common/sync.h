// The synchronization types Fulcrum's code uses: Abseil's, under our names.
//
// In every ordinary build they are aliases of absl::Mutex and friends (clang
// checks their ABSL_GUARDED_BY annotations: -Wthread-safety). In the
// ThreadSanitizer build (-DFULCRUM_TSAN_SYNC, set with
// FULCRUM_SANITIZE=thread) they are thin wrappers that also tell TSan about
// every acquire and release: Debian's Abseil is not built with TSan, so
// without this TSan would see none of the happens-before edges absl::Mutex
// makes and report every guarded access as a race.
#ifndef FULCRUM_COMMON_SYNC_H_
#define FULCRUM_COMMON_SYNC_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#if !defined(FULCRUM_TSAN_SYNC)

namespace fulcrum {
using Mutex = absl::Mutex;
using MutexLock = absl::MutexLock;
using ReaderMutexLock = absl::ReaderMutexLock;
using MutexLockMaybe = absl::MutexLockMaybe;
using CondVar = absl::CondVar;
using Notification = absl::Notification;
}  // namespace fulcrum

#else  // FULCRUM_TSAN_SYNC

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

namespace fulcrum {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.Lock();
    __tsan_acquire(this);
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    __tsan_release(this);
    mu_.Unlock();
  }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() {
    mu_.ReaderLock();
    __tsan_acquire(this);
  }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() {
    __tsan_release(this);
    mu_.ReaderUnlock();
  }
  // The waits release the lock inside Abseil and take it again. Abseil
  // evaluates a waiter's condition with the lock held, on the waiting thread
  // or on whichever thread unlocks, so each evaluation is an acquire and a
  // release too.
  void Await(const absl::Condition& condition) {
    Guarded guarded{this, &condition};
    __tsan_release(this);
    mu_.Await(absl::Condition(&Guarded::Eval, &guarded));
    __tsan_acquire(this);
  }
  bool AwaitWithTimeout(const absl::Condition& condition, absl::Duration timeout) {
    Guarded guarded{this, &condition};
    __tsan_release(this);
    const bool met = mu_.AwaitWithTimeout(absl::Condition(&Guarded::Eval, &guarded), timeout);
    __tsan_acquire(this);
    return met;
  }
  bool AwaitWithDeadline(const absl::Condition& condition, absl::Time deadline) {
    Guarded guarded{this, &condition};
    __tsan_release(this);
    const bool met = mu_.AwaitWithDeadline(absl::Condition(&Guarded::Eval, &guarded), deadline);
    __tsan_acquire(this);
    return met;
  }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() { mu_.AssertHeld(); }
  absl::Mutex* native() { return &mu_; }

 private:
  struct Guarded {
    Mutex* mu;
    const absl::Condition* condition;
    static bool Eval(Guarded* g) {
      __tsan_acquire(g->mu);
      const bool met = g->condition->Eval();
      __tsan_release(g->mu);
      return met;
    }
  };
  absl::Mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) { mu_->ReaderLock(); }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLockMaybe {
 public:
  explicit MutexLockMaybe(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    if (mu_ != nullptr) mu_->Lock();
  }
  ~MutexLockMaybe() ABSL_UNLOCK_FUNCTION() {
    if (mu_ != nullptr) mu_->Unlock();
  }
  MutexLockMaybe(const MutexLockMaybe&) = delete;
  MutexLockMaybe& operator=(const MutexLockMaybe&) = delete;

 private:
  Mutex* const mu_;
};

class CondVar {
 public:
  void Wait(Mutex* mu) {
    __tsan_release(mu);
    cv_.Wait(mu->native());
    __tsan_acquire(mu);
  }
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
    __tsan_release(mu);
    const bool timed_out = cv_.WaitWithTimeout(mu->native(), timeout);
    __tsan_acquire(mu);
    return timed_out;
  }
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline) {
    __tsan_release(mu);
    const bool timed_out = cv_.WaitWithDeadline(mu->native(), deadline);
    __tsan_acquire(mu);
    return timed_out;
  }
  void Signal() { cv_.Signal(); }
  void SignalAll() { cv_.SignalAll(); }

 private:
  absl::CondVar cv_;
};

class Notification {
 public:
  Notification() = default;
  explicit Notification(bool notified) : n_(notified) {}
  void Notify() {
    __tsan_release(this);
    n_.Notify();
  }
  bool HasBeenNotified() const {
    const bool notified = n_.HasBeenNotified();
    if (notified) __tsan_acquire(const_cast<Notification*>(this));
    return notified;
  }
  void WaitForNotification() const {
    n_.WaitForNotification();
    __tsan_acquire(const_cast<Notification*>(this));
  }
  bool WaitForNotificationWithTimeout(absl::Duration timeout) const {
    const bool notified = n_.WaitForNotificationWithTimeout(timeout);
    if (notified) __tsan_acquire(const_cast<Notification*>(this));
    return notified;
  }

 private:
  absl::Notification n_;
};

}  // namespace fulcrum

#endif  // FULCRUM_TSAN_SYNC

namespace fulcrum {

// Debian's Abseil is built without NDEBUG, so by default every
// absl::Mutex::Lock in the process (ours and gRPC's, which uses absl::Mutex
// too) checks lock order: it takes one process-wide spinlock and looks the
// mutex up in a lock-order graph of every mutex alive. That costs about 0.1
// us a lock with a hundred mutexes and 3 us with 200,000 (a server holding
// many chunks), and serialises every thread on the spinlock. Processes that
// serve or measure turn it off first thing (Daemon::Init, the benches, the
// CLI); the test binaries keep it, and have the daemons they start keep it
// (FULCRUM_MUTEX_DEADLOCK_DETECTION=1), so lock-order cycles still abort the
// tests. Call before other threads exist.
inline void SetMutexDeadlockDetection(bool on) {
  absl::SetMutexDeadlockDetectionMode(on ? absl::OnDeadlockCycle::kAbort : absl::OnDeadlockCycle::kIgnore);
}

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_SYNC_H_
