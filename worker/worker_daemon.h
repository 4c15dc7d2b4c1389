// The worker's control loop: waits for an assignment (delivered by heartbeat
// responses), loads, trains, reports, and goes idle again. Thread-safe:
// OnHeartbeat runs on the membership thread, Run on the caller's.
#ifndef FULCRUM_WORKER_WORKER_DAEMON_H_
#define FULCRUM_WORKER_WORKER_DAEMON_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/membership_client.h"
#include "kernels/backend.h"
#include "worker/trainer.h"
#include "common/sync.h"

namespace prometheus {
class Histogram;
class Counter;
class Gauge;
}  // namespace prometheus

namespace fulcrum {

class WorkerDaemon {
 public:
  // `backend` must outlive the daemon; metrics may be null.
  // The worker's Prometheus metrics (any may be null).
  struct Metrics {
    prometheus::Histogram* step_seconds = nullptr;       // compute + push of one partition step
    prometheus::Counter* steps_total = nullptr;
    prometheus::Counter* examples_total = nullptr;       // training examples computed
    prometheus::Histogram* pull_wait_seconds = nullptr;  // time in pulls (BSP: waiting for the step)
    prometheus::Histogram* staleness_steps = nullptr;    // ASP/SSP: lead over the slowest partition
    prometheus::Histogram* compute_seconds = nullptr;    // forward + backward of one partition step
    prometheus::Gauge* device_memory_bytes = nullptr;    // backend memory held (GPU)
    prometheus::Counter* prefetches_used = nullptr;      // BSP prefetched pulls used
    prometheus::Counter* prefetches_missed = nullptr;    // ... and pulled again (late, failed)
  };
  // `transfer`: see TransferOptions; `limits`: see WorkerLimits.
  WorkerDaemon(kernels::Backend* backend, Metrics metrics, TransferOptions transfer = {}, WorkerLimits limits = {});

  void OnHeartbeat(const v1::HeartbeatResponse& response);
  // The job being worked on ("" when idle), for heartbeats.
  std::string CurrentJob() const;
  // Runs until Stop(). `membership` sends the reports.
  void Run(MembershipClient* membership);
  void Stop();

 private:
  // Waits for a LOAD/TRAIN assignment of a job not yet worked on.
  bool WaitForNewJob(v1::Assignment* assignment);
  // Waits until `job_id` reaches TRAIN; false if it was withdrawn.
  bool WaitForTrain(const std::string& job_id, v1::Assignment* assignment);
  bool Withdrawn(const std::string& job_id) const;
  v1::Assignment Latest() const;
  v1::Assignment WaitForChange(const std::string& job_id, int64_t epoch, absl::Duration timeout);
  void RunJob(MembershipClient* membership, v1::Assignment assignment);

  kernels::Backend* backend_;
  const Metrics metrics_;
  const TransferOptions transfer_;
  const WorkerLimits limits_;
  mutable Mutex mu_;  // guards the members below
  CondVar changed_;   // signalled on every heartbeat and on Stop
  v1::Assignment latest_ ABSL_GUARDED_BY(mu_);
  std::string current_job_ ABSL_GUARDED_BY(mu_);
  std::string last_job_ ABSL_GUARDED_BY(mu_);
  int32_t current_rank_ ABSL_GUARDED_BY(mu_) = -1;  // rank in current_job_ (a re-join gets a new one)
  int32_t last_rank_ ABSL_GUARDED_BY(mu_) = -1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The parameter client of the job being trained (TrainerHooks::watch_client).
  Mutex watch_mu_ ABSL_ACQUIRED_AFTER(mu_);
  ParameterClient* watched_ ABSL_GUARDED_BY(watch_mu_) = nullptr;
  std::string watched_job_ ABSL_GUARDED_BY(watch_mu_);
};

}  // namespace fulcrum

#endif  // FULCRUM_WORKER_WORKER_DAEMON_H_
