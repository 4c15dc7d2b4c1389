// Device-neutral compute interface used by the training code.
//
// A Backend implements the handful of dense kernels an MLP needs. All
// matrices are row-major float32 with their natural leading dimension (the
// number of columns of the stored matrix). Pointers are host pointers for now;
// a device backend (e.g. CUDA) will interpret them as device pointers of the
// same layout.
//
// Every method validates its arguments and returns InvalidArgument (without
// writing any output) for negative dimensions, null pointers to non-empty
// buffers, or out-of-range labels. Implementations need not be thread-safe;
// use one Backend per thread.

#ifndef FULCRUM_KERNELS_BACKEND_H_
#define FULCRUM_KERNELS_BACKEND_H_

#include <cstdint>

#include "absl/status/status.h"

namespace fulcrum {
namespace kernels {

enum class Activation { kNone, kRelu, kTanh, kSigmoid };

// Returns "none", "relu", "tanh" or "sigmoid" (or "unknown").
inline const char* ActivationName(Activation act) {
  switch (act) {
    case Activation::kNone:
      return "none";
    case Activation::kRelu:
      return "relu";
    case Activation::kTanh:
      return "tanh";
    case Activation::kSigmoid:
      return "sigmoid";
  }
  return "unknown";
}

class Backend {
 public:
  virtual ~Backend() = default;

  // Short identifier such as "cpu"; used in logs and test names.
  virtual const char* Name() const = 0;

  // C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, where op(X) = X^T
  // when trans_x. A is stored as [m,k] (or [k,m] when trans_a), B as [k,n]
  // (or [n,k] when trans_b), C as [m,n]. When beta == 0, C is write-only: its
  // prior contents (even NaN) do not affect the result. k == 0 is allowed and
  // yields C = beta * C.
  virtual absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                            float alpha, const float* a, const float* b,
                            float beta, float* c) = 0;

  // x[rows, cols] = act(x + bias[cols]) in place (bias broadcast over rows).
  virtual absl::Status BiasActivationForward(Activation act, int rows,
                                             int cols, const float* bias,
                                             float* x) = 0;

  // dy[i] *= act'(z[i]) for i in [0, n), where act' is expressed through the
  // activation output y = act(z): relu: (y > 0), tanh: 1 - y^2,
  // sigmoid: y * (1 - y), none: 1. In place.
  virtual absl::Status ActivationBackward(Activation act, int64_t n,
                                          const float* y, float* dy) = 0;

  // out[j] = sum_i x[i, j] for x[rows, cols]; out has cols elements and is
  // overwritten.
  virtual absl::Status ColumnSum(int rows, int cols, const float* x,
                                 float* out) = 0;

  // Numerically stable softmax cross-entropy over logits[rows, classes] with
  // labels[rows] in [0, classes). If dlogits != nullptr, writes
  // dlogits[rows, classes] = (softmax(logits) - onehot(labels)) * grad_scale.
  // Adds the summed (not averaged) loss to *loss_sum and the number of rows
  // whose argmax (first maximum) equals the label to *correct; either may be
  // nullptr to skip it. All labels are checked before anything is written, so
  // a label out of range returns InvalidArgument with outputs untouched.
  // Requires classes >= 1.
  virtual absl::Status SoftmaxCrossEntropy(int rows, int classes,
                                           const float* logits,
                                           const int32_t* labels,
                                           float grad_scale, float* dlogits,
                                           double* loss_sum,
                                           int64_t* correct) = 0;
};

}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_BACKEND_H_
