#include "bench/bench_util.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>
#include <thread>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/process.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/sync.h"

namespace fulcrum {
namespace bench {
namespace {

const absl::Time kBenchStart = absl::Now();

// What the signal watcher must clean up: the processes of the running
// clusters (read back from each cluster.json) and the temp folder.
// Thread-safe.
class Cleanup {
 public:
  void SetTempDir(const std::string& dir, bool keep) {
    MutexLock lock(&mu_);
    temp_dir_ = dir;
    keep_ = keep;
  }
  void AddCluster(const std::string& dir) {
    MutexLock lock(&mu_);
    clusters_.insert(dir);
  }
  void RemoveCluster(const std::string& dir) {
    MutexLock lock(&mu_);
    clusters_.erase(dir);
  }
  // SIGKILL to every process of every registered cluster; then the temp
  // folder goes unless it is to be kept.
  void KillAll() {
    MutexLock lock(&mu_);
    for (const std::string& dir : clusters_) {
      auto opened = LocalCluster::Open(dir);  // not owned: its destructor kills nothing
      if (!opened.ok()) continue;
      for (const v1::LocalProcess& p : (*opened)->file().processes()) {
        kill(static_cast<pid_t>(p.pid()), SIGKILL);
      }
    }
    if (!temp_dir_.empty() && !keep_) RemoveDir(temp_dir_);
  }

 private:
  Mutex mu_;  // guards everything below
  std::string temp_dir_ ABSL_GUARDED_BY(mu_);
  bool keep_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> clusters_ ABSL_GUARDED_BY(mu_);
};

Cleanup& Cleaner() {
  static Cleanup* cleanup = new Cleanup();
  return *cleanup;
}

void ParseBenchFlags(int argc, char** argv, absl::string_view flags_file, const char* usage) {
  AcceptDashedFlags(argc, argv);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [file = std::string(flags_file)](absl::string_view defined_in) {
    return absl::EndsWith(defined_in, file);
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  absl::ParseCommandLine(argc, argv);
}

}  // namespace

int BenchMain(int argc, char** argv, absl::string_view flags_file, const char* usage,
              const std::function<int()>& run) {
  // Before any thread: SIGINT / SIGTERM are taken by the watcher below.
  BlockTerminationSignals();
  SetMutexDeadlockDetection(false);  // as every daemon (common/sync.h)
  ParseBenchFlags(argc, argv, flags_file, usage);
  std::thread watcher([] {
    const int sig = WaitForShutdown();
    if (sig == 0) return;  // the benchmark finished
    Cleaner().KillAll();
    std::fprintf(stderr, "signal %d: killed every cluster process\n", sig);
    _exit(128 + sig);
  });
  const int rc = run();
  RequestShutdown();
  watcher.join();
  return rc;
}

void Log(const std::string& line) {
  std::printf("[%7.1fs] %s\n", absl::ToDoubleSeconds(absl::Now() - kBenchStart), line.c_str());
  std::fflush(stdout);
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  if (n == 0) return 0;
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double Mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return values.empty() ? 0 : sum / values.size();
}

bool Terminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

double StepsPerSecond(const v1::JobStatus& done) {
  const double end = (done.end_time_unix_ms() - done.start_time_unix_ms()) / 1000.0;
  const int64_t steps = done.progress().step();
  for (const v1::MetricPoint& point : done.history()) {
    if (point.step() > 0 && point.step() < steps && point.elapsed_seconds() < end) {
      return (steps - point.step()) / (end - point.elapsed_seconds());
    }
  }
  return end > 0 ? steps / end : 0;
}

std::string MakeTempDir(absl::string_view name) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp", "/", name, ".XXXXXX");
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) {
    std::fprintf(stderr, "cannot create a folder under $TMPDIR or /tmp: %s\n", std::strerror(errno));
    return "";
  }
  return buffer.data();
}

void RemoveDir(const std::string& dir) {
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

void RegisterTempDir(const std::string& dir, bool keep) { Cleaner().SetTempDir(dir, keep); }

int FinishRun(const std::string& dir, bool good, bool keep_logs) {
  if (good && !keep_logs) {
    RemoveDir(dir);
  } else {
    Log(absl::StrCat("logs kept in ", dir));
  }
  return good ? 0 : 1;
}

v1::JobSpec SyntheticMlpSpec(const std::string& name, const std::vector<int32_t>& hidden_sizes,
                             int64_t examples, float lr, int64_t steps, int workers) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_model()->set_kind(v1::ModelSpec::MLP);
  for (int32_t size : hidden_sizes) spec.mutable_model()->add_hidden_sizes(size);
  spec.mutable_model()->set_activation(v1::RELU);
  v1::DataSpec* data = spec.mutable_data();
  data->set_dataset(v1::DataSpec::SYNTHETIC);
  data->set_synthetic_examples(examples);
  data->set_synthetic_features(784);
  data->set_synthetic_classes(10);
  data->set_batch_size(64);
  data->set_epochs(10000);
  data->set_shuffle_seed(7);
  data->set_max_steps(steps);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_lr(lr);
  spec.mutable_optimizer()->set_momentum(0.9f);
  spec.set_mode(v1::BSP);
  spec.set_num_workers(workers);
  spec.set_seed(3);
  return spec;
}

// ---------------------------------------------------------------------------
// BenchCluster
// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<BenchCluster>> BenchCluster::Start(const LocalCluster::Options& options,
                                                                  absl::Duration job_limit) {
  std::unique_ptr<BenchCluster> cluster(new BenchCluster());
  Cleaner().AddCluster(options.dir);
  cluster->dir_ = options.dir;
  cluster->job_limit_ = job_limit;
  ASSIGN_OR_RETURN(cluster->local_, LocalCluster::Start(options));
  cluster->stub_ = v1::JobService::NewStub(MakeChannel(cluster->local_->scheduler_address()));
  return cluster;
}

BenchCluster::~BenchCluster() {
  local_.reset();
  Cleaner().RemoveCluster(dir_);
}

absl::StatusOr<std::string> BenchCluster::Submit(const v1::JobSpec& spec) {
  grpc::ClientContext context;
  SetDeadline(&context, 10);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::SubmitJobResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(stub_->SubmitJob(&context, request, &response)));
  return response.job_id();
}

absl::StatusOr<v1::JobStatus> BenchCluster::Get(const std::string& job_id) {
  grpc::ClientContext context;
  SetDeadline(&context, 5);
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::JobStatus status;
  RETURN_IF_ERROR(FromGrpcStatus(stub_->GetJob(&context, request, &status)));
  return status;
}

absl::StatusOr<v1::JobStatus> BenchCluster::WaitFor(const std::string& job_id,
                                                    const std::function<bool(const v1::JobStatus&)>& done,
                                                    absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::ToDoubleSeconds(timeout));
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  auto reader = stub_->WatchJob(&context, request);
  v1::JobStatus status;
  while (reader->Read(&status)) {
    if (done(status) || Terminal(status.state())) {
      context.TryCancel();
      reader->Finish().IgnoreError();
      return status;
    }
  }
  absl::Status finished = FromGrpcStatus(reader->Finish());
  return absl::Status(
      finished.ok() ? absl::StatusCode::kUnavailable : finished.code(),
      absl::StrCat("watching job ", job_id, ": ", finished.ok() ? "stream ended" : finished.message(),
                   " (last state ", v1::JobState_Name(status.state()), ")"));
}

absl::StatusOr<v1::JobStatus> BenchCluster::WaitForEnd(const std::string& job_id) {
  return WaitFor(
      job_id, [](const v1::JobStatus&) { return false; }, job_limit_);
}

absl::StatusOr<v1::JobStatus> BenchCluster::RunToEnd(const v1::JobSpec& spec) {
  ASSIGN_OR_RETURN(std::string id, Submit(spec));
  ASSIGN_OR_RETURN(v1::JobStatus done, WaitForEnd(id));
  if (done.state() != v1::SUCCEEDED) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " ended ", v1::JobState_Name(done.state()), ": ", done.reason()));
  }
  return done;
}

}  // namespace bench
}  // namespace fulcrum
