// JobManager: its durable state. Every change to a job marks it dirty; Flush
// writes the dirty jobs' records (and the id counters) to the store outside
// the manager's lock, in one synced batch, never letting an older record of a
// job overwrite a newer one.
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "fulcrum/v1/scheduler_state.pb.h"
#include "scheduler/job_manager_internal.h"
#include "common/sync.h"

namespace fulcrum {
namespace {

constexpr char kJobPrefix[] = "job/";
constexpr char kMetaKey[] = "meta";
constexpr char kManifestPrefix[] = "ckpt/";  // as in checkpoint_coordinator.cc

}  // namespace

std::string JobRecordKey(const std::string& job_id) { return absl::StrCat(kJobPrefix, job_id); }

v1::JobRecord JobManager::RecordOf(const Job& job) {
  v1::JobRecord record;
  *record.mutable_status() = job.status;
  record.set_record_version(job.version);
  record.set_phase(static_cast<int>(job.phase));
  for (const JobWorker& w : job.workers) {
    v1::JobWorkerRecord* r = record.add_workers();
    r->set_id(w.id);
    r->set_rank(w.rank);
    r->set_ready(w.ready);
    for (int32_t p : w.partitions) r->add_partitions(p);
  }
  record.set_next_rank(job.next_rank);
  record.set_num_partitions(job.num_partitions);
  for (int64_t s : job.partition_steps) record.add_partition_steps(s);
  for (int32_t p : job.done_partitions) record.add_done_partitions(p);
  record.set_have_data_info(job.have_data_info);
  *record.mutable_data_info() = job.data_info;
  for (const auto& [id, address] : job.server_addresses) (*record.mutable_server_addresses())[id] = address;
  *record.mutable_shard_map() = job.shard_map;
  record.set_steps_per_epoch(job.steps_per_epoch);
  record.set_total_steps(job.total_steps);
  record.set_started_unix_ms(absl::ToUnixMillis(job.started));
  record.set_next_checkpoint_id(job.next_checkpoint_id);
  record.set_last_checkpoint_step(job.last_checkpoint_step);
  if (job.restore.has_value()) {
    record.set_restoring(true);
    *record.mutable_restore() = *job.restore;
  }
  if (job.handover.has_value()) *record.mutable_handover() = *job.handover;
  record.set_server_claim_bytes(job.server_claim);
  *record.mutable_early_stopping() = job.early_stopping;
  return record;
}

void JobManager::Flush() {
  std::vector<std::pair<std::string, v1::JobRecord>> records;
  std::vector<std::string> deletes;
  v1::SchedulerMeta meta;
  // Taken with the records: a free's commit is in them or saved before.
  std::vector<MovedChunksFree> frees;
  {
    MutexLock lock(&mu_);
    frees.swap(frees_after_save_);
    if (store_ != nullptr && dirty_.empty() && forgotten_.empty() && frees.empty()) return;
    deletes.assign(forgotten_.begin(), forgotten_.end());
    forgotten_.clear();
    for (const std::string& id : dirty_) {
      Job* job = FindJob(id);
      if (job == nullptr) continue;
      records.emplace_back(id, RecordOf(*job));
    }
    dirty_.clear();
    meta.set_next_job(next_job_);
    meta.set_next_server(members_.next_number(v1::SERVER));
    meta.set_next_worker(members_.next_number(v1::WORKER));
  }
  if (store_ == nullptr) {  // nothing to save first
    SendFrees(std::move(frees));
    return;
  }
  std::vector<MovedChunksFree> ready, waiting;
  std::vector<std::string> unsaved;  // jobs whose records the failed write lost
  {
    MutexLock lock(&persist_mu_);
    std::vector<std::pair<std::string, std::string>> puts;
    std::map<std::string, int64_t> before;  // written_ as it was, for a failed write
    for (auto& [id, record] : records) {
      int64_t& written = written_[id];
      if (record.record_version() < written) continue;  // a newer record of it is already out
      before[id] = written;
      written = record.record_version();
      puts.emplace_back(JobRecordKey(id), record.SerializeAsString());
    }
    puts.emplace_back(kMetaKey, meta.SerializeAsString());
    for (const std::string& key : deletes) {
      if (absl::StartsWith(key, kJobPrefix)) written_.erase(key.substr(sizeof(kJobPrefix) - 1));
    }
    absl::Status status = store_->Write(puts, deletes);
    if (!status.ok()) {
      FLOG(ERROR) << "cannot save the scheduler state: " << status;
      for (const auto& [id, version] : before) {
        written_[id] = version;
        unsaved.push_back(id);
      }
    }
    for (MovedChunksFree& free : frees) {
      auto written = written_.find(free.job_id);
      const bool saved = written != written_.end() && written->second >= free.record_version;
      (saved ? ready : waiting).push_back(std::move(free));
    }
  }
  if (!waiting.empty() || !unsaved.empty()) {  // tried again at the next Flush
    MutexLock lock(&mu_);
    for (const std::string& id : unsaved) {
      if (FindJob(id) != nullptr) dirty_.insert(id);
    }
    for (MovedChunksFree& free : waiting) {
      if (FindJob(free.job_id) != nullptr)
        frees_after_save_.push_back(std::move(free));  // (a job forgotten: none)
    }
  }
  SendFrees(std::move(ready));
}

void JobManager::SendFrees(std::vector<MovedChunksFree> frees) {
  std::vector<Action> calls;
  for (MovedChunksFree& free : frees) {
    for (const std::string& address : free.addresses) {
      calls.push_back([this, job_id = free.job_id, address, map = free.map] {
        IgnoreError(servers_->FreeMovedChunks(address, job_id, map));
      });
    }
  }
  Run(std::move(calls));
}

absl::Status JobManager::Recover() {
  if (store_ == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto meta_entries, store_->Scan(kMetaKey));
  ASSIGN_OR_RETURN(auto job_entries, store_->Scan(kJobPrefix));
  ASSIGN_OR_RETURN(auto manifest_entries, store_->Scan(kManifestPrefix));
  MutexLock lock(&mu_);
  for (const auto& [key, value] : meta_entries) {
    if (key != kMetaKey) continue;
    v1::SchedulerMeta meta;
    if (!meta.ParseFromString(value)) return absl::DataLossError("scheduler state: corrupt meta record");
    next_job_ = std::max<int64_t>(next_job_, meta.next_job());
    members_.set_next_number(v1::SERVER, meta.next_server());
    members_.set_next_number(v1::WORKER, meta.next_worker());
  }
  int active = 0;
  for (const auto& [key, value] : job_entries) {
    v1::JobRecord record;
    if (!record.ParseFromString(value)) {
      return absl::DataLossError(absl::StrCat("scheduler state: corrupt record ", key));
    }
    auto job = std::make_unique<Job>();
    job->status = record.status();
    // Rendered on read (records written before that kept them in the status).
    job->status.clear_workers();
    job->status.clear_shards();
    job->status.clear_shard_map();
    job->version = record.record_version();
    job->phase = static_cast<Job::Phase>(record.phase());
    for (const v1::JobWorkerRecord& r : record.workers()) {
      JobWorker w;
      w.id = r.id();
      w.rank = r.rank();
      w.ready = r.ready();
      w.partitions.assign(r.partitions().begin(), r.partitions().end());
      job->workers.push_back(std::move(w));
    }
    job->next_rank = record.next_rank();
    job->num_partitions = record.num_partitions();
    job->partition_steps.assign(record.partition_steps().begin(), record.partition_steps().end());
    job->done_partitions.insert(record.done_partitions().begin(), record.done_partitions().end());
    job->have_data_info = record.have_data_info();
    job->data_info = record.data_info();
    job->server_addresses.insert(record.server_addresses().begin(), record.server_addresses().end());
    job->shard_map = record.shard_map();
    job->steps_per_epoch = record.steps_per_epoch();
    job->total_steps = record.total_steps();
    job->started = absl::FromUnixMillis(record.started_unix_ms());
    job->next_checkpoint_id = std::max<int64_t>(1, record.next_checkpoint_id());
    job->last_checkpoint_step = record.last_checkpoint_step();
    if (record.restoring()) job->restore = record.restore();
    // A copy in flight when the scheduler stopped is done again (from the
    // replicas live then) once members have registered again.
    if (record.has_handover()) job->handover = record.handover();
    job->claims = ClaimsOf(job->status.spec());
    job->server_claim = record.server_claim_bytes();
    job->early_stopping = record.early_stopping();
    // A setup interrupted by the restart is redone from the loading phase.
    if (job->phase == Job::Phase::kSettingUp) job->phase = Job::Phase::kLoading;
    if (job->phase == Job::Phase::kPending) pending_.push_back(job->status.job_id());
    if (job->phase != Job::Phase::kEnded && job->phase != Job::Phase::kPending) ++active;
    {
      MutexLock persist(&persist_mu_);
      written_[job->status.job_id()] = job->version;
    }
    jobs_[job->status.job_id()] = std::move(job);
  }
  for (const auto& [key, value] : manifest_entries) {
    v1::CheckpointManifest manifest;
    if (!manifest.ParseFromString(value)) {
      FLOG(ERROR) << "scheduler state: corrupt checkpoint manifest " << key << "; ignored";
      continue;
    }
    Job* job = FindJob(manifest.job_id());
    if (job == nullptr) continue;
    job->manifests[manifest.info().id()] = manifest;
    job->next_checkpoint_id = std::max(job->next_checkpoint_id, manifest.info().id() + 1);
  }
  // A checkpoint the record calls WRITING either committed its manifest (the
  // commit point) before the scheduler stopped, and the record had not yet
  // caught up: it is complete, and its data must stay; or it never did: it
  // failed, and its data is deleted wherever it may be.
  for (auto& [job_id, job] : jobs_) {
    for (v1::CheckpointInfo& info : *job->status.mutable_checkpoints()) {
      if (info.state() != v1::CheckpointInfo::WRITING) continue;
      auto committed = job->manifests.find(info.id());
      if (committed != job->manifests.end()) {
        info = committed->second.info();
        job->last_checkpoint_step = std::max(job->last_checkpoint_step, info.step());
        continue;
      }
      info.set_state(v1::CheckpointInfo::FAILED);
      info.set_reason("the scheduler restarted while it was being written");
      job->orphaned_checkpoints.insert(info.id());
    }
  }
  // Pending jobs in submit order (ids are zero-padded counters).
  std::sort(pending_.begin(), pending_.end());
  // Members get two leases to register again (counted again from Start,
  // when the scheduler serves): one for the heartbeat that finds the
  // scheduler gone and reconnects (common/rpc.cc bounds that backoff to a
  // second), one for the registration itself.
  recovery_deadline_ = clock_() + RecoveryWindow();
  FLOG(INFO) << "recovered " << jobs_.size() << " jobs (" << active << " running) from the state store";
  return absl::OkStatus();
}

void JobManager::CheckRecovery() {
  if (!recovery_deadline_.has_value() || clock_() < *recovery_deadline_) return;
  recovery_deadline_.reset();
  for (auto& [job_id, job] : jobs_) {
    if (job->phase == Job::Phase::kEnded) {
      for (const auto& [server, address] : job->server_addresses) {
        if (members_.Contains(server)) continue;
        LoseParameters(job.get(),
                       absl::StrCat("server ", server, " did not come back after the scheduler restarted"));
        break;
      }
      continue;
    }
    if (job->phase == Job::Phase::kPending) continue;
    std::vector<std::string> gone;
    for (const auto& [server, address] : job->server_addresses) {
      if (!members_.Contains(server)) gone.push_back(server);
    }
    for (const std::string& server : gone) {
      if (job->phase == Job::Phase::kEnded) break;
      FailOver(job.get(), server, absl::StrCat("server ", server, " did not come back after the scheduler restarted"));
    }
    if (job->phase == Job::Phase::kEnded) continue;
    std::vector<std::string> missing;
    for (const JobWorker& w : job->workers) {
      if (!members_.Contains(w.id)) missing.push_back(w.id);
    }
    for (const std::string& id : missing) RemoveWorker(job.get(), id, "did not come back after the scheduler restarted");
  }
}

}  // namespace fulcrum
