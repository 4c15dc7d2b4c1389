#include "worker/work_ahead.h"

#include <set>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

// A result of (partition, step): 1000 * partition + step, its audit's
// examples the step; an error for step 13.
absl::StatusOr<int> Value(int32_t partition, int64_t step, ExampleAudit* audit) {
  if (step == 13) return absl::DataLossError("step 13 is unlucky");
  audit->examples = step;
  return 1000 * partition + static_cast<int>(step);
}

TEST(WorkAheadTest, TakeGivesTheResultOfItsKeyGuessedRightOrWrong) {
  WorkAhead<int> ahead(Value);
  ExampleAudit audit;
  EXPECT_EQ(*ahead.Take(0, 1, &audit), 1);  // nothing started: made now
  EXPECT_EQ(audit.examples, 1);
  ahead.Start(0, 2);
  EXPECT_EQ(*ahead.Take(0, 2, &audit), 2);  // guessed right
  EXPECT_EQ(audit.examples, 2);
  ahead.Start(0, 3);
  EXPECT_EQ(*ahead.Take(1, 3, &audit), 1003);  // guessed wrong: the right one is made
  EXPECT_EQ(audit.examples, 3);
  ahead.Start(0, 4);
  ahead.Start(2, 4);  // a later guess replaces one not begun
  EXPECT_EQ(*ahead.Take(2, 4, &audit), 2004);
  EXPECT_GE(ahead.made(), 4);
  EXPECT_LE(ahead.made(), 6) << "at most the two wrong guesses were made for nothing";
  // The same key taken again is made again.
  EXPECT_EQ(*ahead.Take(2, 4, &audit), 2004);
}

TEST(WorkAheadTest, AnErrorIsTakenAsMade) {
  WorkAhead<int> ahead(Value);
  ExampleAudit audit;
  ahead.Start(0, 13);
  absl::StatusOr<int> failed = ahead.Take(0, 13, &audit);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(*ahead.Take(0, 14, &audit), 14) << "an error stops nothing";
}

TEST(WorkAheadTest, EveryResultIsMadeOnTheOneThreadOfItsOwn) {
  Mutex mu;
  std::set<std::thread::id> threads;
  WorkAhead<int> ahead([&](int32_t partition, int64_t step, ExampleAudit* audit) {
    MutexLock lock(&mu);
    threads.insert(std::this_thread::get_id());
    return Value(partition, step, audit);
  });
  ExampleAudit audit;
  for (int64_t step = 100; step < 150; ++step) {
    ahead.Start(static_cast<int32_t>(step % 3), step);  // right one time in three
    ASSERT_EQ(*ahead.Take(0, step, &audit), step);
  }
  MutexLock lock(&mu);
  ASSERT_EQ(threads.size(), 1u);
  EXPECT_NE(*threads.begin(), std::this_thread::get_id());
}

}  // namespace
}  // namespace fulcrum
