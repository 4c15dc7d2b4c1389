// Click-through-rate models over sparse categorical features, on the host.
//
// One family covers logistic regression, factorization machines, Wide & Deep
// and DeepFM. An example has one bag of ids per categorical field (possibly
// empty) and num_dense dense features. Field f's bag combines the rows of its
// ids (BagCombiner) into v_f, and the example's logit is the sum of the terms
// the CtrModelConfig turns on:
//
//   z = bias                                        always
//     + sum_f linear_f + dense . dense.weight       linear
//     + 0.5 * sum_d [(sum_f v_fd)^2 - sum_f v_fd^2] fm
//     + MLP(concat(v_0, ..., v_{F-1}, dense))       hidden non-empty
//
// or, with dot_interaction (DLRM, Naumov et al. 2019), the MLP reads
// concat(x0, x_i . x_j for i < j over (x0, v_0, ..., v_{F-1})) where x0 =
// bottom MLP(dense) has embedding_dim values (no x0 without dense features).
//
// where linear_f is field f's bag of the "linear" table (one weight per id)
// and v_f its bag of the "embedding" table. The loss is binary cross-entropy
// with logits, averaged over the batch.
//
// Parameters live outside the model: the dense tensors (CtrDenseTensors
// order) come from the parameter servers' dense path, and the tables
// (CtrTables order) hold only the rows the worker pulled for the batch's
// unique keys. Everything is host memory; compute is float32 (the deep
// part's products through BLAS), loss sums are double.

#ifndef FULCRUM_KERNELS_CTR_MODEL_H_
#define FULCRUM_KERNELS_CTR_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/param_init.h"
#include "kernels/backend.h"
#include "kernels/mlp.h"

namespace fulcrum {
namespace kernels {

// How a bag of ids becomes one vector: kSum is the weighted sum of the ids'
// rows; kMean divides it by the bag's total weight (an empty bag, or one of
// total weight 0, gives zeros).
enum class BagCombiner { kSum, kMean };

struct CtrModelConfig {
  int32_t num_fields = 0;     // categorical fields, in [0, 4096]
  int32_t num_dense = 0;      // dense features, in [0, 65536]
  int32_t embedding_dim = 0;  // k of the "embedding" table, in [0, 4096]; 0 = no embedding table
  // First-order terms: the "linear" table (dim 1) over the fields and
  // "dense.weight" over the dense features. "bias" is there either way.
  bool linear = true;
  // The factorization-machine term over the fields' embedding bags; needs
  // embedding_dim > 0.
  bool fm = false;
  // Widths of the deep part's hidden layers (each in [1, 65536], at most 16
  // layers); empty = no deep part. The MLP reads concat(field bags
  // [num_fields * embedding_dim], dense [num_dense]) and ends in 1 linear unit.
  std::vector<int> hidden;
  Activation activation = Activation::kRelu;  // after every hidden layer
  BagCombiner combiner = BagCombiner::kSum;
  // DLRM's dot interaction as the deep part's input (see above): needs
  // embedding_dim > 0 and hidden, not fm, and at least two vectors to pair.
  bool dot_interaction = false;
  // With dot_interaction and dense features: the bottom MLP's hidden widths
  // (each in [1, 65536], at most 16), before its last layer of
  // embedding_dim units; the activation follows every bottom layer.
  std::vector<int> bottom;
};

// The most pairs a dot interaction (DLRM) reads: every two of its vectors.
constexpr int64_t kMaxDotInteractionPairs = int64_t{1} << 20;

// OK, or INVALID_ARGUMENT naming the offending field: a size out of range,
// fm without an embedding, an embedding without fields or that no term reads
// (fm or hidden), hidden layers without an input, no inputs at all (no fields
// and no dense features), no term at all (not linear, no fm, no hidden), or
// an activation or combiner outside its enum.
absl::Status ValidateCtrModelConfig(const CtrModelConfig& config);

// The dense tensors, in this order: "bias" [1] zeros; "dense.weight"
// [num_dense] zeros when linear and num_dense > 0; for each bottom layer i
// (CtrBottomDims) "bottom{i}.weight" [in, out] (Glorot, as below) and
// "bottom{i}.bias" [out] zeros; then for each deep layer i
// (the hidden layers, then the 1-unit output layer) "deep{i}.weight"
// [in, out], uniform with Glorot scale sqrt(6 / (in + out)), and
// "deep{i}.bias" [out] zeros. The config is not validated.
std::vector<TensorInfo> CtrDenseTensors(const CtrModelConfig& config);

// An embedding table: `dim` floats per key. New keys start as `init` with
// `init_scale` (see TensorInfo).
struct CtrTableInfo {
  std::string name;
  int32_t dim;
  InitKind init;
  float init_scale;
};

// The tables, in this order: "linear" (dim 1, zeros) when linear and
// num_fields > 0; "embedding" (dim embedding_dim, uniform in [-0.05, 0.05])
// when embedding_dim > 0 (common/table_spec.h DefaultTableInitScale: a
// job's spec may set others). The config is not validated.
std::vector<CtrTableInfo> CtrTables(const CtrModelConfig& config);

// The deep part's widths: its input, the hidden layers, 1 (empty without
// hidden layers). The config is not validated.
std::vector<int64_t> CtrDeepDims(const CtrModelConfig& config);
// The bottom MLP's widths: num_dense, bottom..., embedding_dim (empty
// without dot_interaction or dense features). Not validated.
std::vector<int64_t> CtrBottomDims(const CtrModelConfig& config);

// One batch. The caller de-duplicated the batch's keys: every id refers to a
// row of the pulled tables by its index among the batch's unique keys.
// Nothing here is owned; it only has to outlive the call.
struct CtrBatch {
  int32_t batch = 0;
  const float* labels = nullptr;  // [batch], each 0 or 1
  const float* dense = nullptr;   // [batch * num_dense] row-major; may be null when num_dense == 0
  // [batch * num_fields + 1], offsets[0] = 0, non-decreasing: field f of
  // example e is ids [offsets[e * F + f], offsets[e * F + f + 1]). May be null
  // when num_fields == 0.
  const int64_t* offsets = nullptr;
  // Per id: its unique-row index in [0, unique_rows). May be null when there
  // are no ids.
  const int32_t* rows = nullptr;
  const float* weights = nullptr;  // per id, finite and >= 0; null = all 1
  int32_t unique_rows = 0;         // >= 0
};

// Read-only parameters: one pointer per dense tensor (CtrDenseTensors order)
// and per table (CtrTables order, each [unique_rows * dim]; may be null when
// unique_rows == 0).
struct CtrParams {
  std::vector<const float*> dense;
  std::vector<const float*> tables;
};

// Gradients of the mean loss over the batch, same layout as CtrParams. Every
// element is overwritten: a unique row's gradient is the sum over all its
// ids' contributions (0 for a row no id refers to). Must not alias the
// params or the batch.
struct CtrGrads {
  std::vector<float*> dense;
  std::vector<float*> tables;
};

// Accumulated over batches: the summed (not averaged) loss and the number of
// examples.
struct CtrStats {
  double loss_sum = 0;
  int64_t count = 0;
};

// Not thread-safe: one CtrModel per thread. Owns host scratch that is sized on
// first use and only grows.
class CtrModel {
 public:
  explicit CtrModel(CtrModelConfig config);

  const CtrModelConfig& config() const { return config_; }

  // Forward and backward pass. The loss is the mean over the batch of the
  // stable binary cross-entropy with logits, max(z, 0) - z * y +
  // log1p(exp(-|z|)). Overwrites every gradient in `grads`, writes each
  // example's logit to `logits` [batch] when not null, and adds the loss sum
  // and batch size to *stats when not null.
  //
  // INVALID_ARGUMENT, with nothing written (grads, logits, stats), for an
  // invalid config, batch <= 0, unique_rows < 0, a wrong number of param or
  // grad pointers, a null pointer where data is needed, offsets not starting
  // at 0 or decreasing, a row index outside [0, unique_rows), a weight that
  // is negative or not finite, a label not 0 or 1, or a non-finite dense
  // feature, dense parameter or pulled row. Inputs are checked in one pass
  // each, before any compute. Finite inputs whose logits overflow are not
  // caught: the loss and gradients then hold inf or NaN.
  absl::Status ForwardBackward(const CtrBatch& batch, const CtrParams& params, const CtrGrads& grads,
                               CtrStats* stats, float* logits = nullptr);

  // Forward pass only: writes logits (when not null) and adds loss and count
  // to *stats (when not null). batch.labels may be null when stats is null
  // (inference). Same errors as ForwardBackward, minus those about grads.
  absl::Status Forward(const CtrBatch& batch, const CtrParams& params, CtrStats* stats, float* logits);

 private:
  int num_deep_layers() const { return deep_dims_.empty() ? 0 : static_cast<int>(deep_dims_.size()) - 1; }
  const float* DeepWeight(const CtrParams& params, int layer) const;
  const float* DeepBias(const CtrParams& params, int layer) const;
  Activation DeepActivation(int layer) const;

  // Validation (ctr_model.cc): every check runs before anything is written.
  absl::Status ValidateInputs(const CtrBatch& batch, const CtrParams& params, bool need_labels) const;
  absl::Status ValidateIds(const CtrBatch& batch) const;
  absl::Status ValidateValues(const CtrBatch& batch, bool need_labels) const;
  absl::Status ValidateParamValues(const CtrBatch& batch, const CtrParams& params) const;
  absl::Status ValidateGrads(const CtrBatch& batch, const CtrGrads& grads) const;

  // Forward steps; RunForward leaves the logits in logits_.
  void RunForward(const CtrBatch& batch, const CtrParams& params);
  void EnsureScratch(int32_t batch, int64_t num_ids);
  void ComputeIdScales(const CtrBatch& batch);
  void LinearForward(const CtrBatch& batch, const CtrParams& params);
  void EmbedBags(const CtrBatch& batch, const CtrParams& params);
  void CopyDense(const CtrBatch& batch);
  void FmForward(int32_t batch);
  void BottomForward(const CtrBatch& batch, const CtrParams& params);
  void InteractionForward(int32_t batch);
  void DeepForward(int32_t batch, const CtrParams& params);
  // The deep part's input: inter_ with dot_interaction, else input_.
  const float* DeepInput() const { return config_.dot_interaction ? inter_.data() : input_.data(); }
  // Example e's v-th vector of the dot interaction (x0 first when there is
  // one, then the field bags), and where its gradient goes.
  const float* InteractionVector(int32_t e, int v) const;
  float* InteractionGrad(int32_t e, int v);
  // Returns the summed loss; writes d(mean loss)/d(logit) to dlogits_.
  double Loss(const CtrBatch& batch);

  // Backward steps, after RunForward and Loss.
  void RunBackward(const CtrBatch& batch, const CtrParams& params, const CtrGrads& grads);
  void LinearBackward(const CtrBatch& batch, const CtrGrads& grads);
  void DeepBackward(int32_t batch, const CtrParams& params, const CtrGrads& grads);
  void FmBackward(int32_t batch);
  void InteractionBackward(int32_t batch);
  void BottomBackward(const CtrBatch& batch, const CtrParams& params, const CtrGrads& grads);
  void EmbeddingBackward(const CtrBatch& batch, const CtrGrads& grads);

  void Report(const CtrBatch& batch, double loss_sum, CtrStats* stats, float* logits) const;

  CtrModelConfig config_;
  absl::Status config_status_;
  std::vector<TensorInfo> dense_tensors_;
  std::vector<CtrTableInfo> tables_;
  int dense_weight_tensor_ = -1;  // index of "dense.weight" in dense_tensors_, or -1
  int deep_tensor_ = -1;          // index of "deep0.weight", or -1
  int linear_table_ = -1;         // index of "linear" in tables_, or -1
  int embedding_table_ = -1;      // index of "embedding", or -1
  int bottom_tensor_ = -1;        // index of "bottom0.weight", or -1
  std::vector<int> deep_dims_;    // deep input width, hidden..., 1; empty without a deep part
  std::vector<int> bottom_dims_;  // num_dense, bottom..., embedding_dim; empty without a bottom MLP
  int num_vectors_ = 0;           // dot interaction: x0 (with a bottom MLP) and the fields
  int bag_width_ = 0;             // num_fields * embedding_dim: the field bags of one example
  int input_width_ = 0;           // bag_width_, plus num_dense with a deep part

  // Scratch, sized by EnsureScratch.
  std::vector<float> id_scale_;              // per id: its factor in its bag (weight, or weight / bag weight)
  std::vector<float> input_;                 // [batch, input_width_]: field bags, then dense features
  std::vector<float> fm_sum_;                // [batch, embedding_dim]: sum_f v_f
  std::vector<std::vector<float>> outputs_;  // deep layer i's activations [batch, deep_dims_[i + 1]]
  std::vector<float> logits_, dlogits_;      // [batch]
  std::vector<float> delta_, next_delta_;    // [batch, widest hidden layer]: backpropagated error
  std::vector<float> dinput_;                // [batch, bag_width_]: d(loss)/d(field bags)
  std::vector<std::vector<float>> bottom_out_;  // bottom layer i's activations; the last is x0
  std::vector<float> inter_, dinter_;        // [batch, deep_dims_[0]]: the interaction and its gradient
  std::vector<float> dx0_;                   // [batch, embedding_dim]
  std::vector<float> bottom_delta_, bottom_next_;  // [batch, widest bottom layer]
};

}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_CTR_MODEL_H_
