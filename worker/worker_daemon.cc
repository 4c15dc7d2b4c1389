#include "worker/worker_daemon.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include <functional>
#include <new>

#include "absl/strings/str_cat.h"
#include "common/memory_budget.h"
#include "common/logging.h"
#include "worker/parameter_client.h"
#include "worker/trainer.h"
#include "common/sync.h"

namespace fulcrum {

WorkerDaemon::WorkerDaemon(kernels::Backend* backend, Metrics metrics, TransferOptions transfer, WorkerLimits limits)
    : backend_(backend), metrics_(metrics), transfer_(transfer), limits_(std::move(limits)) {}

void WorkerDaemon::OnHeartbeat(const v1::HeartbeatResponse& response) {
  {
    MutexLock lock(&mu_);
    latest_ = response.assignment();
    changed_.SignalAll();
  }
  // A newer shard map (a failover) or the job's end: the requests of the
  // client routing by the old map are cancelled at once.
  const v1::Assignment& assignment = response.assignment();
  MutexLock lock(&watch_mu_);
  if (watched_ == nullptr) return;
  const bool moved = assignment.job_id() == watched_job_ && assignment.phase() == v1::Assignment::TRAIN &&
                     assignment.shard_map().version() > watched_->map_version();
  if (moved || assignment.job_id() != watched_job_) watched_->Supersede();
}

v1::Assignment WorkerDaemon::Latest() const {
  MutexLock lock(&mu_);
  return latest_;
}

v1::Assignment WorkerDaemon::WaitForChange(const std::string& job_id, int64_t epoch, absl::Duration timeout) {
  MutexLock lock(&mu_);
  auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || latest_.job_id() != job_id || latest_.membership_epoch() != epoch;
  };
  absl::Time deadline = absl::Now() + timeout;
  while (!changed()) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return latest_;
}

std::string WorkerDaemon::CurrentJob() const {
  MutexLock lock(&mu_);
  return current_job_;
}

void WorkerDaemon::Stop() {
  MutexLock lock(&mu_);
  stopping_ = true;
  changed_.SignalAll();
}

bool WorkerDaemon::Withdrawn(const std::string& job_id) const {
  MutexLock lock(&mu_);
  return stopping_ || latest_.job_id() != job_id || latest_.phase() == v1::Assignment::STOP ||
         latest_.rank() != current_rank_;
}

bool WorkerDaemon::WaitForNewJob(v1::Assignment* assignment) {
  MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // A new job, or the same job again under a new rank (this worker was
    // taken out of it, e.g. after a missed lease, and then added back).
    bool fresh = latest_.job_id() != last_job_ || latest_.rank() != last_rank_;
    return stopping_ || (!latest_.job_id().empty() && fresh &&
                         (latest_.phase() == v1::Assignment::LOAD ||
                          latest_.phase() == v1::Assignment::TRAIN));
  };
  while (!ready()) mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(50));
  if (stopping_) return false;
  *assignment = latest_;
  current_job_ = last_job_ = latest_.job_id();
  current_rank_ = last_rank_ = latest_.rank();
  return true;
}

bool WorkerDaemon::WaitForTrain(const std::string& job_id, v1::Assignment* assignment) {
  MutexLock lock(&mu_);
  while (!stopping_ && latest_.job_id() == job_id && latest_.rank() == current_rank_ &&
         latest_.phase() == v1::Assignment::LOAD) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(50));
  }
  if (stopping_ || latest_.job_id() != job_id || latest_.rank() != current_rank_ ||
      latest_.phase() != v1::Assignment::TRAIN) {
    return false;
  }
  *assignment = latest_;
  return true;
}

void WorkerDaemon::Run(MembershipClient* membership) {
  v1::Assignment assignment;
  while (WaitForNewJob(&assignment)) {
    RunJob(membership, assignment);
    ReleaseFreedMemory();  // the job's buffers are gone
    MutexLock lock(&mu_);
    current_job_.clear();
  }
}

void WorkerDaemon::RunJob(MembershipClient* membership, v1::Assignment assignment) {
  const std::string job_id = assignment.job_id();
  auto report = [membership, job_id, rank = assignment.rank()](v1::WorkReport r) {
    r.set_job_id(job_id);
    r.set_rank(rank);  // a report of a run that is over is refused, not taken as this one's
    absl::Status status = membership->Report(std::move(r));
    if (!status.ok()) FLOG(WARNING) << "report for job " << job_id << " failed: " << status;
  };
  TrainerHooks hooks;
  hooks.report = report;
  hooks.should_stop = [this, job_id] { return Withdrawn(job_id); };
  hooks.latest_assignment = [this] { return Latest(); };
  hooks.wait_for_change = [this, job_id](int64_t epoch, absl::Duration timeout) {
    return WaitForChange(job_id, epoch, timeout);
  };
  hooks.expect_change = [membership] { membership->Hurry(); };
  hooks.watch_client = [this](ParameterClient* client, const std::string& job) {
    MutexLock lock(&watch_mu_);
    watched_ = client;
    watched_job_ = job;
  };
  hooks.observe_step = [this](double seconds, int64_t examples) {
    if (metrics_.step_seconds) metrics_.step_seconds->Observe(seconds);
    if (metrics_.steps_total) metrics_.steps_total->Increment();
    if (metrics_.examples_total) metrics_.examples_total->Increment(static_cast<double>(examples));
  };
  hooks.observe_compute = [this](double seconds, int64_t memory) {
    if (metrics_.compute_seconds) metrics_.compute_seconds->Observe(seconds);
    if (metrics_.device_memory_bytes) metrics_.device_memory_bytes->Set(static_cast<double>(memory));
  };
  hooks.observe_pull = [this](double seconds) {
    if (metrics_.pull_wait_seconds) metrics_.pull_wait_seconds->Observe(seconds);
  };
  hooks.observe_staleness = [this](int64_t steps) {
    if (metrics_.staleness_steps) metrics_.staleness_steps->Observe(static_cast<double>(steps));
  };
  hooks.observe_prefetch = [this](bool used) {
    prometheus::Counter* counter = used ? metrics_.prefetches_used : metrics_.prefetches_missed;
    if (counter) counter->Increment();
  };
  Trainer trainer(membership->member_id(), backend_, hooks, transfer_, limits_);
  FLOG(INFO) << "job " << job_id << ": rank " << assignment.rank() << " of " << assignment.world_size();
  auto fail = [&](const absl::Status& status) {
    if (Withdrawn(job_id)) return;  // the job ended elsewhere; nothing to report
    FLOG(ERROR) << "job " << job_id << " failed: " << status;
    v1::WorkReport r;
    r.set_kind(v1::WorkReport::FAILED);
    r.set_reason(std::string(status.message()));
    report(r);
  };
  // An allocation that fails (a job bigger than this machine) fails the job,
  // not the process.
  auto guarded = [&](const char* what, const std::function<absl::Status()>& step) {
    try {
      return step();
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(absl::StrCat("out of memory while ", what, " on ", membership->member_id()));
    }
  };
  if (absl::Status status = guarded("loading data", [&] { return trainer.Load(assignment); }); !status.ok()) {
    return fail(status);
  }
  report(trainer.ReadyReport());
  if (!WaitForTrain(job_id, &assignment)) {
    FLOG(INFO) << "job " << job_id << " withdrawn before training";
    return;
  }
  if (absl::Status status = guarded("training", [&] { return trainer.Train(assignment); }); !status.ok()) {
    return fail(status);
  }
  FLOG(INFO) << "job " << job_id << " ended";
}

}  // namespace fulcrum
