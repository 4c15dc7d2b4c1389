// The activations on the host, one float at a time: the CPU backend's
// kernels and the host CTR models compute them the same way.
#ifndef FULCRUM_KERNELS_CPU_ACTIVATION_H_
#define FULCRUM_KERNELS_CPU_ACTIVATION_H_

#include <cmath>

#include "kernels/backend.h"

namespace fulcrum {
namespace kernels {

inline float Activate(Activation act, float z) {
  switch (act) {
    case Activation::kRelu:
      return z > 0.0f ? z : 0.0f;
    case Activation::kTanh:
      return std::tanh(z);
    case Activation::kSigmoid:
      return 1.0f / (1.0f + std::exp(-z));
    case Activation::kNone:
      break;
  }
  return z;
}

// Derivative of the activation expressed through its output y = act(z).
inline float ActivationGrad(Activation act, float y) {
  switch (act) {
    case Activation::kRelu:
      return y > 0.0f ? 1.0f : 0.0f;
    case Activation::kTanh:
      return 1.0f - y * y;
    case Activation::kSigmoid:
      return y * (1.0f - y);
    case Activation::kNone:
      break;
  }
  return 1.0f;
}

}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_CPU_ACTIVATION_H_
