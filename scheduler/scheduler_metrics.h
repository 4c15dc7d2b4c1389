// The scheduler's Prometheus metrics: cluster gauges and, for each running
// job (a bounded set: jobs end), its progress, membership, failovers and
// checkpoints. Refreshed from JobManager snapshots (Update), so the manager
// itself knows nothing of Prometheus.
#ifndef FULCRUM_SCHEDULER_SCHEDULER_METRICS_H_
#define FULCRUM_SCHEDULER_SCHEDULER_METRICS_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "absl/time/time.h"
#include "fulcrum/v1/cluster.pb.h"
#include "fulcrum/v1/job.pb.h"

namespace fulcrum {

class SchedulerMetrics {
 public:
  explicit SchedulerMetrics(prometheus::Registry* registry);

  // Sets every gauge from the jobs and members now; `now` dates the last
  // step change of each job (for "job stuck" alerts). Not thread-safe: one
  // caller (the scheduler's metrics thread).
  void Update(const std::vector<v1::JobStatus>& jobs, const std::vector<v1::MemberInfo>& members, absl::Time now);

 private:
  struct Tracked {
    int64_t step = -1;
    absl::Time step_changed;
  };
  void Remove(const std::string& job_id);

  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Gauge>& members_;
  std::vector<prometheus::Family<prometheus::Gauge>*> per_job_;  // every family labelled by job
  prometheus::Family<prometheus::Gauge>& step_;
  prometheus::Family<prometheus::Gauge>& total_steps_;
  prometheus::Family<prometheus::Gauge>& epoch_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& accuracy_;
  prometheus::Family<prometheus::Gauge>& auc_;
  prometheus::Family<prometheus::Gauge>& test_loss_;
  prometheus::Family<prometheus::Gauge>& samples_;
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Family<prometheus::Gauge>& membership_epoch_;
  prometheus::Family<prometheus::Gauge>& map_version_;
  prometheus::Family<prometheus::Gauge>& failovers_;
  prometheus::Family<prometheus::Gauge>& restores_;
  prometheus::Family<prometheus::Gauge>& staleness_;
  prometheus::Family<prometheus::Gauge>& last_step_time_;
  prometheus::Family<prometheus::Gauge>& checkpoint_time_;
  prometheus::Family<prometheus::Gauge>& checkpoint_seconds_;
  prometheus::Family<prometheus::Gauge>& checkpoint_bytes_;
  prometheus::Family<prometheus::Gauge>& checkpoints_failed_;
  prometheus::Family<prometheus::Gauge>& stragglers_;
  prometheus::Family<prometheus::Gauge>& worker_step_seconds_;
  std::map<std::string, std::set<std::string>> ranks_;  // job -> rank labels with series
  std::map<std::string, Tracked> tracked_;  // running jobs with series
};

}  // namespace fulcrum

#endif  // FULCRUM_SCHEDULER_SCHEDULER_METRICS_H_
