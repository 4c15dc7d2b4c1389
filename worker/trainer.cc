#include "worker/trainer.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <mutex>
#include <random>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/memory_budget.h"
#include "common/param_init.h"
#include "common/slice_loan.h"
#include "common/status_macros.h"
#include "common/table_spec.h"
#include "common/tensor_codec.h"
#include "kernels/model_from_spec.h"
#include "worker/ctr_trainer.h"
#include "worker/parameter_client.h"

namespace fulcrum {
namespace {

// Partition steps left before SetExitMidPush's fault (0: none armed).
std::atomic<int64_t> exit_mid_push_countdown{0};

// A push or a non-waiting pull that takes longer has met a stuck server
// (stopped, partitioned): the worker looks for a new shard map and retries.
constexpr absl::Duration kRpcTimeout = absl::Seconds(10);
// gRPC lets go of a finished push's slices as it finishes; longer means a
// write stuck on a paused peer.
constexpr absl::Duration kReclaimWait = absl::Milliseconds(200);
// A BSP pull waits this long before the worker checks whether it was given a
// partition that the step still lacks.
constexpr absl::Duration kWaitSlice = absl::Seconds(1);
// Partition steps' losses one progress report carries at most (the newest).
constexpr size_t kMaxStepLosses = 8192;
// Data-path failures in a row (each followed by a wait of up to a second for
// a new shard map) before a worker gives up on its job.
constexpr int kMaxFailures = 60;
constexpr absl::Duration kReportEvery = absl::Milliseconds(500);
constexpr int kEvalBatch = 1000;

// Loaded datasets are kept for a later job on the same data (the next job
// of a sweep); only the current job's, so the cache never grows past one
// job's data.
std::mutex g_cache_mu;  // guards g_cache
std::map<std::string, std::shared_ptr<const Dataset>> g_cache;

std::string CacheKey(const v1::DataSpec& data, uint64_t seed, bool train) {
  if (data.dataset() == v1::DataSpec::FASHION_MNIST) return absl::StrCat("fashion:", data.path(), ":", train);
  return absl::StrCat("synthetic:", seed, ":", data.synthetic_examples(), ":", data.synthetic_features(), ":",
                      data.synthetic_classes(), ":", train);
}

// Drops the cached datasets other than `keep` (their memory goes once no
// running job holds them).
void TrimCache(const std::set<std::string>& keep) {
  std::lock_guard<std::mutex> lock(g_cache_mu);
  for (auto it = g_cache.begin(); it != g_cache.end();) {
    it = keep.count(it->first) > 0 ? std::next(it) : g_cache.erase(it);
  }
}

// Loads (or finds cached) one split, within `budget` bytes (0: no limit).
absl::StatusOr<std::shared_ptr<const Dataset>> LoadCached(const v1::DataSpec& data, uint64_t seed, bool train,
                                                          const std::vector<std::string>& roots, int64_t budget) {
  const std::string key = CacheKey(data, seed, train);
  {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    auto it = g_cache.find(key);
    if (it != g_cache.end()) return it->second;
  }
  ASSIGN_OR_RETURN(Dataset split, LoadDenseSplit(data, seed, train, roots, budget));
  auto loaded = std::make_shared<const Dataset>(std::move(split));
  std::lock_guard<std::mutex> lock(g_cache_mu);
  g_cache[key] = loaded;
  return loaded;
}

kernels::Precision ToPrecision(v1::Precision precision) {
  switch (precision) {
    case v1::TF32: return kernels::Precision::kTf32;
    case v1::BF16: return kernels::Precision::kBf16;
    default: return kernels::Precision::kFp32;
  }
}

// The values of each tensor of a shard map.
std::vector<int64_t> TensorSizes(const v1::ShardMap& map) {
  std::vector<int64_t> sizes;
  for (const auto& tensor : map.tensors()) sizes.push_back(tensor.size());
  return sizes;
}

// The backend's 16-bit type for a 16-bit wire format.
kernels::HalfType HalfTypeOf(v1::WireFormat format) {
  return format == v1::WIRE_FP16 ? kernels::HalfType::kFp16 : kernels::HalfType::kBf16;
}

// Host tensors mirrored in backend memory. On a host-memory backend the
// "device" pointers are the host vectors themselves and copies are no-ops.
template <typename T>
class StagedTensors {
 public:
  StagedTensors(kernels::Backend* backend, std::vector<std::vector<T>> host)
      : backend_(backend), host_(std::move(host)) {}

  absl::Status Init() {
    for (auto& tensor : host_) {
      if (backend_->HostMemory()) {
        device_.push_back(tensor.data());
        continue;
      }
      ASSIGN_OR_RETURN(kernels::Buffer buffer, kernels::Buffer::Make(backend_, std::max<size_t>(1, tensor.size()) * sizeof(T)));
      device_.push_back(buffer.get<T>());
      buffers_.push_back(std::move(buffer));
    }
    return absl::OkStatus();
  }
  absl::Status Upload() {
    if (backend_->HostMemory()) return absl::OkStatus();
    for (size_t i = 0; i < host_.size(); ++i) {
      RETURN_IF_ERROR(backend_->CopyFromHost(device_[i], host_[i].data(), host_[i].size() * sizeof(T)));
    }
    return absl::OkStatus();
  }
  absl::Status Download() {
    if (backend_->HostMemory()) return absl::OkStatus();
    for (size_t i = 0; i < host_.size(); ++i) {
      RETURN_IF_ERROR(backend_->CopyToHost(host_[i].data(), device_[i], host_[i].size() * sizeof(T)));
    }
    return absl::OkStatus();
  }
  std::vector<std::vector<T>>* host() { return &host_; }
  std::vector<const T*> device_const() const { return {device_.begin(), device_.end()}; }
  const std::vector<T*>& device() const { return device_; }
  // Leaves the host buffers to `loan` (slices over them are still alive)
  // and goes on with fresh ones.
  void Abandon(SliceLoan* loan) {
    loan->Abandon(&host_);
    if (!backend_->HostMemory()) return;
    for (size_t i = 0; i < host_.size(); ++i) device_[i] = host_[i].data();
  }

 private:
  kernels::Backend* backend_;
  std::vector<std::vector<T>> host_;
  std::vector<T*> device_;
  std::vector<kernels::Buffer> buffers_;
};

// A host array copied once into backend memory (or aliased on the host).
template <typename T>
absl::StatusOr<kernels::Buffer> UploadArray(kernels::Backend* backend, const std::vector<T>& host, const T** device) {
  if (backend->HostMemory()) {
    *device = host.data();
    return kernels::Buffer();
  }
  ASSIGN_OR_RETURN(kernels::Buffer buffer, kernels::Buffer::Make(backend, std::max<size_t>(1, host.size()) * sizeof(T)));
  RETURN_IF_ERROR(backend->CopyFromHost(buffer.get(), host.data(), host.size() * sizeof(T)));
  *device = buffer.get<T>();
  return buffer;
}

}  // namespace

std::map<int32_t, int64_t> PartitionPositions(const v1::Assignment& assignment,
                                              const std::map<int32_t, int64_t>& known) {
  std::map<int32_t, int64_t> owned;
  for (int i = 0; i < assignment.partitions_size(); ++i) {
    const int32_t p = assignment.partitions(i);
    auto it = known.find(p);
    owned[p] = it != known.end() ? it->second
                                 : (i < assignment.partition_steps_size() ? assignment.partition_steps(i) : 0);
  }
  return owned;
}

int32_t FurthestBehind(const std::map<int32_t, int64_t>& positions, int64_t total_steps) {
  int32_t next = -1;
  int64_t at = 0;
  for (const auto& [p, position] : positions) {
    if (position < total_steps && (next < 0 || position < at)) {
      next = p;
      at = position;
    }
  }
  return next;
}

std::string WriterId(const std::string& worker_id) {
  std::random_device random;
  uint64_t tag = (static_cast<uint64_t>(random()) << 32) ^ random() ^ static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  return absl::StrCat(worker_id, "/", absl::Hex(tag, absl::kZeroPad16));
}

void SetExitMidPush(int64_t n) { exit_mid_push_countdown = std::max<int64_t>(0, n); }

bool ExitMidPushNow() { return exit_mid_push_countdown.load() > 0 && exit_mid_push_countdown.fetch_sub(1) == 1; }

Trainer::Trainer(std::string worker_id, kernels::Backend* backend, TrainerHooks hooks, TransferOptions transfer,
                 WorkerLimits limits, ParameterTransport* transport)
    : worker_id_(std::move(worker_id)),
      backend_(backend),
      hooks_(std::move(hooks)),
      transfer_(transfer),
      limits_(std::move(limits)),
      transport_(transport) {}

absl::Status Trainer::Load(const v1::Assignment& assignment) {
  job_id_ = assignment.job_id();
  const v1::JobSpec& spec = assignment.spec();
  click_ = TrainsOnClickPath(spec);
  if (click_) {
    click_spec_ = spec;
    TrimCache({});
    ASSIGN_OR_RETURN(click_data_, LoadClickData(spec, limits_.data_roots, limits_.memory_budget_bytes));
    return absl::OkStatus();
  }
  TrimCache({CacheKey(spec.data(), spec.seed(), true), CacheKey(spec.data(), spec.seed(), false)});
  const int64_t budget = limits_.memory_budget_bytes;
  ASSIGN_OR_RETURN(train_, LoadCached(spec.data(), spec.seed(), /*train=*/true, limits_.data_roots, budget));
  // Every worker loads the test set: whoever owns the evaluation partition
  // (which moves when workers come and go) evaluates at epoch ends.
  const int64_t left = budget > 0 ? std::max<int64_t>(1, budget - DatasetBytes(*train_)) : 0;
  ASSIGN_OR_RETURN(test_, LoadCached(spec.data(), spec.seed(), /*train=*/false, limits_.data_roots, left));
  FLOG(INFO) << "job " << job_id_ << ": loaded " << train_->num_examples << " training examples ("
             << train_->num_features << " features, " << train_->num_classes << " classes)";
  return absl::OkStatus();
}

v1::WorkReport Trainer::ReadyReport() const {
  if (click_) {
    v1::WorkReport report = ClickReadyReport(click_spec_, click_data_);
    report.set_job_id(job_id_);
    return report;
  }
  v1::WorkReport report;
  report.set_job_id(job_id_);
  report.set_kind(v1::WorkReport::READY);
  report.set_train_examples(train_->num_examples);
  report.set_test_examples(test_ ? test_->num_examples : 0);
  report.set_features(train_->num_features);
  report.set_classes(train_->num_classes);
  return report;
}

void Trainer::GatherBatch(const std::vector<int64_t>& perm, int64_t first, int batch) {
  const int features = train_->num_features;
  for (int i = 0; i < batch; ++i) {
    int64_t example = perm[first + i];
    std::copy_n(train_->features.data() + example * features, features,
                batch_x_.data() + static_cast<int64_t>(i) * features);
    batch_y_[i] = train_->labels[example];
  }
}

absl::Status Trainer::Evaluate(const std::vector<const float*>& params, kernels::Mlp* model,
                               kernels::BatchStats* stats) {
  if (test_x_ == nullptr) {
    ASSIGN_OR_RETURN(test_x_buffer_, UploadArray(backend_, test_->features, &test_x_));
    ASSIGN_OR_RETURN(test_y_buffer_, UploadArray(backend_, test_->labels, &test_y_));
  }
  for (int64_t first = 0; first < test_->num_examples; first += kEvalBatch) {
    int batch = static_cast<int>(std::min<int64_t>(kEvalBatch, test_->num_examples - first));
    RETURN_IF_ERROR(model->Evaluate(params, test_x_ + first * test_->num_features, test_y_ + first, batch, stats));
  }
  return absl::OkStatus();
}

// One job's training on this worker: the model, the parameter client and the
// buffers, with the BSP and ASP step loops.
class TrainingRun {
 public:
  TrainingRun(Trainer* trainer, const v1::Assignment& assignment)
      : trainer_(*trainer),
        spec_(assignment.spec()),
        batch_(static_cast<int>(StepBatchSize(spec_))),
        micro_batch_(spec_.data().batch_size()),
        local_steps_(spec_.local_sgd().steps() > 1 ? spec_.local_sgd().steps() : 0),
        num_partitions_(assignment.num_partitions()),
        partitioning_(trainer->train_->num_examples, batch_, num_partitions_),
        steps_per_epoch_(assignment.steps_per_epoch()),
        total_steps_(assignment.total_steps()),
        layout_(LayoutFor(spec_, trainer->train_->num_features, trainer->train_->num_classes)),
        model_(layout_.config, trainer->backend_),
        writer_id_(WriterId(trainer->worker_id_)),
        wire_(spec_.wire_format()),
        compressor_(GradientCompressor::For(spec_.compression(), TensorSizes(assignment.shard_map()))),
        client_(MakeClient(assignment.shard_map())),
        params_(trainer->backend_, client_->MakeBuffers()),
        pulled_(client_->MakeBuffers()),
        grads_(trainer->backend_, client_->MakeBuffers()),
        params16_(trainer->backend_, IsHalfWire(wire_) ? client_->MakeBuffers<uint16_t>()
                                                       : std::vector<std::vector<uint16_t>>()),
        grads16_(trainer->backend_, IsHalfWire(wire_) ? client_->MakeBuffers<uint16_t>()
                                                      : std::vector<std::vector<uint16_t>>()) {}

  absl::Status Init() {
    RETURN_IF_ERROR(partitioning_.CheckStepsPerEpoch(steps_per_epoch_));
    kernels::Backend* backend = trainer_.backend_;
    RETURN_IF_ERROR(backend->SetPrecision(ToPrecision(spec_.precision())));
    RETURN_IF_ERROR(params_.Init());
    RETURN_IF_ERROR(grads_.Init());
    RETURN_IF_ERROR(params16_.Init());
    RETURN_IF_ERROR(grads16_.Init());
    trainer_.batch_x_.assign(static_cast<size_t>(batch_) * trainer_.train_->num_features, 0.0f);
    trainer_.batch_y_.assign(batch_, 0);
    ASSIGN_OR_RETURN(x_buffer_, UploadArray(backend, trainer_.batch_x_, &x_device_));
    ASSIGN_OR_RETURN(y_buffer_, UploadArray(backend, trainer_.batch_y_, &y_device_));
    if (local_steps_ > 0) {
      for (const auto& tensor : *grads_.host()) {
        ASSIGN_OR_RETURN(kernels::Buffer buffer,
                         kernels::Buffer::Make(backend, std::max<size_t>(1, tensor.size()) * sizeof(float)));
        local_.push_back(buffer.get());
        local_buffers_.push_back(std::move(buffer));
      }
    }
    return absl::OkStatus();
  }

  ~TrainingRun() {
    prefetch_.reset();  // it uses client_
    ReclaimPushBuffers(absl::ZeroDuration());  // gRPC may outlive this run's buffers
    if (trainer_.hooks_.watch_client) trainer_.hooks_.watch_client(nullptr, "");
  }

  absl::Status RunBsp();
  absl::Status RunAsp();

 private:
  std::unique_ptr<ParameterClient> MakeClient(const v1::ShardMap& map) {
    // Asked between retries of a failed request.
    auto superseded = [this, version = map.version()] {
      if (trainer_.hooks_.expect_change) trainer_.hooks_.expect_change();
      return trainer_.hooks_.latest_assignment().shard_map().version() > version;
    };
    auto client =
        std::make_unique<ParameterClient>(map, trainer_.job_id_, writer_id_, superseded, wire_, trainer_.transport_);
    client->set_compressor(compressor_.get());
    client->set_lamb(spec_.optimizer().kind() == v1::OptimizerSpec::LAMB);
    // From now on a heartbeat bringing a newer map cancels its requests.
    if (trainer_.hooks_.watch_client) trainer_.hooks_.watch_client(client.get(), trainer_.job_id_);
    return client;
  }
  // Pulls parameters that have at least `min_version` updates (SSP: every
  // partition at least `min_clock` steps) into the landing buffers: the
  // 16-bit host tensors with a 16-bit wire format; else pulled_ when
  // `staged` (the parameters in use stay untouched until the pull is known
  // whole), else the parameters' own host tensors.
  // `exact`: the values at exactly `min_version` (BSP; see ParameterClient::Pull).
  absl::Status PullParams(int64_t min_version, absl::Duration timeout, bool staged,
                          ParameterClient::Versions* versions = nullptr, int64_t min_clock = 0,
                          bool exact = false) {
    if (IsHalfWire(wire_)) return client_->Pull(min_version, timeout, params16_.host(), versions, min_clock, exact);
    return client_->Pull(min_version, timeout, staged ? &pulled_ : params_.host(), versions, min_clock, exact);
  }
  // Makes what PullParams landed the parameters in backend memory (16-bit:
  // uploads the 16-bit values and widens them on the backend).
  absl::Status InstallParams(bool staged) {
    kernels::Backend* backend = trainer_.backend_;
    if (IsHalfWire(wire_)) {
      RETURN_IF_ERROR(params16_.Upload());
      for (size_t t = 0; t < params16_.device().size(); ++t) {
        RETURN_IF_ERROR(backend->UnpackHalf(HalfTypeOf(wire_), static_cast<int64_t>((*params16_.host())[t].size()),
                                            params16_.device()[t], params_.device()[t]));
      }
      return absl::OkStatus();
    }
    if (staged) {
      for (size_t t = 0; t < pulled_.size(); ++t) {
        std::copy(pulled_[t].begin(), pulled_[t].end(), (*params_.host())[t].begin());
      }
    }
    return params_.Upload();
  }
  // Layer `layer`'s gradients (tensors 2 * layer and 2 * layer + 1) are
  // final on the backend: packs them for a 16-bit wire format, then on a
  // host-memory backend sends them at once; on a device queues their copies
  // to the host and notes (layer, ticket) in *downloads for sending later.
  absl::Status LayerDone(int layer, ParameterClient::PushStream* push, std::vector<std::pair<int, int64_t>>* downloads);
  // Sends layer `layer`'s gradients from their host buffers.
  void SendLayer(int layer, ParameterClient::PushStream* push);
  int NumLayers() const { return static_cast<int>(grads_.device().size()) / 2; }
  // Computes partition p's gradient at `step` from the uploaded parameters and pushes it.
  absl::Status ComputeAndPush(int32_t partition, int64_t step);
  // Local SGD: local_steps_ SGD steps over the gathered batch's micro-batches
  // on a copy of the uploaded parameters, leaving in grads_ how far they
  // moved (uploaded minus local).
  absl::Status LocalSteps();
  // Before the gradient buffers are written: waits up to `wait` for gRPC to
  // let go of earlier pushes' slices over them, else abandons them to the
  // loan for fresh ones.
  void ReclaimPushBuffers(absl::Duration wait);
  // Computes and pushes, at `step`, each partition of `assignment` not yet
  // in *pushed; stops at the first failure.
  // With `prefetch_next` (and TransferOptions::prefetch_pull), the last of
  // them also prefetches the parameters of step + 1, layer by layer.
  absl::Status PushMissing(const v1::Assignment& assignment, int64_t step, std::set<int32_t>* pushed,
                           bool prefetch_next = false) {
    std::vector<int32_t> missing;
    for (int32_t p : assignment.partitions()) {
      if (pushed->count(p) == 0) missing.push_back(p);
    }
    for (size_t i = 0; i < missing.size(); ++i) {
      // Not with LAMB: the next step's values wait for its norms, which this
      // worker settles as it pulls (ParameterClient::SettleLamb).
      if (i + 1 == missing.size() && prefetch_next && trainer_.transfer_.prefetch_pull && !client_->lamb()) {
        StartPrefetch(step + 1);
      }
      RETURN_IF_ERROR(ComputeAndPush(missing[i], step));
      pushed->insert(missing[i]);
    }
    return absl::OkStatus();
  }
  // Opens prefetch_ for `version` (SendLayer fetches each layer as it is
  // pushed), landing where PullParams(staged) would.
  void StartPrefetch(int64_t version) {
    // Long enough for the rest of this step on every worker, short enough
    // that a step nobody completes falls back to the ordinary pull loop soon.
    const absl::Duration timeout = kWaitSlice + absl::Seconds(2 * last_step_seconds_);
    prefetch_ = IsHalfWire(wire_) ? client_->StartPull(version, timeout, params16_.host())
                                  : client_->StartPull(version, timeout, &pulled_);
    prefetch_version_ = version;
  }
  // Pulls the current parameters (no waiting) into backend memory.
  absl::Status PullNow() {
    RETURN_IF_ERROR(PullParams(0, kRpcTimeout, /*staged=*/false));
    return InstallParams(/*staged=*/false);
  }
  absl::Status EvaluateAndReport(int64_t step);
  void MaybeReportProgress(int64_t step, bool force, const std::map<int32_t, int64_t>* positions = nullptr);
  void ReportDone(const std::vector<int32_t>& partitions);
  // Blocks until the assignment changes or the job is withdrawn.
  v1::Assignment WaitForChange(const v1::Assignment& current) {
    return trainer_.hooks_.wait_for_change(current.membership_epoch(), absl::Milliseconds(500));
  }
  bool Stopped() const { return trainer_.hooks_.should_stop(); }
  // After a data-path error that a new shard map may cure (ABORTED: the map
  // is stale; UNAVAILABLE: a server is gone or not yet reconfigured), waits
  // briefly for a newer map and switches to it. OK means "retry"; the error
  // itself once it is not of that kind or keeps happening for a minute.
  absl::Status Recover(const absl::Status& error);
  bool EvaluatesAt(int64_t step) const {
    const int64_t every = spec_.data().eval_every_steps();
    return step > 0 && (step % steps_per_epoch_ == 0 || step == total_steps_ || (every > 0 && step % every == 0));
  }

  Trainer& trainer_;
  const v1::JobSpec spec_;
  const int batch_;        // a step's examples
  const int micro_batch_;  // computed at once (data.batchSize; gradient accumulation adds the rest)
  const int local_steps_;  // JobSpec.local_sgd: SGD steps a partition step takes here (0: off)
  const int32_t num_partitions_;
  const DataPartitioning partitioning_;  // which rows a partition step takes
  const int64_t steps_per_epoch_;
  const int64_t total_steps_;
  ModelLayout layout_;
  kernels::Mlp model_;
  // The name this run's pushes carry: the worker id plus a random run tag.
  // Sequence numbers restart with every run (a worker put back into a job,
  // a restarted process under the same id), so deduplication must not mix
  // one run's numbers with another's.
  const std::string writer_id_;
  const v1::WireFormat wire_;                 // how pushes and pulls travel
  // JobSpec.compression's pushes (nullptr: none), with the residuals of the
  // partitions run here; outlives the clients.
  const std::unique_ptr<GradientCompressor> compressor_;
  std::unique_ptr<ParameterClient> client_;  // replaced when the shard map changes
  int failures_ = 0;                          // data-path failures in a row
  int64_t max_staleness_seen_ = 0;            // SSP: largest lead over the slowest partition
  double last_loss_ = 0;                      // figures of the last non-empty report window
  double last_samples_per_second_ = 0;
  double last_step_seconds_ = 0;
  double window_step_seconds_ = 0;  // compute + push time of the window's steps
  StagedTensors<float> params_;
  std::vector<std::vector<float>> pulled_;  // BSP: where pulls land before they are known to be whole
  // The last CopyToHostAsync ticket of the partition step being computed (-1: none).
  int64_t queued_ticket_ = -1;
  // BSP: the next step's pull, issued layer by layer as the last partition
  // step of this one pushes (see TransferOptions::prefetch_pull).
  std::unique_ptr<ParameterClient::PullStream> prefetch_;
  int64_t prefetch_version_ = -1;
  // Pushes lend gRPC the gradients' host buffers (grads_, or grads16_ with a
  // 16-bit wire format) as slices instead of copying them.
  SliceLoan push_loan_;
  StagedTensors<float> grads_;
  // 16-bit wire formats only (else empty): pulled parameters and packed
  // gradients as they travel.
  StagedTensors<uint16_t> params16_;
  StagedTensors<uint16_t> grads16_;
  // Local SGD only: the partition's own parameters in backend memory.
  std::vector<kernels::Buffer> local_buffers_;
  std::vector<float*> local_;
  kernels::Buffer x_buffer_, y_buffer_;
  const float* x_device_ = nullptr;
  const int32_t* y_device_ = nullptr;
  std::vector<int64_t> perm_;
  int64_t perm_epoch_ = -1;
  int64_t seq_ = 0;
  bool die_mid_push_ = false;  // this partition step is SetExitMidPush's
  kernels::BatchStats window_;
  // Partition steps' losses not reported yet (WorkReport.step_losses).
  std::vector<v1::StepLoss> step_losses_;
  int64_t window_steps_ = 0;
  absl::Time window_start_ = absl::Now();
};

absl::Status TrainingRun::Recover(const absl::Status& error) {
  // NOT_FOUND too: a chunk whose new server is still copying it.
  if (!absl::IsAborted(error) && !absl::IsUnavailable(error) && !absl::IsDeadlineExceeded(error) &&
      !absl::IsNotFound(error)) {
    return error;
  }
  if (++failures_ > kMaxFailures) return error;
  // A server failed (not merely a slow step): a new map may be on its way.
  if (!absl::IsDeadlineExceeded(error) && trainer_.hooks_.expect_change) trainer_.hooks_.expect_change();
  const int64_t current = client_->map_version();
  v1::Assignment assignment = trainer_.hooks_.latest_assignment();
  if (assignment.shard_map().version() <= current) {
    assignment = trainer_.hooks_.wait_for_change(assignment.membership_epoch(), absl::Seconds(1));
  }
  if (Stopped()) return absl::CancelledError("assignment withdrawn");
  if (assignment.shard_map().version() > current) {
    FLOG(INFO) << "job " << trainer_.job_id_ << ": shard map version " << assignment.shard_map().version()
               << " after: " << error.message();
    client_ = MakeClient(assignment.shard_map());
  }
  return absl::OkStatus();
}

void TrainingRun::ReclaimPushBuffers(absl::Duration wait) {
  if (push_loan_.AwaitReturned(wait)) return;
  FLOG(WARNING) << "job " << trainer_.job_id_ << ": gRPC still holds an earlier push's gradients (a write stuck on a "
                << "paused server?); going on with fresh buffers";
  if (IsHalfWire(wire_)) {
    grads16_.Abandon(&push_loan_);
  } else {
    grads_.Abandon(&push_loan_);
  }
}

absl::Status TrainingRun::ComputeAndPush(int32_t partition, int64_t step) {
  absl::Time start = absl::Now();
  ReclaimPushBuffers(kReclaimWait);
  die_mid_push_ = ExitMidPushNow();
  const int64_t epoch = partitioning_.EpochOf(step);
  if (epoch != perm_epoch_) {
    perm_ = EpochPermutation(spec_.data().shuffle_seed(), epoch, trainer_.train_->num_examples);
    perm_epoch_ = epoch;
  }
  trainer_.GatherBatch(perm_, partitioning_.FirstRow(step, partition), batch_);
  const uint64_t digest = partitioning_.StepAudit(perm_, step, partition).digest;
  kernels::Backend* backend = trainer_.backend_;
  if (!backend->HostMemory()) {
    RETURN_IF_ERROR(backend->CopyFromHost(x_buffer_.get(), trainer_.batch_x_.data(),
                                          trainer_.batch_x_.size() * sizeof(float)));
    RETURN_IF_ERROR(backend->CopyFromHost(y_buffer_.get(), trainer_.batch_y_.data(),
                                          trainer_.batch_y_.size() * sizeof(int32_t)));
  }
  const absl::Time compute_start = absl::Now();
  std::unique_ptr<ParameterClient::PushStream> push =
      client_->StartPush(++seq_, partition, step, kRpcTimeout, batch_, digest, &push_loan_);
  std::vector<std::pair<int, int64_t>> downloads;  // (layer, ticket of its last copy) in the order queued
  // However this step ends, no copy may still be on its way into the host
  // buffers (an error return leaves them queued; the backend outlives this run).
  auto drain = absl::MakeCleanup([this, backend] {
    if (queued_ticket_ >= 0) (void)backend->WaitCopy(queued_ticket_);
    queued_ticket_ = -1;
  });
  std::function<absl::Status(int)> layer_done;
  if (trainer_.transfer_.overlap_push && local_steps_ == 0) {
    layer_done = [&](int layer) { return LayerDone(layer, push.get(), &downloads); };
  }
  const kernels::BatchStats before = window_;
  if (local_steps_ > 0) {
    RETURN_IF_ERROR(LocalSteps());
  } else {
    // Gradient accumulation: micro-batches one after the other, each adding
    // its share of the step's mean gradient; the last one hands each layer on.
    const int features = trainer_.train_->num_features;
    for (int first = 0; first < batch_; first += micro_batch_) {
      const int size = std::min(micro_batch_, batch_ - first);
      const bool last = first + size == batch_;
      RETURN_IF_ERROR(model_.ForwardBackward(params_.device_const(), x_device_ + int64_t{first} * features,
                                             y_device_ + first, size, grads_.device(), &window_,
                                             last ? layer_done : nullptr,
                                             kernels::MicroBatch{batch_, first > 0}));
    }
  }
  if (window_.count > before.count) {  // this partition step's loss, for the job's loss curve
    if (step_losses_.size() >= kMaxStepLosses) step_losses_.erase(step_losses_.begin());
    v1::StepLoss& loss = step_losses_.emplace_back();
    loss.set_step(step);
    loss.set_partition(partition);
    loss.set_loss(static_cast<float>((window_.loss_sum - before.loss_sum) /
                                     static_cast<double>(window_.count - before.count)));
  }
  if (!layer_done) {
    for (int layer = NumLayers() - 1; layer >= 0; --layer) RETURN_IF_ERROR(LayerDone(layer, push.get(), &downloads));
  }
  // On a device: each layer's gradients leave as soon as their copy is in,
  // while the layers below are still being computed.
  for (const auto& [layer, ticket] : downloads) {
    RETURN_IF_ERROR(backend->WaitCopy(ticket));
    SendLayer(layer, push.get());
  }
  if (trainer_.hooks_.observe_compute) {
    trainer_.hooks_.observe_compute(absl::ToDoubleSeconds(absl::Now() - compute_start), backend->MemoryInUse());
  }
  RETURN_IF_ERROR(push->Finish());
  ++window_steps_;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  window_step_seconds_ += seconds;
  if (trainer_.hooks_.observe_step) trainer_.hooks_.observe_step(seconds, batch_);
  return absl::OkStatus();
}

absl::Status TrainingRun::LocalSteps() {
  kernels::Backend* backend = trainer_.backend_;
  const std::vector<const float*> start = params_.device_const();
  const std::vector<float*>& grads = grads_.device();
  std::vector<int64_t> sizes;
  for (const auto& tensor : *grads_.host()) sizes.push_back(static_cast<int64_t>(tensor.size()));
  // The partition's own copy of the parameters it starts from.
  for (size_t t = 0; t < local_.size(); ++t) {
    RETURN_IF_ERROR(backend->Fill(sizes[t], 0.0f, local_[t]));
    RETURN_IF_ERROR(backend->Axpy(sizes[t], 1.0f, start[t], local_[t]));
  }
  const std::vector<const float*> local(local_.begin(), local_.end());
  const float lr = spec_.local_sgd().lr();
  const int features = trainer_.train_->num_features;
  for (int first = 0; first < batch_; first += micro_batch_) {
    const int size = std::min(micro_batch_, batch_ - first);
    RETURN_IF_ERROR(model_.ForwardBackward(local, x_device_ + int64_t{first} * features, y_device_ + first, size,
                                           grads, &window_));
    for (size_t t = 0; t < local_.size(); ++t) RETURN_IF_ERROR(backend->Axpy(sizes[t], -lr, grads[t], local_[t]));
  }
  // How far it moved: start - local, in place of a gradient.
  for (size_t t = 0; t < local_.size(); ++t) {
    RETURN_IF_ERROR(backend->Fill(sizes[t], 0.0f, grads[t]));
    RETURN_IF_ERROR(backend->Axpy(sizes[t], 1.0f, start[t], grads[t]));
    RETURN_IF_ERROR(backend->Axpy(sizes[t], -1.0f, local_[t], grads[t]));
  }
  return absl::OkStatus();
}

absl::Status TrainingRun::LayerDone(int layer, ParameterClient::PushStream* push,
                                    std::vector<std::pair<int, int64_t>>* downloads) {
  kernels::Backend* backend = trainer_.backend_;
  const bool half = IsHalfWire(wire_);
  int64_t ticket = 0;
  for (int t : {2 * layer, 2 * layer + 1}) {
    const int64_t n = static_cast<int64_t>((*grads_.host())[t].size());
    if (half) RETURN_IF_ERROR(backend->PackHalf(HalfTypeOf(wire_), n, grads_.device()[t], grads16_.device()[t]));
    if (backend->HostMemory()) continue;
    if (half) {
      ASSIGN_OR_RETURN(ticket, backend->CopyToHostAsync((*grads16_.host())[t].data(), grads16_.device()[t],
                                                        n * sizeof(uint16_t)));
    } else {
      ASSIGN_OR_RETURN(ticket, backend->CopyToHostAsync((*grads_.host())[t].data(), grads_.device()[t],
                                                        n * sizeof(float)));
    }
    queued_ticket_ = ticket;
  }
  if (backend->HostMemory()) {  // computed already: send now, while the layers below are computed
    SendLayer(layer, push);
  } else {
    downloads->emplace_back(layer, ticket);
  }
  return absl::OkStatus();
}

void TrainingRun::SendLayer(int layer, ParameterClient::PushStream* push) {
  const std::vector<int> tensors = {2 * layer, 2 * layer + 1};
  if (IsHalfWire(wire_)) {
    push->Send(tensors, *grads16_.host());
  } else {
    push->Send(tensors, *grads_.host());
  }
  if (die_mid_push_) {  // SetExitMidPush's fault
    const absl::Status sent = push->Finish();  // partial: the other layers were never sent
    FLOG(ERROR) << "--exit-mid-push: killing this process halfway through a push (" << sent.message() << ")";
    raise(SIGKILL);
  }
  if (prefetch_ != nullptr) prefetch_->Fetch(tensors);
}

absl::Status TrainingRun::EvaluateAndReport(int64_t step) {
  kernels::BatchStats eval;
  RETURN_IF_ERROR(trainer_.Evaluate(params_.device_const(), &model_, &eval));
  v1::WorkReport report;
  report.set_kind(v1::WorkReport::EVAL);
  report.set_step(step);
  report.set_epoch(static_cast<int32_t>((step + steps_per_epoch_ - 1) / steps_per_epoch_));
  report.set_test_accuracy(static_cast<double>(eval.correct) / std::max<int64_t>(1, eval.count));
  report.set_test_loss(eval.loss_sum / std::max<int64_t>(1, eval.count));
  trainer_.hooks_.report(report);
  return absl::OkStatus();
}

void TrainingRun::MaybeReportProgress(int64_t step, bool force, const std::map<int32_t, int64_t>* positions) {
  absl::Duration elapsed = absl::Now() - window_start_;
  if (!force && elapsed < kReportEvery) return;
  v1::WorkReport report;
  report.set_kind(v1::WorkReport::PROGRESS);
  report.set_step(step);
  const int64_t epoch = partitioning_.EpochOf(std::max<int64_t>(0, step - 1));
  report.set_epoch(static_cast<int32_t>(std::min<int64_t>(spec_.data().epochs(), epoch + 1)));
  // An empty window (nothing computed since the last report) repeats the
  // last figures rather than reporting a loss of 0.
  if (window_.count > 0) {
    last_loss_ = window_.loss_sum / window_.count;
    last_samples_per_second_ = window_steps_ * batch_ / std::max(1e-9, absl::ToDoubleSeconds(elapsed));
  }
  report.set_loss(last_loss_);
  for (v1::StepLoss& loss : step_losses_) *report.add_step_losses() = std::move(loss);
  step_losses_.clear();
  report.set_samples_per_second(last_samples_per_second_);
  report.set_max_staleness_seen(max_staleness_seen_);
  if (window_steps_ > 0) last_step_seconds_ = window_step_seconds_ / window_steps_;
  report.set_step_seconds(last_step_seconds_);
  if (positions != nullptr) {
    for (const auto& [partition, position] : *positions) {
      report.add_partitions(partition);
      report.add_partition_steps(position);
    }
  }
  trainer_.hooks_.report(report);
  window_ = kernels::BatchStats();
  window_steps_ = 0;
  window_step_seconds_ = 0;
  window_start_ = absl::Now();
}

void TrainingRun::ReportDone(const std::vector<int32_t>& partitions) {
  v1::WorkReport report;
  report.set_kind(v1::WorkReport::DONE);
  for (int32_t p : partitions) report.add_partitions(p);
  trainer_.hooks_.report(report);
}

// BSP: every step averages one gradient per partition. The step to compute
// is the version the servers are at, so a worker can join (or take over a
// partition) at any step; a partition's gradient for a step is applied once
// whoever sends it, and is the same whoever computes it.
absl::Status TrainingRun::RunBsp() {
  int64_t next = 0;           // the version to wait for
  int64_t have_version = -1;  // the version of the uploaded parameters
  int64_t evaluated = 0;      // last step evaluated
  std::set<int32_t> pushed;   // partitions pushed for have_version
  bool owe_push = false;      // a push for have_version failed and was not sent again yet
  // A version some chunks were seen waiting at while others had passed it,
  // which this worker has no parameters of (-1: none); and whether the next
  // pull asks for the values at exactly `next`.
  int64_t split_at = -1;
  bool exact = false;
  v1::Assignment assignment = trainer_.hooks_.latest_assignment();
  while (true) {
    if (Stopped()) return absl::CancelledError("assignment withdrawn");
    ParameterClient::Versions versions;
    // Into a staging copy: a pull caught mid-update (mixed versions) must not
    // touch the parameters a recompute of this step still uses (on the CPU
    // backend those are the host buffers themselves).
    const absl::Time pull_start = absl::Now();
    absl::Status pulled;
    bool prefetched = false;
    if (prefetch_ != nullptr) {  // issued while the last step's pushes went out
      if (prefetch_version_ == next) {
        pulled = prefetch_->Finish(&versions);
        prefetched = pulled.ok();
        if (!prefetched) FLOG(DEBUG) << "prefetch of version " << next << " not used: " << pulled;
      }
      prefetch_.reset();
      if (trainer_.hooks_.observe_prefetch) trainer_.hooks_.observe_prefetch(prefetched);
    }
    if (!prefetched) pulled = PullParams(next, kWaitSlice, /*staged=*/true, &versions, /*min_clock=*/0, exact);
    if (exact && absl::IsFailedPrecondition(pulled)) {  // the step completed meanwhile
      FLOG(DEBUG) << "job " << trainer_.job_id_ << ": values of version " << next << " gone: " << pulled;
      exact = false;
      next = next + 1;
      continue;
    }
    exact = false;
    if (trainer_.hooks_.observe_pull) trainer_.hooks_.observe_pull(absl::ToDoubleSeconds(absl::Now() - pull_start));
    if (absl::IsDeadlineExceeded(pulled)) {
      // The step waits for a partition nobody sent: compute the ones this
      // worker owns now (e.g. taken over from a worker that died).
      assignment = trainer_.hooks_.latest_assignment();
      if (assignment.shard_map().version() > client_->map_version()) {  // a failover: follow it
        RETURN_IF_ERROR(Recover(pulled));
        continue;
      }
      if (split_at > have_version) {
        // The chunks stayed split for a whole slice: a worker died with its
        // push of step split_at half sent, and the partitions it owed may be
        // this worker's now, but it never had that step's parameters. The
        // servers keep each chunk's values of the step before: compute the
        // step from those (chunks already past it take the pushes as
        // duplicates).
        FLOG(INFO) << "job " << trainer_.job_id_ << ": chunks split between versions " << split_at << " and "
                   << split_at + 1 << "; computing step " << split_at << " from its parameters";
        next = split_at;
        exact = true;
        split_at = -1;
        continue;
      }
      if (have_version < 0) continue;
      absl::Status pushes = PushMissing(assignment, have_version, &pushed);
      if (!pushes.ok()) RETURN_IF_ERROR(Recover(pushes));
      continue;
    }
    if (!pulled.ok()) {
      RETURN_IF_ERROR(Recover(pulled));
      continue;
    }
    failures_ = 0;
    if (versions.min != versions.max) {  // caught mid-update: wait for all chunks
      if (owe_push && versions.min == have_version) {
        // Some chunks still wait for this step and for a push of this worker
        // that failed (their server died and it switched maps): send what is
        // missing now rather than after a slice of waiting.
        assignment = trainer_.hooks_.latest_assignment();
        absl::Status pushes = PushMissing(assignment, have_version, &pushed);
        if (pushes.ok()) {
          owe_push = false;
        } else {
          RETURN_IF_ERROR(Recover(pushes));
        }
      }
      if (versions.min > have_version) split_at = versions.min;
      next = versions.max;
      continue;
    }
    split_at = -1;
    const int64_t version = versions.min;
    RETURN_IF_ERROR(InstallParams(/*staged=*/true));
    have_version = version;
    pushed.clear();
    owe_push = false;
    assignment = trainer_.hooks_.latest_assignment();
    const bool evaluator = std::count(assignment.partitions().begin(), assignment.partitions().end(),
                                      assignment.eval_partition()) > 0;
    if (evaluator && EvaluatesAt(version) && evaluated < version) {
      RETURN_IF_ERROR(EvaluateAndReport(version));
      evaluated = version;
    }
    if (version >= total_steps_) break;
    absl::Status pushes = PushMissing(assignment, version, &pushed, /*prefetch_next=*/true);
    if (!pushes.ok()) {  // pull this step again (with a new map) and send what is missing
      prefetch_.reset();  // before Recover replaces the client it runs on
      RETURN_IF_ERROR(Recover(pushes));
      owe_push = true;
      next = version;
      continue;
    }
    MaybeReportProgress(version + 1, (version + 1) % steps_per_epoch_ == 0);
    next = version + 1;
  }
  MaybeReportProgress(total_steps_, /*force=*/true);
  // Done: report the partitions owned now, and keep serving the job until it
  // ends, in case a partition (and its final evaluation) moves here.
  std::set<int32_t> reported;
  while (!Stopped()) {
    std::vector<int32_t> fresh;
    bool evaluate = false;
    for (int32_t p : assignment.partitions()) {
      if (!reported.insert(p).second) continue;
      fresh.push_back(p);
      evaluate |= p == assignment.eval_partition() && evaluated < total_steps_;
    }
    if (evaluate) {
      RETURN_IF_ERROR(PullNow());
      RETURN_IF_ERROR(EvaluateAndReport(total_steps_));
      evaluated = total_steps_;
    }
    if (!fresh.empty()) ReportDone(fresh);
    assignment = WaitForChange(assignment);
  }
  return absl::OkStatus();
}

// ASP and SSP: each partition runs through the epochs at its own pace (SSP:
// at most `staleness` steps ahead of the slowest); the worker
// takes its partition that is furthest behind. Servers apply a partition's
// step once, so a partition resumed elsewhere after a failure (from the last
// reported position) is not applied twice.
absl::Status TrainingRun::RunAsp() {
  std::map<int32_t, int64_t> positions;
  std::set<int32_t> reported_done;
  v1::Assignment assignment = trainer_.hooks_.latest_assignment();
  while (!Stopped()) {
    positions = PartitionPositions(assignment, positions);
    const int32_t next = FurthestBehind(positions, total_steps_);
    if (next < 0) {  // every owned partition is through: report, then wait for the job's end
      std::vector<int32_t> fresh;
      for (const auto& [p, position] : positions) {
        if (reported_done.insert(p).second) fresh.push_back(p);
      }
      if (!fresh.empty()) {
        MaybeReportProgress(total_steps_, /*force=*/true, &positions);
        if (positions.count(assignment.eval_partition()) > 0) {
          RETURN_IF_ERROR(PullNow());
          RETURN_IF_ERROR(EvaluateAndReport(total_steps_));
        }
        ReportDone(fresh);
      }
      assignment = WaitForChange(assignment);
      continue;
    }
    const int64_t step = positions[next];
    absl::Status status;
    if (spec_.mode() == v1::SSP) {
      // Stale synchronous: wait until the slowest partition is at most
      // `staleness` steps behind this one.
      ParameterClient::Versions versions;
      status = PullParams(0, kWaitSlice, /*staged=*/false, &versions, step - spec_.staleness());
      if (absl::IsDeadlineExceeded(status)) {  // still too far ahead: look for new partitions, then wait again
        assignment = trainer_.hooks_.latest_assignment();
        if (assignment.shard_map().version() > client_->map_version()) RETURN_IF_ERROR(Recover(status));
        continue;
      }
      if (status.ok()) {
        max_staleness_seen_ = std::max(max_staleness_seen_, step - versions.clock);
        if (trainer_.hooks_.observe_staleness) trainer_.hooks_.observe_staleness(step - versions.clock);
        status = InstallParams(/*staged=*/false);
      }
    } else {
      status = PullNow();
    }
    if (status.ok()) status = ComputeAndPush(next, step);
    if (!status.ok()) {
      RETURN_IF_ERROR(Recover(status));
      assignment = trainer_.hooks_.latest_assignment();
      continue;
    }
    failures_ = 0;
    positions[next] = step + 1;
    if (next == assignment.eval_partition() && EvaluatesAt(step + 1) && step + 1 < total_steps_) {
      RETURN_IF_ERROR(PullNow());
      RETURN_IF_ERROR(EvaluateAndReport(step + 1));
    }
    MaybeReportProgress(step + 1, false, &positions);
    assignment = trainer_.hooks_.latest_assignment();
  }
  return absl::CancelledError("assignment withdrawn");
}

absl::Status Trainer::Train(const v1::Assignment& assignment) {
  if (click_) {
    kernels::Backend* compute =
        backend_->HostMemory() && !transfer_.click_models_on_backend ? nullptr : backend_;
    if (compute != nullptr)
      RETURN_IF_ERROR(compute->SetPrecision(ToPrecision(assignment.spec().precision())));
    return RunClickJob(worker_id_, hooks_, transport_, assignment, click_data_, compute);
  }
  TrainingRun run(this, assignment);
  RETURN_IF_ERROR(run.Init());
  if (assignment.spec().mode() == v1::ASP || assignment.spec().mode() == v1::SSP) {
    absl::Status status = run.RunAsp();
    // The job ending (withdrawn) after this worker is through is success.
    return status;
  }
  return run.RunBsp();
}

}  // namespace fulcrum
