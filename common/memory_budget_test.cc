// A daemon's memory budget against the memory it can have: the budget leaves
// the process its own memory (kProcessReserveBytes), by default and when set.
#include "common/memory_budget.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

TEST(MemoryBudgetTest, TheLargestBudgetLeavesTheProcessItsOwnMemory) {
  EXPECT_EQ(MaxMemoryBudget(2 * kGiB), 2 * kGiB - kProcessReserveBytes);
  EXPECT_EQ(MaxMemoryBudget(2 * kProcessReserveBytes), kProcessReserveBytes);
  EXPECT_EQ(MaxMemoryBudget(96 * kMiB), 48 * kMiB);  // below twice the reserve: half
  EXPECT_EQ(MaxMemoryBudget(0), 0);                  // no limit known: no bound
}

TEST(MemoryBudgetTest, TheDefaultIsAFractionOfTheLimitWithinTheLargest) {
  EXPECT_EQ(DefaultMemoryBudget(10 * kGiB), static_cast<int64_t>(10 * kGiB * 0.8));
  EXPECT_EQ(DefaultMemoryBudget(512 * kMiB), static_cast<int64_t>(512 * kMiB * 0.8));
  // 80% of 256 MiB would leave the process 51.2 MiB; the reserve wins.
  EXPECT_EQ(DefaultMemoryBudget(256 * kMiB), 192 * kMiB);
  EXPECT_EQ(DefaultMemoryBudget(128 * kMiB), 64 * kMiB);
  EXPECT_EQ(DefaultMemoryBudget(100 * kMiB), 50 * kMiB);
  EXPECT_EQ(DefaultMemoryBudget(0), static_cast<int64_t>(4 * kGiB * 0.8));
  for (int64_t limit = kMiB; limit < 64 * kGiB; limit = limit * 3 / 2) {
    EXPECT_LE(DefaultMemoryBudget(limit), MaxMemoryBudget(limit)) << limit;
    EXPECT_TRUE(CheckMemoryBudget(DefaultMemoryBudget(limit), {limit, "a limit"}).ok()) << limit;
  }
}

TEST(MemoryBudgetTest, ABudgetBeyondTheLimitLessTheReserveIsRefusedNamingTheLargest) {
  const MemoryLimit limit{2 * kGiB, "the cgroup's memory limit (/sys/fs/cgroup/memory.max)"};
  EXPECT_TRUE(CheckMemoryBudget(2 * kGiB - kProcessReserveBytes, limit).ok());
  const absl::Status refused = CheckMemoryBudget(2 * kGiB, limit);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  for (const char* part : {"the cgroup's memory limit (/sys/fs/cgroup/memory.max) is 2.0 GiB", "64.0 MiB",
                           "set at most 1.9 GiB (2080374784 bytes)", "leave it unset for 1.6 GiB"}) {
    EXPECT_TRUE(absl::StrContains(refused.message(), part)) << part << " in " << refused.message();
  }
  EXPECT_FALSE(CheckMemoryBudget(2 * kGiB - kProcessReserveBytes + 1, limit).ok());
  EXPECT_TRUE(CheckMemoryBudget(int64_t{1} << 60, {0, "nothing readable"}).ok());
}

}  // namespace
}  // namespace fulcrum
