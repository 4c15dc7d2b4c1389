#include "scheduler/scheduler_metrics.h"

#include <cmath>

namespace fulcrum {
namespace {

prometheus::Family<prometheus::Gauge>& Gauge(prometheus::Registry* registry, const std::string& name,
                                             const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(*registry);
}

double Seconds(int64_t unix_ms) { return static_cast<double>(unix_ms) / 1000.0; }

}  // namespace

SchedulerMetrics::SchedulerMetrics(prometheus::Registry* registry)
    : jobs_(Gauge(registry, "fulcrum_scheduler_jobs", "Jobs known to the scheduler, by state")),
      members_(Gauge(registry, "fulcrum_scheduler_members", "Live members (servers and workers) holding a lease, by member_role")),
      step_(Gauge(registry, "fulcrum_job_step", "Global steps a running job has completed")),
      total_steps_(Gauge(registry, "fulcrum_job_total_steps", "Global steps a running job will run")),
      epoch_(Gauge(registry, "fulcrum_job_epoch", "Epoch (1-based) a running job is in")),
      loss_(Gauge(registry, "fulcrum_job_train_loss", "Mean training loss over the workers' latest reports")),
      accuracy_(Gauge(registry, "fulcrum_job_test_accuracy_ratio", "Test accuracy at the latest evaluation (0..1)")),
      auc_(Gauge(registry, "fulcrum_job_test_auc", "Click models: the test set's ROC AUC at the latest evaluation")),
      test_loss_(Gauge(registry, "fulcrum_job_test_loss", "The test set's mean loss at the latest evaluation")),
      samples_(Gauge(registry, "fulcrum_job_samples_per_second", "Training examples per second, over the workers")),
      workers_(Gauge(registry, "fulcrum_job_workers", "Workers in a running job")),
      membership_epoch_(Gauge(registry, "fulcrum_job_membership_epoch", "Membership epoch of a running job")),
      map_version_(Gauge(registry, "fulcrum_job_shard_map_version", "Shard map version of a running job")),
      failovers_(Gauge(registry, "fulcrum_job_failovers", "Shard failovers of a running job so far")),
      restores_(Gauge(registry, "fulcrum_job_restores", "Restarts of a running job from a checkpoint so far")),
      staleness_(Gauge(registry, "fulcrum_job_max_staleness_steps",
                       "SSP: the largest lead over the slowest partition a worker computed at")),
      last_step_time_(Gauge(registry, "fulcrum_job_last_step_timestamp_seconds",
                            "When the running job's step last advanced (Unix seconds)")),
      checkpoint_time_(Gauge(registry, "fulcrum_job_last_checkpoint_timestamp_seconds",
                             "When the job's latest complete checkpoint was taken (Unix seconds); jobs with "
                             "periodic checkpoints only")),
      checkpoint_seconds_(Gauge(registry, "fulcrum_job_last_checkpoint_duration_seconds",
                                "How long the latest complete checkpoint took, cut to commit")),
      checkpoint_bytes_(Gauge(registry, "fulcrum_job_last_checkpoint_bytes",
                              "Bytes the latest complete checkpoint stored, over all replicas")),
      checkpoints_failed_(Gauge(registry, "fulcrum_job_checkpoints_failed", "Failed checkpoints listed for the job")),
      stragglers_(Gauge(registry, "fulcrum_job_stragglers", "Workers of the job flagged as stragglers")),
      worker_step_seconds_(Gauge(registry, "fulcrum_job_worker_step_seconds",
                                 "Mean time per partition step of each worker of a running job, by rank")) {
  per_job_ = {&step_,     &total_steps_,      &epoch_,       &loss_,      &accuracy_, &auc_,      &test_loss_,
              &samples_,  &workers_,          &membership_epoch_, &map_version_, &failovers_, &restores_, &staleness_,
              &last_step_time_, &checkpoint_time_, &checkpoint_seconds_, &checkpoint_bytes_, &checkpoints_failed_, &stragglers_};
}

void SchedulerMetrics::Remove(const std::string& job_id) {
  for (const std::string& rank : ranks_[job_id]) {
    worker_step_seconds_.Remove(&worker_step_seconds_.Add({{"job_id", job_id}, {"rank", rank}}));
  }
  ranks_.erase(job_id);
  for (prometheus::Family<prometheus::Gauge>* family : per_job_) {
    // Family::Remove takes the metric; Add returns the existing one.
    family->Remove(&family->Add({{"job_id", job_id}}));
  }
}

void SchedulerMetrics::Update(const std::vector<v1::JobStatus>& jobs, const std::vector<v1::MemberInfo>& members,
                              absl::Time now) {
  std::map<std::string, int> by_state, by_role;
  for (int s = v1::PENDING; s <= v1::CANCELLED; ++s) by_state[v1::JobState_Name(static_cast<v1::JobState>(s))] = 0;
  by_role["SERVER"] = by_role["WORKER"] = 0;
  for (const auto& member : members) ++by_role[v1::Role_Name(member.role())];
  for (const auto& [role, n] : by_role) members_.Add({{"member_role", role}}).Set(n);

  std::set<std::string> running;
  for (const v1::JobStatus& job : jobs) {
    ++by_state[v1::JobState_Name(job.state())];
    if (job.state() != v1::RUNNING) continue;
    const std::string& id = job.job_id();
    running.insert(id);
    const std::map<std::string, std::string> labels = {{"job_id", id}};
    const v1::JobProgress& p = job.progress();
    Tracked& tracked = tracked_[id];
    if (p.step() != tracked.step) {
      tracked.step = p.step();
      tracked.step_changed = now;
    }
    step_.Add(labels).Set(static_cast<double>(p.step()));
    total_steps_.Add(labels).Set(static_cast<double>(p.total_steps()));
    epoch_.Add(labels).Set(p.epoch());
    loss_.Add(labels).Set(p.train_loss());
    // NaN until the first evaluation.
    accuracy_.Add(labels).Set(p.test_accuracy() >= 0 ? p.test_accuracy() : std::nan(""));
    if (p.has_test_auc()) auc_.Add(labels).Set(p.test_auc());
    if (p.has_test_loss()) test_loss_.Add(labels).Set(p.test_loss());
    samples_.Add(labels).Set(p.samples_per_second());
    workers_.Add(labels).Set(job.workers_size());
    membership_epoch_.Add(labels).Set(static_cast<double>(job.membership_epoch()));
    map_version_.Add(labels).Set(static_cast<double>(job.shard_map().version()));
    failovers_.Add(labels).Set(static_cast<double>(job.failovers()));
    restores_.Add(labels).Set(static_cast<double>(job.restores()));
    staleness_.Add(labels).Set(static_cast<double>(p.max_staleness_seen()));
    last_step_time_.Add(labels).Set(absl::ToDoubleSeconds(tracked.step_changed - absl::UnixEpoch()));
    const v1::CheckpointSpec& policy = job.spec().checkpoint();
    const bool periodic = policy.every_steps() > 0 || policy.every_seconds() > 0;
    int failed = 0;
    const v1::CheckpointInfo* latest = nullptr;
    for (const v1::CheckpointInfo& c : job.checkpoints()) {
      if (c.state() == v1::CheckpointInfo::FAILED) ++failed;
      if (c.state() == v1::CheckpointInfo::COMPLETE) latest = &c;
    }
    checkpoints_failed_.Add(labels).Set(failed);
    int stragglers = 0;
    std::set<std::string>& ranks = ranks_[id];
    std::set<std::string> seen;
    for (const v1::WorkerAssignmentInfo& w : job.workers()) {
      stragglers += w.straggler() ? 1 : 0;
      const std::string rank = std::to_string(w.rank());
      seen.insert(rank);
      ranks.insert(rank);
      worker_step_seconds_.Add({{"job_id", id}, {"rank", rank}}).Set(w.step_seconds());
    }
    for (auto it = ranks.begin(); it != ranks.end();) {  // workers gone from the job
      if (seen.count(*it) > 0) {
        ++it;
        continue;
      }
      worker_step_seconds_.Remove(&worker_step_seconds_.Add({{"job_id", id}, {"rank", *it}}));
      it = ranks.erase(it);
    }
    stragglers_.Add(labels).Set(stragglers);
    if (periodic) {
      // Until the first one completes, the age counts from the job's start.
      checkpoint_time_.Add(labels).Set(Seconds(latest != nullptr ? latest->time_unix_ms() : job.start_time_unix_ms()));
    }
    if (latest != nullptr) {
      checkpoint_seconds_.Add(labels).Set(latest->duration_seconds());
      checkpoint_bytes_.Add(labels).Set(static_cast<double>(latest->bytes()));
    }
  }
  for (auto it = tracked_.begin(); it != tracked_.end();) {
    if (running.count(it->first) > 0) {
      ++it;
      continue;
    }
    Remove(it->first);
    it = tracked_.erase(it);
  }
  for (const auto& [state, n] : by_state) jobs_.Add({{"state", state}}).Set(n);
}

}  // namespace fulcrum
