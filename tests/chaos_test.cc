// One seeded chaos schedule (tests/chaos.h) over a deterministic BSP job:
// kill -9 with immediate restarts, servers replaced, SIGSTOP/SIGCONT of
// servers, workers and the scheduler, one after another. The job ends
// SUCCEEDED, bit-identical to an undisturbed run, every example used exactly
// once per epoch. bench/chaos_bench.cc runs twenty schedules.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/chaos.h"
#include "tests/cluster_fixture.h"

namespace fulcrum {
namespace {

TEST(ChaosTest, ASeededScheduleOfFaultsEndsBitIdenticalWithAnExactAudit) {
  ChaosOptions options;
  options.seed = 20261202;
  options.faults = 5;
  options.dir = MakeTempDir();
  absl::StatusOr<ChaosResult> result = RunChaosSchedule(options);
  ASSERT_TRUE(result.ok()) << result.status();
  std::string faults;
  for (const ChaosFault& fault : result->faults) {
    absl::StrAppend(&faults, "\n  step ", fault.step, ": ", fault.what, " (stall ", absl::FormatDuration(fault.stall),
                    ")");
  }
  ASSERT_EQ(result->job.state(), v1::SUCCEEDED) << result->job.reason() << faults;
  EXPECT_EQ(result->faults.size(), 5u) << faults;
  EXPECT_TRUE(result->bit_identical) << result->mismatch << faults;
  EXPECT_TRUE(result->audit_exact) << result->mismatch << faults;
  std::cout << "faults survived:" << faults << "\n";
}

}  // namespace
}  // namespace fulcrum
