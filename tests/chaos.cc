#include "tests/chaos.h"

#include <signal.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/export.h"
#include "client/local_cluster.h"
#include "client/safetensors.h"
#include "common/process.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "tests/click_job.h"
#include "fulcrum/v1/job.grpc.pb.h"
#include "worker/example_audit.h"
#include "common/half.h"

namespace fulcrum {
namespace {

constexpr int64_t kExamples = 4096;
constexpr absl::Duration kProgressTimeout = absl::Seconds(120);

int64_t ChaosExamples(bool click) { return click ? 24576 : kExamples; }

bool Terminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}


// The shards that hold some of the job's state: dense chunks or table
// buckets.
std::set<int32_t> HoldingState(const v1::JobStatus& job) {
  std::set<int32_t> holding;
  for (const v1::ChunkLocation& chunk : job.shard_map().chunks()) holding.insert(chunk.shard());
  for (const v1::TableLayout& table : job.shard_map().tables()) {
    holding.insert(table.bucket_shards().begin(), table.bucket_shards().end());
  }
  return holding;
}

class Runner {
 public:
  Runner(const ChaosOptions& options, std::unique_ptr<LocalCluster> cluster)
      : options_(options), cluster_(std::move(cluster)), rng_(options.seed) {
    stub_ = v1::JobService::NewStub(MakeChannel(cluster_->scheduler_address()));
  }

  std::string scheduler() const { return cluster_->scheduler_address(); }

  absl::StatusOr<std::string> Submit(const v1::JobSpec& spec) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::SubmitJobResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, 10);
    RETURN_IF_ERROR(FromGrpcStatus(stub_->SubmitJob(&context, request, &response)));
    return response.job_id();
  }

  // The job's status; retried while the scheduler is away (restarting).
  absl::StatusOr<v1::JobStatus> Get(const std::string& job_id) {
    absl::Status last;
    for (absl::Time deadline = absl::Now() + absl::Seconds(60); absl::Now() < deadline;) {
      v1::GetJobRequest request;
      request.set_job_id(job_id);
      v1::JobStatus status;
      grpc::ClientContext context;
      SetDeadline(&context, 2);
      last = FromGrpcStatus(stub_->GetJob(&context, request, &status));
      if (last.ok()) return status;
      if (!absl::IsUnavailable(last) && !absl::IsDeadlineExceeded(last)) return last;
      absl::SleepFor(absl::Milliseconds(50));  // the scheduler restarts
    }
    return last;
  }

  // Polls until `done(status)` or the job ended.
  template <typename Done>
  absl::StatusOr<v1::JobStatus> WaitFor(const std::string& job_id, Done done) {
    for (absl::Time deadline = absl::Now() + kProgressTimeout; absl::Now() < deadline;) {
      ASSIGN_OR_RETURN(v1::JobStatus status, Get(job_id));
      if (done(status) || Terminal(status.state())) return status;
      absl::SleepFor(absl::Milliseconds(20));  // polling the job's progress
    }
    return absl::DeadlineExceededError(absl::StrCat("job ", job_id, " made no progress in ",
                                                    absl::FormatDuration(kProgressTimeout)));
  }

  absl::StatusOr<v1::JobStatus> WaitForStep(const std::string& job_id, int64_t step) {
    return WaitFor(job_id, [step](const v1::JobStatus& s) { return s.progress().step() >= step; });
  }

  // Every shard that holds state has all its replicas again (after a server
  // was lost).
  absl::StatusOr<v1::JobStatus> WaitForReplicas(const std::string& job_id) {
    const int backups = options_.replicas - 1;
    return WaitFor(job_id, [backups](const v1::JobStatus& s) {
      const std::set<int32_t> holding = HoldingState(s);
      for (const auto& shard : s.shards()) {
        if (holding.count(shard.shard()) > 0 && shard.backup_ids_size() < backups) return false;
      }
      return !s.shards().empty();
    });
  }

  // One fault of the kind the seeded generator picks; returns what it was.
  absl::StatusOr<std::string> Inject(const v1::JobStatus& job) {
    std::vector<std::string> servers, workers;
    const std::set<int32_t> holding = HoldingState(job);
    for (const auto& shard : job.shards()) {
      if (holding.count(shard.shard()) == 0) continue;
      servers.push_back(shard.server_id());
      servers.insert(servers.end(), shard.backup_ids().begin(), shard.backup_ids().end());
    }
    for (const auto& w : job.workers()) workers.push_back(w.worker_id());
    std::sort(servers.begin(), servers.end());
    servers.erase(std::unique(servers.begin(), servers.end()), servers.end());
    if (servers.empty() || workers.empty()) return absl::FailedPreconditionError("the job has no servers or workers");
    auto pick = [this](const std::vector<std::string>& from) {
      return from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng_)];
    };
    auto pause = absl::Milliseconds(std::uniform_int_distribution<int>(500, 4000)(rng_));
    const int kind = std::uniform_int_distribution<int>(0, 6)(rng_);
    switch (kind) {
      case 0: {
        const std::string id = pick(servers);
        RETURN_IF_ERROR(KillAndRestart(id));
        return absl::StrCat("kill -9 ", id, ", restarted at once under its id");
      }
      case 1: {
        const std::string id = pick(servers);
        RETURN_IF_ERROR(cluster_->Signal(id, SIGKILL));
        ASSIGN_OR_RETURN(v1::LocalProcess added, cluster_->AddServer());
        return absl::StrCat("kill -9 ", id, ", replaced at once by ", added.id());
      }
      case 2: {
        const std::string id = pick(workers);
        RETURN_IF_ERROR(KillAndRestart(id));
        return absl::StrCat("kill -9 ", id, ", restarted at once under its id");
      }
      case 3:
      case 4: {
        const std::string id = pick(kind == 3 ? servers : workers);
        RETURN_IF_ERROR(Stop(id, pause));
        return absl::StrCat("SIGSTOP ", id, " for ", absl::FormatDuration(pause));
      }
      case 5: {
        RETURN_IF_ERROR(cluster_->Signal("scheduler", SIGKILL));
        absl::StatusOr<v1::LocalProcess> restarted;
        for (int attempt = 0; attempt < 500; ++attempt) {
          restarted = cluster_->RestartScheduler();
          if (restarted.ok() || !absl::IsFailedPrecondition(restarted.status())) break;
          absl::SleepFor(absl::Milliseconds(10));  // until the killed process is reaped
        }
        RETURN_IF_ERROR(restarted.status());
        return std::string("kill -9 scheduler, restarted at once");
      }
      default:
        RETURN_IF_ERROR(Stop("scheduler", pause));
        return absl::StrCat("SIGSTOP scheduler for ", absl::FormatDuration(pause));
    }
  }

  std::map<std::string, int64_t> MaxRss() const {
    std::map<std::string, int64_t> rss;
    for (const auto& p : cluster_->file().processes()) {
      if (kill(static_cast<pid_t>(p.pid()), 0) != 0) continue;
      int64_t& max = rss[p.role()];
      max = std::max(max, ResidentBytes(p.pid()));
    }
    return rss;
  }

 private:
  absl::Status KillAndRestart(const std::string& id) {
    RETURN_IF_ERROR(cluster_->Signal(id, SIGKILL));
    absl::StatusOr<v1::LocalProcess> restarted;
    for (int attempt = 0; attempt < 500; ++attempt) {
      restarted = cluster_->RestartMember(id);
      if (restarted.ok() || !absl::IsFailedPrecondition(restarted.status())) break;
      absl::SleepFor(absl::Milliseconds(10));  // until the killed process is reaped
    }
    return restarted.status();
  }

  absl::Status Stop(const std::string& id, absl::Duration pause) {
    RETURN_IF_ERROR(cluster_->Signal(id, SIGSTOP));
    absl::SleepFor(pause);  // the pause itself
    return cluster_->Signal(id, SIGCONT);
  }

  const ChaosOptions options_;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<v1::JobService::Stub> stub_;
  std::mt19937_64 rng_;
};

// A job's parameters as `fulcrum export` gathers them: the dense tensors,
// then each table's ids and rows.
absl::StatusOr<std::vector<SafetensorsTensor>> FinalParameters(const std::string& scheduler, const std::string& job_id) {
  ASSIGN_OR_RETURN(ExportResult exported, GatherParameters(scheduler, job_id, /*checkpoint_id=*/0, 20));
  std::vector<SafetensorsTensor> all = std::move(exported.tensors);
  for (SafetensorsTensor& table : exported.tables) all.push_back(std::move(table));
  return all;
}

// Empty when `actual` equals `expected` bit for bit, else what differs.
std::string Difference(const std::vector<SafetensorsTensor>& expected, const std::vector<SafetensorsTensor>& actual) {
  if (actual.size() != expected.size()) {
    return absl::StrCat(actual.size(), " tensors, the reference run has ", expected.size());
  }
  for (size_t t = 0; t < expected.size(); ++t) {
    const SafetensorsTensor& want = expected[t];
    const SafetensorsTensor& got = actual[t];
    if (got.name != want.name || got.shape != want.shape) {
      return absl::StrCat("tensor ", t, " is ", got.name, " [", absl::StrJoin(got.shape, ","), "], the reference's ",
                          want.name, " [", absl::StrJoin(want.shape, ","), "]");
    }
    if (got.u64 != want.u64) return absl::StrCat(want.name, ": the ids differ from the reference run's");
    size_t differ = 0;
    for (size_t i = 0; i < std::min(got.data.size(), want.data.size()); ++i) {
      differ += FloatBits(got.data[i]) != FloatBits(want.data[i]) ? 1 : 0;
    }
    if (differ > 0 || got.data.size() != want.data.size()) {
      return absl::StrCat(want.name, ": ", differ, " of ", want.data.size(), " values differ from the reference run's");
    }
  }
  return "";
}

}  // namespace

v1::JobSpec ChaosJobSpec(bool click) {
  v1::JobSpec spec;
  if (click) {
    // tests/click_job.h's FM job, longer in steps and trained in lockstep;
    // replicated as the cluster's default says.
    spec = ClickSpec(v1::ModelSpec::FM, /*fm_dim=*/2);
    spec.set_name("chaos-click");
    spec.mutable_data()->mutable_synthetic_ctr()->set_examples(ChaosExamples(true));
    spec.mutable_data()->mutable_synthetic_ctr()->set_vocabulary(200);
    spec.mutable_data()->set_batch_size(16);
    spec.set_mode(v1::BSP);
    spec.clear_replicas();
    return spec;
  }
  spec.set_name("chaos");
  spec.mutable_model()->set_kind(v1::ModelSpec::MLP);
  spec.mutable_model()->add_hidden_sizes(256);
  spec.mutable_model()->set_activation(v1::TANH);
  v1::DataSpec* data = spec.mutable_data();
  data->set_dataset(v1::DataSpec::SYNTHETIC);
  data->set_synthetic_examples(kExamples);
  data->set_synthetic_features(20);
  data->set_synthetic_classes(4);
  data->set_batch_size(8);
  data->set_epochs(12);
  data->set_shuffle_seed(7);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_lr(0.05f);
  spec.mutable_optimizer()->set_momentum(0.9f);
  spec.set_mode(v1::BSP);
  spec.set_num_workers(2);
  spec.set_seed(3);
  return spec;
}

absl::StatusOr<ChaosResult> RunChaosSchedule(const ChaosOptions& options) {
  LocalCluster::Options cluster_options;
  cluster_options.dir = options.dir;
  cluster_options.servers = options.servers;
  cluster_options.workers = options.workers;
  cluster_options.replicas = options.replicas;
  cluster_options.scheduler_flags = {"--lease-ms=1500", "--heartbeat-ms=200", "--chunk-bytes=4096"};
  ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> cluster, LocalCluster::Start(cluster_options));
  Runner runner(options, std::move(cluster));

  const v1::JobSpec spec = ChaosJobSpec(options.click);
  ASSIGN_OR_RETURN(std::string reference_id, runner.Submit(spec));
  ASSIGN_OR_RETURN(v1::JobStatus reference, runner.WaitFor(reference_id, [](const v1::JobStatus&) { return false; }));
  if (reference.state() != v1::SUCCEEDED) {
    return absl::InternalError(absl::StrCat("the undisturbed reference run ended ",
                                            v1::JobState_Name(reference.state()), ": ", reference.reason()));
  }
  ASSIGN_OR_RETURN(std::vector<SafetensorsTensor> expected, FinalParameters(runner.scheduler(), reference_id));

  ChaosResult result;
  ASSIGN_OR_RETURN(std::string job_id, runner.Submit(spec));
  ASSIGN_OR_RETURN(v1::JobStatus job, runner.WaitForStep(job_id, 20));
  const int64_t total = std::max<int64_t>(job.progress().total_steps(), 1);
  for (int i = 0; i < options.faults && !Terminal(job.state()); ++i) {
    // Faults spread over the job, each once the last one healed.
    ASSIGN_OR_RETURN(job, runner.WaitForReplicas(job_id));
    ASSIGN_OR_RETURN(job, runner.WaitForStep(job_id, total * (i + 1) / (options.faults + 2)));
    if (Terminal(job.state())) break;
    ChaosFault fault;
    fault.step = job.progress().step();
    const absl::Time hit = absl::Now();
    ASSIGN_OR_RETURN(fault.what, runner.Inject(job));
    ASSIGN_OR_RETURN(job, runner.WaitForStep(job_id, fault.step + 5));
    fault.stall = absl::Now() - hit;
    result.faults.push_back(std::move(fault));
  }
  ASSIGN_OR_RETURN(result.job, runner.WaitFor(job_id, [](const v1::JobStatus&) { return false; }));
  result.max_rss_bytes = runner.MaxRss();
  if (result.job.state() != v1::SUCCEEDED) return result;
  ASSIGN_OR_RETURN(std::vector<SafetensorsTensor> actual, FinalParameters(runner.scheduler(), job_id));
  result.mismatch = Difference(expected, actual);
  result.bit_identical = result.mismatch.empty();
  const ExampleAudit want = ExpectedExampleAudit(result.job.spec(), ChaosExamples(options.click));
  ASSIGN_OR_RETURN(std::vector<ChunkAudit> audits, ReadChunkAudits(result.job));
  result.audit_exact = !audits.empty();
  for (const ChunkAudit& chunk : audits) {
    if (chunk.audit.examples != want.examples || chunk.audit.digest != want.digest) {
      result.audit_exact = false;
      absl::StrAppend(&result.mismatch, result.mismatch.empty() ? "" : "; ", "chunk ", chunk.chunk_id,
                      " holds the audit of ", chunk.audit.examples, " examples, expected ", want.examples);
      break;
    }
  }
  return result;
}

}  // namespace fulcrum
