// What the cluster benchmarks (fulcrum-checkpoint-bench,
// fulcrum-failover-bench) share: main() with its SIGINT / SIGTERM watcher,
// timestamped logging, the temp folder, a LocalCluster with a JobService stub,
// and figures read from a finished job.
//
// Every process a BenchCluster starts is SIGKILLed when the BenchCluster goes,
// and by the signal watcher of BenchMain when SIGINT / SIGTERM arrives first.
#ifndef FULCRUM_BENCH_BENCH_UTIL_H_
#define FULCRUM_BENCH_BENCH_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/local_cluster.h"
#include "fulcrum/v1/job.grpc.pb.h"

namespace fulcrum {
namespace bench {

// The whole of a benchmark's main(): blocks the termination signals (before
// any thread), parses the command line (dashed flag names accepted; --help
// lists the flags defined in a file whose name ends with `flags_file`), then
// returns run()'s exit code. A watcher thread waits meanwhile for SIGINT /
// SIGTERM; on one it kills every registered cluster's processes, removes the
// registered temp folder (see RegisterTempDir) and exits with 128 + signal.
int BenchMain(int argc, char** argv, absl::string_view flags_file, const char* usage,
              const std::function<int()>& run);

// One line on stdout, prefixed with the seconds since the program started,
// flushed at once (the runs take minutes).
void Log(const std::string& line);

double Median(std::vector<double> values);       // 0 when empty
double Mean(const std::vector<double>& values);  // 0 when empty

bool Terminal(v1::JobState state);

// Training steps per second of a finished job, from its first progress point
// with a step in to its end (data loading and start-up left out); over the
// whole start..end span if it has no such point.
double StepsPerSecond(const v1::JobStatus& done);

// Creates a fresh folder $TMPDIR/<name>.XXXXXX (/tmp without $TMPDIR). On
// failure says why on stderr and returns "".
std::string MakeTempDir(absl::string_view name);

// Removes `dir` and everything under it; errors are ignored.
void RemoveDir(const std::string& dir);

// Makes the signal watcher of BenchMain remove `dir` too, unless `keep`.
void RegisterTempDir(const std::string& dir, bool keep);

// The end of a run: removes `dir` when every figure was measured (`good`) and
// `keep_logs` is off, else logs where the logs were kept. Returns the exit
// code: 0 when `good`, else 1.
int FinishRun(const std::string& dir, bool good, bool keep_logs);

// A BSP job of `steps` steps (data.max_steps) on `workers` workers: an MLP
// with ReLU and `hidden_sizes` on synthetic MNIST-shaped data (`examples`
// examples of 784 features, 10 classes, batches of 64, shuffle seed 7, epochs
// enough never to end first), SGD at `lr` with momentum 0.9, seed 3. Replicas
// and checkpoints are left to the caller.
v1::JobSpec SyntheticMlpSpec(const std::string& name, const std::vector<int32_t>& hidden_sizes,
                             int64_t examples, float lr, int64_t steps, int workers);

// A LocalCluster and a JobService stub to its scheduler. Not thread-safe.
class BenchCluster {
 public:
  // Starts the cluster (see LocalCluster::Start) and registers its folder
  // with the signal watcher. `job_limit` bounds WaitForEnd and RunToEnd.
  static absl::StatusOr<std::unique_ptr<BenchCluster>> Start(const LocalCluster::Options& options,
                                                             absl::Duration job_limit);
  // SIGKILLs and reaps every process (LocalCluster's destructor).
  ~BenchCluster();

  LocalCluster& local() { return *local_; }

  absl::StatusOr<std::string> Submit(const v1::JobSpec& spec);
  absl::StatusOr<v1::JobStatus> Get(const std::string& job_id);

  // Follows WatchJob until `done` holds or the job ends; an error (the code
  // of the stream's end, UNAVAILABLE if it ended cleanly) if neither happens
  // within `timeout`.
  absl::StatusOr<v1::JobStatus> WaitFor(const std::string& job_id,
                                        const std::function<bool(const v1::JobStatus&)>& done,
                                        absl::Duration timeout);
  absl::StatusOr<v1::JobStatus> WaitForEnd(const std::string& job_id);

  // Submits `spec` and waits for its end; FAILED_PRECONDITION unless it
  // succeeded.
  absl::StatusOr<v1::JobStatus> RunToEnd(const v1::JobSpec& spec);

 private:
  BenchCluster() = default;

  std::string dir_;
  absl::Duration job_limit_;
  std::unique_ptr<LocalCluster> local_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

}  // namespace bench
}  // namespace fulcrum

#endif  // FULCRUM_BENCH_BENCH_UTIL_H_
