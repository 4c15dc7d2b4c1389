// A multilayer perceptron classifier built on kernels::Backend.
//
// The model is a stack of dense layers: hidden layers apply
// config.activation, the output layer is linear and is followed by softmax
// cross-entropy. Parameters live outside the model (e.g. on a parameter
// server) and are passed in as one pointer per tensor, in MlpTensors order.

#ifndef FULCRUM_KERNELS_MLP_H_
#define FULCRUM_KERNELS_MLP_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/param_init.h"
#include "kernels/backend.h"

namespace fulcrum {
namespace kernels {

using InitKind = ::fulcrum::InitKind;

// Describes one parameter tensor. For kUniform, values are drawn from
// [-init_scale, init_scale]; init_scale is 0 for kZeros.
struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t size;  // product of shape
  InitKind init;
  float init_scale;
};

struct ModelConfig {
  int input_dim;
  std::vector<int> hidden;  // widths of the hidden layers; may be empty
  Activation activation;    // applied after every hidden layer
  int num_classes;
};

// Returns OK if all dimensions are positive, else InvalidArgument naming the
// offending field.
absl::Status ValidateModelConfig(const ModelConfig& config);

// Tensors in a fixed order: for each layer i (hidden layers, then the output
// layer) "layer{i}.weight" of shape [in, out], kUniform with Glorot scale
// sqrt(6 / (in + out)), followed by "layer{i}.bias" of shape [out], kZeros.
// With no hidden layers the model is a softmax regression (two tensors).
// The config is not validated; call ValidateModelConfig first.
std::vector<TensorInfo> MlpTensors(const ModelConfig& config);

// Accumulated over batches: loss_sum is the summed per-example loss, correct
// the number of examples whose argmax matches the label, count the number of
// examples seen.
struct BatchStats {
  double loss_sum = 0;
  int64_t correct = 0;
  int64_t count = 0;
};

// One micro-batch of a larger batch, for gradient accumulation (see
// Mlp::ForwardBackward).
struct MicroBatch {
  int total_batch = 0;  // the whole batch's examples; 0 = this batch alone
  bool accumulate = false;  // add to the gradients instead of overwriting them
};

// Not thread-safe. Owns scratch buffers in backend memory (from
// backend->Allocate) that are sized on first use and only grow. `backend` is
// not owned and must outlive the Mlp. The Mlp never calls SetPrecision: GEMMs
// run at whatever precision the caller set on the backend.
class Mlp {
 public:
  Mlp(ModelConfig config, Backend* backend);

  const ModelConfig& config() const { return config_; }

  // Forward and backward pass on x[batch, input_dim] with labels[batch].
  // params/grads: one pointer per tensor in MlpTensors order (grads must not
  // alias params). params, x, labels and grads are backend memory (device
  // memory for a GPU backend); stats are host values. Writes grads = d(mean loss over the batch)/d(param) and
  // adds the batch's loss, correct count and size to *stats (may be null).
  // InvalidArgument for an invalid config, batch <= 0, a wrong number of
  // params/grads, null pointers, or a label outside [0, num_classes); stats
  // are left unchanged on error. Backend failures pass through.
  //
  // `layer_done` (optional) is called with each layer's index as soon as the
  // ops writing its gradients (tensors 2i and 2i + 1) are queued, from the
  // last layer down, before the rest of the backward pass is queued: the
  // caller can start moving those gradients while the backward pass goes on
  // (on a device, order its copies after them, e.g. CopyToHostAsync). An
  // error it returns stops the pass and is returned.
  //
  // `micro` (optional, see MicroBatch) makes this one micro-batch of a larger batch
  // (gradient accumulation): the gradients are of the loss summed over this
  // micro-batch and divided by micro.total_batch examples, and with
  // micro.accumulate they are added to `grads` instead of overwriting them.
  // Micro-batches of sizes summing to total_batch, the first not
  // accumulating, then leave the gradients of the mean loss over all of them.
  absl::Status ForwardBackward(const std::vector<const float*>& params, const float* x, const int32_t* labels,
                               int batch, const std::vector<float*>& grads, BatchStats* stats,
                               const std::function<absl::Status(int layer)>& layer_done = nullptr,
                               MicroBatch micro = {});

  // Forward pass only; adds loss, correct count and size to *stats (may be
  // null). Same error conditions as ForwardBackward, plus RESOURCE_EXHAUSTED
  // or INTERNAL from the backend (e.g. no device memory for the scratch).
  absl::Status Evaluate(const std::vector<const float*>& params, const float* x, const int32_t* labels,
                        int batch, BatchStats* stats);

 private:
  int num_layers() const { return static_cast<int>(dims_.size()) - 1; }
  Activation LayerActivation(int layer) const;
  absl::Status ValidateInputs(const std::vector<const float*>& params, const float* x, const int32_t* labels,
                              int batch) const;
  absl::Status EnsureScratch(int batch);
  absl::Status Forward(const std::vector<const float*>& params, const float* x, int batch);
  absl::Status Backward(const std::vector<const float*>& params, const float* x, int batch,
                        const std::vector<float*>& grads, const std::function<absl::Status(int)>& layer_done,
                        bool accumulate);
  static void AddStats(double loss_sum, int64_t correct, int batch, BatchStats* stats);

  ModelConfig config_;
  Backend* backend_;
  absl::Status config_status_;
  std::vector<int> dims_;  // dims_[0] = input_dim, ..., dims_.back() = classes
  int scratch_batch_ = 0;  // the batch size the scratch buffers hold
  // outputs_[i] holds layer i's activations [batch, dims_[i + 1]].
  std::vector<Buffer> outputs_;
  // Ping-pong buffers for the backpropagated error [batch, max dim].
  Buffer delta_, next_delta_;
};

}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_MLP_H_
