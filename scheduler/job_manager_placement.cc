// JobManager: the shard map of a job and setting its chunks up on the servers.
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data_partition.h"
#include "common/status_macros.h"
#include "common/logging.h"
#include "common/memory_budget.h"
#include "common/shard_map.h"
#include "kernels/model_from_spec.h"
#include "scheduler/job_manager_internal.h"
#include "scheduler/placement.h"
#include "common/sync.h"

namespace fulcrum {
namespace {

// Until when `server` is not to be asked again (InfinitePast: it may be).
absl::Time DeclinedUntil(const std::map<std::string, absl::Time>& declined, const std::string& server) {
  auto it = declined.find(server);
  return it == declined.end() ? absl::InfinitePast() : it->second;
}

}  // namespace

v1::SetupJobRequest JobManager::SetupRequestFor(const Job& job, const std::string& server_id) const {
  v1::SetupJobRequest request;
  request.set_job_id(job.status.job_id());
  *request.mutable_spec() = job.status.spec();
  request.set_num_partitions(job.num_partitions);
  request.set_total_steps(job.total_steps);
  *request.mutable_shard_map() = job.shard_map;
  request.set_server_id(server_id);
  return request;
}

std::set<int32_t> JobManager::HoldingShards(const Job& job) const {
  return fulcrum::HoldingShards(job.shard_map, job.handover);
}

void JobManager::StartHandover(Job* job, v1::HandoverRecord handover) {
  job->handover = std::move(handover);
  job->handover_attempts = 0;
  job->handover_retry_at = absl::InfinitePast();
  QueueHandoverCopy(job);
}

void JobManager::QueueHandoverCopy(Job* job) {
  const v1::HandoverRecord& handover = *job->handover;
  const v1::ShardMap& map = job->shard_map;
  v1::SetupJobRequest setup = SetupRequestFor(*job, handover.server_id());
  ModelLayout layout = LayoutFor(job->status.spec(), job->data_info.features(), job->data_info.classes());
  for (const v1::ChunkLocation& chunk : map.chunks()) {
    if (chunk.shard() != handover.shard()) continue;
    AddChunkSetup(chunk, layout, &setup);
    if (!handover.new_shard()) continue;
    // A moved chunk comes from the shard it left, from whichever replica
    // leads that shard now (its primary may have died since the move).
    auto from = handover.moved_from().find(chunk.chunk_id());
    if (from != handover.moved_from().end()) {
      setup.mutable_chunks()->rbegin()->set_copy_from(map.shards(from->second).address());
    }
  }
  if (!handover.new_shard()) setup.set_copy_from(map.shards(handover.shard()).address());
  // It was out of the shard's group: what it may hold of the shard is stale,
  // even where a Reconfigure it missed left it a map saying otherwise.
  setup.set_joined_shard(handover.shard());
  // A new shard's leader takes no write until FinishHandover commits the
  // handover and activates it: until then the map may still go back.
  setup.set_await_activation(handover.new_shard());
  std::vector<std::string> others;
  std::string address;
  for (const auto& [id, other] : job->server_addresses) {
    if (id == handover.server_id()) {
      address = other;
    } else {
      others.push_back(other);
    }
  }
  job->handover_in_flight = true;
  job->copying.insert(handover.server_id());
  // Every other replica takes the map first (the primaries then forward to
  // the newcomer, which refuses until it holds the state, so the state it
  // copies cannot move), then the newcomer copies and joins.
  actions_.push_back([this, job_id = job->status.job_id(), others, map, setup = std::move(setup),
                      server_id = handover.server_id(), address] {
    for (const std::string& other : others) IgnoreError(servers_->Reconfigure(other, job_id, map));
    std::optional<v1::ShardMap> activate =
        FinishHandover(job_id, server_id, address, map.version(), servers_->SetupJob(address, setup));
    if (activate.has_value()) ActivationAnswered(job_id, server_id, servers_->Reconfigure(address, job_id, *activate));
  });
}

std::optional<v1::ShardMap> JobManager::FinishHandover(const std::string& job_id, const std::string& server_id,
                                                       const std::string& address, int64_t copy_version,
                                                       const absl::Status& status) {
  MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return std::nullopt;
  job->copying.erase(server_id);
  if (!job->handover.has_value() || job->handover->server_id() != server_id) {
    // The handover was undone while this copy ran (a failover, a restore)
    // and the copy then succeeded: the copy is stale (and, for a new shard,
    // was never activated). The DropJob the undo sent may have come before
    // it. This one names the copy's own map version, so a newer setup of the
    // server (a restore placing the job there again) is kept.
    if (status.ok() && (job->server_addresses.count(server_id) == 0 || job->phase != Job::Phase::kTraining)) {
      actions_.push_back([this, address, job_id, copy_version] {
        IgnoreError(servers_->DropJob(address, job_id, "its handover was undone while it copied", false, copy_version));
      });
    }
    return std::nullopt;
  }
  job->handover_in_flight = false;
  if (job->phase != Job::Phase::kTraining) return std::nullopt;
  if (status.ok()) {
    const bool new_shard = job->handover->new_shard();
    job->handover.reset();
    AddEvent(job, absl::StrCat(server_id, " holds its copy and replicates"));
    // The handover is committed: the new shard's leader may take writes.
    if (!new_shard) return std::nullopt;
    job->activations[server_id].in_flight = true;
    // And no undo puts the moved chunks back: the servers they left free
    // them (until now they kept them for that), once the commit is saved.
    MovedChunksFree free{job_id, job->version, {}, job->shard_map};
    for (const auto& [id, other] : job->server_addresses) {
      if (id != server_id) free.addresses.push_back(other);
    }
    frees_after_save_.push_back(std::move(free));
    return job->shard_map;
  }
  // A source that is gone (a primary that died: the scheduler promotes its
  // backup) or slow is retried from the replica that leads the shard then;
  // anything else (the newcomer refuses: its memory budget, a bad request)
  // puts the map back.
  constexpr int kMaxAttempts = 20;
  if (!FailedForNow(status) || ++job->handover_attempts >= kMaxAttempts) {
    AbandonHandover(job, absl::StrCat("copying onto ", server_id, " failed: ", status.message()));
    return std::nullopt;
  }
  const absl::Duration backoff =
      std::min(absl::Seconds(2), absl::Milliseconds(100) * (int64_t{1} << std::min(job->handover_attempts, 5)));
  job->handover_retry_at = clock_() + backoff;
  AddEvent(job, absl::StrCat("copying onto ", server_id, " failed (", status.message(), "); retrying in ",
                             absl::FormatDuration(backoff), " from the replicas live then"));
  return std::nullopt;
}

void JobManager::ActivationAnswered(const std::string& job_id, const std::string& server_id,
                                    const absl::Status& status) {
  MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return;
  auto it = job->activations.find(server_id);
  if (it == job->activations.end()) return;
  // Done when it took the map, holds a newer one, or no longer holds the job.
  if (status.ok() || absl::IsFailedPrecondition(status) || absl::IsNotFound(status)) {
    job->activations.erase(it);
    return;
  }
  it->second.in_flight = false;
  it->second.retry_at = clock_() + absl::Milliseconds(500);
}

void JobManager::RetryActivations() {
  for (auto& [job_id, job] : jobs_) {
    for (auto it = job->activations.begin(); it != job->activations.end();) {
      auto address = job->server_addresses.find(it->first);
      if (job->phase != Job::Phase::kTraining || address == job->server_addresses.end()) {
        it = job->activations.erase(it);  // the job restarted or ended, or the server left it
        continue;
      }
      if (!it->second.in_flight && clock_() >= it->second.retry_at) {
        it->second.in_flight = true;
        actions_.push_back([this, job_id = job_id, server_id = it->first, address = address->second,
                            map = job->shard_map] {
          ActivationAnswered(job_id, server_id, servers_->Reconfigure(address, job_id, map));
        });
      }
      ++it;
    }
  }
}

void JobManager::RetryHandovers() {
  if (recovery_deadline_.has_value()) return;  // members are still registering again
  for (auto& [job_id, job] : jobs_) {
    if (job->phase != Job::Phase::kTraining || !job->handover.has_value() || job->handover_in_flight) continue;
    if (clock_() < job->handover_retry_at) continue;
    if (!members_.Contains(job->handover->server_id())) {
      AbandonHandover(job.get(), absl::StrCat(job->handover->server_id(), " left the cluster"));
      continue;
    }
    QueueHandoverCopy(job.get());
  }
}

void JobManager::AbandonHandover(Job* job, const std::string& why, bool newcomer_at_fault) {
  const v1::HandoverRecord handover = *job->handover;
  job->handover.reset();
  job->handover_in_flight = false;
  const std::string& newcomer = handover.server_id();
  v1::ShardMap& map = job->shard_map;
  UndoHandover(&map, handover);
  const bool still_serves = InMap(map, newcomer);  // in another role of this job
  auto newcomer_address = job->server_addresses.find(newcomer);
  if (!still_serves && newcomer_address != job->server_addresses.end()) {
    actions_.push_back([this, address = newcomer_address->second, job_id = job->status.job_id(),
                        version = map.version()] {
      IgnoreError(servers_->DropJob(address, job_id, "its handover was abandoned", false, version));
    });
    job->server_addresses.erase(newcomer_address);
  }
  if (newcomer_at_fault) job->handover_declined[newcomer] = clock_() + absl::Seconds(30);
  AddEvent(job, absl::StrCat(why, "; ", newcomer, " does not join (shard map version ", map.version(), ")"));
  for (const auto& [id, address] : job->server_addresses) {
    actions_.push_back([this, address = address, job_id = job->status.job_id(), map = map] {
      IgnoreError(servers_->Reconfigure(address, job_id, map));
    });
  }
}

void JobManager::StartSetups() {
  for (auto& [id, job] : jobs_) {
    if (job->phase != Job::Phase::kLoading || job->workers.empty()) continue;
    if (!std::all_of(job->workers.begin(), job->workers.end(), [](const JobWorker& w) { return w.ready; })) continue;
    if (job->restore.has_value() && !RestoreSourcesLive(job.get())) continue;
    absl::Status status = BuildShardPlan(job.get());
    if (absl::IsUnavailable(status)) {  // servers not (yet) registered, e.g. after a restart: wait
      if (job->status.reason() != status.message()) {
        job->status.set_reason(std::string(status.message()));
        Touch(job.get());
      }
      continue;
    }
    if (!status.ok()) {
      EndJob(job.get(), v1::FAILED, std::string(status.message()));
      continue;
    }
    if (job->restore.has_value()) {
      const v1::CheckpointManifest* manifest = RestoreManifest(*job);
      status = manifest == nullptr ? absl::NotFoundError(absl::StrCat("checkpoint ", job->restore->checkpoint_id(),
                                                                      " of job ", job->restore->job_id(), " is gone"))
                                   : CheckRestoreFits(job->shard_map, *job->restore, *manifest);
      if (!status.ok()) {
        EndJob(job.get(), v1::FAILED, std::string(status.message()));
        continue;
      }
    }
    // Every replica of a shard gets its chunks (and the whole map, for roles).
    ModelLayout layout = LayoutFor(job->status.spec(), job->data_info.features(), job->data_info.classes());
    std::map<std::string, v1::SetupJobRequest> requests;
    // The requests of a shard's replicas (created on first use).
    Job* const setting_up = job.get();  // (a lambda cannot capture a structured binding)
    auto requests_of = [&](int32_t s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const v1::ShardLocation& shard = setting_up->shard_map.shards(s);
      std::vector<std::pair<std::string, std::string>> replicas = {{shard.server_id(), shard.address()}};
      for (int b = 0; b < shard.backup_ids_size(); ++b) replicas.emplace_back(shard.backup_ids(b), shard.backup_addresses(b));
      std::vector<v1::SetupJobRequest*> of;
      for (const auto& [server_id, address] : replicas) {
        auto [it, fresh] = requests.try_emplace(address);
        if (fresh) {
          it->second = SetupRequestFor(*setting_up, server_id);
          if (setting_up->restore.has_value()) *it->second.mutable_restore() = *setting_up->restore;
        }
        of.push_back(&it->second);
      }
      return of;
    };
    for (const v1::ChunkLocation& chunk : job->shard_map.chunks()) {
      for (v1::SetupJobRequest* request : requests_of(chunk.shard())) AddChunkSetup(chunk, layout, request);
    }
    // Shards that hold only table buckets are set up too.
    for (int32_t s : HoldingShards(*job)) requests_of(s);
    job->phase = Job::Phase::kSettingUp;
    job->status.set_reason("setting up parameter shards");
    Touch(job.get());
    actions_.push_back([this, id = id, requests = std::move(requests)]() mutable {
      RunSetup(id, std::move(requests));
    });
  }
}

const v1::CheckpointManifest* JobManager::RestoreManifest(const Job& job) const {
  if (!job.restore.has_value()) return nullptr;
  const Job* source = FindJob(job.restore->job_id());
  if (source == nullptr) return nullptr;
  auto it = source->manifests.find(job.restore->checkpoint_id());
  return it != source->manifests.end() ? &it->second : nullptr;
}

int64_t JobManager::PerServerClaim(const Job& job, int servers) const {
  const v1::CheckpointManifest* saved = RestoreManifest(job);
  return PerServerClaimBytes(job.claims, job.status.spec(),
                             saved != nullptr ? saved->info().server_bytes() : 0, servers);
}

absl::Status JobManager::BuildShardPlan(Job* job) {
  const v1::JobSpec& spec = job->status.spec();
  const v1::WorkReport& data = job->data_info;
  const DataPartitioning partitioning(data.train_examples(), StepBatchSize(spec), job->num_partitions);
  job->steps_per_epoch = partitioning.steps_per_epoch();
  if (job->steps_per_epoch == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training set has ", data.train_examples(), " examples, fewer than one global batch (",
        "data.batchSize * (data.gradientAccumulation or localSgd.steps) * maxWorkers = ",
        partitioning.global_batch(), ")"));
  }
  job->total_steps = partitioning.TotalSteps(spec.data().epochs(), spec.data().max_steps());
  job->status.mutable_progress()->set_total_steps(job->total_steps);
  // The schedule's steps are the job's: a warm-up longer would never reach
  // lr. (Not on a restart from the job's own checkpoint: a job that trained
  // is let go on as it began.)
  const bool own_restore = job->restore.has_value() && job->restore->job_id() == job->status.job_id();
  if (!own_restore && spec.lr_schedule().kind() == v1::LrScheduleSpec::WARMUP_COSINE &&
      spec.lr_schedule().warmup_steps() > job->total_steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lrSchedule.warmupSteps ", spec.lr_schedule().warmup_steps(), " is more than the job's ",
        job->total_steps,
        " steps (its examples, batch and epochs or maxSteps): its warm-up would never reach optimizer.lr"));
  }
  // A checkpoint at the job's last step is there to be evaluated (nothing
  // left to train); one past it cannot be resumed.
  if (job->restore.has_value() && job->restore->job_id() != job->status.job_id() &&
      job->status.progress().step() > job->total_steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resumeFrom: checkpoint ", job->restore->job_id(), "/", job->restore->checkpoint_id(), " is at step ",
        job->status.progress().step(), ", past this job's last step ", job->total_steps,
        " (its examples, batch and epochs or maxSteps): set data.maxSteps to ", job->status.progress().step(),
        " to evaluate it as it is, or more epochs or maxSteps to train on"));
  }

  const ModelLayout layout = LayoutFor(spec, data.features(), data.classes());
  int64_t parameters = 0;
  for (const auto& tensor : layout.tensors) parameters += tensor.size;
  job->status.set_num_parameters(parameters);

  // The servers with room for their share (which grows as fewer take it),
  // this job's own reservation aside.
  job->server_claim = 0;
  // (Leaving out servers a re-shard's restart failed on.)
  auto with_room = [&](int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Member*> servers = ServersWithRoom(bytes);
    servers.erase(std::remove_if(servers.begin(), servers.end(),
                                 [&](const Member* m) { return job->restore_excluded.count(m->id) > 0; }),
                  servers.end());
    return servers;
  };
  std::vector<Member*> servers = with_room(0);
  int64_t per_server = 0;
  for (size_t count = 0; count != servers.size() && !servers.empty();) {
    count = servers.size();
    per_server = PerServerClaim(*job, static_cast<int>(count));
    std::vector<Member*> roomy = with_room(per_server);
    std::vector<Member*> kept;
    for (Member* m : servers) {
      if (std::find(roomy.begin(), roomy.end(), m) != roomy.end()) kept.push_back(m);
    }
    servers.swap(kept);
  }
  job->server_claim = per_server;  // reserved (on every server while it waits)
  const v1::CheckpointManifest* saved = RestoreManifest(*job);
  if (servers.empty()) {
    const int64_t copy = saved != nullptr ? saved->info().server_bytes() : 0;
    return absl::UnavailableError(absl::StrCat(
        "waiting for a parameter server with room: the job claims ", FormatBytes(per_server), " on each",
        copy > 0 ? absl::StrCat(" (checkpoint ", saved->job_id(), "/", saved->info().id(), " held ",
                                FormatBytes(copy), " a copy when taken)")
                 : std::string(),
        ", none is live with that much of its memory budget free"));
  }
  const int replicas = std::max(1, spec.replicas());
  if (static_cast<int>(servers.size()) < replicas) {
    return absl::UnavailableError(absl::StrCat(replicas, " replicas wanted but only ", servers.size(), " servers live"));
  }
  std::vector<ServerRef> refs;
  for (Member* server : servers) refs.push_back({server->id, server->address});
  job->shard_map = PlanShardMap(layout.tensors, refs, spec.num_shards(), replicas,
                                ChunkElemsFor(job->claims, options_.chunk_elems),
                                job->shard_map.version() + 1);  // > 1 when set up again (a restore)
  AddTableLayouts(layout.tables, spec, &job->shard_map, saved != nullptr ? &saved->shard_map() : nullptr);
  for (const v1::ShardLocation& shard : job->shard_map.shards()) {
    job->server_addresses[shard.server_id()] = shard.address();
    for (int b = 0; b < shard.backup_ids_size(); ++b) job->server_addresses[shard.backup_ids(b)] = shard.backup_addresses(b);
  }
  return absl::OkStatus();
}

void JobManager::ReplenishReplicas() {
  auto draining = [this](const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return members_.Draining(id); };
  for (auto& [job_id, job] : jobs_) {
    // (Not while a re-shard's checkpoint is written: the restart that
    // follows lays out every replica anew.)
    if (job->phase != Job::Phase::kTraining || job->handover.has_value() || job->reshard_checkpoint != 0) continue;
    const int replicas = std::max(1, job->status.spec().replicas());
    v1::ShardMap& map = job->shard_map;
    const std::set<int32_t> holding = HoldingShards(*job);
    for (v1::ShardLocation& shard : *map.mutable_shards()) {
      if (holding.count(shard.shard()) == 0 || shard.server_id().empty()) continue;
      int staying = draining(shard.server_id()) ? 0 : 1;
      for (const std::string& b : shard.backup_ids()) staying += draining(b) ? 0 : 1;
      // Short of replicas, or led by a leaving server with no staying backup.
      bool needs = 1 + shard.backup_ids_size() < replicas || (draining(shard.server_id()) && staying == 0);
      if (!needs) continue;
      // The live server that rendezvous hashing ranks highest for this shard
      // among those not in its group.
      std::vector<ServerRef> candidates;
      for (const Member* member : members_.WithRole(v1::SERVER)) {
        if (member->draining) continue;
        const std::string& id = member->id;
        if (DeclinedUntil(job->handover_declined, id) > clock_()) continue;
        if (job->copying.count(id) > 0) continue;  // a copy of an undone handover still runs there
        candidates.push_back({id, member->address});
      }
      std::optional<ServerRef> best = ChooseBackup(map, shard.shard(), candidates);
      if (!best.has_value()) continue;
      const std::string primary = shard.server_id();
      v1::HandoverRecord handover = AddBackup(&map, shard.shard(), *best);
      job->server_addresses[best->id] = best->address;
      AddEvent(job.get(), absl::StrCat(best->id, " joins shard ", handover.shard(), " as a backup (shard map version ",
                                       map.version(), "); copying it from ", primary));
      StartHandover(job.get(), std::move(handover));
      break;  // one newcomer per job at a time
    }
  }
}

void JobManager::DrainServers() {
  // When every server is leaving (the whole cluster going down) nothing can
  // take their shards: they go at once, and their jobs restart from a
  // checkpoint when servers are back (or fail, naming the shard).
  bool any_staying = false;
  for (const Member* member : members_.WithRole(v1::SERVER)) any_staying |= !member->draining;
  for (const Member* member : members_.WithRole(v1::SERVER)) {
    if (!member->draining) continue;
    const std::string id = member->id;
    for (auto& [job_id, job] : jobs_) {
      if (job->phase != Job::Phase::kTraining || job->handover.has_value()) continue;
      if (job->server_addresses.count(id) == 0) continue;
      // It can go once every shard it leads has a staying backup to take over
      // (ReplenishReplicas makes one where there is none).
      bool ready = true;
      for (const auto& shard : job->shard_map.shards()) {
        if (shard.server_id() != id) continue;
        bool staying_backup = false;
        for (const std::string& b : shard.backup_ids()) staying_backup |= members_.Contains(b) && !members_.Draining(b);
        ready &= staying_backup;
      }
      if (ready || !any_staying) FailOver(job.get(), id, absl::StrCat("server ", id, " leaves the cluster"));
    }
  }
}

void JobManager::GrowShards() {
  for (auto& [job_id, job] : jobs_) {
    if (job->phase != Job::Phase::kTraining || job->handover.has_value() || job->status.spec().num_shards() > 0) {
      continue;
    }
    const bool tables = job->shard_map.tables_size() > 0;
    if (tables && (job->checkpointing || job->reshard_checkpoint != 0 || Paused(*job))) continue;
    v1::ShardMap& map = job->shard_map;
    // A live server that leads no shard of the job yet: one that holds
    // nothing of it first (a backup keeps its role and its load).
    Member* newcomer = nullptr;
    bool newcomer_holds_some = false;
    int live = 0;
    for (Member* member : members_.WithRole(v1::SERVER)) {
      if (member->draining) continue;
      const std::string& id = member->id;
      ++live;
      bool leads = false;
      for (const auto& shard : map.shards()) leads |= shard.server_id() == id;
      if (DeclinedUntil(job->handover_declined, id) > clock_()) continue;
      if (tables && DeclinedUntil(job->reshard_declined, id) > clock_()) continue;
      if (job->copying.count(id) > 0) continue;  // a copy of an undone handover still runs there
      if (leads) continue;
      const bool holds_some = InMap(map, id);
      if (newcomer == nullptr || (newcomer_holds_some && !holds_some)) {
        newcomer = member;
        newcomer_holds_some = holds_some;
      }
    }
    if (newcomer == nullptr || live <= map.shards_size()) continue;
    if (tables) {
      ReshardThroughCheckpoint(job.get(), *newcomer);
      continue;
    }
    v1::HandoverRecord handover = AddShard(&map, {newcomer->id, newcomer->address});
    job->server_addresses[newcomer->id] = newcomer->address;
    AddEvent(job.get(), absl::StrCat(newcomer->id, " joins as shard ", handover.shard(), " and takes ",
                                     handover.moved_from_size(), " of ", map.chunks_size(),
                                     " chunks (shard map version ", map.version(), ")"));
    // The old replicas first take the new map (and refuse the moved chunks
    // from then on), then the newcomer copies them.
    StartHandover(job.get(), std::move(handover));
  }
}

void JobManager::FailOver(Job* job, const std::string& server_id, const std::string& why) {
  // (No DropJob to it: it is told to drop its stale copy when it registers
  // again; see ReconcileCopies.)
  if (job->handover.has_value() && job->handover->server_id() == server_id) {
    // It never held what it was copying: the map goes back to how it was.
    AbandonHandover(job, absl::StrCat(why, " before it held its copy"));
  } else if (job->handover.has_value() && InMap(job->shard_map, server_id)) {
    // Another replica is lost while a newcomer copies: the handover's map
    // goes back first (moved chunks return to the shards they left, whose
    // replicas kept them), so that every replica holding a shard whole can
    // take it over; a newcomer that is a whole backup of some shard while it
    // copies another would otherwise never be promoted for it. The newcomer
    // is asked again on a later tick.
    AbandonHandover(job, absl::StrCat(why, " while ", job->handover->server_id(), " copied its share"),
                    /*newcomer_at_fault=*/false);
  }
  if (job->server_addresses.erase(server_id) == 0) return;
  if (job->phase == Job::Phase::kLoading || job->phase == Job::Phase::kPending) return;  // no shards yet
  v1::ShardMap& map = job->shard_map;
  // A backup still copying its state is never promoted.
  const std::string copying = job->handover.has_value() ? job->handover->server_id() : "";
  std::optional<int32_t> lost;
  const std::vector<std::string> changes = RemoveServer(&map, server_id, HoldingShards(*job), copying, &lost);
  if (lost.has_value()) {
    std::string why_lost = absl::StrCat(why, "; it held the only replica of shard ", *lost);
    if (!RestoreFromCheckpoint(job, why_lost)) {
      // What would have saved it: more replicas only where it had one.
      const bool replicated = job->status.spec().replicas() >= 2;
      EndJob(job, v1::FAILED,
             absl::StrCat(why_lost, replicated ? " (every replica of it was lost at once, and the job has no "
                                                 "complete checkpoint: set checkpoint.everySteps or everySeconds "
                                                 "to survive this)"
                                               : " (set replicas >= 2, or checkpoints, to survive this)"));
    }
    return;
  }
  job->status.set_failovers(job->status.failovers() + 1);
  AddEvent(job, absl::StrCat(why, "; shard map version ", map.version(), ": ", absl::StrJoin(changes, ", ")));
  if (job->phase == Job::Phase::kSettingUp) return;  // RunSetup fails and the job with it
  const std::string job_id = job->status.job_id();
  for (const auto& [id, address] : job->server_addresses) {
    actions_.push_back([this, address = address, job_id, map = map] {
      IgnoreError(servers_->Reconfigure(address, job_id, map));
    });
  }
}

void JobManager::RunSetup(const std::string& job_id, std::map<std::string, v1::SetupJobRequest> requests) {
  absl::Status failure;
  std::string failed_server;
  for (auto& [address, request] : requests) {
    absl::Status status = servers_->SetupJob(address, request);
    if (absl::IsAlreadyExists(status)) {
      // The server still holds a trained copy from before (a restore whose
      // DropJob did not reach it): this setup supersedes it.
      IgnoreError(servers_->DropJob(address, job_id, "set up afresh by the scheduler", /*keep_parameters=*/false,
                                    request.shard_map().version() - 1));
      status = servers_->SetupJob(address, request);
    }
    if (!status.ok()) {
      failure = absl::Status(status.code(), absl::StrCat("setting up shards on server ", address,
                                                         ": ", status.message()));
      failed_server = request.server_id();
      break;
    }
  }
  MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr || job->phase != Job::Phase::kSettingUp) return;  // ended meanwhile
  if (!failure.ok()) {
    // A re-shard's restart (a server joined) that a server could not take
    // part in (it died, or refused: its budget) starts again from the same
    // checkpoint without that server, rather than giving the checkpoint up:
    // nothing is wrong with it, and a job that took no other one would fail.
    constexpr int kReshardAttempts = 3;
    if (job->resharding && !absl::IsDataLoss(failure) && ++job->reshard_setup_failures < kReshardAttempts) {
      job->restore_excluded.insert(failed_server);
      job->reshard_declined[failed_server] = clock_() + absl::Minutes(1);
      job->restore.reset();
      if (RestoreFromCheckpoint(job, absl::StrCat(failure.message(), "; the job restarts from the same checkpoint "
                                                  "without ", failed_server))) {
        return;
      }
    }
    if (!RestoreFailed(job, failure)) EndJob(job, v1::FAILED, std::string(failure.message()));
    return;
  }
  job->resharding = false;
  job->reshard_setup_failures = 0;
  job->restore_excluded.clear();
  const bool restored = job->restore.has_value();
  job->restore_skipped.clear();
  job->restore_setup_retries = 0;
  if (restored) {
    AddEvent(job, absl::StrCat("restored from checkpoint ", job->restore->checkpoint_id(), " of job ",
                               job->restore->job_id(), " at step ", job->status.progress().step()));
    job->restore.reset();
  }
  job->phase = Job::Phase::kTraining;
  job->status.set_reason("training");
  job->last_checkpoint_time = clock_();  // periodic checkpoints count from here
  job->last_checkpoint_step = job->status.progress().step();
  if (job->shard_map.version() > 1 && !restored) {  // a server failed during the setup: give the others the new map
    for (const auto& [id, address] : job->server_addresses) {
      actions_.push_back([this, address = address, job_id, map = job->shard_map] {
        IgnoreError(servers_->Reconfigure(address, job_id, map));
      });
    }
  }
  AddEvent(job, absl::StrCat("training with ", job->workers.size(), " workers on ", job->num_partitions,
                             " partitions"));
  *job->status.mutable_shard_map() = job->shard_map;
  FLOG(INFO) << "job " << job_id << " training: " << job->status.num_parameters() << " parameters in "
             << job->shard_map.chunks_size() << " chunks on " << job->server_addresses.size()
             << " servers, " << job->total_steps << " steps";
  Touch(job);
}

}  // namespace fulcrum
