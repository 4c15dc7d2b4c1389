#include "worker/trainer.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/param_init.h"
#include "common/status_macros.h"
#include "kernels/model_from_spec.h"
#include "worker/parameter_client.h"

namespace fulcrum {
namespace {

constexpr absl::Duration kRpcTimeout = absl::Seconds(60);
constexpr absl::Duration kReportEvery = absl::Milliseconds(500);
constexpr int kEvalBatch = 1000;

// Loaded datasets are kept for later jobs on the same files.
std::mutex g_cache_mu;  // guards g_cache
std::map<std::string, std::shared_ptr<const Dataset>> g_cache;

absl::StatusOr<std::shared_ptr<const Dataset>> LoadCached(const v1::DataSpec& data, uint64_t seed,
                                                          bool train) {
  std::string key;
  if (data.dataset() == v1::DataSpec::FASHION_MNIST) {
    key = absl::StrCat("fashion:", data.path(), ":", train);
  } else {
    key = absl::StrCat("synthetic:", seed, ":", data.synthetic_examples(), ":",
                       data.synthetic_features(), ":", data.synthetic_classes(), ":", train);
  }
  {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    auto it = g_cache.find(key);
    if (it != g_cache.end()) return it->second;
  }
  std::shared_ptr<const Dataset> loaded;
  if (data.dataset() == v1::DataSpec::FASHION_MNIST) {
    ASSIGN_OR_RETURN(Dataset d, LoadFashionMnist(data.path(), train));
    loaded = std::make_shared<const Dataset>(std::move(d));
  } else {
    int64_t n = train ? data.synthetic_examples() : std::max<int64_t>(1, data.synthetic_examples() / 5);
    loaded = std::make_shared<const Dataset>(MakeSynthetic(
        seed, n, data.synthetic_features(), data.synthetic_classes(), train ? 0 : 1));
  }
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

// Host tensors mirrored in backend memory. On a host-memory backend the
// "device" pointers are the host vectors themselves and copies are no-ops.
class StagedTensors {
 public:
  StagedTensors(kernels::Backend* backend, std::vector<std::vector<float>> host)
      : backend_(backend), host_(std::move(host)) {}

  absl::Status Init() {
    for (auto& tensor : host_) {
      if (backend_->HostMemory()) {
        device_.push_back(tensor.data());
        continue;
      }
      ASSIGN_OR_RETURN(kernels::Buffer buffer, kernels::Buffer::Make(backend_, tensor.size() * sizeof(float)));
      device_.push_back(buffer.get());
      buffers_.push_back(std::move(buffer));
    }
    return absl::OkStatus();
  }
  absl::Status Upload() {
    if (backend_->HostMemory()) return absl::OkStatus();
    for (size_t i = 0; i < host_.size(); ++i) {
      RETURN_IF_ERROR(backend_->CopyFromHost(device_[i], host_[i].data(), host_[i].size() * sizeof(float)));
    }
    return absl::OkStatus();
  }
  absl::Status Download() {
    if (backend_->HostMemory()) return absl::OkStatus();
    for (size_t i = 0; i < host_.size(); ++i) {
      RETURN_IF_ERROR(backend_->CopyToHost(host_[i].data(), device_[i], host_[i].size() * sizeof(float)));
    }
    return absl::OkStatus();
  }
  std::vector<std::vector<float>>* host() { return &host_; }
  std::vector<const float*> device_const() const { return {device_.begin(), device_.end()}; }
  const std::vector<float*>& device() const { return device_; }

 private:
  kernels::Backend* backend_;
  std::vector<std::vector<float>> host_;
  std::vector<float*> device_;
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

std::vector<int64_t> EpochPermutation(uint64_t seed, int64_t epoch, int64_t n) {
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  uint64_t stream = SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(epoch) + 0x9e3779b97f4a7c15ull));
  for (int64_t i = n - 1; i > 0; --i) {
    uint64_t j = SplitMix64(stream + static_cast<uint64_t>(i)) % static_cast<uint64_t>(i + 1);
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

Trainer::Trainer(std::string worker_id, kernels::Backend* backend, TrainerHooks hooks)
    : worker_id_(std::move(worker_id)), backend_(backend), hooks_(std::move(hooks)) {}

absl::Status Trainer::Load(const v1::Assignment& assignment) {
  job_id_ = assignment.job_id();
  const v1::JobSpec& spec = assignment.spec();
  ASSIGN_OR_RETURN(train_, LoadCached(spec.data(), spec.seed(), /*train=*/true));
  if (assignment.rank() == 0) {
    ASSIGN_OR_RETURN(test_, LoadCached(spec.data(), spec.seed(), /*train=*/false));
  }
  FLOG(INFO) << "job " << job_id_ << ": loaded " << train_->num_examples << " training examples ("
             << train_->num_features << " features, " << train_->num_classes << " classes)";
  return absl::OkStatus();
}

v1::WorkReport Trainer::ReadyReport() const {
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

absl::Status Trainer::Train(const v1::Assignment& assignment) {
  const v1::JobSpec& spec = assignment.spec();
  const int rank = assignment.rank();
  const int batch = spec.data().batch_size();
  const int64_t global_batch = int64_t{batch} * assignment.world_size();
  const int64_t steps_per_epoch = assignment.steps_per_epoch();
  const bool synchronous = spec.mode() != v1::ASP;
  ModelLayout layout = LayoutFor(spec, train_->num_features, train_->num_classes);
  kernels::Mlp model(layout.config, backend_);
  RETURN_IF_ERROR(backend_->SetPrecision(ToPrecision(spec.precision())));
  ParameterClient client(assignment.shard_map(), job_id_, worker_id_, rank);
  StagedTensors params(backend_, client.MakeBuffers());
  StagedTensors grads(backend_, client.MakeBuffers());
  RETURN_IF_ERROR(params.Init());
  RETURN_IF_ERROR(grads.Init());
  // The batch, gathered on the host and staged into backend memory.
  batch_x_.assign(static_cast<size_t>(batch) * train_->num_features, 0.0f);
  batch_y_.assign(batch, 0);
  const float* x_device = nullptr;
  const int32_t* y_device = nullptr;
  ASSIGN_OR_RETURN(kernels::Buffer x_buffer, UploadArray(backend_, batch_x_, &x_device));
  ASSIGN_OR_RETURN(kernels::Buffer y_buffer, UploadArray(backend_, batch_y_, &y_device));
  auto stage_batch = [&]() -> absl::Status {
    if (backend_->HostMemory()) return absl::OkStatus();
    RETURN_IF_ERROR(backend_->CopyFromHost(x_buffer.get(), batch_x_.data(), batch_x_.size() * sizeof(float)));
    return backend_->CopyFromHost(y_buffer.get(), batch_y_.data(), batch_y_.size() * sizeof(int32_t));
  };
  std::vector<int64_t> perm;
  int64_t perm_epoch = -1;
  kernels::BatchStats window;
  int64_t window_steps = 0;
  absl::Time window_start = absl::Now();

  auto report_progress = [&](int64_t steps_done, int32_t epoch) {
    absl::Duration elapsed = absl::Now() - window_start;
    v1::WorkReport report;
    report.set_job_id(job_id_);
    report.set_kind(v1::WorkReport::PROGRESS);
    report.set_step(steps_done);
    report.set_epoch(epoch);
    report.set_loss(window.count ? window.loss_sum / window.count : 0);
    report.set_samples_per_second(window_steps * batch / std::max(1e-9, absl::ToDoubleSeconds(elapsed)));
    hooks_.report(report);
    window = kernels::BatchStats();
    window_steps = 0;
    window_start = absl::Now();
  };

  for (int64_t step = 0; step < assignment.total_steps(); ++step) {
    if (hooks_.should_stop()) return absl::CancelledError("assignment withdrawn");
    absl::Time step_start = absl::Now();
    const int64_t epoch = step / steps_per_epoch;
    if (epoch != perm_epoch) {
      perm = EpochPermutation(spec.data().shuffle_seed(), epoch, train_->num_examples);
      perm_epoch = epoch;
    }
    RETURN_IF_ERROR(client.Pull(synchronous ? step : 0, kRpcTimeout, params.host()));
    RETURN_IF_ERROR(params.Upload());
    GatherBatch(perm, (step % steps_per_epoch) * global_batch + int64_t{rank} * batch, batch);
    RETURN_IF_ERROR(stage_batch());
    RETURN_IF_ERROR(model.ForwardBackward(params.device_const(), x_device, y_device, batch, grads.device(), &window));
    RETURN_IF_ERROR(grads.Download());
    RETURN_IF_ERROR(client.Push(/*seq=*/step + 1, step, *grads.host(), kRpcTimeout));
    ++window_steps;
    if (hooks_.observe_step) hooks_.observe_step(absl::ToDoubleSeconds(absl::Now() - step_start));
    bool last = step + 1 == assignment.total_steps();
    bool epoch_end = (step + 1) % steps_per_epoch == 0 || last;
    if (absl::Now() - window_start >= kReportEvery || epoch_end) {
      report_progress(step + 1, static_cast<int32_t>(epoch + 1));
    }
    if (epoch_end && rank == 0) {
      RETURN_IF_ERROR(client.Pull(synchronous ? step + 1 : 0, kRpcTimeout, params.host()));
      RETURN_IF_ERROR(params.Upload());
      kernels::BatchStats eval;
      RETURN_IF_ERROR(Evaluate(params.device_const(), &model, &eval));
      v1::WorkReport report;
      report.set_job_id(job_id_);
      report.set_kind(v1::WorkReport::EVAL);
      report.set_step(step + 1);
      report.set_epoch(static_cast<int32_t>(epoch + 1));
      report.set_test_accuracy(static_cast<double>(eval.correct) / std::max<int64_t>(1, eval.count));
      report.set_test_loss(eval.loss_sum / std::max<int64_t>(1, eval.count));
      hooks_.report(report);
    }
  }
  return absl::OkStatus();
}

}  // namespace fulcrum
