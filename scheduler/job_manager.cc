#include "scheduler/job_manager.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/sync.h"
#include "common/table_spec.h"
#include "scheduler/job_manager_internal.h"
#include "scheduler/job_spec.h"

namespace fulcrum {
namespace {

// A job keeps at most this many history points: when full, every other
// progress point (never an evaluation) is dropped, so a long job keeps its
// whole span at half the resolution.
constexpr int kMaxHistory = 2000;

// An evaluation goes before the progress points of later steps that came
// in ahead of it (an ASP job's evaluating partition lags the others), back
// to the previous evaluation: the history reads in step order.
void AddHistoryPoint(v1::JobStatus* status, const v1::MetricPoint& point) {
  *status->add_history() = point;
  auto* history = status->mutable_history();
  if (point.evaluation()) {
    for (int i = history->size() - 1;
         i > 0 && !history->Get(i - 1).evaluation() && history->Get(i - 1).step() > point.step(); --i) {
      history->SwapElements(i - 1, i);
    }
  }
  if (status->history_size() <= kMaxHistory) return;
  int kept = 0;
  for (int i = 0; i < history->size(); ++i) {
    // (Points saved before `evaluation` existed: an evaluation had an accuracy.)
    bool evaluation = history->Get(i).evaluation() || history->Get(i).test_accuracy() >= 0;
    bool last = i + 1 == history->size();
    if (evaluation || last || i % 2 == 0) history->SwapElements(kept++, i);
  }
  history->DeleteSubrange(kept, history->size() - kept);
}

}  // namespace

JobManager::JobManager(SchedulerOptions options, ServerControl* servers, Clock clock, KvStore* store)
    : options_(options),
      servers_(servers),
      clock_(clock ? std::move(clock) : Clock(absl::Now)),
      members_(options.lease),
      store_(store),
      checkpoints_(servers, store,
                   {[this](const CheckpointTask& task) { return PlanCheckpoint(task); },
                    [this](const CheckpointTask& task, const absl::Status& status,
                           const v1::CheckpointManifest& manifest,
                           absl::Duration took) { return FinishCheckpoint(task, status, manifest, took); }}) {
  if (options_.server_call_threads > 0) server_calls_ = std::make_unique<ThreadPool>(options_.server_call_threads);
}

JobManager::~JobManager() { Stop(); }

void JobManager::Start() {
  {
    MutexLock lock(&mu_);
    if (recovery_deadline_.has_value()) recovery_deadline_ = clock_() + RecoveryWindow();
  }
  thread_ = std::thread([this] { Loop(); });
  checkpoints_.Start();
}

void JobManager::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  servers_->CancelAll();  // a checkpoint may be waiting on a server for its cut
  checkpoints_.Stop();
  if (server_calls_ != nullptr) server_calls_->Stop();
}

void JobManager::Loop() {
  while (true) {
    {
      MutexLock lock(&mu_);
      CheckPause();
    }
    Tick();
    MutexLock lock(&mu_);
    // The gap CheckPause measures is the wait alone: a tick's own work
    // delays heartbeats (they wait for mu_) but loses none.
    last_tick_ = clock_();
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
  dirty_.insert(job->status.job_id());
  changed_.SignalAll();
}

v1::JobStatus JobManager::Render(const Job& job) const {
  v1::JobStatus status = job.status;
  for (const JobWorker& w : job.workers) {
    v1::WorkerAssignmentInfo* info = status.add_workers();
    info->set_worker_id(w.id);
    info->set_rank(w.rank);
    info->set_ready(w.ready);
    info->set_step_seconds(w.progress.step_seconds());
    info->set_samples_per_second(w.progress.samples_per_second());
    info->set_straggler(w.straggler);
    for (int32_t p : w.partitions) info->add_partitions(p);
    info->set_address(members_.AddressOf(w.id));
  }
  if (job.status.parameters_released_unix_ms() != 0) return status;  // no shards left to show
  const v1::ShardMap& map = job.shard_map;
  for (const v1::ShardLocation& shard : map.shards()) {
    v1::ShardInfo* info = status.add_shards();
    info->set_shard(shard.shard());
    info->set_server_id(shard.server_id());
    info->set_address(shard.address());
    for (const std::string& backup : shard.backup_ids()) info->add_backup_ids(backup);
  }
  for (const v1::ChunkLocation& chunk : map.chunks()) {
    if (chunk.shard() < 0 || chunk.shard() >= status.shards_size()) continue;
    v1::ShardInfo* info = status.mutable_shards(chunk.shard());
    info->set_chunks(info->chunks() + 1);
    info->set_elements(info->elements() + chunk.length());
  }
  // The map workers train with (and `fulcrum export` reads a finished job's
  // parameters through): while training, and after a success while the
  // servers keep the parameters.
  const bool readable = job.phase == Job::Phase::kEnded && !job.server_addresses.empty() && job.total_steps > 0;
  if (job.phase == Job::Phase::kTraining || readable) *status.mutable_shard_map() = map;
  return status;
}

// ---------------------------------------------------------------------------
// JobService
// ---------------------------------------------------------------------------

absl::StatusOr<v1::JobStatus> JobManager::Submit(v1::JobSpec spec, const std::string& resume_from) {
  auto result = DoSubmit(std::move(spec), resume_from);
  Flush();
  return result;
}

absl::StatusOr<v1::JobStatus> JobManager::Cancel(const std::string& job_id) {
  auto result = DoCancel(job_id);
  Flush();
  return result;
}

absl::Status JobManager::Report(const v1::WorkReport& report) {
  absl::Status result = DoReport(report);
  // Progress is written with the next tick; everything else before the
  // worker hears back, so an acknowledged READY or DONE survives a restart.
  if (report.kind() != v1::WorkReport::PROGRESS) Flush();
  return result;
}

absl::StatusOr<v1::JobStatus> JobManager::DoSubmit(v1::JobSpec spec, const std::string& resume_from) {
  ApplyJobSpecDefaults(&spec);
  if (spec.replicas() == 0) spec.set_replicas(options_.default_replicas);
  RETURN_IF_ERROR(ValidateJobSpec(spec));
  const JobClaims claims = ClaimsOf(spec);
  MutexLock lock(&mu_);
  const auto active = std::count_if(jobs_.begin(), jobs_.end(), [](const auto& entry) {
    return entry.second->phase != Job::Phase::kEnded;
  });
  if (active >= options_.max_active_jobs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("submit: the scheduler holds ", active,
                     " jobs that have not ended (pending or running), the most it takes ",
                     "(fulcrum-scheduler --max_active_jobs): wait for some to end, or cancel some"));
  }
  const v1::CheckpointManifest* resume = nullptr;
  if (!resume_from.empty()) {
    std::vector<std::string> parts = absl::StrSplit(resume_from, absl::MaxSplits('/', 1));
    int64_t checkpoint_id = 0;
    if (parts.size() == 2 && (!absl::SimpleAtoi(parts[1], &checkpoint_id) || checkpoint_id <= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("resumeFrom: ", Quote(resume_from),
                                                     "\" must be JOB or JOB/CHECKPOINT (a positive number)"));
    }
    Job* source = FindJob(parts[0]);
    if (source == nullptr) return absl::NotFoundError(absl::StrCat("resumeFrom: no job with id ", Quote(parts[0])));
    for (auto it = source->manifests.rbegin(); it != source->manifests.rend() && resume == nullptr; ++it) {
      if (checkpoint_id != 0 && it->first != checkpoint_id) continue;
      if (it->second.info().state() == v1::CheckpointInfo::COMPLETE) resume = &it->second;
    }
    if (resume == nullptr) {
      return absl::FailedPreconditionError(
          checkpoint_id == 0 ? absl::StrCat("resumeFrom: job ", parts[0], " has no complete checkpoint")
                             : absl::StrCat("resumeFrom: job ", parts[0], " has no complete checkpoint ", checkpoint_id));
    }
    // BSP chunks carry what ASP and SSP ones do not (a gradient buffer per
    // partition, the last step's values): a checkpoint resumes in its kind.
    auto bsp = [](const v1::JobSpec& s) { return s.mode() == v1::BSP || s.mode() == v1::MODE_UNSPECIFIED; };
    if (bsp(source->status.spec()) != bsp(spec)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "resumeFrom: job ", parts[0], " trained in ", v1::Mode_Name(source->status.spec().mode()),
          " and this job is ", v1::Mode_Name(spec.mode()),
          ": a checkpoint resumes in BSP if it was taken in BSP and in ASP or SSP otherwise (BSP state keeps "
          "a gradient buffer per data partition)"));
    }
    RETURN_IF_ERROR(ValidateResume(source->status.spec(), spec));
    // Keys hash by their table's bucket count: a resumed table keeps the
    // checkpoint's, so a spec asking for another is refused, not ignored.
    for (const v1::TableSpec& table : spec.model().tables()) {
      for (const v1::TableLayout& saved : resume->shard_map().tables()) {
        if (saved.name() == table.name() && table.buckets() > 0 && table.buckets() != saved.buckets()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "resumeFrom: table ", table.name(), " is in ", saved.buckets(), " buckets in checkpoint ",
              resume->info().id(), " of job ", parts[0], ", and keys hash by that count, so it stays ",
              saved.buckets(), " (the spec asks for ", table.buckets(),
              "): leave buckets unset or set it to ", saved.buckets()));
        }
      }
    }
  }
  {
    // What can never fit the processes' memory budgets is refused now.
    std::vector<int64_t> worker_budgets, server_budgets;
    for (const auto& [id, member] : members_.all()) {
      (member->role == v1::WORKER ? worker_budgets : server_budgets).push_back(member->memory_budget);
    }
    RETURN_IF_ERROR(CheckFitsBudgets(claims, spec, worker_budgets, server_budgets,
                                     resume != nullptr ? resume->info().server_bytes() : 0));
  }
  RETURN_IF_ERROR(CheckChunkCount(claims, options_.chunk_elems));
  auto job = std::make_unique<Job>();
  job->claims = claims;
  std::string id = absl::StrFormat("job-%04d", next_job_++);
  job->status.set_job_id(id);
  *job->status.mutable_spec() = std::move(spec);
  job->status.set_state(v1::PENDING);
  job->status.set_reason("waiting for workers and servers");
  job->status.set_submit_time_unix_ms(absl::ToUnixMillis(clock_()));
  job->status.mutable_progress()->set_epochs(job->status.spec().data().epochs());
  job->status.mutable_progress()->set_test_accuracy(-1);
  job->num_partitions = job->status.spec().max_workers();
  job->partition_steps.assign(job->num_partitions, 0);
  if (resume != nullptr) {
    PlanRestore(job.get(), *resume);
    job->status.set_resumed_from(absl::StrCat(resume->job_id(), "/", resume->info().id()));
  }
  v1::JobStatus status = Render(*job);
  jobs_[id] = std::move(job);
  pending_.push_back(id);
  FLOG(INFO) << "job " << id << " submitted (" << status.spec().name() << ")";
  Touch(jobs_[id].get());
  return status;
}

absl::StatusOr<v1::JobStatus> JobManager::Get(const std::string& job_id) const {
  MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id ", Quote(job_id)));
  return Render(*job);
}

namespace {

// What a list shows of a job: its status less what only GetJob needs (and
// what grows with the job: history, loss curve, events, the shard map's
// chunks and tables).
v1::JobStatus Summarize(v1::JobStatus status) {
  status.clear_history();
  status.clear_loss_curve();
  status.clear_events();
  const int64_t version = status.shard_map().version();
  status.clear_shard_map();
  if (version != 0) status.mutable_shard_map()->set_version(version);
  return status;
}

}  // namespace

std::vector<v1::JobStatus> JobManager::List() const {
  MutexLock lock(&mu_);
  std::vector<v1::JobStatus> jobs;
  for (const auto& [id, job] : jobs_) jobs.push_back(Summarize(Render(*job)));
  return jobs;
}

absl::StatusOr<v1::ListJobsResponse> JobManager::ListPage(const v1::ListJobsRequest& request) const {
  if (request.page_size() < 0 || request.page_size() > kMaxListPageSize) {
    return absl::InvalidArgumentError(absl::StrCat("ListJobs: page_size must be in [0, ", kMaxListPageSize,
                                                   "] (got ", request.page_size(), ")"));
  }
  if (request.page_token().size() > 128 || !IsPrintable(request.page_token())) {
    return absl::InvalidArgumentError(
        absl::StrCat("ListJobs: page_token ", Quote(request.page_token(), 64),
                     " must be a page's next_page_token (printable, at most 128 characters)"));
  }
  v1::ListJobsResponse response;
  int64_t bytes = 0;
  MutexLock lock(&mu_);
  const size_t most = request.page_size() > 0 ? static_cast<size_t>(request.page_size()) : jobs_.size() + 1;
  for (auto it = jobs_.upper_bound(request.page_token()); it != jobs_.end(); ++it) {
    v1::JobStatus summary = Summarize(Render(*it->second));
    const auto size = static_cast<int64_t>(summary.ByteSizeLong());
    if (static_cast<size_t>(response.jobs_size()) == most ||
        (response.jobs_size() > 0 && bytes + size > options_.list_page_bytes)) {
      response.set_next_page_token(response.jobs().rbegin()->job_id());
      break;
    }
    bytes += size;
    *response.add_jobs() = std::move(summary);
  }
  return response;
}

absl::StatusOr<v1::JobStatus> JobManager::DoCancel(const std::string& job_id) {
  MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id ", Quote(job_id)));
  if (IsTerminal(job->status.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ended (", v1::JobState_Name(job->status.state()), ")"));
  }
  EndJob(job, v1::CANCELLED, "cancelled by user");
  return Render(*job);
}

absl::StatusOr<v1::JobStatus> JobManager::WaitForChange(const std::string& job_id, int64_t* version,
                                                        absl::Duration timeout) const {
  absl::Time deadline = absl::Now() + timeout;
  MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id ", Quote(job_id)));
  while (job->version <= *version && !stopping_) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  *version = job->version;
  return Render(*job);
}

void JobManager::EndJob(Job* job, v1::JobState state, const std::string& reason) {
  const std::string& id = job->status.job_id();
  bool was_pending = job->phase == Job::Phase::kPending;
  job->phase = Job::Phase::kEnded;
  job->status.set_state(state);
  job->status.set_reason(reason);
  job->status.set_end_time_unix_ms(absl::ToUnixMillis(clock_()));
  if (was_pending) pending_.erase(std::remove(pending_.begin(), pending_.end(), id), pending_.end());
  for (const JobWorker& worker : job->workers) {
    Member* member = members_.Find(worker.id);
    if (member != nullptr && member->job_id == id) member->job_id.clear();
  }
  if (job->loss_curve != nullptr) {
    job->loss_curve->Flush(job->status.mutable_loss_curve());
    job->loss_curve.reset();
  }
  const bool keep = state == v1::SUCCEEDED;
  for (const auto& [server, address] : job->server_addresses) {
    actions_.push_back([this, address = address, id, reason, keep, version = job->shard_map.version()] {
      IgnoreError(servers_->DropJob(address, id, reason, keep, version));
    });
  }
  if (!keep) {  // its parameters are gone from the servers, and its claim on them
    job->server_addresses.clear();
    job->server_claim = 0;
  }
  FLOG(INFO) << "job " << id << " " << v1::JobState_Name(state) << ": " << reason;
  Touch(job);
}

// ---------------------------------------------------------------------------
// ClusterService
// ---------------------------------------------------------------------------

absl::Status JobManager::DoReport(const v1::WorkReport& report) {
  MutexLock lock(&mu_);
  Job* job = FindJob(report.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id ", Quote(report.job_id())));
  if (job->phase == Job::Phase::kEnded) {
    return absl::FailedPreconditionError(absl::StrCat("job ", report.job_id(), " already ended"));
  }
  auto worker = std::find_if(job->workers.begin(), job->workers.end(),
                             [&](const JobWorker& w) { return w.id == report.member_id(); });
  if (worker == job->workers.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat(report.member_id(), " is not a worker of job ", report.job_id()));
  }
  if (report.has_rank() && report.rank() != worker->rank) {
    // Sent before the worker saw that it was taken out and added back: its
    // earlier run's failure (a push refused by servers that dropped the job
    // for a restore) or progress is not this run's.
    FLOG(INFO) << "job " << report.job_id() << ": ignoring a " << v1::WorkReport::Kind_Name(report.kind())
               << " report of " << report.member_id() << " as rank " << report.rank()
               << ", which it is no longer (" << worker->rank << " now)";
    return absl::FailedPreconditionError(absl::StrCat(report.member_id(), " is rank ", worker->rank,
                                                      " of job ", report.job_id(), ", not ", report.rank(),
                                                      ": the report is of a run that is over"));
  }
  switch (report.kind()) {
    case v1::WorkReport::READY:
      // Every worker reads the same data: one that counts other examples
      // would shuffle, and so split the epoch, otherwise (the same number of
      // steps an epoch, which the workers check, is not enough).
      if (job->have_data_info && (report.train_examples() != job->data_info.train_examples() ||
                                  report.test_examples() != job->data_info.test_examples())) {
        EndJob(
            job, v1::FAILED,
            absl::StrCat(worker->id, " read ", report.train_examples(), " training and ",
                         report.test_examples(), " test examples, where ", job->data_info.member_id(),
                         " read ", job->data_info.train_examples(), " and ", job->data_info.test_examples(),
                         ": the workers read different data (files that differ between the workers' "
                         "machines, or changed since the job started)"));
        return absl::OkStatus();
      }
      worker->ready = true;
      if (report.bad_records() > 0 && !job->bad_records_told) {  // every worker reads the same files
        job->bad_records_told = true;
        AddEvent(job, absl::StrCat(worker->id, " skipped ", report.bad_records(),
                                   " bad records of the data files (data.onBadRecord: SKIP); the first: ",
                                   Quote(report.first_bad_record(), 256)));
      }
      if (!job->have_data_info) {
        job->data_info = report;
        job->have_data_info = true;
      }
      Rebalance(job);
      if (job->phase == Job::Phase::kTraining) {
        AddEvent(job, absl::StrCat(worker->id, " ready; takes partitions {",
                                   absl::StrJoin(worker->partitions, ","), "}"));
      }
      break;
    case v1::WorkReport::PROGRESS:
      worker->progress = report;
      OnProgress(job, report);
      FlagStragglers(job);
      break;
    case v1::WorkReport::EVAL:
      OnEval(job, report);
      break;
    case v1::WorkReport::DONE:
      OnDone(job, report);
      break;
    case v1::WorkReport::FAILED:
      EndJob(job, v1::FAILED, absl::StrCat(report.member_id(), ": ", Printable(report.reason(), 2048)));
      break;
    default:
      return absl::InvalidArgumentError("work report: kind must be set");
  }
  Touch(job);
  return absl::OkStatus();
}

void JobManager::OnDone(Job* job, const v1::WorkReport& report) {
  for (int32_t p : report.partitions()) {
    if (p >= 0 && p < job->num_partitions) job->done_partitions.insert(p);
  }
  if (static_cast<int32_t>(job->done_partitions.size()) < job->num_partitions) return;
  const v1::JobProgress& progress = job->status.progress();
  std::string reason = "finished";
  if (progress.test_accuracy() >= 0) {
    absl::StrAppendFormat(&reason, ": test accuracy %.4f", progress.test_accuracy());
  } else if (progress.has_test_loss()) {
    absl::StrAppendFormat(&reason, ": test loss %.4f", progress.test_loss());  // a regression
  }
  if (progress.has_test_auc()) absl::StrAppendFormat(&reason, ", test AUC %.4f", progress.test_auc());
  EndJob(job, v1::SUCCEEDED, reason);
}

void JobManager::OnProgress(Job* job, const v1::WorkReport& report) {
  for (int i = 0; i < report.partitions_size() && i < report.partition_steps_size(); ++i) {
    int32_t p = report.partitions(i);
    if (p >= 0 && p < job->num_partitions) {
      // A position is one of the job's: a worker's bad report would have
      // the others skip the partition.
      const int64_t highest = job->total_steps > 0 ? job->total_steps : std::numeric_limits<int64_t>::max();
      job->partition_steps[p] =
          std::max(job->partition_steps[p], std::clamp<int64_t>(report.partition_steps(i), 0, highest));
    }
  }
  if (report.step_losses_size() > 0) {
    if (job->loss_curve == nullptr) job->loss_curve = std::make_unique<LossCurveBuilder>(job->num_partitions);
    for (const v1::StepLoss& loss : report.step_losses()) job->loss_curve->Add(loss, job->status.mutable_loss_curve());
  }
  v1::JobProgress* progress = job->status.mutable_progress();
  int64_t step = 0;
  double loss = 0, samples_per_second = 0;
  int reporting = 0;
  for (const JobWorker& w : job->workers) {
    const v1::WorkReport& p = w.progress;
    if (p.kind() != v1::WorkReport::PROGRESS) continue;
    step = std::max(step, p.step());
    loss += p.loss();
    samples_per_second += p.samples_per_second();
    ++reporting;
  }
  progress->set_step(step);
  progress->set_max_staleness_seen(std::max(progress->max_staleness_seen(), report.max_staleness_seen()));
  progress->set_epoch(static_cast<int32_t>(
      std::min<int64_t>(job->status.spec().data().epochs(), step / std::max<int64_t>(1, job->steps_per_epoch) + 1)));
  progress->set_train_loss(reporting ? loss / reporting : 0);
  progress->set_samples_per_second(samples_per_second);
  progress->set_elapsed_seconds(absl::ToDoubleSeconds(clock_() - job->started));
  absl::Time now = clock_();
  if (now - job->last_history_point >= absl::Seconds(1)) {
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

void JobManager::FlagStragglers(Job* job) {
  for (JobWorker& w : job->workers) {
    const double mine = w.progress.step_seconds();
    std::vector<double> others;
    for (const JobWorker& o : job->workers) {
      if (&o != &w && o.progress.step_seconds() > 0) others.push_back(o.progress.step_seconds());
    }
    if (mine <= 0 || others.empty()) continue;
    std::nth_element(others.begin(), others.begin() + others.size() / 2, others.end());
    const double median = others[others.size() / 2];
    w.slow_reports = mine > options_.straggler_factor * median ? w.slow_reports + 1 : 0;
    const bool straggler = w.slow_reports >= 3;
    if (straggler != w.straggler) {
      w.straggler = straggler;
      if (straggler) {
        AddEvent(job, absl::StrFormat("%s is a straggler: %.1f ms a step, the others' median %.1f ms", w.id,
                                      mine * 1e3, median * 1e3));
      }
    }
  }
}

void JobManager::OnEval(Job* job, const v1::WorkReport& report) {
  v1::JobProgress* progress = job->status.mutable_progress();
  if (report.step() >= job->shown_evaluation_step) {
    job->shown_evaluation_step = report.step();
    progress->set_test_accuracy(report.test_accuracy());
    progress->set_test_loss(report.test_loss());
    if (report.has_test_auc()) progress->set_test_auc(report.test_auc());
  }
  v1::MetricPoint point;
  point.set_evaluation(true);
  point.set_step(report.step());
  point.set_epoch(report.epoch());
  // Before the first PROGRESS (an early evaluation, data.evalEverySteps)
  // there is no training loss yet: -1, not 0.
  point.set_train_loss(progress->step() > 0 ? progress->train_loss() : -1);
  point.set_samples_per_second(progress->samples_per_second());
  point.set_test_accuracy(report.test_accuracy());
  point.set_test_loss(report.test_loss());
  if (report.has_test_auc()) point.set_test_auc(report.test_auc());
  point.set_elapsed_seconds(absl::ToDoubleSeconds(clock_() - job->started));
  AddHistoryPoint(&job->status, point);
  FLOG(INFO) << "job " << job->status.job_id() << " epoch " << report.epoch() << ": test accuracy "
             << report.test_accuracy() << ", test loss " << report.test_loss()
             << (report.has_test_auc() ? absl::StrCat(", test AUC ", report.test_auc()) : "");
  MaybeStopEarly(job, report);
}

void JobManager::MaybeStopEarly(Job* job, const v1::WorkReport& report) {
  const v1::EarlyStoppingSpec& rule = job->status.spec().early_stopping();
  if (rule.patience() <= 0 || job->phase == Job::Phase::kEnded) return;
  double value = 0;
  bool higher_is_better = true;
  const char* name = "";
  switch (rule.metric()) {
    case v1::EarlyStoppingSpec::TEST_LOSS:
      value = report.test_loss();
      higher_is_better = false;
      name = "test loss";
      break;
    case v1::EarlyStoppingSpec::TEST_ACCURACY:
      value = report.test_accuracy();
      name = "test accuracy";
      break;
    case v1::EarlyStoppingSpec::TEST_AUC:
      if (!report.has_test_auc()) return;
      value = report.test_auc();
      name = "test AUC";
      break;
    default:
      return;
  }
  if (!std::isfinite(value)) return;  // nothing to compare (a diverged loss fails elsewhere)
  v1::EarlyStoppingState& state = job->early_stopping;
  // A job resumed from a checkpoint evaluates its replayed steps again.
  if (state.evaluated() && report.step() <= state.last_step()) return;
  state.set_last_step(report.step());
  const double gain = higher_is_better ? value - state.best() : state.best() - value;
  if (!state.evaluated() || gain > rule.min_delta()) {
    state.set_evaluated(true);
    state.set_best(value);
    state.set_best_step(report.step());
    state.set_since_best(0);
    return;
  }
  state.set_since_best(state.since_best() + 1);
  if (state.since_best() < rule.patience()) return;
  const std::string reason = absl::StrFormat(
      "stopped early at step %d: %s did not improve by more than %g in %d evaluations (best %.4f at step %d)",
      report.step(), name, rule.min_delta(), state.since_best(), state.best(), state.best_step());
  AddEvent(job, reason);
  EndJob(job, v1::SUCCEEDED, reason);
}

void JobManager::CheckPause() {
  // (The background loop runs it every tick; tests that drive Tick() with a
  // fake clock jump time on purpose.)
  const absl::Time now = clock_();
  // The scheduler itself did not run (SIGSTOP, a node starved of CPU): it
  // heard no heartbeat in that time, so that time is nobody's silence. Every
  // member's silence is counted in time the scheduler listened: a pause of
  // 1.4 s on a 1.5 s lease must not expire a member whose last heartbeat
  // came 200 ms before it, and a pause of minutes must not expire everyone.
  if (last_tick_.has_value() && now - *last_tick_ > 2 * options_.tick) {
    const absl::Duration deaf = now - *last_tick_ - options_.tick;  // beyond the wait between ticks
    if (deaf > options_.heartbeat_interval) {
      FLOG(WARNING) << "the scheduler did not run for " << absl::FormatDuration(now - *last_tick_)
                    << "; that time does not count against any member's lease";
    }
    members_.CreditDeafTime(deaf, now);
  }
  last_tick_ = now;
}

// ---------------------------------------------------------------------------
// Retention
// ---------------------------------------------------------------------------

void JobManager::ReleaseParameters(Job* job) {
  const std::string& id = job->status.job_id();
  for (const auto& [server, address] : job->server_addresses) {
    actions_.push_back([this, address = address, id, version = job->shard_map.version()] {
      IgnoreError(servers_->DropJob(address, id, "retention: its parameters are released", false, version));
    });
  }
  job->server_addresses.clear();
  job->server_claim = 0;
  job->status.set_parameters_released_unix_ms(absl::ToUnixMillis(clock_()));
  // What a finished job keeps: its summary, the last of its history and events.
  constexpr int kKeptHistory = 100, kKeptEvents = 20;
  auto* history = job->status.mutable_history();
  if (history->size() > kKeptHistory) history->DeleteSubrange(0, history->size() - kKeptHistory);
  auto* events = job->status.mutable_events();
  if (events->size() > kKeptEvents) events->DeleteSubrange(0, events->size() - kKeptEvents);
  LossCurveBuilder::Coarsen(512, job->status.mutable_loss_curve());
  job->shard_map.clear_chunks();
  Touch(job);
}

bool JobManager::ForgetHolder(Job* job, const std::string& id) {
  v1::ShardMap map = job->shard_map;
  for (v1::ShardLocation& shard : *map.mutable_shards()) {
    std::vector<std::pair<std::string, std::string>> others;  // the backups but `id`: ids and addresses
    for (int i = 0; i < shard.backup_ids_size() && i < shard.backup_addresses_size(); ++i) {
      if (shard.backup_ids(i) != id) others.emplace_back(shard.backup_ids(i), shard.backup_addresses(i));
    }
    if (shard.server_id() == id) {
      if (others.empty()) return false;
      shard.set_server_id(others.front().first);
      shard.set_address(others.front().second);
      others.erase(others.begin());
    }
    shard.clear_backup_ids();
    shard.clear_backup_addresses();
    for (const auto& [backup, address] : others) {
      shard.add_backup_ids(backup);
      shard.add_backup_addresses(address);
    }
  }
  job->shard_map = std::move(map);
  job->server_addresses.erase(id);
  Touch(job);
  return true;
}

void JobManager::LoseParameters(Job* job, const std::string& why) {
  if (job->status.parameters_released_unix_ms() > 0 || job->server_addresses.empty()) return;
  AddEvent(job, absl::StrCat("its parameters are gone from the servers: ", why,
                             "; its checkpoints remain (fulcrum export --checkpoint)"));
  ReleaseParameters(job);
}

void JobManager::ApplyRetention() {
  std::vector<Job*> ended;
  for (auto& [id, job] : jobs_) {
    if (job->phase == Job::Phase::kEnded) ended.push_back(job.get());
  }
  // Newest first.
  std::sort(ended.begin(), ended.end(), [](const Job* a, const Job* b) {
    return std::make_pair(a->status.end_time_unix_ms(), a->status.job_id()) >
           std::make_pair(b->status.end_time_unix_ms(), b->status.job_id());
  });
  const int64_t now = absl::ToUnixMillis(clock_());
  for (size_t i = 0; i < ended.size(); ++i) {
    Job* job = ended[i];
    const bool old = now - job->status.end_time_unix_ms() > absl::ToInt64Milliseconds(options_.retain_finished_for);
    if ((static_cast<int>(i) >= options_.retain_finished_jobs || old) &&
        job->status.parameters_released_unix_ms() == 0) {
      ReleaseParameters(job);
    }
    if (static_cast<int>(i) < options_.max_finished_records) continue;
    // Forgotten altogether: the record, its checkpoints' manifests and data.
    const std::string id = job->status.job_id();
    for (const auto& [checkpoint, manifest] : job->manifests) {
      std::map<std::string, std::string> holders(manifest.server_addresses().begin(),
                                                 manifest.server_addresses().end());
      actions_.push_back([this, holders, id, checkpoint = checkpoint] {
        for (const auto& [server, address] : holders) IgnoreError(servers_->DeleteCheckpoint(address, id, checkpoint));
      });
    }
    FLOG(INFO) << "job " << id << " forgotten (retention: over " << options_.max_finished_records
               << " finished jobs)";
    forgotten_.insert(JobRecordKey(id));
    for (const auto& [checkpoint, manifest] : job->manifests) forgotten_.insert(CheckpointManifestKey(id, checkpoint));
    dirty_.erase(id);
    jobs_.erase(id);
  }
}

// ---------------------------------------------------------------------------
// Background work
// ---------------------------------------------------------------------------

void JobManager::Tick() {
  std::vector<Action> actions;
  {
    MutexLock lock(&mu_);
    CheckRecovery();
    ExpireLeases();
    SchedulePending();
    GrowJobs();
    StartSetups();
    if (options_.grow_shards) GrowShards();
    DrainServers();
    RetryHandovers();
    RetryActivations();
    ReplenishReplicas();
    ScheduleCheckpoints();
    ApplyRetention();
    actions.swap(actions_);
  }
  Run(std::move(actions));
  Flush();
}

void JobManager::Run(std::vector<Action> actions) {
  for (Action& action : actions) {
    if (server_calls_ != nullptr) {
      server_calls_->Post(std::move(action));
    } else {
      action();
    }
  }
}

}  // namespace fulcrum
