// JobManager: the job side of checkpoints (when they are due, their records
// in the job's status, the manifests kept, retention) and restores. Taking
// one is the CheckpointCoordinator's (scheduler/checkpoint_coordinator.h),
// on its own thread.
#include <algorithm>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/data_partition.h"
#include "common/logging.h"
#include "common/memory_budget.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/sync.h"
#include "common/table_spec.h"
#include "scheduler/admission.h"
#include "scheduler/job_manager_internal.h"

namespace fulcrum {
namespace {

constexpr int kMaxCheckpointInfos = 100;  // FAILED entries beyond this are forgotten
constexpr int kDefaultKeepLast = 3;
constexpr int64_t kNearEndSteps = 16;  // no periodic checkpoint this close to the end

}  // namespace

// ---------------------------------------------------------------------------
// Taking checkpoints
// ---------------------------------------------------------------------------

v1::CheckpointInfo* JobManager::FindCheckpointInfo(Job* job, int64_t id) {
  for (v1::CheckpointInfo& info : *job->status.mutable_checkpoints()) {
    if (info.id() == id) return &info;
  }
  return nullptr;
}

int64_t JobManager::QueueCheckpoint(Job* job, const std::string& trigger) {
  const int64_t id = job->next_checkpoint_id++;
  job->checkpointing = true;
  job->last_checkpoint_time = clock_();
  job->last_checkpoint_step = job->status.progress().step();
  v1::CheckpointInfo* info = job->status.add_checkpoints();
  info->set_id(id);
  info->set_step(job->status.progress().step());
  info->set_time_unix_ms(absl::ToUnixMillis(clock_()));
  info->set_state(v1::CheckpointInfo::WRITING);
  info->set_trigger(trigger);
  checkpoints_.Enqueue({job->status.job_id(), id});
  Touch(job);
  return id;
}

void JobManager::ScheduleCheckpoints() {
  for (auto& [job_id, job] : jobs_) {
    const v1::CheckpointSpec& policy = job->status.spec().checkpoint();
    if (job->phase != Job::Phase::kTraining || job->checkpointing || Paused(*job) || job->handover.has_value()) continue;
    // Not in the last steps: the job's final parameters are kept anyway.
    if (job->status.progress().step() + kNearEndSteps >= job->total_steps) continue;
    if (policy.every_steps() > 0 && job->status.progress().step() - job->last_checkpoint_step >= policy.every_steps()) {
      QueueCheckpoint(job.get(), "every_steps");
    } else if (policy.every_seconds() > 0 &&
               clock_() - job->last_checkpoint_time >= absl::Seconds(policy.every_seconds())) {
      QueueCheckpoint(job.get(), "every_seconds");
    }
  }
}

void JobManager::RunQueuedCheckpoints() { checkpoints_.RunQueued(); }

void JobManager::ReshardThroughCheckpoint(Job* job, const Member& newcomer) {
  // A table's buckets are not copied live to a new shard as dense chunks
  // are: a push's parts are numbered by the map, so a step half applied under
  // the old map could not be finished exactly once under the new one. A
  // checkpoint is a cut where no step is half applied; the restore lays the
  // tables out over every live server (keys keep their buckets, buckets get
  // new shards) and the workers go on from the cut.
  if (job->status.progress().step() + kNearEndSteps >= job->total_steps) return;  // not worth a restart
  // The newcomer must have room for its share, or the restart would place
  // the job on the same servers again (and the next tick ask once more).
  // A share is the estimate's, or of what the job's servers hold now when
  // more (its tables grew), laid over one server more.
  const int servers = job->shard_map.shards_size() + 1;
  int64_t held = 0;
  for (const auto& [id, address] : job->server_addresses) {
    if (const Member* server = members_.Find(id); server != nullptr) held += server->HeldBytes(job->status.job_id());
  }
  const int64_t share =
      std::max(PerServerBytes(job->claims, job->status.spec(), servers), (held + servers - 1) / servers);
  const int64_t claimed = ServerClaimed(newcomer.id, job);  // not counting what it holds of the job already
  if (newcomer.memory_budget > 0 && claimed + share > newcomer.memory_budget) {
    job->reshard_declined[newcomer.id] = clock_() + absl::Minutes(1);
    AddEvent(job, absl::StrCat(newcomer.id, " does not join: a share of the job takes ", FormatBytes(share), ", its ",
                               FormatBytes(newcomer.memory_budget), " memory budget has ",
                               FormatBytes(std::max<int64_t>(0, newcomer.memory_budget - claimed)), " free"));
    return;
  }
  job->reshard_checkpoint = QueueCheckpoint(job, "reshard");
  job->reshard_server = newcomer.id;
  AddEvent(job, absl::StrCat(newcomer.id, " joins: the job's tables move with checkpoint ", job->reshard_checkpoint,
                             ", then the job restarts from it on ", job->shard_map.shards_size() + 1, " servers"));
}

namespace {

// A failure that a failover (a dead or paused server's lease running out),
// a finished handover or the job moving on clears by itself.
// NOT_FOUND is a server restarted at once (a new process, without the job)
// before the scheduler saw it go.
bool PassingCheckpointFailure(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
         code == absl::StatusCode::kAborted || code == absl::StatusCode::kNotFound;
}

// Tries of a checkpoint asked for by a user (the waits between them add up
// to 23 s, past a failover under a lease of several seconds).
constexpr int kCheckpointNowTries = 5;

}  // namespace

absl::StatusOr<v1::CheckpointInfo> JobManager::CheckpointNow(const std::string& job_id, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id ", Quote(job_id)));
  auto training = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return job->phase == Job::Phase::kTraining;
  };
  if (!training()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " is not training (",
                                                      v1::JobState_Name(job->status.state()), ", ",
                                                      job->status.reason(), "): there is nothing to checkpoint"));
  }
  // The job ended while the request waited.
  auto ended = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " ended (", v1::JobState_Name(job->status.state()), ": ",
                     job->status.reason(), ") before the checkpoint was taken"));
  };
  // A checkpoint that fails because a server is unreachable (killed or
  // paused, its lease not yet run out) or restarted without the job is taken
  // again once the job's shard map changes (the failover) or, at the latest,
  // after a wait that doubles from 1 s to 8 s, up to kCheckpointNowTries
  // times within the deadline. One is not started while a server copies a
  // shard in (a checkpoint waits for it), nor while the job restores.
  absl::Duration backoff = absl::Seconds(1);
  for (int attempt = 1;; ++attempt) {
    // A handover is waited for a minute at most; after that the plan
    // refuses the checkpoint, saying why.
    const absl::Time handover_deadline = std::min(deadline, absl::Now() + absl::Minutes(1));
    auto can_start = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return job->phase == Job::Phase::kEnded ||
             (training() && !job->checkpointing &&
              (!job->handover.has_value() || absl::Now() >= handover_deadline));
    };
    while (!can_start()) {
      const absl::Time until = job->checkpointing || !training() ? deadline : handover_deadline;
      if (changed_.WaitWithDeadline(&mu_, until) && until == deadline) {
        return absl::DeadlineExceededError(absl::StrCat("job ", job_id, ": ",
                                                        job->checkpointing
                                                            ? "a checkpoint is still being written"
                                                        : training() ? "a server is still copying a shard in"
                                                                     : "it is still restoring"));
      }
    }
    if (!training()) return ended();
    const int64_t id = QueueCheckpoint(job, "manual");
    const int64_t map_version = job->shard_map.version();
    v1::CheckpointInfo* info = FindCheckpointInfo(job, id);
    while (info != nullptr && info->state() == v1::CheckpointInfo::WRITING) {
      if (job->phase == Job::Phase::kEnded) return ended();  // its calls may still wait on a server
      if (changed_.WaitWithDeadline(&mu_, deadline)) {
        return absl::DeadlineExceededError(absl::StrCat("checkpoint ", id, " of job ", job_id,
                                                        " is still being written; see `fulcrum get ", job_id,
                                                        "`"));
      }
      info = FindCheckpointInfo(job, id);
    }
    if (info == nullptr) return absl::InternalError("checkpoint record vanished");
    if (info->state() != v1::CheckpointInfo::FAILED || job->last_failed_checkpoint != id ||
        !PassingCheckpointFailure(job->last_failed_code)) {
      return *info;
    }
    const v1::CheckpointInfo failed = *info;
    const absl::Time retry_at = std::min(deadline, absl::Now() + backoff);
    if (job->phase == Job::Phase::kEnded) return ended();
    if (attempt == kCheckpointNowTries || retry_at >= deadline) return failed;
    if (attempt == 1) {
      AddEvent(job, absl::StrCat("checkpoint ", id, " failed (", failed.reason(),
                                 "); asked for by a user, it is taken again once the job's servers answer"));
    }
    while (training() && job->shard_map.version() == map_version) {
      if (changed_.WaitWithDeadline(&mu_, retry_at)) break;
    }
    backoff = std::min(backoff * 2, absl::Seconds(8));
  }
}

absl::StatusOr<CheckpointPlan> JobManager::PlanCheckpoint(const CheckpointTask& task) {
  MutexLock lock(&mu_);
  Job* job = FindJob(task.job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("job ", task.job_id, " is gone"));
  if (job->phase != Job::Phase::kTraining) return absl::FailedPreconditionError("the job stopped training");
  if (job->handover.has_value()) {
    return absl::UnavailableError(
        "a server is joining the job (copying chunks): take the checkpoint once it holds its copy");
  }
  CheckpointPlan plan;
  // Every replica of every shard that holds chunks (an empty shard's server
  // has nothing of the job).
  const std::set<int32_t> holding = HoldingShards(*job);
  for (const v1::ShardLocation& shard : job->shard_map.shards()) {
    if (holding.count(shard.shard()) == 0) continue;
    plan.servers[shard.server_id()] = shard.address();
    for (int b = 0; b < shard.backup_ids_size(); ++b) plan.servers[shard.backup_ids(b)] = shard.backup_addresses(b);
  }
  plan.synchronous = job->status.spec().mode() == v1::BSP || job->status.spec().mode() == v1::MODE_UNSPECIFIED;
  plan.total_steps = job->total_steps;
  v1::CheckpointManifest& manifest = plan.manifest;
  manifest.set_job_id(task.job_id);
  *manifest.mutable_shard_map() = job->shard_map;
  manifest.mutable_server_addresses()->insert(plan.servers.begin(), plan.servers.end());
  manifest.set_num_partitions(job->num_partitions);
  manifest.set_global_batch(
      DataPartitioning(job->data_info.train_examples(), StepBatchSize(job->status.spec()), job->num_partitions)
          .global_batch());
  *manifest.mutable_progress() = job->status.progress();
  *manifest.mutable_spec() = job->status.spec();
  if (const v1::CheckpointInfo* info = FindCheckpointInfo(job, task.id)) *manifest.mutable_info() = *info;
  // What one copy takes on the servers now: their heartbeats' counts over
  // the replicas there are (a restore is placed by it).
  int64_t held = 0, holders = 0;
  for (const auto& [id, address] : plan.servers) {
    if (const Member* server = members_.Find(id); server != nullptr) held += server->HeldBytes(task.job_id);
  }
  for (const v1::ShardLocation& shard : job->shard_map.shards()) {
    if (holding.count(shard.shard()) > 0) holders += 1 + shard.backup_ids_size();
  }
  if (holders > 0) {
    manifest.mutable_info()->set_server_bytes(held / holders * static_cast<int64_t>(holding.size()));
  }
  // Tables are stored incrementally on the latest committed checkpoint
  // while its chain is shorter than full_every (and its manifest small).
  const int full_every = std::max(1, job->status.spec().checkpoint().full_every());
  if (job->shard_map.tables_size() > 0 && full_every > 1) {
    for (auto it = job->manifests.rbegin(); it != job->manifests.rend(); ++it) {
      if (it->first >= task.id || it->second.info().state() != v1::CheckpointInfo::COMPLETE) continue;
      if (ChainsOnto(it->second, full_every)) plan.base = it->second;
      break;
    }
  }
  return plan;
}

std::vector<ExpiredCheckpoint> JobManager::FinishCheckpoint(const CheckpointTask& task, const absl::Status& status,
                                                            const v1::CheckpointManifest& manifest,
                                                            absl::Duration took) {
  std::vector<ExpiredCheckpoint> expired;
  {
    MutexLock lock(&mu_);
    Job* job = FindJob(task.job_id);
    if (job == nullptr) return expired;
    job->checkpointing = false;
    v1::CheckpointInfo* info = FindCheckpointInfo(job, task.id);
    if (info == nullptr) info = job->status.add_checkpoints();
    const bool at_end = absl::IsOutOfRange(status);
    if (at_end && info->trigger() != "manual") {
      // A periodic one that met the job's last steps: not taken, not a failure.
      info->set_state(v1::CheckpointInfo::FAILED);
      info->set_reason("skipped");
    } else if (!status.ok()) {
      job->last_failed_checkpoint = task.id;
      job->last_failed_code = status.code();
      // A server of it lost its lease meanwhile (paused, cut off): what it
      // captured may still be written when it comes back, so it is told to
      // delete it when it registers again.
      for (const auto& [server, address] : manifest.server_addresses()) {
        if (members_.Contains(server)) continue;
        job->orphaned_checkpoints.insert(task.id);
        break;
      }
      info->set_state(v1::CheckpointInfo::FAILED);
      info->set_reason(std::string(status.message()));
      info->set_duration_seconds(absl::ToDoubleSeconds(took));
      FLOG(WARNING) << "job " << task.job_id << ": checkpoint " << task.id << " failed: " << status.message();
    } else {
      *info = manifest.info();
      // The next periodic one counts from the later of the progress that
      // queued this one and its cut: an ASP cut (each partition's lowest
      // step) lies behind that progress, and counting from it would queue
      // the next at once.
      job->last_checkpoint_step = std::max(job->last_checkpoint_step, manifest.info().step());
      job->manifests[task.id] = manifest;
      FLOG(INFO) << "job " << task.job_id << ": checkpoint " << task.id << " complete at step " << info->step()
                 << " (" << info->bytes() << " bytes, " << info->duration_seconds() << " s)";
      // Retention: the newest keep_last complete ones stay, with the ones
      // their tables are stored incrementally on; older ones go.
      int keep = job->status.spec().checkpoint().keep_last();
      if (keep <= 0) keep = kDefaultKeepLast;
      std::vector<int64_t> complete;
      for (const auto& [id, m] : job->manifests) {
        if (m.info().state() == v1::CheckpointInfo::COMPLETE) complete.push_back(id);
      }
      std::set<int64_t> needed;
      for (size_t i = complete.size() > static_cast<size_t>(keep) ? complete.size() - keep : 0; i < complete.size(); ++i) {
        for (int64_t id = complete[i]; id != 0 && needed.insert(id).second;) {
          auto m = job->manifests.find(id);
          id = m == job->manifests.end() ? 0 : m->second.info().base_id();
        }
      }
      for (int64_t id : complete) {
        if (needed.count(id) > 0) continue;
        const v1::CheckpointManifest& old = job->manifests[id];
        expired.push_back({id, {old.server_addresses().begin(), old.server_addresses().end()}});
        job->manifests.erase(id);
      }
    }
    if (job->reshard_checkpoint == task.id) {
      const std::string newcomer = std::exchange(job->reshard_server, "");
      job->reshard_checkpoint = 0;
      const bool complete = info->state() == v1::CheckpointInfo::COMPLETE;
      const std::string reason = info->reason();
      if (job->phase == Job::Phase::kTraining && complete && members_.Contains(newcomer) &&
          !members_.Draining(newcomer)) {
        job->reshard_failures = 0;
        job->resharding = true;
        job->reshard_setup_failures = 0;
        RestoreFromCheckpoint(job, absl::StrCat(newcomer, " joined: the shards are laid out again over every server"));
      } else if (job->phase == Job::Phase::kTraining) {
        // Asked again after 30 s, doubling with each failure in a row up to
        // 16 minutes (servers without a checkpoint store fail every time).
        const absl::Duration wait = absl::Seconds(30) * (int64_t{1} << std::min(job->reshard_failures, 5));
        ++job->reshard_failures;
        job->reshard_declined[newcomer] = clock_() + wait;
        AddEvent(job, absl::StrCat(newcomer, " does not join: checkpoint ", task.id, " ",
                                   complete ? "is complete but the server left" : absl::StrCat("failed: ", reason),
                                   "; asked again in ", absl::FormatDuration(wait)));
      }
    }
    // The status keeps the kept checkpoints and the latest failures.
    auto* infos = job->status.mutable_checkpoints();
    for (int i = infos->size() - 1; i >= 0; --i) {
      const v1::CheckpointInfo& c = infos->Get(i);
      bool gone = c.state() == v1::CheckpointInfo::COMPLETE && job->manifests.count(c.id()) == 0;
      bool skipped = c.state() == v1::CheckpointInfo::FAILED && c.reason() == "skipped";
      if (gone || skipped) infos->DeleteSubrange(i, 1);
    }
    // Past the bound, the oldest failures go first.
    for (int i = 0; i < infos->size() && infos->size() > kMaxCheckpointInfos;) {
      if (infos->Get(i).state() == v1::CheckpointInfo::FAILED) {
        infos->DeleteSubrange(i, 1);
      } else {
        ++i;
      }
    }
    Touch(job);
  }
  Flush();
  return expired;
}

absl::StatusOr<v1::CheckpointManifest> JobManager::GetCheckpoint(const std::string& job_id,
                                                                 int64_t checkpoint_id) const {
  MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id ", Quote(job_id)));
  if (checkpoint_id == 0) {
    for (auto it = job->manifests.rbegin(); it != job->manifests.rend(); ++it) {
      if (it->second.info().state() == v1::CheckpointInfo::COMPLETE) return it->second;
    }
    return absl::NotFoundError(absl::StrCat("job ", job_id, " has no complete checkpoint"));
  }
  auto it = job->manifests.find(checkpoint_id);
  if (it == job->manifests.end()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " has no committed checkpoint ", checkpoint_id));
  }
  return it->second;
}

// ---------------------------------------------------------------------------
// Restoring
// ---------------------------------------------------------------------------

void JobManager::PlanRestore(Job* job, const v1::CheckpointManifest& manifest) {
  v1::RestoreSource restore;
  restore.set_job_id(manifest.job_id());
  restore.set_checkpoint_id(manifest.info().id());
  *restore.mutable_chunks() = manifest.chunks();
  // The holders' current addresses where they are live (a server that came
  // back on another port), else the addresses recorded at the cut.
  for (const auto& [id, address] : manifest.server_addresses()) {
    const Member* member = members_.Find(id);
    (*restore.mutable_server_addresses())[id] = member != nullptr ? member->address : address;
  }
  const DataPartitioning partitioning(job->data_info.train_examples(), StepBatchSize(job->status.spec()),
                                      job->num_partitions);
  int64_t step = manifest.info().step();
  std::vector<int64_t> positions(manifest.partition_steps().begin(), manifest.partition_steps().end());
  if (manifest.num_partitions() != job->num_partitions || manifest.global_batch() != partitioning.global_batch()) {
    // Another number of workers: the same examples done, in the new job's steps.
    step = partitioning.StepFrom(step, manifest.global_batch());
    restore.set_repartition(true);
    restore.set_version(step);
    positions.assign(job->num_partitions, step);
  }
  job->partition_steps = positions;
  job->partition_steps.resize(job->num_partitions, step);
  job->status.mutable_progress()->set_step(step);
  job->last_checkpoint_step = step;
  job->restore = std::move(restore);
}

bool JobManager::RestoreFromCheckpoint(Job* job, const std::string& why) {
  const v1::CheckpointManifest* latest = nullptr;
  for (auto it = job->manifests.rbegin(); it != job->manifests.rend() && latest == nullptr; ++it) {
    if (it->second.info().state() == v1::CheckpointInfo::COMPLETE && job->restore_skipped.count(it->first) == 0) {
      latest = &it->second;
    }
  }
  if (latest == nullptr) return false;
  const std::string& id = job->status.job_id();
  // Everything that ran on the lost state starts over: servers drop what
  // they still hold, workers are taken out (they come back under new ranks).
  for (const auto& [server, address] : job->server_addresses) {
    if (!members_.Contains(server)) continue;
    actions_.push_back([this, address = address, id, version = job->shard_map.version()] {
      IgnoreError(servers_->DropJob(address, id, "the job restarts from a checkpoint", false, version));
    });
  }
  job->server_addresses.clear();
  job->handover.reset();
  for (const JobWorker& w : job->workers) {
    Member* member = members_.Find(w.id);
    if (member != nullptr && member->job_id == id) member->job_id.clear();
  }
  job->workers.clear();
  job->done_partitions.clear();
  PlanRestore(job, *latest);
  job->restore_since = clock_();
  job->phase = Job::Phase::kPending;
  job->status.set_restores(job->status.restores() + 1);
  pending_.push_front(id);
  job->status.set_reason(absl::StrCat("restoring from checkpoint ", latest->info().id(), " (step ",
                                      latest->info().step(), "): ", why));
  AddEvent(job, job->status.reason());
  return true;
}

bool JobManager::RestoreSourcesLive(Job* job) {
  v1::RestoreSource& restore = *job->restore;
  std::set<std::string> missing;
  for (const v1::CheckpointChunk& chunk : restore.chunks()) {
    // The chunk, and for a bucket stored incrementally every link below it.
    for (const v1::CheckpointChunk* entry = &chunk; entry != nullptr;
         entry = entry->has_base() ? &entry->base() : nullptr) {
      bool live = false;
      for (const std::string& server : entry->server_ids()) {
        const Member* member = members_.Find(server);
        if (member == nullptr) continue;
        (*restore.mutable_server_addresses())[server] = member->address;
        live = true;
      }
      if (!live) missing.insert(entry->server_ids().begin(), entry->server_ids().end());
    }
  }
  if (missing.empty()) {
    job->restore_waiting_since.reset();
    return true;
  }
  const absl::Time now = clock_();
  if (!job->restore_waiting_since.has_value()) job->restore_waiting_since = now;
  const std::string who = absl::StrJoin(missing, ", ");
  if (now - *job->restore_waiting_since < options_.lease * 40) {
    std::string reason = absl::StrCat("waiting for ", who, " (holding checkpoint ", restore.checkpoint_id(),
                                      ") to come back");
    if (job->status.reason() != reason) {
      job->status.set_reason(reason);
      Touch(job);
    }
    return false;
  }
  job->restore_waiting_since.reset();
  absl::Status gone = absl::NotFoundError(absl::StrCat(who, " did not come back"));
  if (!RestoreFailed(job, gone)) {
    EndJob(job, v1::FAILED, absl::StrCat("cannot restore: checkpoint ", restore.checkpoint_id(), ": ", gone.message()));
  }
  return false;
}

bool JobManager::RestoreFailed(Job* job, const absl::Status& failure) {
  if (!job->restore.has_value()) return false;
  const int64_t bad = job->restore->checkpoint_id();
  auto it = job->manifests.find(bad);
  if (it == job->manifests.end() || job->restore->job_id() != job->status.job_id()) return false;
  // Short of memory budget: an older checkpoint needs as much (the job fails
  // naming the budget, not the checkpoint).
  if (absl::IsResourceExhausted(failure)) return false;
  // A server paused, restarted or cut off during the setup: the checkpoint is
  // as good as it was; the next setup runs over the servers live then.
  constexpr int kRestoreSetupRetries = 5;
  if (FailedForNow(failure) && ++job->restore_setup_retries <= kRestoreSetupRetries) {
    job->restore.reset();
    FLOG(WARNING) << "job " << job->status.job_id() << ": setting up checkpoint " << bad
                  << " failed for now (try " << job->restore_setup_retries << " of " << kRestoreSetupRetries
                  << "): " << failure.message();
    return RestoreFromCheckpoint(job, absl::StrCat("setting up checkpoint ", bad, " failed for now (",
                                                   failure.message(), "); trying it again"));
  }
  job->restore_setup_retries = 0;
  if (!absl::IsDataLoss(failure)) {  // unreadable, not proven bad: skipped, kept
    job->restore_skipped.insert(bad);
    job->restore.reset();
    FLOG(WARNING) << "job " << job->status.job_id() << ": checkpoint " << bad << " cannot be read: " << failure.message();
    return RestoreFromCheckpoint(job, absl::StrCat("checkpoint ", bad, " cannot be read (", failure.message(), ")"));
  }
  it->second.mutable_info()->set_state(v1::CheckpointInfo::CORRUPT);
  it->second.mutable_info()->set_reason(std::string(failure.message()));
  if (v1::CheckpointInfo* info = FindCheckpointInfo(job, bad)) *info = it->second.info();
  if (store_ != nullptr) {
    v1::CheckpointManifest marked = it->second;
    actions_.push_back([this, key = CheckpointManifestKey(job->status.job_id(), bad), marked] {
      IgnoreError(store_->Put(key, marked.SerializeAsString()));
    });
  }
  job->restore.reset();
  FLOG(WARNING) << "job " << job->status.job_id() << ": checkpoint " << bad << " is unusable: " << failure.message();
  return RestoreFromCheckpoint(job, absl::StrCat("checkpoint ", bad, " is unusable (", failure.message(), ")"));
}

absl::Status JobManager::CheckRestoreFits(const v1::ShardMap& plan, const v1::RestoreSource& restore,
                                          const v1::CheckpointManifest& manifest) {
  auto mismatch = [&](const std::string& what) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", restore.checkpoint_id(), " of job ",
                                                      restore.job_id(), " does not fit this job: ", what));
  };
  const v1::ShardMap& saved = manifest.shard_map();
  // Names of a map's tensors or tables, the first 8.
  auto names = [](const auto& items) {
    std::vector<std::string> listed;
    for (const auto& item : items) {
      if (listed.size() == 8) {
        listed.push_back("...");
        break;
      }
      listed.push_back(item.name());
    }
    return absl::StrJoin(listed, ", ");
  };
  if (saved.tensors_size() != plan.tensors_size()) {
    return mismatch(absl::StrCat(saved.tensors_size(), " tensors saved (", names(saved.tensors()),
                                 "), the model has ", plan.tensors_size(), " (", names(plan.tensors()),
                                 "): a different model?"));
  }
  for (int t = 0; t < plan.tensors_size(); ++t) {
    if (saved.tensors(t).size() != plan.tensors(t).size() || saved.tensors(t).name() != plan.tensors(t).name()) {
      return mismatch(absl::StrCat("tensor ", plan.tensors(t).name(), " has ", plan.tensors(t).size(),
                                   " elements, the checkpoint's ", saved.tensors(t).name(), " ",
                                   saved.tensors(t).size(), " (a different model?)"));
    }
  }
  if (saved.tables_size() != plan.tables_size()) {
    return mismatch(absl::StrCat(saved.tables_size(), " sparse tables saved (", names(saved.tables()),
                                 "), the model has ", plan.tables_size(), " (", names(plan.tables()), ")"));
  }
  for (int t = 0; t < plan.tables_size(); ++t) {
    const v1::TableLayout& a = plan.tables(t);
    const v1::TableLayout& b = saved.tables(t);
    if (a.name() != b.name() || a.dim() != b.dim() || a.buckets() != b.buckets()) {
      return mismatch(absl::StrCat("table ", a.name(), " has rows of ", a.dim(), " in ", a.buckets(),
                                   " buckets, the checkpoint's ", b.name(), " rows of ", b.dim(), " in ", b.buckets(),
                                   " buckets"));
    }
  }
  if (saved.chunks_size() != plan.chunks_size()) {
    return mismatch(absl::StrCat(
        "the model is cut into ", plan.chunks_size(), " chunks, the checkpoint into ", saved.chunks_size(),
        " (a scheduler with another --chunk-bytes, or a version that cuts top-k jobs' "
        "chunks otherwise?)"));
  }
  for (int c = 0; c < plan.chunks_size(); ++c) {
    const auto& a = plan.chunks(c);
    const auto& b = saved.chunks(c);
    if (a.chunk_id() != b.chunk_id() || a.tensor() != b.tensor() || a.offset() != b.offset() ||
        a.length() != b.length()) {
      return mismatch(absl::StrCat("chunk ", a.chunk_id(), " is cut differently"));
    }
  }
  return absl::OkStatus();
}

}  // namespace fulcrum
