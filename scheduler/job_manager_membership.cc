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
#include "scheduler/partitions.h"
#include "common/sync.h"

namespace fulcrum {
namespace {

constexpr int kMaxEvents = 200;

std::string PartitionList(const std::vector<int32_t>& partitions) {
  return absl::StrCat("{", absl::StrJoin(partitions, ","), "}");
}

}  // namespace

absl::StatusOr<v1::RegisterResponse> JobManager::Register(const v1::RegisterRequest& request) {
  RETURN_IF_ERROR(CheckRegistration(request));
  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const std::string id, members_.ChooseId(request, clock_()));
  if (!members_.Contains(id) && members_.all().size() >= static_cast<size_t>(options_.max_members)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "register: the cluster has ", members_.all().size(),
        " members, the most this scheduler takes (fulcrum-scheduler --max_members); a member that stops "
        "heartbeating frees its place when its lease runs out"));
  }
  if (request.role() == v1::SERVER) servers_->MarkAlive(request.address());
  Member* existing = members_.Find(id);
  if (existing != nullptr) {
    // The same id registering again is a restarted process: whatever it held
    // for running jobs (a worker's partitions, a server's parameters) is gone.
    for (auto& [job_id, job] : jobs_) {
      if (job->phase == Job::Phase::kEnded || job->phase == Job::Phase::kPending) continue;
      if (existing->job_id == job_id) RemoveWorker(job.get(), id, "restarted");
    }
  }
  const bool known = existing != nullptr;
  std::string resumes;  // a worker's job after a scheduler restart
  // After a scheduler restart, members of running jobs register again: a
  // worker goes back to its job; a server must still hold the job's shards.
  for (auto& [job_id, job] : jobs_) {
    if (job->phase == Job::Phase::kEnded && request.role() == v1::SERVER &&
        job->server_addresses.count(id) > 0 &&
        std::find(request.jobs().begin(), request.jobs().end(), job_id) == request.jobs().end()) {
      if (job->status.parameters_released_unix_ms() == 0 && ForgetHolder(job.get(), id)) {
        AddEvent(job.get(), absl::StrCat("server ", id,
                                         " restarted without its parameters; the shards it held are "
                                         "read from their other replicas"));
      } else {
        LoseParameters(job.get(), absl::StrCat("server ", id, " restarted without them"));
      }
    }
    if (job->phase == Job::Phase::kEnded || job->phase == Job::Phase::kPending) continue;
    if (request.role() == v1::WORKER && !known) {
      for (const JobWorker& w : job->workers) {
        if (w.id == id) resumes = job_id;
      }
    }
    if (request.role() == v1::SERVER && job->server_addresses.count(id) > 0 &&
        job->phase != Job::Phase::kLoading &&
        std::find(request.jobs().begin(), request.jobs().end(), job_id) == request.jobs().end()) {
      FailOver(job.get(), id, absl::StrCat("server ", id, " restarted and lost the job's parameters"));
    }
  }
  if (request.role() == v1::SERVER) {
    ReconcileCopies(id, request);
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
  members_.Add(request, id, clock_())->job_id = resumes;
  FLOG(INFO) << "registered " << id << " (" << v1::Role_Name(request.role()) << ", "
             << (request.address().empty() ? "no address" : request.address()) << ")";
  v1::RegisterResponse response;
  response.set_member_id(id);
  response.set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return response;
}

void JobManager::ReconcileCopies(const std::string& server_id, const v1::RegisterRequest& request) {
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
      // It still serves the job: it gets the current map again. A scheduler
      // that restarted may have left it behind (a map it missed, or a new
      // shard's activation it never sent); not the newcomer of a handover
      // still being copied, which waits for FinishHandover's activation.
      const bool copying = job->handover.has_value() && job->handover->server_id() == server_id;
      if (job->phase == Job::Phase::kTraining && !copying) {
        actions_.push_back([this, address = request.address(), job_id, map = job->shard_map] {
          IgnoreError(servers_->Reconfigure(address, job_id, map));
        });
      }
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

namespace {

// NOT_FOUND when `member` is held by another process than `incarnation`
// (0: any): a process paused while a replacement registered under its id
// renews no lease and drains nothing when it comes back.
absl::Status CheckIncarnation(const Member* member, uint64_t incarnation) {
  if (member == nullptr || incarnation == 0 || member->incarnation == incarnation) return absl::OkStatus();
  return absl::NotFoundError(absl::StrFormat(
      "member \"%s\" is held by another process (pid %d, address %s) that registered since: this one was "
      "replaced; register again",
      member->id, member->pid, member->address.empty() ? "none" : member->address));
}

// INVALID_ARGUMENT for held bytes no server reports: too many jobs, a
// negative count or one past any server's memory.
absl::Status CheckHeldBytes(const v1::HeartbeatRequest& request) {
  if (request.held_bytes_size() > kMaxHeldJobs) {
    return absl::InvalidArgumentError(absl::StrCat("heartbeat: held bytes of ", request.held_bytes_size(),
                                                   " jobs; at most ", kMaxHeldJobs));
  }
  for (const auto& [job_id, bytes] : request.held_bytes()) {
    if (bytes < 0 || bytes > kMaxHeldBytes) {
      return absl::InvalidArgumentError(absl::StrCat("heartbeat: job ", Quote(job_id, 64), " holds ", bytes,
                                                     " bytes; a count is 0 to ", kMaxHeldBytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::HeartbeatResponse> JobManager::Heartbeat(const v1::HeartbeatRequest& request) {
  MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckIncarnation(members_.Find(request.member_id()), request.incarnation()));
  RETURN_IF_ERROR(CheckHeldBytes(request));
  Member* member = members_.Renew(request.member_id(), clock_());
  if (member == nullptr) {
    return absl::NotFoundError(absl::StrCat("member ", Quote(request.member_id()),
                                            " is not registered (lease expired?): register again"));
  }
  if (member->role == v1::SERVER) {
    member->held_bytes.clear();
    for (const auto& [job_id, bytes] : request.held_bytes()) {
      if (FindJob(job_id) != nullptr) member->held_bytes[job_id] = bytes;
    }
  }
  v1::HeartbeatResponse response;
  if (member->role == v1::WORKER) *response.mutable_assignment() = AssignmentFor(*member);
  if (member->draining) response.set_drained(Drained(member->id));
  return response;
}

absl::Status JobManager::Leave(const std::string& member_id, uint64_t incarnation) {
  MutexLock lock(&mu_);
  Member* member = members_.Find(member_id);
  if (member == nullptr) return absl::NotFoundError(absl::StrCat("member ", Quote(member_id), " is not registered"));
  RETURN_IF_ERROR(CheckIncarnation(member, incarnation));
  if (member->role != v1::SERVER) return absl::InvalidArgumentError("only servers leave through Leave");
  if (!member->draining) FLOG(INFO) << "server " << member_id << " leaves: moving its shards away";
  member->draining = true;
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
  for (const auto& [id, member] : members_.all()) {
    v1::MemberInfo info;
    info.set_member_id(id);
    info.set_role(member->role);
    info.set_address(member->address);
    info.set_metrics_address(member->metrics_address);
    info.set_job_id(member->job_id);
    info.set_last_heartbeat_unix_ms(absl::ToUnixMillis(member->last_heartbeat));
    info.set_device(member->device);
    info.set_draining(member->draining);
    info.set_memory_budget_bytes(member->memory_budget);
    if (member->role == v1::SERVER) info.set_memory_claimed_bytes(ServerClaimed(id));
    members.push_back(std::move(info));
  }
  return members;
}

void JobManager::ExpireLeases() {
  for (const Membership::Lost& lost : members_.Expire(clock_())) {
    const Member& member = lost.member;
    const std::string what = absl::StrFormat("%s %s lost its lease: no heartbeat for %.1fs",
                                             member.role == v1::SERVER ? "server" : "worker", member.id,
                                             absl::ToDoubleSeconds(lost.silent));
    FLOG(WARNING) << what;
    if (member.role == v1::SERVER) servers_->MarkDead(member.address);  // a paused one holds no call up
    for (auto& [job_id, job] : jobs_) {
      if (job->phase == Job::Phase::kEnded || job->phase == Job::Phase::kPending) continue;
      if (job->server_addresses.count(member.id) > 0) {
        FailOver(job.get(), member.id, what);
      } else if (member.job_id == job_id) {
        RemoveWorker(job.get(), member.id,
                     absl::StrFormat("lost (no heartbeat for %.1fs)", absl::ToDoubleSeconds(lost.silent)));
      }
    }
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

int64_t JobManager::ServerClaimed(const std::string& server_id, const Job* except) const {
  const Member* server = members_.Find(server_id);
  int64_t claimed = 0;
  for (const auto& [id, job] : jobs_) {
    if (job.get() == except) continue;
    const int64_t held = server != nullptr ? server->HeldBytes(id) : 0;
    // A job loading its data is not placed yet: it may land on any server.
    // A placed one claims its estimate, or what it holds when more (its
    // tables grew); one no longer placed here what it still holds.
    const bool unplaced = job->phase == Job::Phase::kLoading;
    claimed +=
        unplaced || job->server_addresses.count(server_id) > 0 ? std::max(job->server_claim, held) : held;
  }
  return claimed;
}

std::vector<Member*> JobManager::ServersWithRoom(int64_t per_server) const {
  std::vector<Member*> servers;
  for (Member* member : members_.WithRole(v1::SERVER)) {
    if (member->draining) continue;
    if (member->memory_budget > 0 && ServerClaimed(member->id) + per_server > member->memory_budget) continue;
    servers.push_back(member);
  }
  return servers;
}

JobManager::StartOutcome JobManager::TryAssign(Job* job) {
  int wanted = job->status.spec().num_workers();
  const int replicas = std::max(1, job->status.spec().replicas());
  std::vector<Member*> idle;
  int workers_fitting = 0, servers = 0;
  for (const auto& [id, member] : members_.all()) {
    if (member->role == v1::SERVER && !member->draining) ++servers;
    if (member->role != v1::WORKER || !WorkerFits(*member, *job)) continue;
    ++workers_fitting;
    if (member->job_id.empty()) idle.push_back(member.get());
  }
  // A job going back to its own checkpoint (it lost a server) may have lost
  // workers too and run on fewer since: once they had two leases to come
  // back, it restarts on the workers there are. Its data partitions are
  // fixed, so it computes the same; idle workers join it later.
  if (job->restore.has_value() && job->restore_since.has_value() && workers_fitting >= 1 &&
      workers_fitting < wanted && clock_() - *job->restore_since >= options_.lease * 2) {
    wanted = workers_fitting;
  }
  const int64_t per_server = PerServerClaim(*job, std::max(1, servers));
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
        "waiting for resources: %d of %d workers idle, %d of %d servers with the %s of memory it needs free "
        "(%d "
        "replicas wanted)",
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
  job->status.set_start_time_unix_ms(absl::ToUnixMillis(job->started));
  for (int i = 0; i < wanted; ++i) AddWorker(job, idle[i]);
  FLOG(INFO) << "job " << job->status.job_id() << " assigned to " << wanted << " workers";
  return StartOutcome::kStarted;
}

void JobManager::GrowJobs() {
  // Running jobs take idle workers up to maxWorkers; pending jobs come first
  // (SchedulePending ran before), so elastic growth never starves a new job.
  for (auto& [job_id, job] : jobs_) {
    if (job->phase != Job::Phase::kLoading && job->phase != Job::Phase::kTraining) continue;
    for (const auto& [id, member] : members_.all()) {
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
  Touch(job);
}

void JobManager::RemoveWorker(Job* job, const std::string& worker_id, const std::string& why) {
  auto it = std::find_if(job->workers.begin(), job->workers.end(),
                         [&](const JobWorker& w) { return w.id == worker_id; });
  if (it == job->workers.end()) return;
  std::vector<int32_t> orphans = it->partitions;
  job->workers.erase(it);
  Member* member = members_.Find(worker_id);
  if (member != nullptr && member->job_id == job->status.job_id()) member->job_id.clear();
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
  std::vector<std::vector<int32_t>*> ready;
  for (JobWorker& w : job->workers) {
    if (w.ready) ready.push_back(&w.partitions);
  }
  SpreadPartitions(job->num_partitions, ready);  // unowned partitions wait while none is ready
  UpdatePause(job);
}

void JobManager::AddEvent(Job* job, const std::string& message) {
  job->status.set_membership_epoch(job->status.membership_epoch() + 1);
  v1::JobEvent* event = job->status.add_events();
  event->set_time_unix_ms(absl::ToUnixMillis(clock_()));
  event->set_membership_epoch(job->status.membership_epoch());
  event->set_message(message);
  if (job->status.events_size() > kMaxEvents) job->status.mutable_events()->DeleteSubrange(0, 1);
  FLOG(INFO) << "job " << job->status.job_id() << " epoch " << job->status.membership_epoch() << ": " << message;
  Touch(job);
}

}  // namespace fulcrum
