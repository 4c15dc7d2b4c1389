#include "kernels/ctr_model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/finite.h"
#include "common/status_macros.h"
#include "kernels/cpu/activation.h"
#include "kernels/model_util.h"

namespace fulcrum {
namespace kernels {
namespace {

int TensorIndex(const std::vector<TensorInfo>& tensors, const std::string& name) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

int TableIndex(const std::vector<CtrTableInfo>& tables, const std::string& name) {
  for (size_t i = 0; i < tables.size(); ++i) {
    if (tables[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// A pointer list of a CtrModel call.
absl::Status CheckCtrPointers(const char* what, size_t expected, size_t actual, bool any_null) {
  return kernels::CheckPointers("CtrModel", "CtrDenseTensors and CtrTables", what, expected, actual,
                                any_null);
}

absl::Status CheckNotNull(const char* name, const void* ptr) {
  if (ptr != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("CtrModel: batch.", name, " is null"));
}

// c[m, n] = op(a) * op(b), row-major with natural leading dimensions: a is
// stored [m, k] (or [k, m] when trans_a), b [k, n] (or [n, k] when trans_b).
void Gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n,
              k, 1.0f, a, trans_a ? m : k, b, trans_b ? k : n, 0.0f, c, n);
}

// x[e, :] += scale * y[:] for a row of `dim` floats.
void Axpy(int dim, float scale, const float* y, float* x) {
  for (int d = 0; d < dim; ++d) x[d] += scale * y[d];
}

}  // namespace

CtrModel::CtrModel(CtrModelConfig config)
    : config_(std::move(config)), config_status_(ValidateCtrModelConfig(config_)) {
  if (!config_status_.ok()) return;  // every call fails; the sizes below may overflow
  dense_tensors_ = CtrDenseTensors(config_);
  tables_ = CtrTables(config_);
  dense_weight_tensor_ = TensorIndex(dense_tensors_, "dense.weight");
  deep_tensor_ = TensorIndex(dense_tensors_, "deep0.weight");
  linear_table_ = TableIndex(tables_, "linear");
  embedding_table_ = TableIndex(tables_, "embedding");
  bottom_tensor_ = TensorIndex(dense_tensors_, "bottom0.weight");
  for (int64_t dim : CtrDeepDims(config_)) deep_dims_.push_back(static_cast<int>(dim));
  for (int64_t dim : CtrBottomDims(config_)) bottom_dims_.push_back(static_cast<int>(dim));
  bag_width_ = config_.num_fields * config_.embedding_dim;
  input_width_ = bag_width_ + (deep_dims_.empty() || config_.dot_interaction ? 0 : config_.num_dense);
  outputs_.resize(deep_dims_.empty() ? 0 : deep_dims_.size() - 1);
  bottom_out_.resize(bottom_dims_.empty() ? 0 : bottom_dims_.size() - 1);
  num_vectors_ = config_.dot_interaction ? config_.num_fields + (bottom_dims_.empty() ? 0 : 1) : 0;
}

const float* CtrModel::DeepWeight(const CtrParams& params, int layer) const {
  return params.dense[deep_tensor_ + 2 * layer];
}

const float* CtrModel::DeepBias(const CtrParams& params, int layer) const {
  return params.dense[deep_tensor_ + 2 * layer + 1];
}

Activation CtrModel::DeepActivation(int layer) const {
  return layer + 1 < num_deep_layers() ? config_.activation : Activation::kNone;
}

// ---------------------------------------------------------------------------
// Validation.

absl::Status CtrModel::ValidateInputs(const CtrBatch& batch, const CtrParams& params,
                                      bool need_labels) const {
  RETURN_IF_ERROR(config_status_);
  if (batch.batch <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("CtrModel: batch.batch = ", batch.batch, " must be > 0"));
  }
  if (batch.unique_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CtrModel: batch.unique_rows = ", batch.unique_rows, " must be >= 0"));
  }
  if (need_labels) RETURN_IF_ERROR(CheckNotNull("labels", batch.labels));
  if (config_.num_dense > 0) RETURN_IF_ERROR(CheckNotNull("dense", batch.dense));
  if (config_.num_fields > 0) RETURN_IF_ERROR(CheckNotNull("offsets", batch.offsets));
  RETURN_IF_ERROR(
      CheckCtrPointers("params.dense", dense_tensors_.size(), params.dense.size(), AnyNull(params.dense)));
  RETURN_IF_ERROR(CheckCtrPointers("params.tables", tables_.size(), params.tables.size(),
                                   batch.unique_rows > 0 && AnyNull(params.tables)));
  RETURN_IF_ERROR(ValidateIds(batch));
  RETURN_IF_ERROR(ValidateValues(batch, need_labels));
  return ValidateParamValues(batch, params);
}

// Offsets first, so that a bad offset is the error reported even when an id
// is bad too.
absl::Status CtrModel::ValidateIds(const CtrBatch& batch) const {
  if (config_.num_fields == 0) return absl::OkStatus();
  const int64_t bags = int64_t{batch.batch} * config_.num_fields;
  if (batch.offsets[0] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CtrModel: batch.offsets[0] = ", batch.offsets[0], " must be 0"));
  }
  for (int64_t b = 0; b < bags; ++b) {
    if (batch.offsets[b + 1] < batch.offsets[b]) {
      return absl::InvalidArgumentError(
          absl::StrCat("CtrModel: batch.offsets[", b + 1, "] = ", batch.offsets[b + 1], " < offsets[", b,
                       "] = ", batch.offsets[b], "; offsets must be non-decreasing"));
    }
  }
  const int64_t num_ids = batch.offsets[bags];
  if (num_ids > 0) RETURN_IF_ERROR(CheckNotNull("rows", batch.rows));
  for (int64_t j = 0; j < num_ids; ++j) {
    if (batch.rows[j] < 0 || batch.rows[j] >= batch.unique_rows) {
      return absl::InvalidArgumentError(absl::StrCat("CtrModel: batch.rows[", j, "] = ", batch.rows[j],
                                                     " is outside [0, unique_rows = ", batch.unique_rows,
                                                     ")"));
    }
    if (batch.weights != nullptr && !(batch.weights[j] >= 0.0f && std::isfinite(batch.weights[j]))) {
      return absl::InvalidArgumentError(
          absl::StrCat("CtrModel: batch.weights[", j, "] = ", batch.weights[j], " must be finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::Status CtrModel::ValidateValues(const CtrBatch& batch, bool need_labels) const {
  for (int32_t e = 0; need_labels && e < batch.batch; ++e) {
    if (batch.labels[e] != 0.0f && batch.labels[e] != 1.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("CtrModel: batch.labels[", e, "] = ", batch.labels[e], " must be 0 or 1"));
    }
  }
  const int64_t bad = FirstNonFinite(batch.dense, int64_t{batch.batch} * config_.num_dense);
  if (bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CtrModel: batch.dense[", bad, "] (example ", bad / config_.num_dense, ", feature ",
                     bad % config_.num_dense, ") = ", batch.dense[bad], " is not finite"));
  }
  return absl::OkStatus();
}

absl::Status CtrModel::ValidateParamValues(const CtrBatch& batch, const CtrParams& params) const {
  for (size_t t = 0; t < dense_tensors_.size(); ++t) {
    const int64_t bad = FirstNonFinite(params.dense[t], dense_tensors_[t].size);
    if (bad < 0) continue;
    return absl::InvalidArgumentError(absl::StrCat("CtrModel: params.dense[", t, "] (\"",
                                                   dense_tensors_[t].name, "\") element ", bad, " = ",
                                                   params.dense[t][bad], " is not finite"));
  }
  for (size_t t = 0; t < tables_.size(); ++t) {
    const int64_t bad = FirstNonFinite(params.tables[t], int64_t{batch.unique_rows} * tables_[t].dim);
    if (bad < 0) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "CtrModel: params.tables[", t, "] (\"", tables_[t].name, "\") row ", bad / tables_[t].dim,
        " element ", bad % tables_[t].dim, " = ", params.tables[t][bad], " is not finite"));
  }
  return absl::OkStatus();
}

absl::Status CtrModel::ValidateGrads(const CtrBatch& batch, const CtrGrads& grads) const {
  RETURN_IF_ERROR(
      CheckCtrPointers("grads.dense", dense_tensors_.size(), grads.dense.size(), AnyNull(grads.dense)));
  return CheckCtrPointers("grads.tables", tables_.size(), grads.tables.size(),
                          batch.unique_rows > 0 && AnyNull(grads.tables));
}

// ---------------------------------------------------------------------------
// Forward.

void CtrModel::EnsureScratch(int32_t batch, int64_t num_ids) {
  const size_t b = static_cast<size_t>(batch);
  Grow(id_scale_, static_cast<size_t>(num_ids));
  Grow(input_, b * input_width_);
  Grow(fm_sum_, config_.fm ? b * config_.embedding_dim : 0);
  Grow(logits_, b);
  Grow(dlogits_, b);
  Grow(dinput_, b * bag_width_);
  for (int i = 0; i < num_deep_layers(); ++i) Grow(outputs_[i], b * deep_dims_[i + 1]);
  if (num_deep_layers() > 0) {
    const size_t widest = *std::max_element(config_.hidden.begin(), config_.hidden.end());
    Grow(delta_, b * widest);
    Grow(next_delta_, b * widest);
  }
  if (config_.dot_interaction) {
    Grow(inter_, b * deep_dims_[0]);
    Grow(dinter_, b * deep_dims_[0]);
  }
  if (!bottom_dims_.empty()) {
    for (size_t i = 0; i < bottom_out_.size(); ++i) Grow(bottom_out_[i], b * bottom_dims_[i + 1]);
    Grow(dx0_, b * config_.embedding_dim);
    const size_t widest = *std::max_element(bottom_dims_.begin() + 1, bottom_dims_.end());
    Grow(bottom_delta_, b * widest);
    Grow(bottom_next_, b * widest);
  }
}

void CtrModel::ComputeIdScales(const CtrBatch& batch) {
  const int64_t bags = int64_t{batch.batch} * config_.num_fields;
  for (int64_t b = 0; b < bags; ++b) {
    const int64_t begin = batch.offsets[b], end = batch.offsets[b + 1];
    double total = 0;
    for (int64_t j = begin; j < end; ++j) {
      id_scale_[j] = batch.weights == nullptr ? 1.0f : batch.weights[j];
      total += id_scale_[j];
    }
    if (config_.combiner != BagCombiner::kMean) continue;
    const float inverse = total > 0 ? static_cast<float>(1.0 / total) : 0.0f;
    for (int64_t j = begin; j < end; ++j) id_scale_[j] *= inverse;
  }
}

// logits_ = bias (+ the linear terms).
void CtrModel::LinearForward(const CtrBatch& batch, const CtrParams& params) {
  const float bias = params.dense[0][0];
  const int dense = config_.num_dense, fields = config_.num_fields;
  const float* dense_weight = dense_weight_tensor_ >= 0 ? params.dense[dense_weight_tensor_] : nullptr;
  const float* linear = linear_table_ >= 0 ? params.tables[linear_table_] : nullptr;
  for (int32_t e = 0; e < batch.batch; ++e) {
    float z = bias;
    if (dense_weight != nullptr) {
      for (int d = 0; d < dense; ++d) z += dense_weight[d] * batch.dense[int64_t{e} * dense + d];
    }
    if (linear != nullptr) {
      const int64_t first = int64_t{e} * fields;
      for (int64_t j = batch.offsets[first]; j < batch.offsets[first + fields]; ++j) {
        z += id_scale_[j] * linear[batch.rows[j]];
      }
    }
    logits_[e] = z;
  }
}

// input_[e, :bag_width_] = the field bags of example e.
void CtrModel::EmbedBags(const CtrBatch& batch, const CtrParams& params) {
  const int k = config_.embedding_dim, fields = config_.num_fields;
  const float* table = params.tables[embedding_table_];
  for (int32_t e = 0; e < batch.batch; ++e) {
    float* row = input_.data() + static_cast<size_t>(e) * input_width_;
    std::fill(row, row + bag_width_, 0.0f);
    for (int f = 0; f < fields; ++f) {
      const int64_t bag = int64_t{e} * fields + f;
      for (int64_t j = batch.offsets[bag]; j < batch.offsets[bag + 1]; ++j) {
        Axpy(k, id_scale_[j], table + static_cast<int64_t>(batch.rows[j]) * k, row + f * k);
      }
    }
  }
}

// input_[e, bag_width_:] = the dense features of example e (deep part only).
void CtrModel::CopyDense(const CtrBatch& batch) {
  const int dense = config_.num_dense;
  for (int32_t e = 0; e < batch.batch; ++e) {
    std::copy_n(batch.dense + int64_t{e} * dense, dense,
                input_.data() + static_cast<size_t>(e) * input_width_ + bag_width_);
  }
}

void CtrModel::FmForward(int32_t batch) {
  const int k = config_.embedding_dim, fields = config_.num_fields;
  for (int32_t e = 0; e < batch; ++e) {
    const float* v = input_.data() + static_cast<size_t>(e) * input_width_;
    float* sum = fm_sum_.data() + static_cast<size_t>(e) * k;
    std::fill(sum, sum + k, 0.0f);
    float squares = 0.0f;
    for (int f = 0; f < fields; ++f) {
      for (int d = 0; d < k; ++d) {
        sum[d] += v[f * k + d];
        squares += v[f * k + d] * v[f * k + d];
      }
    }
    float sum_squared = 0.0f;
    for (int d = 0; d < k; ++d) sum_squared += sum[d] * sum[d];
    logits_[e] += 0.5f * (sum_squared - squares);
  }
}

// bottom_out_: the bottom MLP over the dense features; its last is x0.
void CtrModel::BottomForward(const CtrBatch& batch, const CtrParams& params) {
  const float* input = batch.dense;
  for (size_t i = 0; i < bottom_out_.size(); ++i) {
    const int in = bottom_dims_[i], out = bottom_dims_[i + 1];
    float* output = bottom_out_[i].data();
    Gemm(false, false, batch.batch, out, in, input, params.dense[bottom_tensor_ + 2 * i], output);
    const float* bias = params.dense[bottom_tensor_ + 2 * i + 1];
    for (int32_t e = 0; e < batch.batch; ++e) {
      float* row = output + static_cast<size_t>(e) * out;
      for (int c = 0; c < out; ++c) row[c] = Activate(config_.activation, row[c] + bias[c]);
    }
    input = output;
  }
}

const float* CtrModel::InteractionVector(int32_t e, int v) const {
  const int k = config_.embedding_dim;
  if (!bottom_dims_.empty()) {
    if (v == 0) return bottom_out_.back().data() + static_cast<size_t>(e) * k;
    --v;
  }
  return input_.data() + static_cast<size_t>(e) * input_width_ + static_cast<size_t>(v) * k;
}

float* CtrModel::InteractionGrad(int32_t e, int v) {
  const int k = config_.embedding_dim;
  if (!bottom_dims_.empty()) {
    if (v == 0) return dx0_.data() + static_cast<size_t>(e) * k;
    --v;
  }
  return dinput_.data() + static_cast<size_t>(e) * bag_width_ + static_cast<size_t>(v) * k;
}

// inter_[e] = x0 (when there is one), then x_i . x_j for i < j, row by row.
void CtrModel::InteractionForward(int32_t batch) {
  const int k = config_.embedding_dim, width = deep_dims_[0];
  // An example's vectors are looked up once, not once a pair.
  std::vector<const float*> vectors(static_cast<size_t>(num_vectors_));
  for (int32_t e = 0; e < batch; ++e) {
    for (int v = 0; v < num_vectors_; ++v) vectors[static_cast<size_t>(v)] = InteractionVector(e, v);
    float* out = inter_.data() + static_cast<size_t>(e) * width;
    int p = 0;
    if (!bottom_dims_.empty()) {
      std::copy_n(vectors[0], k, out);
      p = k;
    }
    for (int i = 0; i < num_vectors_; ++i) {
      const float* a = vectors[static_cast<size_t>(i)];
      for (int j = i + 1; j < num_vectors_; ++j) {
        const float* b = vectors[static_cast<size_t>(j)];
        float dot = 0.0f;
        for (int d = 0; d < k; ++d) dot += a[d] * b[d];
        out[p++] = dot;
      }
    }
  }
}

void CtrModel::DeepForward(int32_t batch, const CtrParams& params) {
  const float* input = DeepInput();
  for (int i = 0; i < num_deep_layers(); ++i) {
    const int in = deep_dims_[i], out = deep_dims_[i + 1];
    float* output = outputs_[i].data();
    Gemm(false, false, batch, out, in, input, DeepWeight(params, i), output);
    const float* bias = DeepBias(params, i);
    const Activation act = DeepActivation(i);
    for (int32_t e = 0; e < batch; ++e) {
      float* row = output + static_cast<size_t>(e) * out;
      for (int c = 0; c < out; ++c) row[c] = Activate(act, row[c] + bias[c]);
    }
    input = output;
  }
  for (int32_t e = 0; e < batch; ++e) logits_[e] += outputs_.back()[e];
}

double CtrModel::Loss(const CtrBatch& batch) {
  double loss_sum = 0;
  const float inverse_batch = 1.0f / static_cast<float>(batch.batch);
  for (int32_t e = 0; e < batch.batch; ++e) {
    const float z = logits_[e], y = batch.labels[e];
    loss_sum += std::max(z, 0.0f) - z * y + std::log1p(std::exp(-std::fabs(z)));
    dlogits_[e] = (Sigmoid(z) - y) * inverse_batch;
  }
  return loss_sum;
}

void CtrModel::RunForward(const CtrBatch& batch, const CtrParams& params) {
  const int64_t num_ids =
      config_.num_fields > 0 ? batch.offsets[int64_t{batch.batch} * config_.num_fields] : 0;
  EnsureScratch(batch.batch, num_ids);
  ComputeIdScales(batch);
  LinearForward(batch, params);
  if (embedding_table_ >= 0) EmbedBags(batch, params);
  if (input_width_ > bag_width_) CopyDense(batch);
  if (config_.fm) FmForward(batch.batch);
  if (!bottom_dims_.empty()) BottomForward(batch, params);
  if (config_.dot_interaction) InteractionForward(batch.batch);
  if (num_deep_layers() > 0) DeepForward(batch.batch, params);
}

// ---------------------------------------------------------------------------
// Backward.

void CtrModel::LinearBackward(const CtrBatch& batch, const CtrGrads& grads) {
  float bias = 0.0f;
  for (int32_t e = 0; e < batch.batch; ++e) bias += dlogits_[e];
  grads.dense[0][0] = bias;
  if (dense_weight_tensor_ >= 0) {
    float* dense_weight = grads.dense[dense_weight_tensor_];
    const int dense = config_.num_dense;
    std::fill(dense_weight, dense_weight + dense, 0.0f);
    for (int32_t e = 0; e < batch.batch; ++e)
      Axpy(dense, dlogits_[e], batch.dense + int64_t{e} * dense, dense_weight);
  }
  if (linear_table_ < 0) return;
  float* linear = grads.tables[linear_table_];
  std::fill(linear, linear + batch.unique_rows, 0.0f);
  const int fields = config_.num_fields;
  for (int32_t e = 0; e < batch.batch; ++e) {
    const int64_t first = int64_t{e} * fields;
    for (int64_t j = batch.offsets[first]; j < batch.offsets[first + fields]; ++j) {
      linear[batch.rows[j]] += dlogits_[e] * id_scale_[j];
    }
  }
}

// Writes the deep tensors' gradients and dinput_ (the field bags' part of the
// input gradient), or with the dot interaction dinter_ (all of it).
void CtrModel::DeepBackward(int32_t batch, const CtrParams& params, const CtrGrads& grads) {
  const float* delta = dlogits_.data();
  for (int i = num_deep_layers() - 1; i >= 0; --i) {
    const int in = deep_dims_[i], out = deep_dims_[i + 1];
    const float* input = i == 0 ? DeepInput() : outputs_[i - 1].data();
    Gemm(true, false, in, out, batch, input, delta, grads.dense[deep_tensor_ + 2 * i]);
    float* bias = grads.dense[deep_tensor_ + 2 * i + 1];
    std::fill(bias, bias + out, 0.0f);
    for (int32_t e = 0; e < batch; ++e) Axpy(out, 1.0f, delta + static_cast<size_t>(e) * out, bias);
    if (i == 0) break;
    Gemm(false, true, batch, in, out, delta, DeepWeight(params, i), next_delta_.data());
    const Activation act = DeepActivation(i - 1);
    for (size_t n = 0; n < static_cast<size_t>(batch) * in; ++n)
      next_delta_[n] *= ActivationGrad(act, input[n]);
    std::swap(delta_, next_delta_);
    delta = delta_.data();
  }
  if (config_.dot_interaction) {
    Gemm(false, true, batch, deep_dims_[0], deep_dims_[1], delta, DeepWeight(params, 0), dinter_.data());
    return;
  }
  // The first bag_width_ rows of deep0.weight map the field bags.
  if (bag_width_ > 0)
    Gemm(false, true, batch, bag_width_, deep_dims_[1], delta, DeepWeight(params, 0), dinput_.data());
}

// dinput_ (and dx0_) from dinter_: d(x_i . x_j) / d x_i = x_j.
void CtrModel::InteractionBackward(int32_t batch) {
  const int k = config_.embedding_dim, width = deep_dims_[0];
  std::fill(dinput_.begin(), dinput_.begin() + static_cast<size_t>(batch) * bag_width_, 0.0f);
  std::vector<const float*> vectors(static_cast<size_t>(num_vectors_));
  std::vector<float*> grads(static_cast<size_t>(num_vectors_));
  for (int32_t e = 0; e < batch; ++e) {
    for (int v = 0; v < num_vectors_; ++v) {
      vectors[static_cast<size_t>(v)] = InteractionVector(e, v);
      grads[static_cast<size_t>(v)] = InteractionGrad(e, v);
    }
    const float* g = dinter_.data() + static_cast<size_t>(e) * width;
    int p = 0;
    if (!bottom_dims_.empty()) {
      std::copy_n(g, k, grads[0]);
      p = k;
    }
    for (int i = 0; i < num_vectors_; ++i) {
      for (int j = i + 1; j < num_vectors_; ++j) {
        const float gij = g[p++];
        Axpy(k, gij, vectors[static_cast<size_t>(j)], grads[static_cast<size_t>(i)]);
        Axpy(k, gij, vectors[static_cast<size_t>(i)], grads[static_cast<size_t>(j)]);
      }
    }
  }
}

// The bottom tensors' gradients from dx0_.
void CtrModel::BottomBackward(const CtrBatch& batch, const CtrParams& params, const CtrGrads& grads) {
  const int32_t b = batch.batch;
  const Activation act = config_.activation;
  const float* x0 = bottom_out_.back().data();
  for (size_t n = 0; n < static_cast<size_t>(b) * config_.embedding_dim; ++n)
    bottom_delta_[n] = dx0_[n] * ActivationGrad(act, x0[n]);
  const float* delta = bottom_delta_.data();
  for (int i = static_cast<int>(bottom_out_.size()) - 1; i >= 0; --i) {
    const int in = bottom_dims_[i], out = bottom_dims_[i + 1];
    const float* input = i == 0 ? batch.dense : bottom_out_[i - 1].data();
    Gemm(true, false, in, out, b, input, delta, grads.dense[bottom_tensor_ + 2 * i]);
    float* bias = grads.dense[bottom_tensor_ + 2 * i + 1];
    std::fill(bias, bias + out, 0.0f);
    for (int32_t e = 0; e < b; ++e) Axpy(out, 1.0f, delta + static_cast<size_t>(e) * out, bias);
    if (i == 0) break;
    Gemm(false, true, b, in, out, delta, params.dense[bottom_tensor_ + 2 * i], bottom_next_.data());
    for (size_t n = 0; n < static_cast<size_t>(b) * in; ++n) bottom_next_[n] *= ActivationGrad(act, input[n]);
    std::swap(bottom_delta_, bottom_next_);
    delta = bottom_delta_.data();
  }
}

// dinput_ += d(fm)/d(v_f) = dlogit * (sum_f' v_f' - v_f).
void CtrModel::FmBackward(int32_t batch) {
  const int k = config_.embedding_dim, fields = config_.num_fields;
  for (int32_t e = 0; e < batch; ++e) {
    const float* v = input_.data() + static_cast<size_t>(e) * input_width_;
    const float* sum = fm_sum_.data() + static_cast<size_t>(e) * k;
    float* dv = dinput_.data() + static_cast<size_t>(e) * bag_width_;
    for (int f = 0; f < fields; ++f) {
      for (int d = 0; d < k; ++d) dv[f * k + d] += dlogits_[e] * (sum[d] - v[f * k + d]);
    }
  }
}

// Scatters dinput_ to the embedding rows of each bag's ids.
void CtrModel::EmbeddingBackward(const CtrBatch& batch, const CtrGrads& grads) {
  const int k = config_.embedding_dim;
  float* table = grads.tables[embedding_table_];
  std::fill(table, table + int64_t{batch.unique_rows} * k, 0.0f);
  const int64_t bags = int64_t{batch.batch} * config_.num_fields;
  for (int64_t b = 0; b < bags; ++b) {
    const float* dv = dinput_.data() + b * k;  // bag b = (e, f) sits at e * bag_width_ + f * k
    for (int64_t j = batch.offsets[b]; j < batch.offsets[b + 1]; ++j) {
      Axpy(k, id_scale_[j], dv, table + static_cast<int64_t>(batch.rows[j]) * k);
    }
  }
}

void CtrModel::RunBackward(const CtrBatch& batch, const CtrParams& params, const CtrGrads& grads) {
  LinearBackward(batch, grads);
  if (bag_width_ > 0 && num_deep_layers() == 0) {
    std::fill(dinput_.begin(), dinput_.begin() + static_cast<size_t>(batch.batch) * bag_width_, 0.0f);
  }
  if (num_deep_layers() > 0) DeepBackward(batch.batch, params, grads);
  if (config_.dot_interaction) InteractionBackward(batch.batch);
  if (!bottom_dims_.empty()) BottomBackward(batch, params, grads);
  if (config_.fm) FmBackward(batch.batch);
  if (embedding_table_ >= 0) EmbeddingBackward(batch, grads);
}

void CtrModel::Report(const CtrBatch& batch, double loss_sum, CtrStats* stats, float* logits) const {
  if (logits != nullptr) std::copy_n(logits_.data(), batch.batch, logits);
  if (stats == nullptr) return;
  stats->loss_sum += loss_sum;
  stats->count += batch.batch;
}

absl::Status CtrModel::ForwardBackward(const CtrBatch& batch, const CtrParams& params, const CtrGrads& grads,
                                       CtrStats* stats, float* logits) {
  RETURN_IF_ERROR(ValidateInputs(batch, params, /*need_labels=*/true));
  RETURN_IF_ERROR(ValidateGrads(batch, grads));
  RunForward(batch, params);
  const double loss_sum = Loss(batch);
  RunBackward(batch, params, grads);
  Report(batch, loss_sum, stats, logits);
  return absl::OkStatus();
}

absl::Status CtrModel::Forward(const CtrBatch& batch, const CtrParams& params, CtrStats* stats,
                               float* logits) {
  RETURN_IF_ERROR(ValidateInputs(batch, params, /*need_labels=*/stats != nullptr));
  RunForward(batch, params);
  const double loss_sum = stats != nullptr ? Loss(batch) : 0.0;
  Report(batch, loss_sum, stats, logits);
  return absl::OkStatus();
}

}  // namespace kernels
}  // namespace fulcrum
