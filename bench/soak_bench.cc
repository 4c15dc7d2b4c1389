// fulcrum-soak-bench: does memory grow with every finished job? A local
// cluster (2 servers, 2 workers) runs many small jobs one after another;
// every few jobs the resident memory (VmRSS) of the scheduler, the servers
// and the workers is sampled. After a warm-up, the slope of RSS against the
// number of finished jobs (least squares) is the memory each finished job
// leaves behind. With retention (fulcrum-scheduler --retain-finished-jobs /
// --max-finished-records, set small here so that the soak passes them) the
// slope must be flat; --retain-finished-jobs=1000000 shows the cost without.
// The table also gives the slope over the second half of the samples: a leak
// keeps its rate there, while caches and allocator pools that settle (RocksDB
// files, gRPC and glibc pools) flatten; that one must be under 1 KiB a job.
//
//   fulcrum-soak-bench [--jobs N] [--sample-every N] [--warmup N]
//                      [--retain-finished-jobs N] [--max-finished-records N]
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "common/memory_budget.h"
#include "common/process.h"

ABSL_FLAG(int, jobs, 400, "Small jobs to run one after another");
ABSL_FLAG(int, sample_every, 20, "Sample every process's RSS after every this many jobs");
ABSL_FLAG(int, warmup, 100, "Jobs before the slope is measured (allocator and caches settle)");
ABSL_FLAG(int, retain_finished_jobs, 10, "The scheduler's --retain-finished-jobs");
ABSL_FLAG(int, max_finished_records, 50, "The scheduler's --max-finished-records");
ABSL_FLAG(bool, keep_logs, false, "Keep the cluster's folder (process logs)");
ABSL_FLAG(bool, processes_keep_freed_memory, true,
          "Every process's --keep-freed-memory (false: glibc's defaults)");

namespace fulcrum {
namespace bench {
namespace {


// Least-squares slope of y against x.
double Slope(const std::vector<double>& x, const std::vector<double>& y) {
  const double mx = Mean(x), my = Mean(y);
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - mx) * (y[i] - my);
    den += (x[i] - mx) * (x[i] - mx);
  }
  return den > 0 ? num / den : 0;
}

int Run() {
  LocalCluster::Options options;
  options.dir = MakeTempDir("fulcrum-soak");
  options.servers = 2;
  options.workers = 2;
  options.scheduler_flags = {absl::StrCat("--retain-finished-jobs=", absl::GetFlag(FLAGS_retain_finished_jobs)),
                             absl::StrCat("--max-finished-records=", absl::GetFlag(FLAGS_max_finished_records))};
  const std::string keep =
      absl::StrCat("--keep-freed-memory=", absl::GetFlag(FLAGS_processes_keep_freed_memory));
  options.scheduler_flags.push_back(keep);
  options.server_flags = {keep};
  options.worker_flags = {keep};
  auto cluster = BenchCluster::Start(options, absl::Minutes(5));
  if (!cluster.ok()) {
    Log(absl::StrCat("cannot start the cluster: ", cluster.status().message()));
    return 1;
  }
  v1::JobSpec spec = SyntheticMlpSpec("soak", {64}, 2048, 0.05f, 20, 2);
  // Series of (finished jobs, RSS) per process id.
  std::map<std::string, std::vector<double>> jobs_at, rss_at;
  std::map<std::string, std::string> role_of;
  const int total = absl::GetFlag(FLAGS_jobs);
  for (int done = 1; done <= total; ++done) {
    spec.set_seed(done);  // a distinct job (and dataset) each time
    spec.mutable_data()->set_shuffle_seed(done);
    absl::StatusOr<v1::JobStatus> job = (*cluster)->RunToEnd(spec);
    if (!job.ok()) {
      Log(absl::StrCat("job ", done, " did not succeed: ", job.status().message()));
      return FinishRun(options.dir, false, true);
    }
    if (done % absl::GetFlag(FLAGS_sample_every) != 0) continue;
    std::string line = absl::StrCat(done, " jobs:");
    for (const auto& p : (*cluster)->local().file().processes()) {
      const int64_t rss = ResidentBytes(p.pid());
      if (rss == 0) continue;
      jobs_at[p.id()].push_back(done);
      rss_at[p.id()].push_back(static_cast<double>(rss));
      role_of[p.id()] = p.role();
      absl::StrAppend(&line, " ", p.id(), " ", FormatBytes(rss));
    }
    Log(line);
  }
  std::printf(
      "\n| process | RSS after warm-up | RSS at the end | slope per finished job | slope over the second half |\n"
      "|---|---|---|---|---|\n");
  bool flat = true;
  for (const auto& [id, xs] : jobs_at) {
    std::vector<double> x, y;
    for (size_t i = 0; i < xs.size(); ++i) {
      if (xs[i] < absl::GetFlag(FLAGS_warmup)) continue;
      x.push_back(xs[i]);
      y.push_back(rss_at[id][i]);
    }
    if (x.size() < 2) continue;
    const double slope = Slope(x, y);
    // A leak keeps its rate; caches and allocator pools that settle do not:
    // the slope over the second half of the samples tells them apart.
    const size_t half = x.size() / 2;
    const std::vector<double> x2(x.begin() + static_cast<std::ptrdiff_t>(half), x.end());
    const std::vector<double> y2(y.begin() + static_cast<std::ptrdiff_t>(half), y.end());
    const double late = x2.size() >= 2 ? Slope(x2, y2) : slope;
    // Flat: under 1 KiB a job (noise of allocator pages, not retained jobs)
    // over the second half.
    flat &= late < 1024;
    std::printf("| %s (%s) | %s | %s | %+.0f B/job | %+.0f B/job |\n", id.c_str(), role_of[id].c_str(),
                FormatBytes(static_cast<int64_t>(y.front())).c_str(),
                FormatBytes(static_cast<int64_t>(y.back())).c_str(), slope, late);
  }
  std::printf("\n%d jobs; retention: parameters of the last %d finished jobs, records of the last %d\n", total,
              absl::GetFlag(FLAGS_retain_finished_jobs), absl::GetFlag(FLAGS_max_finished_records));
  return FinishRun(options.dir, true, absl::GetFlag(FLAGS_keep_logs)) == 0 && flat ? 0 : 1;
}

}  // namespace
}  // namespace bench
}  // namespace fulcrum

int main(int argc, char** argv) {
  return fulcrum::bench::BenchMain(argc, argv, "soak_bench.cc", "fulcrum-soak-bench [--jobs N]", fulcrum::bench::Run);
}
