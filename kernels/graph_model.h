// Click models described as a layer graph (job.proto ModelSpec GRAPH), on
// the host.
//
// A graph is a list of layers, each reading layers listed before it, ending
// in one loss layer. Every layer's output is, per example, `vectors` vectors
// of `dim` floats (an embedding layer's vectors are its fields' bags, which
// FM and DOT pair up); layers that read a width read all of it. The layer
// types, their parameters and shapes:
//
//   kDenseInput  ()            -> 1 x num_dense       the example's dense features
//   kEmbedding   ()            -> |fields| x dim      each field's bag of `table` rows
//   kLinear      (x)           -> 1 x units           x . "<name>.weight" [in, units] + "<name>.bias"
//   kActivation  (x)           -> x's shape
//   kConcat      (x, y, ...)   -> their vectors in order when their dims agree,
//                                  else 1 x (sum of widths)
//   kFm          (x)           -> 1 x 1               0.5 * sum_d [(sum_i x_id)^2 - sum_i x_id^2]
//   kDot         (x, y, ...)   -> 1 x n(n-1)/2        x_i . x_j for i < j over their n vectors
//   kAdd         (x, y, ...)   -> x's shape           x + y + ... (+ "<name>.bias" [width] when bias)
//   kReduceSum   (x)           -> 1 x 1               the sum of x's values
//   kLoss        (x)           -> x's shape           the model's output, scored by `loss`
//
// Tables are keyed by uint64 id and live on the servers; a step pulls, per
// table, the rows of the distinct ids of the fields that read it
// (GraphTableFields), so a table only ever holds its own fields' ids.
// Dense tensors come from the servers' dense path. Compute is float32 (the
// linear layers' products through BLAS), loss sums double; the loss is the
// batch mean of sigmoid cross-entropy with logits, softmax cross-entropy, or
// the squared error (prediction - label)^2.
#ifndef FULCRUM_KERNELS_GRAPH_MODEL_H_
#define FULCRUM_KERNELS_GRAPH_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/ctr_model.h"

namespace fulcrum {
namespace kernels {

// Numbered as job.proto's LayerSpec.Type.
enum class LayerType {
  kUnspecified,  // refused by validation
  kDenseInput,
  kEmbedding,
  kLinear,
  kActivation,
  kConcat,
  kFm,
  kDot,
  kAdd,
  kReduceSum,
  kLoss,
};

enum class LossKind { kSigmoidCrossEntropy, kSoftmaxCrossEntropy, kMeanSquaredError };

struct GraphLayer {
  std::string name;
  LayerType type = LayerType::kLoss;
  std::vector<std::string> inputs;  // names of earlier layers
  int32_t units = 0;                // kLinear
  std::string table;                // kEmbedding
  int32_t dim = 0;                  // kEmbedding
  std::vector<int32_t> fields;      // kEmbedding; empty = every field
  BagCombiner combiner = BagCombiner::kSum;
  Activation activation = Activation::kNone;  // kActivation (kNone is refused there)
  LossKind loss = LossKind::kSigmoidCrossEntropy;
  bool bias = false;  // kAdd
};

// Builders for code that writes graphs (CtrModelAsGraph, tests): a layer
// with its name, type and inputs, and the setting its type takes.
GraphLayer MakeLayer(std::string name, LayerType type, std::vector<std::string> inputs = {});
GraphLayer LinearLayer(std::string name, std::string input, int32_t units);
GraphLayer ActivationLayer(std::string name, std::string input, Activation activation);
GraphLayer EmbeddingLayer(std::string name, std::string table, int32_t dim, std::vector<int32_t> fields = {},
                          BagCombiner combiner = BagCombiner::kSum);

struct GraphConfig {
  int32_t num_fields = 0;  // categorical fields of the data, in [0, 4096]
  int32_t num_dense = 0;   // dense features of the data, in [0, 65536]
  std::vector<GraphLayer> layers;
};

// OK, or INVALID_ARGUMENT naming the layer (`layer 3 ("deep"): ...`) and the
// mismatch: 1 to 256 layers with unique names; each layer's inputs named
// and listed before it, in the number its type takes; the last layer, and
// only it, a loss; every other layer read by a later one; shapes that
// agree (FM and DOT over vectors of one dim, at least two of them; ADD over
// equal widths; sigmoid cross-entropy and squared error over 1 value,
// softmax over 2 to 65536 classes); dense input only with dense features,
// embedding fields in [0, num_fields) without repeats, one dim per table, at
// most 16 tables; sizes in range (units in [1, 65536], dim in [1, 1024], a
// layer at most 2^20 values an example, a weight at most 2^28 floats, all
// layers together at most 2^22 values an example); and settings only on the
// types they apply to.
absl::Status ValidateGraphConfig(const GraphConfig& config);

// A layer's output per example: `vectors` vectors of `dim` values.
struct GraphShape {
  int64_t vectors = 1, dim = 1;
  int64_t width() const { return vectors * dim; }
};

// Every layer's shape, in layer order. The config must be valid.
std::vector<GraphShape> GraphShapes(const GraphConfig& config);

// The values of every layer together for one example, and each DOT's
// inputs side by side as a backend joins them: GraphModel keeps them and
// their gradients per example of a batch. Valid config.
int64_t GraphValuesPerExample(const GraphConfig& config);

// The dense tensors in layer order: per kLinear layer "<name>.weight" [in,
// units] (uniform in +-sqrt(6 / (in + units))) and "<name>.bias" [units]
// (zeros); per kAdd with bias "<name>.bias" [width] (zeros). The config
// must be valid.
std::vector<TensorInfo> GraphDenseTensors(const GraphConfig& config);

// The tables in order of first use: dim from their layers, uniform init at
// DefaultTableInitScale(name) (a job's spec may set another). Valid config.
std::vector<CtrTableInfo> GraphTables(const GraphConfig& config);

// Per table (GraphTables order): the fields whose ids it reads, ascending.
std::vector<std::vector<int32_t>> GraphTableFields(const GraphConfig& config);

// A preset kind (a valid CtrModelConfig) as a graph computing the same
// function: the kinds' tensors keep their names where they mean the same
// ("deep{i}", "bottom{i}"), "logit.bias" is "bias" and "dense_lin.weight"
// is "dense.weight" (with "dense_lin.bias" an extra bias, its gradient the
// bias's); the tables keep theirs.
GraphConfig CtrModelAsGraph(const CtrModelConfig& config);

// For each dense tensor of CtrModelAsGraph(config), in its order: the index
// of the kind's tensor (CtrDenseTensors(config)) that it is, or -1 for
// "dense_lin.bias" (an extra bias: held at 0, its gradient is the kind's
// "bias"'s, which the kind's own tensor already gets).
std::vector<int> CtrTensorsOfGraph(const CtrModelConfig& config);

// A graph over dense data (FASHION_MNIST, SYNTHETIC) of an MLP's shape runs
// on the workers' backend as the MLP of kernels/mlp.h (any other runs as a
// GraphModel): DENSE_INPUT, then LINEAR layers, each
// but the last followed by one ACTIVATION (one kind throughout), the last
// of `classes` units, then a SOFTMAX_CROSS_ENTROPY LOSS. Writes the MLP's
// hidden widths and activation (kNone without hidden layers) and the LINEAR
// layers' names; INVALID_ARGUMENT naming the layer that breaks the shape.
// `classes` 0: not checked.
absl::Status GraphAsMlp(const std::vector<GraphLayer>& layers, int32_t classes, std::vector<int>* hidden,
                        Activation* activation, std::vector<std::string>* linear_names);

// The loss and the width of the model's output per example (1, or the
// classes of softmax). Valid config.
LossKind GraphLossOf(const GraphConfig& config);
int32_t GraphOutputWidth(const GraphConfig& config);

// One batch. Per table t (GraphTables order), rows[t][j] is id j's row among
// the rows pulled for table t, in [0, unique_rows[t]), or -1 when id j's
// field is not one table t reads (it must be one for the fields it reads).
struct GraphBatch {
  int32_t batch = 0;
  // [batch]: sigmoid cross-entropy 0 or 1; softmax a class number; squared
  // error any finite value. May be null for Forward without stats.
  const float* labels = nullptr;
  const float* dense = nullptr;      // [batch * num_dense]; null when num_dense == 0
  const int64_t* offsets = nullptr;  // [batch * num_fields + 1] as CtrBatch's; null when num_fields == 0
  const float* weights = nullptr;    // per id, finite and >= 0; null = all 1
  std::vector<const int32_t*> rows;
  std::vector<int32_t> unique_rows;
};

// Not thread-safe: one GraphModel per thread. Owns scratch that is sized on
// first use and only grows.
//
// With a backend, the model computes through its ops (a GPU's, for one): a
// pass copies the dense parameters, the pulled rows and the batch into
// backend memory, runs every layer there (the embedding layers through the
// backend's embedding bags, the linear ones through its GEMM) and copies the
// gradients and outputs back. Inputs are validated on the host first, with
// the same errors as the host model's; the results equal the host model's
// within float rounding (summation orders, the backend's GEMM precision).
// The backend must outlive the model and is used from its thread only.
class GraphModel {
 public:
  explicit GraphModel(GraphConfig config, Backend* backend = nullptr);
  ~GraphModel();
  GraphModel(const GraphModel&) = delete;
  GraphModel& operator=(const GraphModel&) = delete;

  // The backend it computes on, or null for the host.
  Backend* backend() const;

  const GraphConfig& config() const { return config_; }
  const std::vector<TensorInfo>& dense_tensors() const { return dense_tensors_; }
  const std::vector<CtrTableInfo>& tables() const { return tables_; }

  // Forward and backward pass: the mean loss over the batch, every gradient
  // in `grads` overwritten (a table row's is the sum of its ids'), the
  // outputs (GraphOutputWidth per example) written to `outputs` when not
  // null, loss sum and batch size added to *stats when not null.
  // INVALID_ARGUMENT with nothing written for an invalid config, batch <= 0,
  // wrong pointer counts, null data, bad offsets or rows, a bad weight, a
  // label its loss does not take, or a non-finite dense feature, parameter
  // or pulled row. On a backend, a failure after those checks (a device out
  // of memory or lost) may leave `grads` and `outputs` partly written.
  absl::Status ForwardBackward(const GraphBatch& batch, const CtrParams& params, const CtrGrads& grads,
                               CtrStats* stats, float* outputs = nullptr);

  // Forward only; labels may be null when stats is.
  absl::Status Forward(const GraphBatch& batch, const CtrParams& params, CtrStats* stats, float* outputs);

 private:
  // A layer resolved: inputs as layer indices, shapes known.
  struct Node {
    LayerType type;
    std::vector<int> inputs;
    int vectors = 1, dim = 1;
    int width() const { return vectors * dim; }
    int tensor = -1;  // its first dense tensor (weight; ADD: bias), or -1
    int table = -1;   // kEmbedding: its table
    bool trainable_upstream = false;  // it or a layer it reads has parameters
  };

  absl::Status ValidateInputs(const GraphBatch& batch, const CtrParams& params, bool need_labels) const;
  absl::Status ValidateLabels(const GraphBatch& batch) const;
  void EnsureScratch(int32_t batch);
  void RunForward(const GraphBatch& batch, const CtrParams& params);
  void ForwardNode(int n, const GraphBatch& batch, const CtrParams& params);
  double Loss(const GraphBatch& batch);  // writes the output layer's gradient
  void RunBackward(const GraphBatch& batch, const CtrParams& params, const CtrGrads& grads);
  void BackwardNode(int n, const GraphBatch& batch, const CtrParams& params, const CtrGrads& grads);
  void Report(const GraphBatch& batch, double loss_sum, CtrStats* stats, float* outputs) const;
  // The backend's pass (graph_model_backend.cc): forward, the loss when
  // `loss_sum` (its gradient too when `grads`), backward when `grads`; the
  // outputs copied out when `outputs`. Inputs already validated.
  struct OnBackend;
  struct OnBackendDeleter {
    void operator()(OnBackend* on_backend) const;
  };
  static std::unique_ptr<OnBackend, OnBackendDeleter> MakeOnBackend(Backend* backend);
  absl::Status RunOnBackend(const GraphBatch& batch, const CtrParams& params, const CtrGrads* grads,
                            double* loss_sum, float* outputs);
  absl::Status PassOnBackend(const GraphBatch& batch, const CtrParams& params, const CtrGrads* grads,
                             double* loss_sum, float* outputs);

  GraphConfig config_;
  absl::Status config_status_;
  std::vector<TensorInfo> dense_tensors_;
  std::vector<CtrTableInfo> tables_;
  std::vector<Node> nodes_;
  std::vector<std::vector<bool>> table_reads_;  // per table, per field: whether the table reads it
  LossKind loss_ = LossKind::kSigmoidCrossEntropy;

  std::vector<std::vector<float>> out_, grad_;    // per layer [batch, width]
  std::unique_ptr<OnBackend, OnBackendDeleter> on_backend_;  // null: the host computes
};

// A preset kind computed as its graph (CtrModelAsGraph), on a backend: how a
// GPU worker runs the kinds. Parameters and gradients are the kind's
// (CtrDenseTensors order, CtrTables order); the graph's one extra tensor,
// "dense_lin.bias", is held at 0 here and its gradient (the kind's "bias"'s,
// which that tensor already gets) dropped. Not thread-safe.
class PresetAsGraph {
 public:
  PresetAsGraph(const CtrModelConfig& config, Backend* backend);

  // OK, or why the kind has no graph (not expected of a valid kind).
  const absl::Status& status() const { return status_; }
  const GraphModel& graph() const { return graph_; }

  // As GraphModel's, over the kind's tensors.
  absl::Status ForwardBackward(const GraphBatch& batch, const CtrParams& params, const CtrGrads& grads,
                               CtrStats* stats, float* outputs = nullptr);
  absl::Status Forward(const GraphBatch& batch, const CtrParams& params, CtrStats* stats, float* outputs);

 private:
  CtrParams Mapped(const CtrParams& params);
  CtrGrads Mapped(const CtrGrads& grads);

  GraphModel graph_;
  absl::Status status_;
  std::vector<int> kind_of_;                             // per graph tensor: CtrTensorsOfGraph
  std::vector<std::vector<float>> spare_, spare_grads_;  // per graph tensor without a kind's: zeros, a sink
};

}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_GRAPH_MODEL_H_
