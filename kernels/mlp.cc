#include "kernels/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/model_util.h"

namespace fulcrum {
namespace kernels {
namespace {

std::vector<int> LayerDims(const ModelConfig& config) {
  std::vector<int> dims;
  dims.push_back(config.input_dim);
  dims.insert(dims.end(), config.hidden.begin(), config.hidden.end());
  dims.push_back(config.num_classes);
  return dims;
}

absl::Status CheckMlpPointers(const char* what, size_t expected, size_t actual_count, bool any_null) {
  if (actual_count != expected) {
    return absl::InvalidArgumentError(absl::StrCat("Mlp: got ", actual_count, " ", what,
                                                   " pointers, expected ", expected,
                                                   " (one per tensor in MlpTensors order)"));
  }
  if (any_null) {
    return absl::InvalidArgumentError(absl::StrCat("Mlp: a ", what,
                                                   " pointer is null; pass one buffer per "
                                                   "tensor in MlpTensors order"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateModelConfig(const ModelConfig& config) {
  if (config.input_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelConfig: input_dim = ", config.input_dim, " must be positive"));
  }
  if (config.num_classes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelConfig: num_classes = ", config.num_classes, " must be positive"));
  }
  for (size_t i = 0; i < config.hidden.size(); ++i) {
    if (config.hidden[i] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ModelConfig: hidden[", i, "] = ", config.hidden[i], " must be positive"));
    }
  }
  return absl::OkStatus();
}

std::vector<TensorInfo> MlpTensors(const ModelConfig& config) {
  const std::vector<int> dims = LayerDims(config);
  std::vector<TensorInfo> tensors;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    const int64_t in = dims[i], out = dims[i + 1];
    const float glorot = std::sqrt(6.0f / static_cast<float>(in + out));
    const std::string prefix = absl::StrCat("layer", i);
    tensors.push_back({prefix + ".weight", {in, out}, in * out, InitKind::kUniform, glorot});
    tensors.push_back({prefix + ".bias", {out}, out, InitKind::kZeros, 0.0f});
  }
  return tensors;
}

Mlp::Mlp(ModelConfig config, Backend* backend)
    : config_(std::move(config)),
      backend_(backend),
      config_status_(ValidateModelConfig(config_)),
      dims_(LayerDims(config_)),
      outputs_(dims_.size() - 1) {
  if (config_status_.ok() && backend_ == nullptr) {
    config_status_ =
        absl::InvalidArgumentError("Mlp: backend is null; pass a Backend such as MakeCpuBackend()");
  }
}

Activation Mlp::LayerActivation(int layer) const {
  return layer + 1 < num_layers() ? config_.activation : Activation::kNone;
}

absl::Status Mlp::ValidateInputs(const std::vector<const float*>& params, const float* x,
                                 const int32_t* labels, int batch) const {
  RETURN_IF_ERROR(config_status_);
  if (batch <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("Mlp: batch = ", batch, " must be positive"));
  }
  if (x == nullptr || labels == nullptr) {
    return absl::InvalidArgumentError("Mlp: x and labels must be non-null");
  }
  return CheckMlpPointers("param", 2 * num_layers(), params.size(), AnyNull(params));
}

// Grows every scratch buffer to `batch` rows; the old contents are dropped.
absl::Status Mlp::EnsureScratch(int batch) {
  if (batch <= scratch_batch_) return absl::OkStatus();
  scratch_batch_ = 0;  // stays 0 if an allocation below fails
  for (int i = 0; i < num_layers(); ++i) {
    outputs_[i].Reset();
    ASSIGN_OR_RETURN(outputs_[i], Buffer::Make(backend_, sizeof(float) * batch * dims_[i + 1]));
  }
  const size_t widest = *std::max_element(dims_.begin(), dims_.end());
  delta_.Reset();
  next_delta_.Reset();
  ASSIGN_OR_RETURN(delta_, Buffer::Make(backend_, sizeof(float) * batch * widest));
  ASSIGN_OR_RETURN(next_delta_, Buffer::Make(backend_, sizeof(float) * batch * widest));
  scratch_batch_ = batch;
  return absl::OkStatus();
}

absl::Status Mlp::Forward(const std::vector<const float*>& params, const float* x, int batch) {
  RETURN_IF_ERROR(EnsureScratch(batch));
  const float* input = x;
  for (int i = 0; i < num_layers(); ++i) {
    const int in = dims_[i], out = dims_[i + 1];
    float* output = outputs_[i].get();
    RETURN_IF_ERROR(backend_->Gemm(false, false, batch, out, in, 1.0f, input, params[2 * i], 0.0f, output));
    RETURN_IF_ERROR(
        backend_->BiasActivationForward(LayerActivation(i), batch, out, params[2 * i + 1], output));
    input = output;
  }
  return absl::OkStatus();
}

// Expects delta_ to hold d(loss)/d(logits). Propagates it down the layers.
absl::Status Mlp::Backward(const std::vector<const float*>& params, const float* x, int batch,
                           const std::vector<float*>& grads, const std::function<absl::Status(int)>& layer_done,
                           bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  for (int i = num_layers() - 1; i >= 0; --i) {
    const int in = dims_[i], out = dims_[i + 1];
    const float* input = i == 0 ? x : outputs_[i - 1].get();
    RETURN_IF_ERROR(
        backend_->Gemm(true, false, in, out, batch, 1.0f, input, delta_.get(), beta, grads[2 * i]));
    RETURN_IF_ERROR(backend_->ColumnSum(batch, out, delta_.get(), grads[2 * i + 1], accumulate));
    if (layer_done) RETURN_IF_ERROR(layer_done(i));
    if (i == 0) break;
    RETURN_IF_ERROR(backend_->Gemm(false, true, batch, in, out, 1.0f, delta_.get(), params[2 * i], 0.0f,
                                   next_delta_.get()));
    RETURN_IF_ERROR(
        backend_->ActivationBackward(LayerActivation(i - 1), int64_t{batch} * in, input, next_delta_.get()));
    std::swap(delta_, next_delta_);
  }
  return absl::OkStatus();
}

void Mlp::AddStats(double loss_sum, int64_t correct, int batch, BatchStats* stats) {
  if (stats == nullptr) return;
  stats->loss_sum += loss_sum;
  stats->correct += correct;
  stats->count += batch;
}

absl::Status Mlp::ForwardBackward(const std::vector<const float*>& params, const float* x,
                                  const int32_t* labels, int batch, const std::vector<float*>& grads,
                                  BatchStats* stats, const std::function<absl::Status(int)>& layer_done,
                                  MicroBatch micro) {
  RETURN_IF_ERROR(ValidateInputs(params, x, labels, batch));
  if (micro.total_batch != 0 && micro.total_batch < batch) {
    return absl::InvalidArgumentError(absl::StrCat("Mlp::ForwardBackward: a micro-batch of ", batch,
                                                   " examples in a batch of ", micro.total_batch));
  }
  const int total = micro.total_batch > 0 ? micro.total_batch : batch;
  RETURN_IF_ERROR(CheckMlpPointers("grad", params.size(), grads.size(), AnyNull(grads)));
  RETURN_IF_ERROR(Forward(params, x, batch));
  double loss_sum = 0.0;
  int64_t correct = 0;
  RETURN_IF_ERROR(backend_->SoftmaxCrossEntropy(batch, config_.num_classes, outputs_.back().get(), labels,
                                                1.0f / static_cast<float>(total), delta_.get(), &loss_sum,
                                                &correct));
  RETURN_IF_ERROR(Backward(params, x, batch, grads, layer_done, micro.accumulate));
  AddStats(loss_sum, correct, batch, stats);
  return absl::OkStatus();
}

absl::Status Mlp::Evaluate(const std::vector<const float*>& params, const float* x, const int32_t* labels,
                           int batch, BatchStats* stats) {
  RETURN_IF_ERROR(ValidateInputs(params, x, labels, batch));
  RETURN_IF_ERROR(Forward(params, x, batch));
  double loss_sum = 0.0;
  int64_t correct = 0;
  RETURN_IF_ERROR(backend_->SoftmaxCrossEntropy(batch, config_.num_classes, outputs_.back().get(), labels,
                                                0.0f, nullptr, &loss_sum, &correct));
  AddStats(loss_sum, correct, batch, stats);
  return absl::OkStatus();
}

}  // namespace kernels
}  // namespace fulcrum
