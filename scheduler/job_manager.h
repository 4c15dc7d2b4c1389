// The scheduler's core: jobs, membership (leases), assignments and shard maps.
// No gRPC here: scheduler/services.cc translates RPCs onto this class, and the
// servers are reached through the ServerControl interface.
//
// Life of a job: Submit -> PENDING until numWorkers idle workers and a server
// are live -> RUNNING/loading (workers get a LOAD assignment, load their data
// and report READY) -> RUNNING/training (the scheduler builds the shard map,
// sets the chunks up on the servers and hands workers a TRAIN assignment) ->
// SUCCEEDED when every worker reported DONE, FAILED on a worker's failure
// report or a lost lease, CANCELLED by CancelJob.
#ifndef FULCRUM_SCHEDULER_JOB_MANAGER_H_
#define FULCRUM_SCHEDULER_JOB_MANAGER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "fulcrum/v1/cluster.pb.h"
#include "fulcrum/v1/job.pb.h"
#include "common/kv_store.h"
#include "common/thread_pool.h"
#include "fulcrum/v1/parameter.pb.h"
#include "fulcrum/v1/scheduler_state.pb.h"
#include "common/sync.h"
#include "scheduler/checkpoint_coordinator.h"
#include "scheduler/membership.h"
#include "scheduler/server_control.h"

namespace fulcrum {

struct SchedulerOptions {
  absl::Duration lease = absl::Milliseconds(1800);
  absl::Duration heartbeat_interval = absl::Milliseconds(300);
  int64_t chunk_elems = 65536;  // 256 KiB of float32
  int32_t default_replicas = 1;  // for jobs whose spec sets none
  // A server joining the cluster becomes a new shard of running jobs with
  // numShards 0 (about 1/N of the chunks move to it).
  bool grow_shards = true;
  absl::Duration tick = absl::Milliseconds(100);
  // A worker whose step time stays (three reports in a row) above this many
  // times the median of the other workers' is flagged as a straggler.
  double straggler_factor = 2.0;
  // Threads calling the servers (setups, reconfigurations, drops) for the
  // background tick, so that a stopped or slow server never holds the tick
  // (lease expiry, scheduling). 0: the tick makes the calls itself before it
  // returns (what tests that drive Tick() by hand want).
  int server_call_threads = 0;
  // Queue: a job at the head that cannot start because others hold the
  // workers or servers keeps later jobs waiting at most this long; then jobs
  // behind it that fit may start first. A job that cannot run on the cluster
  // as it is (more workers than registered) never holds others up.
  absl::Duration max_queue_wait = absl::Seconds(60);
  // Retention: the servers keep the parameters of the newest this many
  // finished jobs, each for at most retain_finished_for; the scheduler keeps
  // the records (status, events, checkpoints) of at most max_finished_records.
  int retain_finished_jobs = 100;
  absl::Duration retain_finished_for = absl::Hours(24);
  int max_finished_records = 1000;
  // Bounds on what clients can make the scheduler hold: jobs not ended
  // (pending or running; Submit past it is RESOURCE_EXHAUSTED) and members
  // (a registration under a new id past it is RESOURCE_EXHAUSTED; a member
  // that stops heartbeating frees its place when its lease runs out).
  int max_active_jobs = 1000;
  int max_members = 10000;
  // The most bytes of job summaries one ListJobs page carries (messages are
  // at most 8 MiB).
  int64_t list_page_bytes = 4 << 20;
};

class JobManager {
 public:
  using Clock = std::function<absl::Time()>;
  // `servers` (and `store`, if given) must outlive the manager. `clock`
  // defaults to absl::Now. With a store, every job's state is written to it
  // and Recover() reloads it after a restart.
  JobManager(SchedulerOptions options, ServerControl* servers, Clock clock = nullptr, KvStore* store = nullptr);

  // Reloads jobs from the store (call once, before Start). Servers and
  // workers of running jobs get two leases (from Start) to register again; a
  // worker that does not is treated as lost, a server as failed.
  absl::Status Recover();
  ~JobManager();  // calls Stop()

  // Starts / stops the background thread that expires leases, schedules jobs
  // and talks to the servers.
  void Start();
  void Stop();

  // --- JobService ---
  // INVALID_ARGUMENT naming the field for a bad spec.
  // `resume_from`: "" or "JOB[/CHECKPOINT]" (see SubmitJobRequest).
  // NOT_FOUND / FAILED_PRECONDITION when that checkpoint is unknown or unusable.
  absl::StatusOr<v1::JobStatus> Submit(v1::JobSpec spec, const std::string& resume_from = "");
  // NOT_FOUND for an unknown id.
  absl::StatusOr<v1::JobStatus> Get(const std::string& job_id) const;
  // Every job's summary, in id order: its status without history, loss
  // curve and events, and of the shard map its version alone.
  std::vector<v1::JobStatus> List() const;
  // One page of them for ListJobs (see ListJobsRequest): at most page_size
  // (0: no count) and never past SchedulerOptions::list_page_bytes (but one
  // job). INVALID_ARGUMENT for a page size outside [0, kMaxListPageSize] or
  // a token no page could have given.
  static constexpr int kMaxListPageSize = 1000;
  absl::StatusOr<v1::ListJobsResponse> ListPage(const v1::ListJobsRequest& request) const;
  // FAILED_PRECONDITION if the job already ended.
  absl::StatusOr<v1::JobStatus> Cancel(const std::string& job_id);
  // Waits until the job's status changes past `*version` (or `timeout`
  // passes), then returns the status and updates *version.
  absl::StatusOr<v1::JobStatus> WaitForChange(const std::string& job_id, int64_t* version,
                                              absl::Duration timeout) const;

  // Takes a checkpoint of a training job now and waits (up to `timeout`)
  // until it is complete or failed. FAILED_PRECONDITION if the job is not
  // training. Needs Start() (the checkpoint thread) or RunQueuedCheckpoints().
  absl::StatusOr<v1::CheckpointInfo> CheckpointNow(const std::string& job_id, absl::Duration timeout);
  // A committed checkpoint's manifest; id 0: the latest complete one.
  absl::StatusOr<v1::CheckpointManifest> GetCheckpoint(const std::string& job_id, int64_t checkpoint_id) const;
  // Runs the checkpoints queued so far on the calling thread (tests).
  void RunQueuedCheckpoints();

  // --- ClusterService ---
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  // NOT_FOUND when the member is unknown (lease expired): register again.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  absl::Status Report(const v1::WorkReport& report);
  std::vector<v1::MemberInfo> Members() const;
  // A server asks to leave: its shards move to other servers (a backup is
  // promoted, or one is made first), then heartbeats answer drained.
  // `incarnation`: the process asking (RegisterRequest.incarnation; 0: any).
  absl::Status Leave(const std::string& member_id, uint64_t incarnation = 0);

  // One pass of lease expiry, scheduling and server calls (the background
  // thread runs it every options.tick; tests may call it directly).
  void Tick();

 private:
  struct Job;
  using Action = std::function<void()>;

  static bool IsTerminal(v1::JobState state);
  absl::StatusOr<v1::JobStatus> DoSubmit(v1::JobSpec spec, const std::string& resume_from);
  absl::StatusOr<v1::JobStatus> DoCancel(const std::string& job_id);
  absl::Status DoReport(const v1::WorkReport& report);
  // Membership of running jobs (job_manager_membership.cc).
  void GrowJobs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddWorker(Job* job, Member* member) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveWorker(Job* job, const std::string& worker_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Rebalance(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Below minWorkers ready workers a training job pauses (assignments carry
  // no partitions) until enough are back; UpdatePause keeps its reason and
  // events in step.
  bool Paused(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdatePause(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddEvent(Job* job, const std::string& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's status as clients see it: the stored part (spec, state,
  // progress, history, events, checkpoints) with its workers, shards and
  // shard map rendered from the job's current state.
  v1::JobStatus Render(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues DropJob for the jobs a (re)registering server holds but must not,
  // and Reconfigure with the current map for those it still serves.
  void ReconcileCopies(const std::string& server_id, const v1::RegisterRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A server of the job is gone: promote backups of the shards it led, drop
  // it from the others, bump the map version (job_manager_placement.cc).
  void FailOver(Job* job, const std::string& server_id, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds live spare servers to replica groups short of the job's replicas:
  // the new backup copies the shard from its primary, then joins.
  void ReplenishReplicas() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Jobs with one shard per live server (numShards 0) take a new server as a
  // new shard: consistent hashing moves about 1/N of the chunks to it, copied
  // from their primaries while the workers keep training. Jobs with sparse
  // tables are laid out again through a checkpoint (ReshardThroughCheckpoint).
  void GrowShards() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job with tables takes `newcomer` as a new shard by taking a checkpoint
  // and, once it is complete, restarting from it over every live server: the
  // restore that already moves tables onto another number of servers.
  void ReshardThroughCheckpoint(Job* job, const Member& newcomer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DrainServers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Drained(const std::string& server_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Handovers (a server copying chunks to join a job, job_manager_placement.cc):
  // starts one, queues its copy from the replicas that hold the chunks now,
  // takes the copy's result, retries failed copies and, when the server
  // cannot take the chunks, puts the map back as it was before.
  void StartHandover(Job* job, v1::HandoverRecord handover) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueHandoverCopy(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The copy's outcome; the map to activate the newcomer with when it now
  // leads a new shard (SetupJobRequest.await_activation).
  std::optional<v1::ShardMap> FinishHandover(const std::string& job_id, const std::string& server_id,
                                             const std::string& address, int64_t copy_version,
                                             const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  void RetryHandovers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new shard's activation: its answer (done, or retried in 500 ms), and
  // the ticks' resending of the unanswered ones (Job::activations).
  void ActivationAnswered(const std::string& job_id, const std::string& server_id, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);
  void RetryActivations() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts the map back as it was before the handover. `newcomer_at_fault`:
  // the newcomer failed (it is not asked again for a while); else another
  // replica did and the handover is simply started again later.
  void AbandonHandover(Job* job, const std::string& why, bool newcomer_at_fault = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shards whose replicas hold chunks of the job: those of the map's chunks
  // and, during a new shard's handover, those its chunks move from.
  std::set<int32_t> HoldingShards(const Job& job) const;
  // A SetupJob request for `server_id` with the job's spec, sizes and map (no chunks yet).
  v1::SetupJobRequest SetupRequestFor(const Job& job, const std::string& server_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Job* FindJob(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Touch(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndJob(Job* job, v1::JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLeases() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A tick long after the previous one (the scheduler was paused or
  // starved): the time it did not run does not count as members' silence.
  void CheckPause() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SchedulePending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartSetups() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  enum class StartOutcome { kStarted, kWaiting, kNotOnThisCluster };
  StartOutcome TryAssign(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Admission (scheduler/admission.h): whether a worker's budget takes the
  // job; the memory the jobs placed on a server (but `except`) claim of it:
  // each its estimate or, when more, what the server last said it holds.
  bool WorkerFits(const Member& worker, const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t ServerClaimed(const std::string& server_id, const Job* except = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Live servers with room for `per_server` bytes more.
  std::vector<Member*> ServersWithRoom(int64_t per_server) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The manifest of the checkpoint `job` restores from (null: none, or its
  // job is gone), and what the job claims on each of `servers` servers: its
  // estimate, or that checkpoint's share when more (admission.h).
  const v1::CheckpointManifest* RestoreManifest(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t PerServerClaim(const Job& job, int servers) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Retention of finished jobs (see SchedulerOptions).
  void ApplyRetention() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseParameters(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A finished job whose live parameters a server lost (it restarted
  // without them, or never came back after the scheduler restarted): the
  // rest are released too, and the job says why (its checkpoints remain).
  // An ended job's parameters without server `id` (it restarted without
  // them): each shard it held is read from another holder, a backup becoming
  // the primary where it was one (the map's version stays: the servers hold
  // that version). False, changing nothing, when a shard has no other holder.
  bool ForgetHolder(Job* job, const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LoseParameters(Job* job, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BuildShardPlan(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunSetup(const std::string& job_id, std::map<std::string, v1::SetupJobRequest> requests);
  void OnProgress(Job* job, const v1::WorkReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnDone(Job* job, const v1::WorkReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnEval(Job* job, const v1::WorkReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the job when spec.early_stopping says its evaluations stopped
  // improving.
  void MaybeStopEarly(Job* job, const v1::WorkReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Flags workers whose step time stays above straggler_factor times the
  // median of the others' (an event when one becomes a straggler).
  void FlagStragglers(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Assignment AssignmentFor(const Member& member) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();
  // Persistence (job_manager_state.cc).
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);
  static v1::JobRecord RecordOf(const Job& job);
  void CheckRecovery() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How long after a restart members of running jobs have to register again.
  absl::Duration RecoveryWindow() const { return options_.lease * 2; }
  // Checkpoints (job_manager_checkpoint.cc; taken by checkpoints_).
  // Starts the checkpoints that are due (everySteps / everySeconds).
  void ScheduleCheckpoints() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t QueueCheckpoint(Job* job, const std::string& trigger) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The coordinator's hooks: what a checkpoint starting now covers; its
  // outcome (the job's records, manifests kept, retention).
  absl::StatusOr<CheckpointPlan> PlanCheckpoint(const CheckpointTask& task) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<ExpiredCheckpoint> FinishCheckpoint(const CheckpointTask& task, const absl::Status& status,
                                                  const v1::CheckpointManifest& manifest, absl::Duration took)
      ABSL_LOCKS_EXCLUDED(mu_);
  v1::CheckpointInfo* FindCheckpointInfo(Job* job, int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restarts a job whose parameters are lost from its latest complete
  // checkpoint: back to pending, every worker re-added, a new placement set
  // up from the checkpoint. False when it has none.
  bool RestoreFromCheckpoint(Job* job, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the job's next setup start from `manifest`.
  void PlanRestore(Job* job, const v1::CheckpointManifest& manifest) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION when the checkpoint's tensors and chunks differ from the job's plan.
  static absl::Status CheckRestoreFits(const v1::ShardMap& plan, const v1::RestoreSource& restore,
                                       const v1::CheckpointManifest& manifest);
  // Whether a server holding each chunk of the checkpoint to restore is live
  // (their current addresses are then in the restore source). A job waits
  // for missing holders (a server restarting with its volume) for a while,
  // then tries an older checkpoint.
  bool RestoreSourcesLive(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A restore's setup failed: one that failed for a reason that passes
  // (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, CANCELLED: a server paused or
  // cut off) tries the same checkpoint again, up to 5 times in a row; a
  // checkpoint that did not verify is marked CORRUPT, one that could not be
  // read is skipped, and the previous one is tried. False when none is left,
  // and for RESOURCE_EXHAUSTED (an older checkpoint needs as much budget).
  bool RestoreFailed(Job* job, const absl::Status& failure) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SchedulerOptions options_;
  ServerControl* const servers_;
  const Clock clock_;

  mutable Mutex mu_;  // guards everything below
  mutable CondVar changed_;  // signalled whenever a job's status changes
  Membership members_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> pending_ ABSL_GUARDED_BY(mu_);  // PENDING jobs in submit order
  std::vector<Action> actions_ ABSL_GUARDED_BY(mu_);     // server calls to run unlocked
  int64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::unique_ptr<ThreadPool> server_calls_;  // with options.server_call_threads

  KvStore* const store_;
  std::set<std::string> dirty_ ABSL_GUARDED_BY(mu_);  // jobs to write to the store
  // The servers a committed new shard's chunks left, to be told the moves
  // are final (FreeMovedChunks) once the job's record of the commit is saved
  // (`record_version`, Job::version then): a scheduler restarted from an
  // older record would copy the chunks from them again. Sent by Flush.
  struct MovedChunksFree {
    std::string job_id;
    int64_t record_version = 0;
    std::vector<std::string> addresses;
    v1::ShardMap map;
  };
  std::vector<MovedChunksFree> frees_after_save_ ABSL_GUARDED_BY(mu_);
  // Runs server calls: on the pool, or here without one.
  void Run(std::vector<Action> actions) ABSL_LOCKS_EXCLUDED(mu_);
  // The FreeMovedChunks calls of `frees`, run.
  void SendFrees(std::vector<MovedChunksFree> frees) ABSL_LOCKS_EXCLUDED(mu_);
  std::set<std::string> forgotten_ ABSL_GUARDED_BY(mu_);  // job records to delete from the store
  std::optional<absl::Time> recovery_deadline_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> last_tick_ ABSL_GUARDED_BY(mu_);
  Mutex persist_mu_ ABSL_ACQUIRED_AFTER(mu_);  // serializes writes to the store
  std::map<std::string, int64_t> written_ ABSL_GUARDED_BY(persist_mu_);  // record version written per job
  // Its own thread and lock; its lock is taken after mu_ (Enqueue), never
  // held while it calls back.
  CheckpointCoordinator checkpoints_;
};

}  // namespace fulcrum

#endif  // FULCRUM_SCHEDULER_JOB_MANAGER_H_
