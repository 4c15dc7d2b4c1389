// JobManager: members, leases and the ownership of data partitions.
//
// A job has num_partitions = maxWorkers data partitions. Ready workers own
// them, spread as evenly as possible; when a worker dies its partitions go to
// the others, and a joining worker takes some once its data is loaded. Every
// change bumps the job's membership epoch and is recorded as an event.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/ascii.h"
#include "common/logging.h"
#include "common/quote.h"
#include "common/memory_budget.h"
#include "common/status_macros.h"
#include "scheduler/job_manager_internal.h"
#include "common/sync.h"

namespace fulcrum {
namespace {

constexpr int kMaxEvents = 200;

int64_t UnixMillis(absl::Time t) { return absl::ToUnixMillis(t); }

std::string PartitionList(const std::vector<int32_t>& partitions) {
  return absl::StrCat("{", absl::StrJoin(partitions, ","), "}");
}

// Member ids name pods and processes in events, logs and metrics labels:
// letters, digits, '.', '_' and '-', as Kubernetes names are.
bool ValidMemberId(const std::string& id) {
  if (id.empty() || id.size() > 128 || !absl::ascii_isalnum(static_cast<unsigned char>(id[0]))) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

absl::Status CheckRegistration(const v1::RegisterRequest& request) {
  if (!request.requested_id().empty() && !ValidMemberId(request.requested_id())) {
    return absl::InvalidArgumentError(absl::StrCat("register: requested id ", Quote(request.requested_id()),
                                                   " must be 1-128 letters, digits, '.', '_' or '-', starting with "
                                                   "a letter or digit"));
  }
  for (const auto& [field, value] : {std::pair<const char*, const std::string*>{"address", &request.address()},
                                     {"metrics address", &request.metrics_address()},
                                     {"device", &request.device()}}) {
    if (value->size() > 256 || !IsPrintable(*value)) {
      return absl::InvalidArgumentError(absl::StrCat("register: the ", field, " must be at most 256 printable "
                                                     "characters (got ", Quote(*value, 64), ")"));
    }
  }
  if (request.jobs_size() > 100000) return absl::InvalidArgumentError("register: too many held jobs listed");
  for (const std::string& job : request.jobs()) {
    if (job.size() > 256 || !IsPrintable(job)) {
      return absl::InvalidArgumentError(absl::StrCat("register: held job id ", Quote(job, 64), " is not a job id"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::RegisterResponse> JobManager::Register(const v1::RegisterRequest& request) {
  if (request.role() != v1::SERVER && request.role() != v1::WORKER) {
    return absl::InvalidArgumentError("register: role must be SERVER or WORKER");
  }
  if (request.role() == v1::SERVER && request.address().empty()) {
    return absl::InvalidArgumentError("register: a server must give its address");
  }
  RETURN_IF_ERROR(CheckRegistration(request));
  MutexLock lock(&mu_);
  std::string id = request.requested_id();
  if (id.empty()) {
    const char* prefix = request.role() == v1::SERVER ? "server-" : "worker-";
    do {
      id = absl::StrCat(prefix, next_member_[request.role()]++);
    } while (members_.count(id) > 0);
  }
  auto existing = members_.find(id);
  if (existing != members_.end() && existing->second->incarnation != request.incarnation() &&
      clock_() - existing->second->last_heartbeat <= options_.lease) {
    // Another process holds the id and its lease: two processes must never
    // share one. A restarted process lands here until the old lease runs out.
    const Member& holder = *existing->second;
    return absl::AlreadyExistsError(absl::StrFormat(
        "register: id \"%s\" is held by a live %s (pid %d, address %s, lease renewed %.1fs ago): "
        "choose another id, or, if that process is gone, retry after its lease (%.1fs) expires",
        id, holder.role == v1::SERVER ? "server" : "worker", holder.pid,
        holder.address.empty() ? "none" : holder.address, absl::ToDoubleSeconds(clock_() - holder.last_heartbeat),
        absl::ToDoubleSeconds(options_.lease)));
  }
  if (existing != members_.end()) {
    // The same id registering again is a restarted process: whatever it held
    // for running jobs (a worker's partitions, a server's parameters) is gone.
    for (auto& [job_id, job] : jobs_) {
      if (job->phase == Job::Phase::kEnded || job->phase == Job::Phase::kPending) continue;
      if (existing->second->job_id == job_id) {
        RemoveWorker(job.get(), id, "restarted");
      }
    }
  }
  auto member = std::make_unique<Member>();
  member->id = id;
  member->role = request.role();
  member->address = request.address();
  member->metrics_address = request.metrics_address();
  member->device = request.device();
  member->pid = request.pid();
  member->incarnation = request.incarnation();
  member->memory_budget = std::max<int64_t>(0, request.memory_budget_bytes());
  member->last_heartbeat = clock_();
  // After a scheduler restart, members of running jobs register again: a
  // worker goes back to its job; a server must still hold the job's shards.
  for (auto& [job_id, job] : jobs_) {
    if (job->phase == Job::Phase::kEnded || job->phase == Job::Phase::kPending) continue;
    if (request.role() == v1::WORKER && existing == members_.end()) {
      for (const JobWorker& w : job->workers) {
        if (w.id == id) member->job_id = job_id;
      }
    }
    if (request.role() == v1::SERVER && job->server_addresses.count(id) > 0 &&
        job->phase != Job::Phase::kLoading &&
        std::find(request.jobs().begin(), request.jobs().end(), job_id) == request.jobs().end()) {
      FailOver(job.get(), id, absl::StrCat("server ", id, " restarted and lost the job's parameters"));
    }
  }
  if (request.role() == v1::SERVER) {
    DropStaleCopies(id, request);
    // Data of checkpoints never committed (the scheduler restarted while
    // they were written) is deleted wherever it may be.
    for (const auto& [job_id, job] : jobs_) {
      for (int64_t orphan : job->orphaned_checkpoints) {
        actions_.push_back([this, address = request.address(), job_id = job_id, orphan] {
          IgnoreError(servers_->DeleteCheckpoint(address, job_id, orphan));
        });
      }
    }
  }
  members_[id] = std::move(member);
  FLOG(INFO) << "registered " << id << " (" << v1::Role_Name(request.role()) << ", "
             << (request.address().empty() ? "no address" : request.address()) << ")";
  v1::RegisterResponse response;
  response.set_member_id(id);
  response.set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return response;
}

void JobManager::DropStaleCopies(const std::string& server_id, const v1::RegisterRequest& request) {
  // A server coming back (a restart that kept its state, a partition that
  // healed) may hold jobs it no longer serves: it was failed over, or the job
  // is gone. Its copy is stale; it must never be read or written again.
  for (const std::string& job_id : request.jobs()) {
    Job* job = FindJob(job_id);
    std::string why;
    if (job == nullptr) {
      why = "the scheduler does not know the job";
    } else if (job->server_addresses.count(server_id) == 0 && job->phase != Job::Phase::kPending &&
               job->phase != Job::Phase::kLoading) {
      why = "this server no longer serves the job (it was failed over)";
    } else {
      continue;
    }
    FLOG(WARNING) << "server " << server_id << " holds a stale copy of job " << job_id << ": " << why
                  << "; dropping it";
    if (job != nullptr) AddEvent(job, absl::StrCat(server_id, " rejoined with a stale copy; dropped"));
    const int64_t version = job != nullptr ? job->shard_map.version() : 0;
    actions_.push_back([this, address = request.address(), job_id, why, version] {
      IgnoreError(servers_->DropJob(address, job_id, absl::StrCat("stale copy: ", why), /*keep_parameters=*/false,
                                    version));
    });
  }
}

absl::StatusOr<v1::HeartbeatResponse> JobManager::Heartbeat(const v1::HeartbeatRequest& request) {
  MutexLock lock(&mu_);
  auto it = members_.find(request.member_id());
  if (it == members_.end()) {
    return absl::NotFoundError(absl::StrCat("member \"", request.member_id(),
                                            "\" is not registered (lease expired?): register again"));
  }
  Member& member = *it->second;
  member.last_heartbeat = clock_();
  v1::HeartbeatResponse response;
  if (member.role == v1::WORKER) *response.mutable_assignment() = AssignmentFor(member);
  if (member.draining) response.set_drained(Drained(member.id));
  return response;
}

absl::Status JobManager::Leave(const std::string& member_id) {
  MutexLock lock(&mu_);
  auto it = members_.find(member_id);
  if (it == members_.end()) return absl::NotFoundError(absl::StrCat("member \"", member_id, "\" is not registered"));
  if (it->second->role != v1::SERVER) return absl::InvalidArgumentError("only servers leave through Leave");
  if (!it->second->draining) FLOG(INFO) << "server " << member_id << " leaves: moving its shards away";
  it->second->draining = true;
  return absl::OkStatus();
}

bool JobManager::Drained(const std::string& server_id) const {
  for (const auto& [job_id, job] : jobs_) {
    if (job->phase == Job::Phase::kEnded || job->phase == Job::Phase::kPending) continue;
    if (job->server_addresses.count(server_id) > 0) return false;
  }
  return true;
}

v1::Assignment JobManager::AssignmentFor(const Member& member) const {
  v1::Assignment assignment;
  Job* job = member.job_id.empty() ? nullptr : FindJob(member.job_id);
  if (job == nullptr || job->phase == Job::Phase::kEnded) return assignment;
  const JobWorker* self = nullptr;
  for (const JobWorker& w : job->workers) {
    if (w.id == member.id) self = &w;
  }
  if (self == nullptr) return assignment;
  assignment.set_job_id(job->status.job_id());
  *assignment.mutable_spec() = job->status.spec();
  assignment.set_rank(self->rank);
  assignment.set_world_size(static_cast<int32_t>(job->workers.size()));
  assignment.set_num_partitions(job->num_partitions);
  assignment.set_membership_epoch(job->status.membership_epoch());
  assignment.set_eval_partition(0);
  if (job->phase != Job::Phase::kTraining || !self->ready) {
    assignment.set_phase(v1::Assignment::LOAD);
    return assignment;
  }
  assignment.set_phase(v1::Assignment::TRAIN);
  *assignment.mutable_shard_map() = job->shard_map;
  assignment.set_steps_per_epoch(job->steps_per_epoch);
  assignment.set_total_steps(job->total_steps);
  // Below minWorkers the job pauses: workers keep the map but compute nothing.
  if (Paused(*job)) return assignment;
  for (int32_t p : self->partitions) {
    assignment.add_partitions(p);
    assignment.add_partition_steps(job->partition_steps[p]);
  }
  return assignment;
}

std::vector<v1::MemberInfo> JobManager::Members() const {
  MutexLock lock(&mu_);
  std::vector<v1::MemberInfo> members;
  for (const auto& [id, member] : members_) {
    v1::MemberInfo info;
    info.set_member_id(id);
    info.set_role(member->role);
    info.set_address(member->address);
    info.set_metrics_address(member->metrics_address);
    info.set_job_id(member->job_id);
    info.set_last_heartbeat_unix_ms(UnixMillis(member->last_heartbeat));
    info.set_device(member->device);
    info.set_draining(member->draining);
    info.set_memory_budget_bytes(member->memory_budget);
    if (member->role == v1::SERVER) info.set_memory_claimed_bytes(ServerClaimed(id));
    members.push_back(std::move(info));
  }
  return members;
}

void JobManager::ExpireLeases() {
  absl::Time now = clock_();
  for (auto it = members_.begin(); it != members_.end();) {
    Member& member = *it->second;
    absl::Duration silent = now - member.last_heartbeat;
    if (silent <= options_.lease) {
      ++it;
      continue;
    }
    std::string what = absl::StrFormat("%s %s lost its lease: no heartbeat for %.1fs",
                                       member.role == v1::SERVER ? "server" : "worker", member.id,
                                       absl::ToDoubleSeconds(silent));
    FLOG(WARNING) << what;
    for (auto& [job_id, job] : jobs_) {
      if (job->phase == Job::Phase::kEnded || job->phase == Job::Phase::kPending) continue;
      if (job->server_addresses.count(member.id) > 0) {
        FailOver(job.get(), member.id, what);
      } else if (member.job_id == job_id) {
        RemoveWorker(job.get(), member.id, absl::StrFormat("lost (no heartbeat for %.1fs)",
                                                           absl::ToDoubleSeconds(silent)));
      }
    }
    it = members_.erase(it);
  }
}

void JobManager::SchedulePending() {
  // First come, first served, with a bound: a job waiting for workers or
  // servers that others hold keeps the jobs behind it waiting (so a big job
  // is not starved by a stream of small ones), but only for max_queue_wait;
  // then jobs behind it that fit may start first. One that cannot run on the
  // cluster as it is holds nobody up.
  const absl::Time now = clock_();
  std::vector<std::string> queue(pending_.begin(), pending_.end());
  for (const std::string& id : queue) {
    Job* job = FindJob(id);
    if (job == nullptr || job->phase != Job::Phase::kPending) {
      pending_.erase(std::remove(pending_.begin(), pending_.end(), id), pending_.end());
      continue;
    }
    const StartOutcome start = TryAssign(job);
    if (start == StartOutcome::kStarted) {
      pending_.erase(std::remove(pending_.begin(), pending_.end(), id), pending_.end());
      continue;
    }
    if (start == StartOutcome::kNotOnThisCluster) {
      job->waiting_since.reset();
      continue;
    }
    if (!job->waiting_since.has_value()) job->waiting_since = now;
    if (now - *job->waiting_since < options_.max_queue_wait) return;
  }
}

bool JobManager::WorkerFits(const Member& worker, const Job& job) const {
  return worker.memory_budget == 0 || job.claims.worker_bytes <= worker.memory_budget;
}

int64_t JobManager::ServerClaimed(const std::string& server_id) const {
  int64_t claimed = 0;
  for (const auto& [id, job] : jobs_) {
    // A job loading its data is not placed yet: it may land on any server.
    const bool unplaced = job->phase == Job::Phase::kLoading;
    if (unplaced || job->server_addresses.count(server_id) > 0) claimed += job->server_claim;
  }
  return claimed;
}

std::vector<JobManager::Member*> JobManager::ServersWithRoom(int64_t per_server) const {
  std::vector<Member*> servers;
  for (const auto& [id, member] : members_) {
    if (member->role != v1::SERVER || member->draining) continue;
    if (member->memory_budget > 0 && ServerClaimed(id) + per_server > member->memory_budget) continue;
    servers.push_back(member.get());
  }
  return servers;
}

JobManager::StartOutcome JobManager::TryAssign(Job* job) {
  const int wanted = job->status.spec().num_workers();
  const int replicas = std::max(1, job->status.spec().replicas());
  std::vector<Member*> idle;
  int workers_fitting = 0, servers = 0;
  for (auto& [id, member] : members_) {
    if (member->role == v1::SERVER && !member->draining) ++servers;
    if (member->role != v1::WORKER || !WorkerFits(*member, *job)) continue;
    ++workers_fitting;
    if (member->job_id.empty()) idle.push_back(member.get());
  }
  const int64_t per_server = PerServerBytes(job->claims, job->status.spec(), std::max(1, servers));
  const int servers_with_room = static_cast<int>(ServersWithRoom(per_server).size());
  auto wait = [&](StartOutcome start, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (job->status.reason() != reason) {
      job->status.set_reason(reason);
      Touch(job);
    }
    return start;
  };
  if (workers_fitting < wanted || servers < replicas) {
    return wait(StartOutcome::kNotOnThisCluster,
                absl::StrFormat("cannot start on the cluster as it is: needs %d workers with %s of memory budget "
                                "(%d registered) and %d servers for %d replicas (%d registered); jobs queued behind "
                                "it may start first",
                                wanted, FormatBytes(job->claims.worker_bytes), workers_fitting, replicas, replicas,
                                servers));
  }
  if (static_cast<int>(idle.size()) < wanted || servers_with_room < replicas) {
    std::string reason = absl::StrFormat(
        "waiting for resources: %d of %d workers idle, %d of %d servers with %s of memory free (%d replicas wanted)",
        idle.size(), wanted, servers_with_room, servers, FormatBytes(per_server), replicas);
    if (job->waiting_since.has_value() && clock_() - *job->waiting_since >= options_.max_queue_wait) {
      absl::StrAppend(&reason, "; jobs queued behind it may start first");
    }
    return wait(StartOutcome::kWaiting, reason);
  }
  job->phase = Job::Phase::kLoading;
  job->server_claim = per_server;  // reserved on every server until it is placed
  job->waiting_since.reset();
  job->started = clock_();
  job->status.set_state(v1::RUNNING);
  job->status.set_reason("workers loading data");
  job->status.set_start_time_unix_ms(UnixMillis(job->started));
  for (int i = 0; i < wanted; ++i) AddWorker(job, idle[i]);
  FLOG(INFO) << "job " << job->status.job_id() << " assigned to " << wanted << " workers";
  return StartOutcome::kStarted;
}

void JobManager::GrowJobs() {
  // Running jobs take idle workers up to maxWorkers; pending jobs come first
  // (SchedulePending ran before), so elastic growth never starves a new job.
  for (auto& [job_id, job] : jobs_) {
    if (job->phase != Job::Phase::kLoading && job->phase != Job::Phase::kTraining) continue;
    for (auto& [id, member] : members_) {
      if (static_cast<int>(job->workers.size()) >= job->status.spec().max_workers()) break;
      if (member->role != v1::WORKER || !member->job_id.empty() || !WorkerFits(*member, *job)) continue;
      AddWorker(job.get(), member.get());
      AddEvent(job.get(), absl::StrCat(id, " joined; loading data"));
    }
  }
}

void JobManager::AddWorker(Job* job, Member* member) {
  member->job_id = job->status.job_id();
  JobWorker worker;
  worker.id = member->id;
  worker.rank = job->next_rank++;
  job->workers.push_back(std::move(worker));
  SyncWorkerStatus(job);
  Touch(job);
}

void JobManager::RemoveWorker(Job* job, const std::string& worker_id, const std::string& why) {
  auto it = std::find_if(job->workers.begin(), job->workers.end(),
                         [&](const JobWorker& w) { return w.id == worker_id; });
  if (it == job->workers.end()) return;
  std::vector<int32_t> orphans = it->partitions;
  job->workers.erase(it);
  auto member = members_.find(worker_id);
  if (member != members_.end() && member->second->job_id == job->status.job_id()) member->second->job_id.clear();
  Rebalance(job);
  std::string message = absl::StrCat(worker_id, " ", why);
  if (!orphans.empty()) absl::StrAppend(&message, "; its partitions ", PartitionList(orphans), " moved");
  AddEvent(job, message);
}

bool JobManager::Paused(const Job& job) const {
  if (job.phase != Job::Phase::kTraining) return false;
  int ready = 0;
  for (const JobWorker& w : job.workers) ready += w.ready ? 1 : 0;
  return ready < job.status.spec().min_workers();
}

void JobManager::UpdatePause(Job* job) {
  constexpr absl::string_view kWaiting = "paused: waiting for workers";
  const bool waiting = absl::StartsWith(job->status.reason(), kWaiting);
  if (Paused(*job)) {
    int ready = 0;
    for (const JobWorker& w : job->workers) ready += w.ready ? 1 : 0;
    std::string reason = absl::StrFormat("%s (%d ready, minWorkers %d)", kWaiting, ready,
                                         job->status.spec().min_workers());
    if (job->status.reason() != reason) {
      if (!waiting) AddEvent(job, reason);
      job->status.set_reason(reason);
      Touch(job);
    }
  } else if (waiting) {
    job->status.set_reason("");
    AddEvent(job, "resumed: minWorkers ready");
  }
}

void JobManager::Rebalance(Job* job) {
  std::vector<JobWorker*> ready;
  for (JobWorker& w : job->workers) {
    if (w.ready) ready.push_back(&w);
  }
  std::vector<bool> owned(job->num_partitions, false);
  for (JobWorker* w : ready) {
    for (int32_t p : w->partitions) owned[p] = true;
  }
  if (ready.empty()) {  // unowned partitions wait for a ready worker
    UpdatePause(job);
    return;
  }
  auto least = [&] {
    return *std::min_element(ready.begin(), ready.end(), [](JobWorker* a, JobWorker* b) {
      return a->partitions.size() < b->partitions.size();
    });
  };
  for (int32_t p = 0; p < job->num_partitions; ++p) {
    if (!owned[p]) least()->partitions.push_back(p);
  }
  // Even out: move the highest partition of the busiest worker to the idlest.
  while (true) {
    JobWorker* most = *std::max_element(ready.begin(), ready.end(), [](JobWorker* a, JobWorker* b) {
      return a->partitions.size() < b->partitions.size();
    });
    JobWorker* fewest = least();
    if (most->partitions.size() <= fewest->partitions.size() + 1) break;
    fewest->partitions.push_back(most->partitions.back());
    most->partitions.pop_back();
  }
  for (JobWorker* w : ready) std::sort(w->partitions.begin(), w->partitions.end());
  SyncWorkerStatus(job);
  UpdatePause(job);
}

void JobManager::AddEvent(Job* job, const std::string& message) {
  job->status.set_membership_epoch(job->status.membership_epoch() + 1);
  v1::JobEvent* event = job->status.add_events();
  event->set_time_unix_ms(UnixMillis(clock_()));
  event->set_membership_epoch(job->status.membership_epoch());
  event->set_message(message);
  if (job->status.events_size() > kMaxEvents) job->status.mutable_events()->DeleteSubrange(0, 1);
  FLOG(INFO) << "job " << job->status.job_id() << " epoch " << job->status.membership_epoch() << ": " << message;
  Touch(job);
}

void JobManager::SyncWorkerStatus(Job* job) {
  job->status.clear_workers();
  for (const JobWorker& w : job->workers) {
    v1::WorkerAssignmentInfo* info = job->status.add_workers();
    info->set_worker_id(w.id);
    info->set_rank(w.rank);
    info->set_ready(w.ready);
    info->set_step_seconds(w.progress.step_seconds());
    info->set_samples_per_second(w.progress.samples_per_second());
    info->set_straggler(w.straggler);
    for (int32_t p : w.partitions) info->add_partitions(p);
    auto member = members_.find(w.id);
    if (member != members_.end()) info->set_address(member->second->address);
  }
}

}  // namespace fulcrum
