#include "kernels/graph_model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/finite.h"
#include "common/status_macros.h"
#include "kernels/cpu/activation.h"
#include "kernels/graph_bags.h"
#include "kernels/model_util.h"

namespace fulcrum {
namespace kernels {
namespace {

absl::Status Bad(const std::string& message) { return absl::InvalidArgumentError(absl::StrCat("GraphModel: ", message)); }

// A pointer list of a GraphModel call.
absl::Status CheckGraphPointers(const char* what, size_t expected, size_t actual, bool any_null) {
  return kernels::CheckPointers("GraphModel", "GraphDenseTensors and GraphTables", what, expected, actual,
                                any_null);
}

// c[m, n] = op(a) * op(b) + beta * c, row-major (see ctr_model.cc).
void Gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, const float* b, float beta, float* c) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
              1.0f, a, trans_a ? m : k, b, trans_b ? k : n, beta, c, n);
}

void Axpy(int64_t n, float scale, const float* y, float* x) {
  for (int64_t d = 0; d < n; ++d) x[d] += scale * y[d];
}

}  // namespace

GraphModel::GraphModel(GraphConfig config, Backend* backend)
    : config_(std::move(config)), config_status_(ValidateGraphConfig(config_)) {
  if (!config_status_.ok()) return;  // every call fails
  if (backend != nullptr) on_backend_ = MakeOnBackend(backend);
  dense_tensors_ = GraphDenseTensors(config_);
  tables_ = GraphTables(config_);
  loss_ = GraphLossOf(config_);
  for (const std::vector<int32_t>& fields : GraphTableFields(config_)) {
    std::vector<bool>& reads = table_reads_.emplace_back(static_cast<size_t>(config_.num_fields), false);
    for (int32_t f : fields) reads[static_cast<size_t>(f)] = true;
  }
  const std::vector<GraphShape> shapes = GraphShapes(config_);
  std::map<std::string, int> index, table_index, tensor_index;
  for (size_t t = 0; t < tables_.size(); ++t) table_index[tables_[t].name] = static_cast<int>(t);
  for (size_t t = 0; t < dense_tensors_.size(); ++t) tensor_index[dense_tensors_[t].name] = static_cast<int>(t);
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    const GraphLayer& layer = config_.layers[i];
    Node node;
    node.type = layer.type;
    node.vectors = static_cast<int>(shapes[i].vectors);
    node.dim = static_cast<int>(shapes[i].dim);
    for (const std::string& name : layer.inputs) node.inputs.push_back(index[name]);
    if (layer.type == LayerType::kLinear) node.tensor = tensor_index[layer.name + ".weight"];
    if (layer.type == LayerType::kAdd && layer.bias) node.tensor = tensor_index[layer.name + ".bias"];
    if (layer.type == LayerType::kEmbedding) node.table = table_index[layer.table];
    node.trainable_upstream = node.tensor >= 0 || node.table >= 0;
    for (int in : node.inputs) node.trainable_upstream = node.trainable_upstream || nodes_[in].trainable_upstream;
    nodes_.push_back(std::move(node));
    index[layer.name] = static_cast<int>(i);
  }
  out_.resize(nodes_.size());
  grad_.resize(nodes_.size());
}

// ---------------------------------------------------------------------------
// Validation: every check runs before anything is written.

absl::Status GraphModel::ValidateInputs(const GraphBatch& batch, const CtrParams& params, bool need_labels) const {
  RETURN_IF_ERROR(config_status_);
  if (batch.batch <= 0) return Bad(absl::StrCat("batch.batch = ", batch.batch, " must be > 0"));
  if (need_labels && batch.labels == nullptr) return Bad("batch.labels is null");
  if (config_.num_dense > 0 && batch.dense == nullptr) return Bad("batch.dense is null");
  if (config_.num_fields > 0 && batch.offsets == nullptr) return Bad("batch.offsets is null");
  if (batch.rows.size() != tables_.size() || batch.unique_rows.size() != tables_.size()) {
    return Bad(absl::StrCat("batch has rows for ", batch.rows.size(), " and unique_rows for ", batch.unique_rows.size(),
                            " tables, the model has ", tables_.size()));
  }
  RETURN_IF_ERROR(
      CheckGraphPointers("params.dense", dense_tensors_.size(), params.dense.size(), AnyNull(params.dense)));
  RETURN_IF_ERROR(CheckGraphPointers("params.tables", tables_.size(), params.tables.size(), false));
  const int64_t bags = int64_t{batch.batch} * config_.num_fields;
  int64_t num_ids = 0;
  if (config_.num_fields > 0) {
    if (batch.offsets[0] != 0) return Bad(absl::StrCat("batch.offsets[0] = ", batch.offsets[0], " must be 0"));
    for (int64_t b = 0; b < bags; ++b) {
      if (batch.offsets[b + 1] < batch.offsets[b]) {
        return Bad(absl::StrCat("batch.offsets[", b + 1, "] = ", batch.offsets[b + 1], " < offsets[", b,
                                "]; offsets must be non-decreasing"));
      }
    }
    num_ids = batch.offsets[bags];
  }
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (batch.unique_rows[t] < 0) return Bad(absl::StrCat("batch.unique_rows[", t, "] < 0"));
    if (batch.unique_rows[t] > 0 && params.tables[t] == nullptr) return Bad("a params.tables pointer is null");
    if (num_ids > 0 && batch.rows[t] == nullptr) return Bad(absl::StrCat("batch.rows[", t, "] is null"));
    for (int64_t b = 0; b < bags; ++b) {
      const bool read = table_reads_[t][static_cast<size_t>(b % config_.num_fields)];
      for (int64_t j = batch.offsets[b]; j < batch.offsets[b + 1]; ++j) {
        const int32_t row = batch.rows[t][j];
        if (read ? (row < 0 || row >= batch.unique_rows[t]) : row != -1) {
          return Bad(absl::StrCat("batch.rows[", t, "][", j, "] = ", row, " for field ", b % config_.num_fields,
                                  read ? absl::StrCat(" is outside [0, ", batch.unique_rows[t], ")")
                                       : std::string(", which table \"" + tables_[t].name + "\" does not read, must be -1")));
        }
      }
    }
    const int64_t bad = FirstNonFinite(params.tables[t], int64_t{batch.unique_rows[t]} * tables_[t].dim);
    if (bad >= 0) {
      return Bad(absl::StrCat("params.tables[", t, "] (\"", tables_[t].name, "\") row ", bad / tables_[t].dim,
                              " element ", bad % tables_[t].dim, " is not finite"));
    }
  }
  for (int64_t j = 0; batch.weights != nullptr && j < num_ids; ++j) {
    if (!(batch.weights[j] >= 0.0f && std::isfinite(batch.weights[j]))) {
      return Bad(absl::StrCat("batch.weights[", j, "] = ", batch.weights[j], " must be finite and >= 0"));
    }
  }
  const int64_t bad_dense = FirstNonFinite(batch.dense, int64_t{batch.batch} * config_.num_dense);
  if (bad_dense >= 0) {
    return Bad(absl::StrCat("batch.dense[", bad_dense, "] (example ", bad_dense / config_.num_dense, ", feature ",
                            bad_dense % config_.num_dense, ") is not finite"));
  }
  for (size_t t = 0; t < dense_tensors_.size(); ++t) {
    const int64_t bad = FirstNonFinite(params.dense[t], dense_tensors_[t].size);
    if (bad >= 0) {
      return Bad(absl::StrCat("params.dense[", t, "] (\"", dense_tensors_[t].name, "\") element ", bad,
                              " is not finite"));
    }
  }
  return need_labels ? ValidateLabels(batch) : absl::OkStatus();
}

absl::Status GraphModel::ValidateLabels(const GraphBatch& batch) const {
  const int32_t classes = nodes_.back().dim * nodes_.back().vectors;
  for (int32_t e = 0; e < batch.batch; ++e) {
    const float y = batch.labels[e];
    switch (loss_) {
      case LossKind::kSigmoidCrossEntropy:
        if (y != 0.0f && y != 1.0f) return Bad(absl::StrCat("batch.labels[", e, "] = ", y, " must be 0 or 1"));
        break;
      case LossKind::kSoftmaxCrossEntropy:
        if (!(y >= 0.0f && y < static_cast<float>(classes) && y == std::floor(y))) {
          return Bad(absl::StrCat("batch.labels[", e, "] = ", y, " is not a class number in [0, ", classes, ")"));
        }
        break;
      case LossKind::kMeanSquaredError:
        if (!std::isfinite(y)) return Bad(absl::StrCat("batch.labels[", e, "] = ", y, " is not finite"));
        break;
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Forward.

void GraphModel::EnsureScratch(int32_t batch) {
  for (size_t n = 0; n < nodes_.size(); ++n) {
    const size_t size = static_cast<size_t>(batch) * static_cast<size_t>(nodes_[n].width());
    if (out_[n].size() < size) out_[n].resize(size);
    if (grad_[n].size() < size) grad_[n].resize(size);
  }
}

void GraphModel::ForwardNode(int n, const GraphBatch& batch, const CtrParams& params) {
  const Node& node = nodes_[static_cast<size_t>(n)];
  const GraphLayer& layer = config_.layers[static_cast<size_t>(n)];
  const int32_t b = batch.batch;
  const int width = node.width();
  float* out = out_[static_cast<size_t>(n)].data();
  auto in = [&](int k) { return out_[static_cast<size_t>(node.inputs[static_cast<size_t>(k)])].data(); };
  auto in_width = [&](int k) { return nodes_[static_cast<size_t>(node.inputs[static_cast<size_t>(k)])].width(); };
  switch (node.type) {
    case LayerType::kUnspecified:
      break;  // a valid config has none
    case LayerType::kDenseInput:
      std::copy_n(batch.dense, static_cast<size_t>(b) * width, out);
      break;
    case LayerType::kEmbedding: {
      const int dim = node.dim, fields = config_.num_fields;
      const float* table = params.tables[static_cast<size_t>(node.table)];
      const int32_t* rows = batch.rows[static_cast<size_t>(node.table)];
      std::fill(out, out + static_cast<size_t>(b) * width, 0.0f);
      ForEachBagId(batch, fields, layer.fields, node.vectors, dim, layer.combiner, rows,
                   [&](int64_t at, int32_t row, float scale) { Axpy(dim, scale, table + int64_t{row} * dim, out + at); });
      break;
    }
    case LayerType::kLinear: {
      const int in_w = in_width(0);
      Gemm(false, false, b, width, in_w, in(0), params.dense[static_cast<size_t>(node.tensor)], 0.0f, out);
      const float* bias = params.dense[static_cast<size_t>(node.tensor) + 1];
      for (int32_t e = 0; e < b; ++e) Axpy(width, 1.0f, bias, out + static_cast<size_t>(e) * width);
      break;
    }
    case LayerType::kActivation: {
      const float* x = in(0);
      for (size_t i = 0; i < static_cast<size_t>(b) * width; ++i) out[i] = Activate(layer.activation, x[i]);
      break;
    }
    case LayerType::kConcat:
      for (int32_t e = 0; e < b; ++e) {
        float* row = out + static_cast<size_t>(e) * width;
        for (size_t k = 0; k < node.inputs.size(); ++k) {
          const int w = in_width(static_cast<int>(k));
          row = std::copy_n(in(static_cast<int>(k)) + static_cast<size_t>(e) * w, w, row);
        }
      }
      break;
    case LayerType::kFm: {
      const Node& x = nodes_[static_cast<size_t>(node.inputs[0])];
      const int dim = x.dim;
      std::vector<float> sum(static_cast<size_t>(dim));
      for (int32_t e = 0; e < b; ++e) {
        const float* v = in(0) + static_cast<size_t>(e) * x.width();
        std::fill(sum.begin(), sum.end(), 0.0f);
        float squares = 0.0f;
        for (int i = 0; i < x.vectors; ++i) {
          for (int d = 0; d < dim; ++d) {
            sum[d] += v[i * dim + d];
            squares += v[i * dim + d] * v[i * dim + d];
          }
        }
        float sum_squared = 0.0f;
        for (int d = 0; d < dim; ++d) sum_squared += sum[d] * sum[d];
        out[e] = 0.5f * (sum_squared - squares);
      }
      break;
    }
    case LayerType::kDot: {
      const int dim = nodes_[static_cast<size_t>(node.inputs[0])].dim;
      std::vector<const float*> vec;
      for (int32_t e = 0; e < b; ++e) {
        vec.clear();
        for (size_t k = 0; k < node.inputs.size(); ++k) {
          const Node& x = nodes_[static_cast<size_t>(node.inputs[k])];
          const float* base = in(static_cast<int>(k)) + static_cast<size_t>(e) * x.width();
          for (int v = 0; v < x.vectors; ++v) vec.push_back(base + static_cast<size_t>(v) * dim);
        }
        float* row = out + static_cast<size_t>(e) * width;
        int p = 0;
        for (size_t i = 0; i < vec.size(); ++i) {
          for (size_t j = i + 1; j < vec.size(); ++j) {
            float dot = 0.0f;
            for (int d = 0; d < dim; ++d) dot += vec[i][d] * vec[j][d];
            row[p++] = dot;
          }
        }
      }
      break;
    }
    case LayerType::kAdd: {
      const size_t size = static_cast<size_t>(b) * width;
      std::copy_n(in(0), size, out);
      for (size_t k = 1; k < node.inputs.size(); ++k) Axpy(static_cast<int64_t>(size), 1.0f, in(static_cast<int>(k)), out);
      if (node.tensor >= 0) {
        const float* bias = params.dense[static_cast<size_t>(node.tensor)];
        for (int32_t e = 0; e < b; ++e) Axpy(width, 1.0f, bias, out + static_cast<size_t>(e) * width);
      }
      break;
    }
    case LayerType::kReduceSum: {
      const int w = in_width(0);
      for (int32_t e = 0; e < b; ++e) {
        const float* x = in(0) + static_cast<size_t>(e) * w;
        float s = 0.0f;
        for (int i = 0; i < w; ++i) s += x[i];
        out[e] = s;
      }
      break;
    }
    case LayerType::kLoss:
      std::copy_n(in(0), static_cast<size_t>(b) * width, out);
      break;
  }
}

void GraphModel::RunForward(const GraphBatch& batch, const CtrParams& params) {
  EnsureScratch(batch.batch);
  for (size_t n = 0; n < nodes_.size(); ++n) ForwardNode(static_cast<int>(n), batch, params);
}

double GraphModel::Loss(const GraphBatch& batch) {
  const size_t last = nodes_.size() - 1;
  const int width = nodes_[last].width();
  const float* z = out_[last].data();
  float* dz = grad_[last].data();
  const float inverse_batch = 1.0f / static_cast<float>(batch.batch);
  double loss_sum = 0;
  for (int32_t e = 0; e < batch.batch; ++e) {
    const float y = batch.labels[e];
    switch (loss_) {
      case LossKind::kSigmoidCrossEntropy:
        loss_sum += std::max(z[e], 0.0f) - z[e] * y + std::log1p(std::exp(-std::fabs(z[e])));
        dz[e] = (Sigmoid(z[e]) - y) * inverse_batch;
        break;
      case LossKind::kMeanSquaredError:
        loss_sum += (z[e] - y) * (z[e] - y);
        dz[e] = 2.0f * (z[e] - y) * inverse_batch;
        break;
      case LossKind::kSoftmaxCrossEntropy: {
        const float* row = z + static_cast<size_t>(e) * width;
        float* drow = dz + static_cast<size_t>(e) * width;
        const float top = *std::max_element(row, row + width);
        double total = 0;
        for (int c = 0; c < width; ++c) total += std::exp(static_cast<double>(row[c] - top));
        const int label = static_cast<int>(y);
        loss_sum += std::log(total) - static_cast<double>(row[label] - top);
        for (int c = 0; c < width; ++c) {
          const float p = static_cast<float>(std::exp(static_cast<double>(row[c] - top)) / total);
          drow[c] = (p - (c == label ? 1.0f : 0.0f)) * inverse_batch;
        }
        break;
      }
    }
  }
  return loss_sum;
}

// ---------------------------------------------------------------------------
// Backward: grad_[n] holds d(mean loss)/d(out_[n]) once every layer reading
// n has run; a layer adds into its inputs' gradients.

void GraphModel::BackwardNode(int n, const GraphBatch& batch, const CtrParams& params, const CtrGrads& grads) {
  const Node& node = nodes_[static_cast<size_t>(n)];
  const GraphLayer& layer = config_.layers[static_cast<size_t>(n)];
  const int32_t b = batch.batch;
  const int width = node.width();
  const float* g = grad_[static_cast<size_t>(n)].data();
  auto input = [&](size_t k) -> const Node& { return nodes_[static_cast<size_t>(node.inputs[k])]; };
  auto in = [&](size_t k) { return out_[static_cast<size_t>(node.inputs[k])].data(); };
  auto din = [&](size_t k) { return grad_[static_cast<size_t>(node.inputs[k])].data(); };
  auto wants = [&](size_t k) { return input(k).trainable_upstream; };
  switch (node.type) {
    case LayerType::kUnspecified:
    case LayerType::kDenseInput:
      break;
    case LayerType::kEmbedding: {
      const int dim = node.dim, fields = config_.num_fields;
      float* table = grads.tables[static_cast<size_t>(node.table)];
      const int32_t* rows = batch.rows[static_cast<size_t>(node.table)];
      ForEachBagId(batch, fields, layer.fields, node.vectors, dim, layer.combiner, rows,
                   [&](int64_t at, int32_t row, float scale) { Axpy(dim, scale, g + at, table + int64_t{row} * dim); });
      break;
    }
    case LayerType::kLinear: {
      const int in_w = input(0).width();
      float* dweight = grads.dense[static_cast<size_t>(node.tensor)];
      float* dbias = grads.dense[static_cast<size_t>(node.tensor) + 1];
      Gemm(true, false, in_w, width, b, in(0), g, 0.0f, dweight);
      std::fill(dbias, dbias + width, 0.0f);
      for (int32_t e = 0; e < b; ++e) Axpy(width, 1.0f, g + static_cast<size_t>(e) * width, dbias);
      if (wants(0)) {
        Gemm(false, true, b, in_w, width, g, params.dense[static_cast<size_t>(node.tensor)], 1.0f, din(0));
      }
      break;
    }
    case LayerType::kActivation: {
      if (!wants(0)) break;
      const float* y = out_[static_cast<size_t>(n)].data();
      float* dx = din(0);
      for (size_t i = 0; i < static_cast<size_t>(b) * width; ++i) dx[i] += g[i] * ActivationGrad(layer.activation, y[i]);
      break;
    }
    case LayerType::kConcat: {
      size_t offset = 0;
      for (size_t k = 0; k < node.inputs.size(); ++k) {
        const int w = input(k).width();
        if (wants(k)) {
          float* dx = din(k);
          for (int32_t e = 0; e < b; ++e) {
            Axpy(w, 1.0f, g + static_cast<size_t>(e) * width + offset, dx + static_cast<size_t>(e) * w);
          }
        }
        offset += static_cast<size_t>(w);
      }
      break;
    }
    case LayerType::kFm: {
      if (!wants(0)) break;
      const Node& x = input(0);
      const int dim = x.dim;
      std::vector<float> sum(static_cast<size_t>(dim));
      for (int32_t e = 0; e < b; ++e) {
        const float* v = in(0) + static_cast<size_t>(e) * x.width();
        float* dv = din(0) + static_cast<size_t>(e) * x.width();
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (int i = 0; i < x.vectors; ++i) Axpy(dim, 1.0f, v + static_cast<size_t>(i) * dim, sum.data());
        for (int i = 0; i < x.vectors; ++i) {
          for (int d = 0; d < dim; ++d) dv[i * dim + d] += g[e] * (sum[d] - v[i * dim + d]);
        }
      }
      break;
    }
    case LayerType::kDot: {
      const int dim = input(0).dim;
      std::vector<const float*> vec;
      std::vector<float*> dvec;  // null where the input wants no gradient
      for (int32_t e = 0; e < b; ++e) {
        vec.clear();
        dvec.clear();
        for (size_t k = 0; k < node.inputs.size(); ++k) {
          const Node& x = input(k);
          const size_t base = static_cast<size_t>(e) * x.width();
          for (int v = 0; v < x.vectors; ++v) {
            vec.push_back(in(k) + base + static_cast<size_t>(v) * dim);
            dvec.push_back(wants(k) ? din(k) + base + static_cast<size_t>(v) * dim : nullptr);
          }
        }
        const float* row = g + static_cast<size_t>(e) * width;
        int p = 0;
        for (size_t i = 0; i < vec.size(); ++i) {
          for (size_t j = i + 1; j < vec.size(); ++j) {
            const float gij = row[p++];
            if (dvec[i] != nullptr) Axpy(dim, gij, vec[j], dvec[i]);
            if (dvec[j] != nullptr) Axpy(dim, gij, vec[i], dvec[j]);
          }
        }
      }
      break;
    }
    case LayerType::kAdd: {
      const size_t size = static_cast<size_t>(b) * width;
      for (size_t k = 0; k < node.inputs.size(); ++k) {
        if (wants(k)) Axpy(static_cast<int64_t>(size), 1.0f, g, din(k));
      }
      if (node.tensor >= 0) {
        float* dbias = grads.dense[static_cast<size_t>(node.tensor)];
        std::fill(dbias, dbias + width, 0.0f);
        for (int32_t e = 0; e < b; ++e) Axpy(width, 1.0f, g + static_cast<size_t>(e) * width, dbias);
      }
      break;
    }
    case LayerType::kReduceSum: {
      if (!wants(0)) break;
      const int w = input(0).width();
      float* dx = din(0);
      for (int32_t e = 0; e < b; ++e) {
        for (int i = 0; i < w; ++i) dx[static_cast<size_t>(e) * w + i] += g[e];
      }
      break;
    }
    case LayerType::kLoss:
      if (wants(0)) Axpy(static_cast<int64_t>(b) * width, 1.0f, g, din(0));
      break;
  }
}

void GraphModel::RunBackward(const GraphBatch& batch, const CtrParams& params, const CtrGrads& grads) {
  const size_t last = nodes_.size() - 1;
  for (size_t n = 0; n < last; ++n) {
    std::fill_n(grad_[n].data(), static_cast<size_t>(batch.batch) * nodes_[n].width(), 0.0f);
  }
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (batch.unique_rows[t] > 0) std::fill_n(grads.tables[t], int64_t{batch.unique_rows[t]} * tables_[t].dim, 0.0f);
  }
  for (size_t n = nodes_.size(); n-- > 0;) BackwardNode(static_cast<int>(n), batch, params, grads);
}

void GraphModel::Report(const GraphBatch& batch, double loss_sum, CtrStats* stats, float* outputs) const {
  const size_t last = nodes_.size() - 1;
  if (outputs != nullptr) std::copy_n(out_[last].data(), static_cast<size_t>(batch.batch) * nodes_[last].width(), outputs);
  if (stats == nullptr) return;
  stats->loss_sum += loss_sum;
  stats->count += batch.batch;
}

absl::Status GraphModel::ForwardBackward(const GraphBatch& batch, const CtrParams& params, const CtrGrads& grads,
                                         CtrStats* stats, float* outputs) {
  RETURN_IF_ERROR(ValidateInputs(batch, params, /*need_labels=*/true));
  RETURN_IF_ERROR(
      CheckGraphPointers("grads.dense", dense_tensors_.size(), grads.dense.size(), AnyNull(grads.dense)));
  RETURN_IF_ERROR(CheckGraphPointers("grads.tables", tables_.size(), grads.tables.size(), false));
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (batch.unique_rows[t] > 0 && grads.tables[t] == nullptr) return Bad("a grads.tables pointer is null");
  }
  double loss_sum = 0;
  if (on_backend_ != nullptr) {
    // The loss is read back only when asked for (on a device, a wait).
    RETURN_IF_ERROR(RunOnBackend(batch, params, &grads, stats != nullptr ? &loss_sum : nullptr, outputs));
    if (stats != nullptr) {
      stats->loss_sum += loss_sum;
      stats->count += batch.batch;
    }
    return absl::OkStatus();
  }
  RunForward(batch, params);
  loss_sum = Loss(batch);
  RunBackward(batch, params, grads);
  Report(batch, loss_sum, stats, outputs);
  return absl::OkStatus();
}

absl::Status GraphModel::Forward(const GraphBatch& batch, const CtrParams& params, CtrStats* stats, float* outputs) {
  RETURN_IF_ERROR(ValidateInputs(batch, params, /*need_labels=*/stats != nullptr));
  if (on_backend_ != nullptr) {
    double loss_sum = 0;
    RETURN_IF_ERROR(RunOnBackend(batch, params, nullptr, stats != nullptr ? &loss_sum : nullptr, outputs));
    if (stats != nullptr) {
      stats->loss_sum += loss_sum;
      stats->count += batch.batch;
    }
    return absl::OkStatus();
  }
  RunForward(batch, params);
  const double loss_sum = stats != nullptr ? Loss(batch) : 0.0;
  Report(batch, loss_sum, stats, outputs);
  return absl::OkStatus();
}

}  // namespace kernels
}  // namespace fulcrum
