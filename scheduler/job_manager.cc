#include "scheduler/job_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/shard_map.h"
#include "common/status_macros.h"
#include "kernels/model_from_spec.h"
#include "scheduler/job_spec.h"

namespace fulcrum {
namespace {

// A job keeps at most this many history points: when full, every other
// progress point (never an evaluation) is dropped, so a long job keeps its
// whole span at half the resolution.
constexpr int kMaxHistory = 2000;

void AddHistoryPoint(v1::JobStatus* status, const v1::MetricPoint& point) {
  *status->add_history() = point;
  if (status->history_size() <= kMaxHistory) return;
  auto* history = status->mutable_history();
  int kept = 0;
  for (int i = 0; i < history->size(); ++i) {
    bool evaluation = history->Get(i).test_accuracy() >= 0;
    bool last = i + 1 == history->size();
    if (evaluation || last || i % 2 == 0) history->SwapElements(kept++, i);
  }
  history->DeleteSubrange(kept, history->size() - kept);
}

int64_t UnixMillis(absl::Time t) { return absl::ToUnixMillis(t); }

// Stable across processes and platforms (unlike std::hash / absl::Hash).
uint64_t StableHash(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

}  // namespace

struct JobManager::Member {
  std::string id;
  v1::Role role = v1::ROLE_UNSPECIFIED;
  std::string address;
  std::string metrics_address;
  std::string device;
  int64_t pid = 0;
  absl::Time last_heartbeat;
  std::string job_id;  // workers: the job assigned, if any
};

struct JobManager::Job {
  v1::JobStatus status;
  int64_t version = 0;
  absl::Time started;
  enum class Phase { kPending, kLoading, kSettingUp, kTraining, kEnded } phase = Phase::kPending;
  std::vector<std::string> workers;  // member id by rank
  std::vector<bool> ready;
  std::vector<bool> done;
  std::vector<v1::WorkReport> progress;  // latest PROGRESS by rank
  v1::WorkReport data_info;              // rank 0's READY report
  std::vector<std::string> server_ids;   // servers holding its chunks
  std::map<std::string, std::string> server_addresses;
  v1::ShardMap shard_map;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  absl::Time last_history_point;
};

JobManager::JobManager(SchedulerOptions options, ServerControl* servers, Clock clock)
    : options_(options), servers_(servers), clock_(clock ? std::move(clock) : Clock(absl::Now)) {}

JobManager::~JobManager() { Stop(); }

void JobManager::Start() { thread_ = std::thread([this] { Loop(); }); }

void JobManager::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void JobManager::Loop() {
  while (true) {
    Tick();
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.tick)) return;
  }
}

bool JobManager::IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

JobManager::Job* JobManager::FindJob(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

void JobManager::Touch(Job* job) {
  ++job->version;
  changed_.SignalAll();
}

// ---------------------------------------------------------------------------
// JobService
// ---------------------------------------------------------------------------

absl::StatusOr<v1::JobStatus> JobManager::Submit(v1::JobSpec spec) {
  ApplyJobSpecDefaults(&spec);
  RETURN_IF_ERROR(ValidateJobSpec(spec));
  absl::MutexLock lock(&mu_);
  auto job = std::make_unique<Job>();
  std::string id = absl::StrFormat("job-%04d", next_job_++);
  job->status.set_job_id(id);
  *job->status.mutable_spec() = std::move(spec);
  job->status.set_state(v1::PENDING);
  job->status.set_reason("waiting for workers and servers");
  job->status.set_submit_time_unix_ms(UnixMillis(clock_()));
  job->status.mutable_progress()->set_epochs(job->status.spec().data().epochs());
  job->status.mutable_progress()->set_test_accuracy(-1);
  v1::JobStatus status = job->status;
  jobs_[id] = std::move(job);
  pending_.push_back(id);
  FLOG(INFO) << "job " << id << " submitted (" << status.spec().name() << ")";
  Touch(jobs_[id].get());
  return status;
}

absl::StatusOr<v1::JobStatus> JobManager::Get(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id \"", job_id, "\""));
  return job->status;
}

std::vector<v1::JobStatus> JobManager::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::JobStatus> jobs;
  for (const auto& [id, job] : jobs_) {
    jobs.push_back(job->status);
    jobs.back().clear_history();
  }
  return jobs;
}

absl::StatusOr<v1::JobStatus> JobManager::Cancel(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id \"", job_id, "\""));
  if (IsTerminal(job->status.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ended (", v1::JobState_Name(job->status.state()), ")"));
  }
  EndJob(job, v1::CANCELLED, "cancelled by user");
  return job->status;
}

absl::StatusOr<v1::JobStatus> JobManager::WaitForChange(const std::string& job_id, int64_t* version,
                                                        absl::Duration timeout) const {
  absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id \"", job_id, "\""));
  while (job->version <= *version && !stopping_) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  *version = job->version;
  return job->status;
}

void JobManager::EndJob(Job* job, v1::JobState state, const std::string& reason) {
  const std::string& id = job->status.job_id();
  bool was_pending = job->phase == Job::Phase::kPending;
  job->phase = Job::Phase::kEnded;
  job->status.set_state(state);
  job->status.set_reason(reason);
  job->status.set_end_time_unix_ms(UnixMillis(clock_()));
  if (was_pending) pending_.erase(std::remove(pending_.begin(), pending_.end(), id), pending_.end());
  for (const std::string& worker : job->workers) {
    auto it = members_.find(worker);
    if (it != members_.end() && it->second->job_id == id) it->second->job_id.clear();
  }
  for (const auto& [server, address] : job->server_addresses) {
    bool keep = state == v1::SUCCEEDED;
    actions_.push_back([this, address = address, id, reason, keep] {
      IgnoreError(servers_->DropJob(address, id, reason, keep));
    });
  }
  FLOG(INFO) << "job " << id << " " << v1::JobState_Name(state) << ": " << reason;
  Touch(job);
}

// ---------------------------------------------------------------------------
// ClusterService
// ---------------------------------------------------------------------------

absl::StatusOr<v1::RegisterResponse> JobManager::Register(const v1::RegisterRequest& request) {
  if (request.role() != v1::SERVER && request.role() != v1::WORKER) {
    return absl::InvalidArgumentError("register: role must be SERVER or WORKER");
  }
  if (request.role() == v1::SERVER && request.address().empty()) {
    return absl::InvalidArgumentError("register: a server must give its address");
  }
  absl::MutexLock lock(&mu_);
  std::string id = request.requested_id();
  if (id.empty()) {
    const char* prefix = request.role() == v1::SERVER ? "server-" : "worker-";
    do {
      id = absl::StrCat(prefix, next_member_[request.role()]++);
    } while (members_.count(id) > 0);
  }
  if (members_.count(id) > 0) {
    // The same id registering again is a restarted process: whatever it held
    // for running jobs (a worker's step, a server's parameters) is gone.
    for (auto& [job_id, job] : jobs_) {
      if (job->phase == Job::Phase::kEnded || job->phase == Job::Phase::kPending) continue;
      bool uses = std::count(job->workers.begin(), job->workers.end(), id) > 0 ||
                  job->server_addresses.count(id) > 0;
      if (uses) EndJob(job.get(), v1::FAILED, absl::StrCat(id, " restarted while running the job"));
    }
  }
  auto member = std::make_unique<Member>();
  member->id = id;
  member->role = request.role();
  member->address = request.address();
  member->metrics_address = request.metrics_address();
  member->device = request.device();
  member->pid = request.pid();
  member->last_heartbeat = clock_();
  members_[id] = std::move(member);
  FLOG(INFO) << "registered " << id << " (" << v1::Role_Name(request.role()) << ", "
             << (request.address().empty() ? "no address" : request.address()) << ")";
  v1::RegisterResponse response;
  response.set_member_id(id);
  response.set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return response;
}

absl::StatusOr<v1::HeartbeatResponse> JobManager::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(request.member_id());
  if (it == members_.end()) {
    return absl::NotFoundError(absl::StrCat("member \"", request.member_id(),
                                            "\" is not registered (lease expired?): register again"));
  }
  Member& member = *it->second;
  member.last_heartbeat = clock_();
  v1::HeartbeatResponse response;
  if (member.role == v1::WORKER) *response.mutable_assignment() = AssignmentFor(member);
  return response;
}

v1::Assignment JobManager::AssignmentFor(const Member& member) const {
  v1::Assignment assignment;
  Job* job = member.job_id.empty() ? nullptr : FindJob(member.job_id);
  if (job == nullptr || job->phase == Job::Phase::kEnded) return assignment;
  assignment.set_job_id(job->status.job_id());
  *assignment.mutable_spec() = job->status.spec();
  assignment.set_world_size(static_cast<int32_t>(job->workers.size()));
  for (size_t rank = 0; rank < job->workers.size(); ++rank) {
    if (job->workers[rank] == member.id) assignment.set_rank(static_cast<int32_t>(rank));
  }
  if (job->phase == Job::Phase::kTraining) {
    assignment.set_phase(v1::Assignment::TRAIN);
    *assignment.mutable_shard_map() = job->shard_map;
    assignment.set_steps_per_epoch(job->steps_per_epoch);
    assignment.set_total_steps(job->total_steps);
  } else {
    assignment.set_phase(v1::Assignment::LOAD);
  }
  return assignment;
}

absl::Status JobManager::Report(const v1::WorkReport& report) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(report.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id \"", report.job_id(), "\""));
  if (job->phase == Job::Phase::kEnded) {
    return absl::FailedPreconditionError(absl::StrCat("job ", report.job_id(), " already ended"));
  }
  auto rank_it = std::find(job->workers.begin(), job->workers.end(), report.member_id());
  if (rank_it == job->workers.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat(report.member_id(), " is not a worker of job ", report.job_id()));
  }
  int rank = static_cast<int>(rank_it - job->workers.begin());
  switch (report.kind()) {
    case v1::WorkReport::READY:
      job->ready[rank] = true;
      if (rank == 0) job->data_info = report;
      break;
    case v1::WorkReport::PROGRESS:
      OnProgress(job, rank, report);
      break;
    case v1::WorkReport::EVAL:
      OnEval(job, report);
      break;
    case v1::WorkReport::DONE:
      job->done[rank] = true;
      if (std::all_of(job->done.begin(), job->done.end(), [](bool d) { return d; })) {
        double accuracy = job->status.progress().test_accuracy();
        EndJob(job, v1::SUCCEEDED,
               accuracy >= 0 ? absl::StrFormat("finished: test accuracy %.4f", accuracy) : "finished");
      }
      break;
    case v1::WorkReport::FAILED:
      EndJob(job, v1::FAILED, absl::StrCat(report.member_id(), " (rank ", rank, "): ", report.reason()));
      break;
    default:
      return absl::InvalidArgumentError("work report: kind must be set");
  }
  Touch(job);
  return absl::OkStatus();
}

void JobManager::OnProgress(Job* job, int rank, const v1::WorkReport& report) {
  job->progress[rank] = report;
  v1::JobProgress* progress = job->status.mutable_progress();
  int64_t step = 0;
  double loss = 0, samples_per_second = 0;
  int reporting = 0;
  for (const v1::WorkReport& p : job->progress) {
    if (p.kind() != v1::WorkReport::PROGRESS) continue;
    step = std::max(step, p.step());
    loss += p.loss();
    samples_per_second += p.samples_per_second();
    ++reporting;
  }
  progress->set_step(step);
  progress->set_epoch(static_cast<int32_t>(
      std::min<int64_t>(job->status.spec().data().epochs(), step / std::max<int64_t>(1, job->steps_per_epoch) + 1)));
  progress->set_train_loss(reporting ? loss / reporting : 0);
  progress->set_samples_per_second(samples_per_second);
  progress->set_elapsed_seconds(absl::ToDoubleSeconds(clock_() - job->started));
  absl::Time now = clock_();
  if (rank == 0 && now - job->last_history_point >= absl::Seconds(1)) {
    job->last_history_point = now;
    v1::MetricPoint point;
    point.set_step(step);
    point.set_epoch(progress->epoch());
    point.set_train_loss(progress->train_loss());
    point.set_samples_per_second(samples_per_second);
    point.set_test_accuracy(-1);
    point.set_elapsed_seconds(progress->elapsed_seconds());
    AddHistoryPoint(&job->status, point);
  }
}

void JobManager::OnEval(Job* job, const v1::WorkReport& report) {
  v1::JobProgress* progress = job->status.mutable_progress();
  progress->set_test_accuracy(report.test_accuracy());
  v1::MetricPoint point;
  point.set_step(report.step());
  point.set_epoch(report.epoch());
  point.set_train_loss(progress->train_loss());
  point.set_samples_per_second(progress->samples_per_second());
  point.set_test_accuracy(report.test_accuracy());
  point.set_test_loss(report.test_loss());
  point.set_elapsed_seconds(absl::ToDoubleSeconds(clock_() - job->started));
  AddHistoryPoint(&job->status, point);
  FLOG(INFO) << "job " << job->status.job_id() << " epoch " << report.epoch()
             << ": test accuracy " << report.test_accuracy() << ", test loss " << report.test_loss();
}

std::vector<v1::MemberInfo> JobManager::Members() const {
  absl::MutexLock lock(&mu_);
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
    members.push_back(std::move(info));
  }
  return members;
}

// ---------------------------------------------------------------------------
// Background work
// ---------------------------------------------------------------------------

void JobManager::Tick() {
  std::vector<Action> actions;
  {
    absl::MutexLock lock(&mu_);
    ExpireLeases();
    SchedulePending();
    StartSetups();
    actions.swap(actions_);
  }
  for (Action& action : actions) action();
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
      bool uses = std::count(job->workers.begin(), job->workers.end(), member.id) > 0 ||
                  job->server_addresses.count(member.id) > 0;
      if (uses) EndJob(job.get(), v1::FAILED, what);
    }
    it = members_.erase(it);
  }
}

void JobManager::SchedulePending() {
  // First come, first served: a job that cannot start blocks those behind it,
  // so a big job is not starved by a stream of small ones.
  while (!pending_.empty()) {
    Job* job = FindJob(pending_.front());
    if (job == nullptr || job->phase != Job::Phase::kPending) {
      pending_.pop_front();
      continue;
    }
    if (!TryAssign(job)) return;
    pending_.pop_front();
  }
}

bool JobManager::TryAssign(Job* job) {
  std::vector<Member*> idle;
  int servers = 0;
  for (auto& [id, member] : members_) {
    if (member->role == v1::SERVER) ++servers;
    if (member->role == v1::WORKER && member->job_id.empty()) idle.push_back(member.get());
  }
  int wanted = job->status.spec().num_workers();
  if (servers == 0 || static_cast<int>(idle.size()) < wanted) {
    std::string reason = absl::StrFormat("waiting for resources: %d of %d workers idle, %d servers live",
                                         idle.size(), wanted, servers);
    if (job->status.reason() != reason) {
      job->status.set_reason(reason);
      Touch(job);
    }
    return false;
  }
  job->phase = Job::Phase::kLoading;
  job->started = clock_();
  job->status.set_state(v1::RUNNING);
  job->status.set_reason("workers loading data");
  job->status.set_start_time_unix_ms(UnixMillis(job->started));
  for (int rank = 0; rank < wanted; ++rank) {
    idle[rank]->job_id = job->status.job_id();
    job->workers.push_back(idle[rank]->id);
    v1::WorkerAssignmentInfo* info = job->status.add_workers();
    info->set_worker_id(idle[rank]->id);
    info->set_rank(rank);
  }
  job->ready.assign(wanted, false);
  job->done.assign(wanted, false);
  job->progress.assign(wanted, v1::WorkReport());
  FLOG(INFO) << "job " << job->status.job_id() << " assigned to " << wanted << " workers";
  Touch(job);
  return true;
}

void JobManager::StartSetups() {
  for (auto& [id, job] : jobs_) {
    if (job->phase != Job::Phase::kLoading) continue;
    if (!std::all_of(job->ready.begin(), job->ready.end(), [](bool r) { return r; })) continue;
    absl::Status status = BuildShardPlan(job.get());
    if (!status.ok()) {
      EndJob(job.get(), v1::FAILED, std::string(status.message()));
      continue;
    }
    std::map<std::string, v1::SetupJobRequest> requests;
    for (const v1::ChunkLocation& chunk : job->shard_map.chunks()) {
      const v1::ShardLocation& shard = job->shard_map.shards(chunk.shard());
      v1::SetupJobRequest& request = requests[shard.address()];
      if (request.job_id().empty()) {
        request.set_job_id(id);
        *request.mutable_spec() = job->status.spec();
        request.set_num_workers(static_cast<int32_t>(job->workers.size()));
        request.set_total_steps(job->total_steps);
      }
      v1::ChunkSetup* setup = request.add_chunks();
      setup->set_chunk_id(chunk.chunk_id());
      setup->set_tensor(chunk.tensor());
      setup->set_offset(chunk.offset());
      setup->set_length(chunk.length());
    }
    // Initialization comes from the model's tensor table.
    ModelLayout layout = LayoutFor(job->status.spec(), job->data_info.features(), job->data_info.classes());
    for (auto& [address, request] : requests) {
      for (v1::ChunkSetup& setup : *request.mutable_chunks()) {
        const auto& tensor = layout.tensors[setup.tensor()];
        setup.set_init(tensor.init == InitKind::kUniform ? v1::ChunkSetup::UNIFORM : v1::ChunkSetup::ZEROS);
        setup.set_init_scale(tensor.init_scale);
      }
    }
    job->phase = Job::Phase::kSettingUp;
    job->status.set_reason("setting up parameter shards");
    Touch(job.get());
    actions_.push_back([this, id = id, requests = std::move(requests)]() mutable {
      RunSetup(id, std::move(requests));
    });
  }
}

absl::Status JobManager::BuildShardPlan(Job* job) {
  const v1::JobSpec& spec = job->status.spec();
  const v1::WorkReport& data = job->data_info;
  int64_t global_batch = int64_t{spec.data().batch_size()} * spec.num_workers();
  job->steps_per_epoch = data.train_examples() / global_batch;
  if (job->steps_per_epoch == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training set has ", data.train_examples(), " examples, fewer than one global batch (",
        "data.batchSize * numWorkers = ", global_batch, ")"));
  }
  job->total_steps = job->steps_per_epoch * spec.data().epochs();
  if (spec.data().max_steps() > 0) job->total_steps = std::min(job->total_steps, spec.data().max_steps());
  job->status.mutable_progress()->set_total_steps(job->total_steps);

  ModelLayout layout = LayoutFor(spec, data.features(), data.classes());
  std::vector<int64_t> sizes;
  v1::ShardMap& map = job->shard_map;
  map.Clear();
  map.set_version(1);
  map.set_chunk_elems(options_.chunk_elems);
  int64_t parameters = 0;
  for (const auto& tensor : layout.tensors) {
    v1::TensorLayout* t = map.add_tensors();
    t->set_name(tensor.name);
    for (int64_t d : tensor.shape) t->add_shape(d);
    t->set_size(tensor.size);
    sizes.push_back(tensor.size);
    parameters += tensor.size;
  }
  job->status.set_num_parameters(parameters);

  std::vector<uint64_t> server_keys;
  std::vector<Member*> servers;
  for (auto& [id, member] : members_) {
    if (member->role != v1::SERVER) continue;
    servers.push_back(member.get());
    server_keys.push_back(StableHash(id));
  }
  if (servers.empty()) return absl::UnavailableError("no parameter server is live");
  int32_t num_shards = spec.num_shards() > 0 ? spec.num_shards() : static_cast<int32_t>(servers.size());
  std::vector<size_t> placement = BalancedShardPlacement(num_shards, server_keys);
  for (int32_t s = 0; s < num_shards; ++s) {
    Member* server = servers[placement[s]];
    v1::ShardLocation* shard = map.add_shards();
    shard->set_shard(s);
    shard->set_server_id(server->id);
    shard->set_address(server->address);
    job->server_addresses[server->id] = server->address;
  }
  std::vector<ChunkSpan> chunks = CutIntoChunks(sizes, options_.chunk_elems);
  std::vector<int32_t> shard_of = AssignChunksToShards(chunks, num_shards);
  job->status.clear_shards();
  for (int32_t s = 0; s < num_shards; ++s) {
    v1::ShardInfo* info = job->status.add_shards();
    info->set_shard(s);
    info->set_server_id(map.shards(s).server_id());
    info->set_address(map.shards(s).address());
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    v1::ChunkLocation* chunk = map.add_chunks();
    chunk->set_chunk_id(static_cast<int32_t>(i));
    chunk->set_tensor(chunks[i].tensor_index);
    chunk->set_offset(chunks[i].offset);
    chunk->set_length(chunks[i].length);
    chunk->set_shard(shard_of[i]);
    v1::ShardInfo* info = job->status.mutable_shards(shard_of[i]);
    info->set_chunks(info->chunks() + 1);
    info->set_elements(info->elements() + chunks[i].length);
  }
  return absl::OkStatus();
}

void JobManager::RunSetup(const std::string& job_id, std::map<std::string, v1::SetupJobRequest> requests) {
  absl::Status failure;
  for (auto& [address, request] : requests) {
    absl::Status status = servers_->SetupJob(address, request);
    if (!status.ok()) {
      failure = absl::Status(status.code(), absl::StrCat("setting up shards on server ", address,
                                                         ": ", status.message()));
      break;
    }
  }
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr || job->phase != Job::Phase::kSettingUp) return;  // ended meanwhile
  if (!failure.ok()) {
    EndJob(job, v1::FAILED, std::string(failure.message()));
    return;
  }
  job->phase = Job::Phase::kTraining;
  job->status.set_reason("training");
  *job->status.mutable_shard_map() = job->shard_map;
  FLOG(INFO) << "job " << job_id << " training: " << job->status.num_parameters() << " parameters in "
             << job->shard_map.chunks_size() << " chunks on " << job->server_addresses.size()
             << " servers, " << job->total_steps << " steps";
  Touch(job);
}

}  // namespace fulcrum
