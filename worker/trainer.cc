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

std::vector<const float*> ConstPointers(const std::vector<std::vector<float>>& buffers) {
  std::vector<const float*> pointers;
  for (const auto& b : buffers) pointers.push_back(b.data());
  return pointers;
}

std::vector<float*> Pointers(std::vector<std::vector<float>>* buffers) {
  std::vector<float*> pointers;
  for (auto& b : *buffers) pointers.push_back(b.data());
  return pointers;
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
  batch_x_.resize(static_cast<size_t>(batch) * features);
  batch_y_.resize(batch);
  for (int i = 0; i < batch; ++i) {
    int64_t example = perm[first + i];
    std::copy_n(train_->features.data() + example * features, features,
                batch_x_.data() + static_cast<int64_t>(i) * features);
    batch_y_[i] = train_->labels[example];
  }
}

absl::Status Trainer::Evaluate(const std::vector<const float*>& params, kernels::Mlp* model,
                               kernels::BatchStats* stats) {
  for (int64_t first = 0; first < test_->num_examples; first += kEvalBatch) {
    int batch = static_cast<int>(std::min<int64_t>(kEvalBatch, test_->num_examples - first));
    RETURN_IF_ERROR(model->Evaluate(params, test_->features.data() + first * test_->num_features,
                                    test_->labels.data() + first, batch, stats));
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
  ParameterClient client(assignment.shard_map(), job_id_, worker_id_, rank);
  auto params = client.MakeBuffers();
  auto grads = client.MakeBuffers();
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
    RETURN_IF_ERROR(client.Pull(synchronous ? step : 0, kRpcTimeout, &params));
    GatherBatch(perm, (step % steps_per_epoch) * global_batch + int64_t{rank} * batch, batch);
    RETURN_IF_ERROR(model.ForwardBackward(ConstPointers(params), batch_x_.data(), batch_y_.data(),
                                          batch, Pointers(&grads), &window));
    RETURN_IF_ERROR(client.Push(/*seq=*/step + 1, step, grads, kRpcTimeout));
    ++window_steps;
    if (hooks_.observe_step) hooks_.observe_step(absl::ToDoubleSeconds(absl::Now() - step_start));
    bool last = step + 1 == assignment.total_steps();
    bool epoch_end = (step + 1) % steps_per_epoch == 0 || last;
    if (absl::Now() - window_start >= kReportEvery || epoch_end) {
      report_progress(step + 1, static_cast<int32_t>(epoch + 1));
    }
    if (epoch_end && rank == 0) {
      RETURN_IF_ERROR(client.Pull(synchronous ? step + 1 : 0, kRpcTimeout, &params));
      kernels::BatchStats eval;
      RETURN_IF_ERROR(Evaluate(ConstPointers(params), &model, &eval));
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
