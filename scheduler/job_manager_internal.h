// JobManager's private state, shared by its .cc files (split by concern:
// job_manager.cc the job API and reports, job_manager_membership.cc what
// members joining and leaving mean for jobs, job_manager_placement.cc shard
// maps, job_manager_checkpoint.cc checkpoints and restores,
// job_manager_state.cc persistence).
#ifndef FULCRUM_SCHEDULER_JOB_MANAGER_INTERNAL_H_
#define FULCRUM_SCHEDULER_JOB_MANAGER_INTERNAL_H_

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "fulcrum/v1/scheduler_state.pb.h"
#include "scheduler/admission.h"
#include "scheduler/job_manager.h"
#include "scheduler/loss_curve.h"

namespace fulcrum {

// The key of a job's record in the scheduler's store.
std::string JobRecordKey(const std::string& job_id);

// Whether a call to a server failed for a reason that passes (it was
// paused, restarted, cut off or slow): the same work is tried again (a
// handover's copy, a restore's setup) rather than given up.
inline bool FailedForNow(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) || absl::IsAborted(status) ||
         absl::IsCancelled(status);
}

// A worker taking part in a job.
struct JobWorker {
  std::string id;
  int32_t rank = 0;                  // order of joining the job
  bool ready = false;                // its data is loaded
  std::vector<int32_t> partitions;   // data partitions it computes (ready workers only)
  v1::WorkReport progress;           // its latest PROGRESS report
  int slow_reports = 0;              // reports in a row above the straggler bound
  bool straggler = false;
};

struct JobManager::Job {
  enum class Phase { kPending, kLoading, kSettingUp, kTraining, kEnded };

  v1::JobStatus status;
  JobClaims claims;            // of the processes' memory budgets
  int64_t server_claim = 0;    // bytes on each server it is placed on (set with its shard map)
  v1::EarlyStoppingState early_stopping;  // spec.early_stopping: the best evaluation and those since
  // The step of the evaluation the progress shows (-1: none yet): a report
  // of an earlier step arriving after it (from a worker that held the
  // evaluation before a rebalance) goes into the history only.
  int64_t shown_evaluation_step = -1;
  // Since when it waits for resources others hold (the queue's bound).
  std::optional<absl::Time> waiting_since;
  int64_t version = 0;  // bumped on every status change (WatchJob)
  absl::Time started;
  Phase phase = Phase::kPending;
  std::vector<JobWorker> workers;  // live workers, in joining order
  int32_t next_rank = 0;
  int32_t num_partitions = 0;
  std::vector<int64_t> partition_steps;  // ASP: steps done per partition (resume points)
  std::set<int32_t> done_partitions;
  bool have_data_info = false;
  bool bad_records_told = false;  // the event of records skipped as bad, once a job
  v1::WorkReport data_info;  // the first READY report: dataset sizes
  std::map<std::string, std::string> server_addresses;  // server id -> address
  v1::ShardMap shard_map;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  absl::Time last_history_point;
  // Builds status.loss_curve from the workers' step losses (while training).
  std::unique_ptr<LossCurveBuilder> loss_curve;
  // A server copying chunks to join (a new backup or a new shard), if any;
  // see HandoverRecord. One at a time per job.
  std::optional<v1::HandoverRecord> handover;
  bool handover_in_flight = false;  // its copy is running
  // New shards' leaders whose activation (the committed map, Reconfigure)
  // has not been acknowledged yet: sent again until it is, since a leader
  // never activated refuses its shard's writes for good.
  struct Activation {
    bool in_flight = false;
    absl::Time retry_at = absl::InfinitePast();
  };
  std::map<std::string, Activation> activations;  // by server id
  // Servers whose SetupJob copy for this job has not answered yet, also of a
  // handover undone meanwhile: none is given another handover before it
  // answers (two copies into one server's state at once could interleave).
  std::set<std::string> copying;
  int handover_attempts = 0;        // failed copies so far
  absl::Time handover_retry_at = absl::InfinitePast();
  // Servers whose handover was abandoned recently are not picked again
  // before the time given.
  std::map<std::string, absl::Time> handover_declined;
  // Checkpoints: committed manifests by id (COMPLETE or CORRUPT), the next
  // id, whether one is in flight and when/where the last one was started.
  std::map<int64_t, v1::CheckpointManifest> manifests;
  int64_t next_checkpoint_id = 1;
  bool checkpointing = false;
  // The last checkpoint that failed and how (CheckpointNow asks again after
  // a failure a failover or a finished handover may clear).
  int64_t last_failed_checkpoint = 0;
  absl::StatusCode last_failed_code = absl::StatusCode::kOk;
  // A job with tables growing onto a new server: the checkpoint it restarts
  // from once complete (0: none) and the server that joins.
  int64_t reshard_checkpoint = 0;
  std::string reshard_server;
  // Servers not asked to re-shard the job again before the time given (their
  // checkpoint failed, or they lack room). Kept apart from handover_declined:
  // such a server may still be the backup a shard is short of.
  std::map<std::string, absl::Time> reshard_declined;
  int reshard_failures = 0;  // re-shard checkpoints failed in a row (the wait doubles)
  // Set while the job restarts from a re-shard's checkpoint (until its setup
  // succeeds): a server that fails that setup is left out and the same
  // checkpoint tried again (restore_excluded; reshard_setup_failures bounds
  // the attempts).
  bool resharding = false;
  int reshard_setup_failures = 0;
  std::set<std::string> restore_excluded;
  absl::Time last_checkpoint_time;
  int64_t last_checkpoint_step = 0;
  // Set while the job's next setup starts from a checkpoint.
  std::optional<v1::RestoreSource> restore;
  std::optional<absl::Time> restore_waiting_since;  // for missing holders
  std::set<int64_t> restore_skipped;                // unreadable checkpoints, not tried again
  // Restore setups in a row that failed for a reason that passes (a server
  // paused or cut off): the same checkpoint is tried again, this many times.
  int restore_setup_retries = 0;
  // When the job last went back to a checkpoint of its own (it restarts on
  // fewer workers than numWorkers once they had two leases to come back).
  std::optional<absl::Time> restore_since;
  // Checkpoints that were being written when the scheduler stopped: never
  // committed; servers that register are told to delete their data.
  std::set<int64_t> orphaned_checkpoints;
};

}  // namespace fulcrum

#endif  // FULCRUM_SCHEDULER_JOB_MANAGER_INTERNAL_H_
