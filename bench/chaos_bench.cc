// fulcrum-chaos-bench: twenty seeded chaos schedules (tests/chaos.h), each on
// a fresh local cluster of real processes: a deterministic BSP job hit by a
// run of faults (kill -9 with immediate restarts of servers, workers and the
// scheduler, servers replaced by new ones, SIGSTOP/SIGCONT of any process),
// one after another. Reports per schedule the faults survived, whether the
// job ended bit-identical to an undisturbed run with an exact example audit,
// the longest stall and the processes' memory; then the totals: schedules
// survived, stall p50 / max over every fault, RSS max by role.
//
//   fulcrum-chaos-bench [--schedules N] [--faults N] [--first-seed S] [--click] [--keep-logs]
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "common/memory_budget.h"
#include "tests/chaos.h"

ABSL_FLAG(int, schedules, 20, "Chaos schedules to run (seeds first-seed, first-seed + 1, ...)");
ABSL_FLAG(int, faults, 6, "Faults per schedule");
ABSL_FLAG(uint64_t, first_seed, 1, "Seed of the first schedule");
ABSL_FLAG(bool, keep_logs, false, "Keep the clusters' folders (process logs)");
ABSL_FLAG(bool, click, false, "Run the click job (a factorization machine over sparse tables) instead of the MLP");

namespace fulcrum {
namespace bench {
namespace {

int Run() {
  const int schedules = absl::GetFlag(FLAGS_schedules);
  std::vector<double> stalls;
  std::map<std::string, int64_t> rss;
  int survived = 0, faults = 0;
  std::printf("| seed | faults | result | longest stall | faults |\n|---|---|---|---|---|\n");
  for (int i = 0; i < schedules; ++i) {
    ChaosOptions options;
    options.seed = absl::GetFlag(FLAGS_first_seed) + i;
    options.faults = absl::GetFlag(FLAGS_faults);
    options.click = absl::GetFlag(FLAGS_click);
    options.dir = MakeTempDir("fulcrum-chaos");
    RegisterTempDir(options.dir, absl::GetFlag(FLAGS_keep_logs));
    absl::StatusOr<ChaosResult> result = RunChaosSchedule(options);
    std::string outcome, what;
    double longest = 0;
    bool good = false;
    if (!result.ok()) {
      outcome = absl::StrCat("could not run: ", result.status().message());
    } else {
      good = result->job.state() == v1::SUCCEEDED && result->bit_identical && result->audit_exact;
      outcome = result->job.state() != v1::SUCCEEDED
                    ? absl::StrCat(v1::JobState_Name(result->job.state()), ": ", result->job.reason())
                    : (good ? "SUCCEEDED, bit-identical, audit exact" : absl::StrCat("SUCCEEDED but ", result->mismatch));
      for (const ChaosFault& fault : result->faults) {
        const double seconds = absl::ToDoubleSeconds(fault.stall);
        stalls.push_back(seconds);
        longest = std::max(longest, seconds);
        absl::StrAppend(&what, what.empty() ? "" : "; ", fault.what, absl::StrFormat(" (%.2f s)", seconds));
      }
      faults += static_cast<int>(result->faults.size());
      for (const auto& [role, bytes] : result->max_rss_bytes) rss[role] = std::max(rss[role], bytes);
    }
    survived += good ? 1 : 0;
    std::printf("| %llu | %zu | %s | %.2f s | %s |\n", static_cast<unsigned long long>(options.seed),
                result.ok() ? result->faults.size() : 0, outcome.c_str(), longest, what.c_str());
    std::fflush(stdout);
    if (good && !absl::GetFlag(FLAGS_keep_logs)) RemoveDir(options.dir);
  }
  std::sort(stalls.begin(), stalls.end());
  std::printf("\n| figure | value |\n|---|---|\n");
  std::printf("| schedules survived (SUCCEEDED, bit-identical, exact audit) | %d of %d |\n", survived, schedules);
  std::printf("| faults injected | %d |\n", faults);
  std::printf("| stall after a fault (fault to 5 steps past it) | p50 %.2f s / max %.2f s |\n", Median(stalls),
              stalls.empty() ? 0.0 : stalls.back());
  for (const auto& [role, bytes] : rss) std::printf("| max RSS of a %s at the end | %s |\n", role.c_str(), FormatBytes(bytes).c_str());
  return survived == schedules ? 0 : 1;
}

}  // namespace
}  // namespace bench
}  // namespace fulcrum

int main(int argc, char** argv) {
  return fulcrum::bench::BenchMain(argc, argv, "chaos_bench.cc",
                                   "fulcrum-chaos-bench [--schedules N] [--faults N] [--first-seed S] [--click]",
                                   fulcrum::bench::Run);
}
