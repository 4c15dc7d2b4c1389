#include "common/sync.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace fulcrum {
namespace {

// Takes two mutexes in one order, then in the other: a lock-order cycle.
void LockInBothOrders() {
  Mutex a;
  Mutex b;
  {
    MutexLock first(&a);
    MutexLock second(&b);
  }
  {
    MutexLock first(&b);
    MutexLock second(&a);
  }
}

// Each case runs in a child process, so that the mode it sets stays there.
TEST(MutexDeadlockDetectionTest, OnALockOrderCycleAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        SetMutexDeadlockDetection(true);
        LockInBothOrders();
      },
      "potential deadlock");
}

TEST(MutexDeadlockDetectionTest, OffTheSameLocksRunThrough) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        SetMutexDeadlockDetection(false);
        LockInBothOrders();
        std::exit(0);
      },
      testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace fulcrum
