// GraphModel's pass on a Backend (graph_model.h): the layers of
// graph_model.cc, each through the backend's ops, over backend memory.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/backend.h"
#include "kernels/graph_bags.h"
#include "kernels/graph_model.h"

namespace fulcrum {
namespace kernels {

// Backend memory that grows to the largest size asked of it.
class GrowingBuffer {
 public:
  template <typename T = float>
  absl::StatusOr<T*> Ensure(Backend* backend, int64_t elements) {
    const size_t bytes = sizeof(T) * static_cast<size_t>(std::max<int64_t>(elements, 1));
    if (buffer_.bytes() < bytes) {
      buffer_.Reset();
      ASSIGN_OR_RETURN(buffer_, Buffer::Make(backend, bytes));
    }
    return buffer_.get<T>();
  }
  // As Ensure, every element `value`: filled when the memory is new (the
  // caller never writes it).
  absl::StatusOr<float*> EnsureFilled(Backend* backend, int64_t elements, float value) {
    const bool fresh = buffer_.bytes() < sizeof(float) * static_cast<size_t>(std::max<int64_t>(elements, 1));
    ASSIGN_OR_RETURN(float* data, Ensure(backend, elements));
    if (fresh)
      RETURN_IF_ERROR(backend->Fill(static_cast<int64_t>(buffer_.bytes() / sizeof(float)), value, data));
    return data;
  }
  template <typename T = float>
  T* get() const {
    return buffer_.get<T>();
  }

 private:
  Buffer buffer_;
};

struct GraphModel::OnBackend {
  explicit OnBackend(Backend* b) : backend(b) {}
  Backend* const backend;
  std::vector<GrowingBuffer> out, grad;             // per layer [batch, width]
  std::vector<GrowingBuffer> dense, dense_grads;    // per dense tensor
  std::vector<GrowingBuffer> rows, row_grads;       // per table [unique rows, dim]
  std::vector<GrowingBuffer> offsets, ids, scales;  // per layer (EMBEDDING): its bags
  std::vector<GrowingBuffer> joined, joined_grad;   // per layer (DOT): its inputs' vectors together
  GrowingBuffer labels, class_labels, ones, zeros, scratch;
  // Host staging of one EMBEDDING layer's bags.
  std::vector<int32_t> host_offsets, host_ids;
  std::vector<float> host_scales;
  std::vector<int32_t> host_classes;
};

std::unique_ptr<GraphModel::OnBackend, GraphModel::OnBackendDeleter> GraphModel::MakeOnBackend(
    Backend* backend) {
  return std::unique_ptr<OnBackend, OnBackendDeleter>(new OnBackend(backend));
}

void GraphModel::OnBackendDeleter::operator()(OnBackend* on_backend) const { delete on_backend; }

GraphModel::~GraphModel() = default;

Backend* GraphModel::backend() const { return on_backend_ == nullptr ? nullptr : on_backend_->backend; }

namespace {

template <typename T>
absl::Status Upload(Backend* backend, T* dst, const T* src, int64_t elements) {
  if (elements == 0) return absl::OkStatus();
  return backend->CopyFromHost(dst, src, sizeof(T) * static_cast<size_t>(elements));
}

absl::Status Download(Backend* backend, float* dst, const float* src, int64_t elements) {
  if (elements == 0) return absl::OkStatus();
  return backend->CopyToHost(dst, src, sizeof(float) * static_cast<size_t>(elements));
}

}  // namespace

absl::Status GraphModel::RunOnBackend(const GraphBatch& batch, const CtrParams& params, const CtrGrads* grads,
                                      double* loss_sum, float* outputs) {
  const absl::Status status = PassOnBackend(batch, params, grads, loss_sum, outputs);
  // A pass that failed half way may have work queued on a device: let it
  // finish (and its errors go with this one) so the next pass starts clean.
  if (!status.ok()) on_backend_->backend->Synchronize().IgnoreError();
  return status;
}

absl::Status GraphModel::PassOnBackend(const GraphBatch& batch, const CtrParams& params,
                                       const CtrGrads* grads, double* loss_sum, float* outputs) {
  OnBackend& d = *on_backend_;
  Backend* const be = d.backend;
  const int32_t b = batch.batch;
  const size_t layers = nodes_.size();
  d.out.resize(layers);
  d.grad.resize(layers);
  d.offsets.resize(layers);
  d.ids.resize(layers);
  d.scales.resize(layers);
  d.joined.resize(layers);
  d.joined_grad.resize(layers);
  d.dense.resize(dense_tensors_.size());
  d.dense_grads.resize(dense_tensors_.size());
  d.rows.resize(tables_.size());
  d.row_grads.resize(tables_.size());

  // The layers' buffers first (the bags' and DOT's grow as they are built).
  int64_t widest = 1;
  for (size_t n = 0; n < layers; ++n) {
    const int64_t size = int64_t{b} * nodes_[n].width();
    widest = std::max<int64_t>(widest, nodes_[n].width());
    RETURN_IF_ERROR(d.out[n].Ensure(be, size).status());
    if (grads != nullptr || n + 1 == layers) RETURN_IF_ERROR(d.grad[n].Ensure(be, size).status());
  }
  for (size_t t = 0; t < dense_tensors_.size(); ++t) {
    ASSIGN_OR_RETURN(float* tensor, d.dense[t].Ensure(be, dense_tensors_[t].size));
    RETURN_IF_ERROR(Upload(be, tensor, params.dense[t], dense_tensors_[t].size));
    if (grads != nullptr) RETURN_IF_ERROR(d.dense_grads[t].Ensure(be, dense_tensors_[t].size).status());
  }
  for (size_t t = 0; t < tables_.size(); ++t) {
    const int64_t size = int64_t{batch.unique_rows[t]} * tables_[t].dim;
    ASSIGN_OR_RETURN(float* rows, d.rows[t].Ensure(be, size));
    RETURN_IF_ERROR(Upload(be, rows, params.tables[t], size));
    if (grads != nullptr) {
      ASSIGN_OR_RETURN(float* row_grads, d.row_grads[t].Ensure(be, size));
      RETURN_IF_ERROR(be->Fill(size, 0.0f, row_grads));
    }
  }
  ASSIGN_OR_RETURN(float* ones, d.ones.EnsureFilled(be, widest, 1.0f));
  ASSIGN_OR_RETURN(float* zeros, d.zeros.EnsureFilled(be, widest, 0.0f));
  ASSIGN_OR_RETURN(float* scratch, d.scratch.Ensure(be, int64_t{b} * widest));

  // Each EMBEDDING layer's bags: one per example and field it reads, ids
  // as rows of the pulled rows, with their scales (graph_bags.h).
  constexpr size_t kMaxIds = std::numeric_limits<int32_t>::max();
  for (size_t n = 0; n < layers; ++n) {
    const Node& node = nodes_[n];
    if (node.type != LayerType::kEmbedding) continue;
    const GraphLayer& layer = config_.layers[n];
    const int32_t* rows = batch.rows[static_cast<size_t>(node.table)];
    d.host_offsets.assign(1, 0);
    d.host_ids.clear();
    d.host_scales.clear();
    ForEachBagId(
        batch, config_.num_fields, layer.fields, node.vectors, node.dim, layer.combiner, rows,
        [&](int64_t /*at*/, int32_t row, float scale) {
          d.host_ids.push_back(row);
          d.host_scales.push_back(scale);
        },
        [&] { d.host_offsets.push_back(static_cast<int32_t>(d.host_ids.size())); });  // checked below
    if (d.host_ids.size() > kMaxIds) {
      return absl::InvalidArgumentError(
          absl::StrCat("GraphModel: layer \"", layer.name, "\" reads more than 2^31 ids in one batch"));
    }
    const auto num_ids = static_cast<int64_t>(d.host_ids.size());
    ASSIGN_OR_RETURN(int32_t * offsets,
                     d.offsets[n].Ensure<int32_t>(be, static_cast<int64_t>(d.host_offsets.size())));
    ASSIGN_OR_RETURN(int32_t * ids, d.ids[n].Ensure<int32_t>(be, num_ids));
    ASSIGN_OR_RETURN(float* scales, d.scales[n].Ensure(be, num_ids));
    RETURN_IF_ERROR(Upload(be, offsets, d.host_offsets.data(), static_cast<int64_t>(d.host_offsets.size())));
    RETURN_IF_ERROR(Upload(be, ids, d.host_ids.data(), num_ids));
    RETURN_IF_ERROR(Upload(be, scales, d.host_scales.data(), num_ids));
  }

  auto out = [&](int n) { return d.out[static_cast<size_t>(n)].get(); };
  auto grad = [&](int n) { return d.grad[static_cast<size_t>(n)].get(); };
  auto width_of = [&](int n) { return nodes_[static_cast<size_t>(n)].width(); };

  // DOT's inputs side by side: [b, their vectors, dim].
  auto join = [&](const Node& node, size_t n) -> absl::StatusOr<float*> {
    int total = 0;
    for (int in : node.inputs) total += width_of(in);
    ASSIGN_OR_RETURN(float* joined, d.joined[n].Ensure(be, int64_t{b} * total));
    int offset = 0;
    for (int in : node.inputs) {
      RETURN_IF_ERROR(be->CopyColumns(b, width_of(in), out(in), width_of(in), joined + offset, total, false));
      offset += width_of(in);
    }
    return joined;
  };

  // Forward.
  for (size_t n = 0; n < layers; ++n) {
    const Node& node = nodes_[n];
    const GraphLayer& layer = config_.layers[n];
    const int width = node.width();
    float* y = d.out[n].get();
    const int x = node.inputs.empty() ? -1 : node.inputs[0];
    switch (node.type) {
      case LayerType::kUnspecified:
        break;
      case LayerType::kDenseInput:
        RETURN_IF_ERROR(Upload(be, y, batch.dense, int64_t{b} * width));
        break;
      case LayerType::kEmbedding: {
        const auto t = static_cast<size_t>(node.table);
        RETURN_IF_ERROR(be->EmbeddingBagForward(b * node.vectors, node.dim, d.offsets[n].get<int32_t>(),
                                                d.ids[n].get<int32_t>(), d.scales[n].get(),
                                                batch.unique_rows[t], d.rows[t].get(), y));
        break;
      }
      case LayerType::kLinear: {
        const auto w = static_cast<size_t>(node.tensor);
        RETURN_IF_ERROR(
            be->Gemm(false, false, b, width, width_of(x), 1.0f, out(x), d.dense[w].get(), 0.0f, y));
        RETURN_IF_ERROR(be->BiasActivationForward(Activation::kNone, b, width, d.dense[w + 1].get(), y));
        break;
      }
      case LayerType::kActivation:
        RETURN_IF_ERROR(be->CopyColumns(b, width, out(x), width, y, width, false));
        RETURN_IF_ERROR(be->BiasActivationForward(layer.activation, b, width, zeros, y));
        break;
      case LayerType::kConcat: {
        int offset = 0;
        for (int in : node.inputs) {
          RETURN_IF_ERROR(be->CopyColumns(b, width_of(in), out(in), width_of(in), y + offset, width, false));
          offset += width_of(in);
        }
        break;
      }
      case LayerType::kFm: {
        const Node& in = nodes_[static_cast<size_t>(x)];
        RETURN_IF_ERROR(be->FmForward(b, in.vectors, in.dim, out(x), y));
        break;
      }
      case LayerType::kDot: {
        ASSIGN_OR_RETURN(float* joined, join(node, n));
        int vectors = 0;
        for (int in : node.inputs) vectors += nodes_[static_cast<size_t>(in)].vectors;
        RETURN_IF_ERROR(be->PairwiseDotForward(b, vectors, nodes_[static_cast<size_t>(x)].dim, joined, y));
        break;
      }
      case LayerType::kAdd:
        RETURN_IF_ERROR(be->CopyColumns(b, width, out(x), width, y, width, false));
        for (size_t k = 1; k < node.inputs.size(); ++k) {
          RETURN_IF_ERROR(be->Axpy(int64_t{b} * width, 1.0f, out(node.inputs[k]), y));
        }
        if (node.tensor >= 0) {
          RETURN_IF_ERROR(be->BiasActivationForward(Activation::kNone, b, width,
                                                    d.dense[static_cast<size_t>(node.tensor)].get(), y));
        }
        break;
      case LayerType::kReduceSum:
        RETURN_IF_ERROR(be->Gemm(false, false, b, 1, width_of(x), 1.0f, out(x), ones, 0.0f, y));
        break;
      case LayerType::kLoss:
        RETURN_IF_ERROR(be->CopyColumns(b, width, out(x), width, y, width, false));
        break;
    }
  }

  // The loss, and the output layer's gradient when training.
  const int last = static_cast<int>(layers) - 1;
  const int out_width = width_of(last);
  float* dz = grads != nullptr ? grad(last) : nullptr;
  const float inverse_batch = 1.0f / static_cast<float>(b);
  if (loss_sum != nullptr || dz != nullptr) {
    if (loss_ == LossKind::kSoftmaxCrossEntropy) {
      d.host_classes.resize(static_cast<size_t>(b));
      for (int32_t e = 0; e < b; ++e)
        d.host_classes[static_cast<size_t>(e)] = static_cast<int32_t>(batch.labels[e]);
      ASSIGN_OR_RETURN(int32_t * classes, d.class_labels.Ensure<int32_t>(be, b));
      RETURN_IF_ERROR(Upload(be, classes, d.host_classes.data(), b));
      RETURN_IF_ERROR(
          be->SoftmaxCrossEntropy(b, out_width, out(last), classes, inverse_batch, dz, loss_sum, nullptr));
    } else {
      ASSIGN_OR_RETURN(float* labels, d.labels.Ensure(be, b));
      RETURN_IF_ERROR(Upload(be, labels, batch.labels, b));
      const Backend::PointLoss kind = loss_ == LossKind::kSigmoidCrossEntropy
                                          ? Backend::PointLoss::kSigmoidCrossEntropy
                                          : Backend::PointLoss::kSquaredError;
      RETURN_IF_ERROR(be->PointwiseLoss(kind, b, out(last), labels, inverse_batch, dz, loss_sum));
    }
  }

  if (grads != nullptr) {
    for (size_t n = 0; n + 1 < layers; ++n) {
      RETURN_IF_ERROR(be->Fill(int64_t{b} * nodes_[n].width(), 0.0f, d.grad[n].get()));
    }
    for (int n = last; n >= 0; --n) {
      const Node& node = nodes_[static_cast<size_t>(n)];
      const GraphLayer& layer = config_.layers[static_cast<size_t>(n)];
      const int width = node.width();
      const float* g = grad(n);
      const int x = node.inputs.empty() ? -1 : node.inputs[0];
      auto wants = [&](int in) { return nodes_[static_cast<size_t>(in)].trainable_upstream; };
      switch (node.type) {
        case LayerType::kUnspecified:
        case LayerType::kDenseInput:
          break;
        case LayerType::kEmbedding: {
          const auto t = static_cast<size_t>(node.table);
          RETURN_IF_ERROR(be->EmbeddingBagBackward(
              b * node.vectors, node.dim, d.offsets[static_cast<size_t>(n)].get<int32_t>(),
              d.ids[static_cast<size_t>(n)].get<int32_t>(), d.scales[static_cast<size_t>(n)].get(),
              batch.unique_rows[t], g, d.row_grads[t].get()));
          break;
        }
        case LayerType::kLinear: {
          const auto w = static_cast<size_t>(node.tensor);
          const int in_w = width_of(x);
          RETURN_IF_ERROR(
              be->Gemm(true, false, in_w, width, b, 1.0f, out(x), g, 0.0f, d.dense_grads[w].get()));
          RETURN_IF_ERROR(be->ColumnSum(b, width, g, d.dense_grads[w + 1].get(), false));
          if (wants(x))
            RETURN_IF_ERROR(be->Gemm(false, true, b, in_w, width, 1.0f, g, d.dense[w].get(), 1.0f, grad(x)));
          break;
        }
        case LayerType::kActivation:
          if (!wants(x)) break;
          RETURN_IF_ERROR(be->CopyColumns(b, width, g, width, scratch, width, false));
          RETURN_IF_ERROR(be->ActivationBackward(layer.activation, int64_t{b} * width, out(n), scratch));
          RETURN_IF_ERROR(be->Axpy(int64_t{b} * width, 1.0f, scratch, grad(x)));
          break;
        case LayerType::kConcat: {
          int offset = 0;
          for (int in : node.inputs) {
            if (wants(in))
              RETURN_IF_ERROR(
                  be->CopyColumns(b, width_of(in), g + offset, width, grad(in), width_of(in), true));
            offset += width_of(in);
          }
          break;
        }
        case LayerType::kFm: {
          if (!wants(x)) break;
          const Node& in = nodes_[static_cast<size_t>(x)];
          RETURN_IF_ERROR(be->FmBackward(b, in.vectors, in.dim, out(x), g, grad(x)));
          break;
        }
        case LayerType::kDot: {
          int vectors = 0, total = 0;
          for (int in : node.inputs) {
            vectors += nodes_[static_cast<size_t>(in)].vectors;
            total += width_of(in);
          }
          ASSIGN_OR_RETURN(float* joined_grad,
                           d.joined_grad[static_cast<size_t>(n)].Ensure(be, int64_t{b} * total));
          RETURN_IF_ERROR(be->Fill(int64_t{b} * total, 0.0f, joined_grad));
          RETURN_IF_ERROR(be->PairwiseDotBackward(b, vectors, nodes_[static_cast<size_t>(x)].dim,
                                                  d.joined[static_cast<size_t>(n)].get(), g, joined_grad));
          int offset = 0;
          for (int in : node.inputs) {
            if (wants(in)) {
              RETURN_IF_ERROR(be->CopyColumns(b, width_of(in), joined_grad + offset, total, grad(in),
                                              width_of(in), true));
            }
            offset += width_of(in);
          }
          break;
        }
        case LayerType::kAdd:
          for (int in : node.inputs) {
            if (wants(in)) RETURN_IF_ERROR(be->Axpy(int64_t{b} * width, 1.0f, g, grad(in)));
          }
          if (node.tensor >= 0) {
            RETURN_IF_ERROR(
                be->ColumnSum(b, width, g, d.dense_grads[static_cast<size_t>(node.tensor)].get(), false));
          }
          break;
        case LayerType::kReduceSum:
          if (wants(x))
            RETURN_IF_ERROR(be->Gemm(false, false, b, width_of(x), 1, 1.0f, g, ones, 1.0f, grad(x)));
          break;
        case LayerType::kLoss:
          if (wants(x)) RETURN_IF_ERROR(be->Axpy(int64_t{b} * width, 1.0f, g, grad(x)));
          break;
      }
    }
    for (size_t t = 0; t < dense_tensors_.size(); ++t) {
      RETURN_IF_ERROR(Download(be, grads->dense[t], d.dense_grads[t].get(), dense_tensors_[t].size));
    }
    for (size_t t = 0; t < tables_.size(); ++t) {
      RETURN_IF_ERROR(Download(be, grads->tables[t], d.row_grads[t].get(),
                               int64_t{batch.unique_rows[t]} * tables_[t].dim));
    }
  }
  if (outputs != nullptr) RETURN_IF_ERROR(Download(be, outputs, out(last), int64_t{b} * out_width));
  return be->Synchronize();
}

PresetAsGraph::PresetAsGraph(const CtrModelConfig& config, Backend* backend)
    : graph_(CtrModelAsGraph(config), backend),
      status_(ValidateGraphConfig(graph_.config())),
      kind_of_(status_.ok() ? CtrTensorsOfGraph(config) : std::vector<int>()) {
  spare_.resize(kind_of_.size());
  spare_grads_.resize(kind_of_.size());
  for (size_t t = 0; t < kind_of_.size(); ++t) {
    if (kind_of_[t] >= 0) continue;
    const auto size = static_cast<size_t>(graph_.dense_tensors()[t].size);
    spare_[t].assign(size, 0.0f);
    spare_grads_[t].resize(size);
  }
}

namespace {

// The graph's dense tensors from the kind's: per graph tensor its kind's
// (kind_of), or the spare one where it has none.
template <typename Pointer>
std::vector<Pointer> GraphOrder(const std::vector<int>& kind_of, const std::vector<Pointer>& kind,
                                std::vector<std::vector<float>>* spare) {
  std::vector<Pointer> mapped;
  for (size_t t = 0; t < kind_of.size(); ++t) {
    const bool held = kind_of[t] >= 0 && static_cast<size_t>(kind_of[t]) < kind.size();
    mapped.push_back(held ? kind[static_cast<size_t>(kind_of[t])] : (*spare)[t].data());
  }
  return mapped;
}

}  // namespace

CtrParams PresetAsGraph::Mapped(const CtrParams& params) {
  CtrParams mapped;
  mapped.tables = params.tables;
  mapped.dense = GraphOrder(kind_of_, params.dense, &spare_);
  return mapped;
}

CtrGrads PresetAsGraph::Mapped(const CtrGrads& grads) {
  CtrGrads mapped;
  mapped.tables = grads.tables;
  mapped.dense = GraphOrder(kind_of_, grads.dense, &spare_grads_);
  return mapped;
}

absl::Status PresetAsGraph::ForwardBackward(const GraphBatch& batch, const CtrParams& params,
                                            const CtrGrads& grads, CtrStats* stats, float* outputs) {
  RETURN_IF_ERROR(status_);
  const size_t kind_tensors =
      kind_of_.size() - static_cast<size_t>(std::count(kind_of_.begin(), kind_of_.end(), -1));
  if (params.dense.size() != kind_tensors || grads.dense.size() != kind_tensors) {
    return absl::InvalidArgumentError(absl::StrCat("PresetAsGraph: got ", params.dense.size(),
                                                   " dense tensors and ", grads.dense.size(),
                                                   " gradients, the kind has ", kind_tensors));
  }
  return graph_.ForwardBackward(batch, Mapped(params), Mapped(grads), stats, outputs);
}

absl::Status PresetAsGraph::Forward(const GraphBatch& batch, const CtrParams& params, CtrStats* stats,
                                    float* outputs) {
  RETURN_IF_ERROR(status_);
  return graph_.Forward(batch, Mapped(params), stats, outputs);
}

}  // namespace kernels
}  // namespace fulcrum
