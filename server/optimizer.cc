#include "server/optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/vector_clones.h"

namespace fulcrum {
namespace {

absl::Status CheckFiniteNonNegative(const char* name, float value) {
  if (!std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be finite and >= 0, got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckBeta(const char* name, float value) {
  if (!std::isfinite(value) || value < 0 || value >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be in [0, 1), got ", value));
  }
  return absl::OkStatus();
}

// The update loops below are written to vectorize (CMakeLists compiles this
// file with -O3 -fno-math-errno, and with an AVX2 clone where the CPU has
// it): coefficients in locals, arrays __restrict, loop-invariant branches
// hoisted. Each element's arithmetic is unchanged (and never contracted into
// FMAs), so results are bit-identical to the scalar loops whatever the CPU
// (common/vector_clones.h).

FULCRUM_VECTOR_CLONES void SgdPlain(float lr, float wd, int64_t n, const float* __restrict grad,
                                    float* __restrict param) {
  if (wd != 0) {
    for (int64_t i = 0; i < n; ++i) param[i] -= lr * (grad[i] + wd * param[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) param[i] -= lr * grad[i];
  }
}

FULCRUM_VECTOR_CLONES void SgdMomentum(float lr, float wd, float momentum, bool nesterov, int64_t n,
                                       const float* __restrict grad, float* __restrict param,
                                       float* __restrict velocity) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = wd != 0 ? grad[i] + wd * param[i] : grad[i];
    const float v = momentum * velocity[i] + g;
    velocity[i] = v;
    param[i] -= lr * (nesterov ? g + momentum * v : v);
  }
}

void ApplySgd(const OptimizerConfig& c, float lr, int64_t n, const float* grad,
              float* param, float* const* state) {
  if (c.momentum <= 0) return SgdPlain(lr, c.weight_decay, n, grad, param);
  SgdMomentum(lr, c.weight_decay, c.momentum, c.nesterov, n, grad, param, state[0]);
}

FULCRUM_VECTOR_CLONES void AdamLoop(float beta1, float beta2, float one_minus_b1, float one_minus_b2,
                                    float epsilon, float step_size, float bias2_sqrt, float l2, int64_t n,
                                    const float* __restrict grad, float* __restrict param, float* __restrict m,
                                    float* __restrict v) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = l2 != 0 ? grad[i] + l2 * param[i] : grad[i];
    const float mi = beta1 * m[i] + one_minus_b1 * g;
    const float vi = beta2 * v[i] + one_minus_b2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bias2_sqrt + epsilon;
    param[i] -= step_size * (mi / denom);
  }
}

// Adam / AdamW moment update. `l2` is the coupled L2 coefficient (0 for
// AdamW, whose decay the caller applies separately).
void ApplyAdamMoments(const OptimizerConfig& c, float lr, int64_t step,
                      float l2, int64_t n, const float* grad, float* param,
                      float* const* state) {
  // Scalars are computed once per block in double, then rounded to float, as
  // PyTorch does for its Python-side bias corrections.
  const double bias1 = 1.0 - std::pow(static_cast<double>(c.beta1), step);
  const double bias2 = 1.0 - std::pow(static_cast<double>(c.beta2), step);
  const float step_size = static_cast<float>(lr / bias1);
  const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  AdamLoop(c.beta1, c.beta2, 1.0f - c.beta1, 1.0f - c.beta2, c.epsilon, step_size, bias2_sqrt, l2, n, grad, param,
           state[0], state[1]);
}

FULCRUM_VECTOR_CLONES void Scale(float keep, int64_t n, float* __restrict param) {
  for (int64_t i = 0; i < n; ++i) param[i] *= keep;
}

void ApplyAdamW(const OptimizerConfig& c, float lr, int64_t step, int64_t n,
                const float* grad, float* param, float* const* state) {
  if (c.weight_decay != 0) Scale(1.0f - lr * c.weight_decay, n, param);
  ApplyAdamMoments(c, lr, step, /*l2=*/0, n, grad, param, state);
}

FULCRUM_VECTOR_CLONES void AdagradLoop(float lr, float wd, float epsilon, int64_t n, const float* __restrict grad,
                                       float* __restrict param, float* __restrict sum) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = wd != 0 ? grad[i] + wd * param[i] : grad[i];
    const float s = sum[i] + g * g;
    sum[i] = s;
    param[i] -= lr * (g / (std::sqrt(s) + epsilon));
  }
}

void ApplyAdagrad(const OptimizerConfig& c, float lr, int64_t n,
                  const float* grad, float* param, float* const* state) {
  AdagradLoop(lr, c.weight_decay, c.epsilon, n, grad, param, state[0]);
}

// LAMB's per-element coefficients of one step.
struct LambStep {
  float beta1, beta2, one_minus_b1, one_minus_b2, bias1, bias2, epsilon, wd;
};

LambStep LambStepOf(const OptimizerConfig& c, int64_t step) {
  if (step < 1) step = 1;
  return {c.beta1,
          c.beta2,
          1.0f - c.beta1,
          1.0f - c.beta2,
          static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta1), step)),
          static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta2), step)),
          c.epsilon,
          c.weight_decay};
}

// The new moments and the update r of one element: the same arithmetic for
// the norms and for the update, so that both see the same r.
inline float LambElement(const LambStep& s, float g, float w, float m, float v, float* m_out, float* v_out) {
  const float mi = s.beta1 * m + s.one_minus_b1 * g;
  const float vi = s.beta2 * v + s.one_minus_b2 * (g * g);
  *m_out = mi;
  *v_out = vi;
  return (mi / s.bias1) / (std::sqrt(vi / s.bias2) + s.epsilon) + s.wd * w;
}

FULCRUM_VECTOR_CLONES void LambLoop(LambStep s, float step_size, int64_t n, const float* __restrict grad,
                                    float* __restrict param, float* __restrict m, float* __restrict v) {
  for (int64_t i = 0; i < n; ++i) {
    float mi, vi;
    const float r = LambElement(s, grad[i], param[i], m[i], v[i], &mi, &vi);
    m[i] = mi;
    v[i] = vi;
    param[i] -= step_size * r;
  }
}

// PyTorch's single-tensor RMSprop, operation by operation (see ApplyOptimizer).
// `average` (centered) and `buffer` (momentum) are null when not used.
FULCRUM_VECTOR_CLONES void RmspropLoop(float lr, float wd, float alpha, float one_minus_alpha, float epsilon,
                                       float momentum, int64_t n, const float* __restrict grad,
                                       float* __restrict param, float* __restrict square,
                                       float* __restrict average, float* __restrict buffer) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = wd != 0 ? grad[i] + wd * param[i] : grad[i];
    const float s = square[i] * alpha + (one_minus_alpha * g) * g;
    square[i] = s;
    float d;
    if (average != nullptr) {
      const float a = average[i] + one_minus_alpha * (g - average[i]);
      average[i] = a;
      d = std::sqrt(s - a * a) + epsilon;
    } else {
      d = std::sqrt(s) + epsilon;
    }
    if (buffer != nullptr) {
      const float b = buffer[i] * momentum + g / d;
      buffer[i] = b;
      param[i] -= lr * b;
    } else {
      param[i] -= lr * (g / d);
    }
  }
}

void ApplyRmsprop(const OptimizerConfig& c, float lr, int64_t n, const float* grad, float* param,
                  float* const* state) {
  float* average = c.centered ? state[1] : nullptr;
  float* buffer = c.momentum > 0 ? state[c.centered ? 2 : 1] : nullptr;
  RmspropLoop(lr, c.weight_decay, c.alpha, 1.0f - c.alpha, c.epsilon, c.momentum, n, grad, param, state[0],
              average, buffer);
}

}  // namespace

absl::Status ValidateOptimizerConfig(const OptimizerConfig& config) {
  if (absl::Status s = CheckFiniteNonNegative("momentum", config.momentum);
      !s.ok()) {
    return s;
  }
  if (config.nesterov && !(config.momentum > 0)) {
    return absl::InvalidArgumentError("nesterov requires momentum > 0");
  }
  if (absl::Status s = CheckBeta("beta1", config.beta1); !s.ok()) return s;
  if (absl::Status s = CheckBeta("beta2", config.beta2); !s.ok()) return s;
  if (absl::Status s = CheckFiniteNonNegative("epsilon", config.epsilon);
      !s.ok()) {
    return s;
  }
  // Without epsilon a zero gradient on a zero second moment is 0 / 0 (NaN
  // parameters from finite gradients); Adagrad's starting accumulator
  // keeps its denominator above zero too.
  const bool adagrad_kept = config.kind == OptimizerKind::kAdagrad && config.initial_accumulator > 0;
  if (config.kind != OptimizerKind::kSgd && config.epsilon == 0 && !adagrad_kept) {
    return absl::InvalidArgumentError(
        "epsilon must be > 0 (or, for Adagrad, initial_accumulator > 0): a zero gradient would divide 0 by "
        "0");
  }
  if (absl::Status s =
          CheckFiniteNonNegative("weight_decay", config.weight_decay);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckBeta("alpha", config.alpha); !s.ok()) return s;
  return CheckFiniteNonNegative("initial_accumulator",
                                config.initial_accumulator);
}

int OptimizerStateSlots(const OptimizerConfig& config) {
  switch (config.kind) {
    case OptimizerKind::kSgd:
      return config.momentum > 0 ? 1 : 0;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
    case OptimizerKind::kLamb:
      return 2;
    case OptimizerKind::kAdagrad:
      return 1;
    case OptimizerKind::kRmsprop:
      return 1 + (config.centered ? 1 : 0) + (config.momentum > 0 ? 1 : 0);
  }
  return 0;
}

void InitOptimizerState(const OptimizerConfig& config, int64_t n,
                        float* const* state) {
  if (n <= 0) return;
  const float fill = config.kind == OptimizerKind::kAdagrad
                         ? config.initial_accumulator
                         : 0.0f;
  const int slots = OptimizerStateSlots(config);
  for (int s = 0; s < slots; ++s) {
    for (int64_t i = 0; i < n; ++i) state[s][i] = fill;
  }
}

void ApplyOptimizer(const OptimizerConfig& config, float lr, int64_t step,
                    int64_t n, const float* grad, float* param,
                    float* const* state) {
  if (n <= 0) return;
  if (step < 1) step = 1;
  switch (config.kind) {
    case OptimizerKind::kSgd:
      ApplySgd(config, lr, n, grad, param, state);
      return;
    case OptimizerKind::kAdam:
      ApplyAdamMoments(config, lr, step, config.weight_decay, n, grad, param,
                       state);
      return;
    case OptimizerKind::kAdamW:
      ApplyAdamW(config, lr, step, n, grad, param, state);
      return;
    case OptimizerKind::kAdagrad:
      ApplyAdagrad(config, lr, n, grad, param, state);
      return;
    case OptimizerKind::kRmsprop:
      ApplyRmsprop(config, lr, n, grad, param, state);
      return;
    case OptimizerKind::kLamb:
      ApplyLamb(config, lr, step, n, grad, param, state, LambBlockNorms(config, step, n, grad, param, state));
      return;
  }
}

LambNorms LambBlockNorms(const OptimizerConfig& config, int64_t step, int64_t n, const float* grad,
                         const float* param, const float* const* state) {
  const LambStep s = LambStepOf(config, step);
  LambNorms norms;
  for (int64_t i = 0; i < n; ++i) {
    float mi, vi;
    const float r = LambElement(s, grad[i], param[i], state[0][i], state[1][i], &mi, &vi);
    norms.weight_sq += static_cast<double>(param[i]) * static_cast<double>(param[i]);
    norms.update_sq += static_cast<double>(r) * static_cast<double>(r);
  }
  return norms;
}

absl::Status CheckLambNorms(const LambNorms& tensor, const std::string& what) {
  if (tensor.weight_sq >= 0 && tensor.update_sq >= 0 && std::isfinite(tensor.weight_sq) &&
      std::isfinite(tensor.update_sq)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("LAMB norms ", what, " must be finite and >= 0, got ",
                                                 tensor.weight_sq, " and ", tensor.update_sq));
}

float LambTrustRatio(const LambNorms& tensor) {
  if (!(tensor.weight_sq > 0) || !(tensor.update_sq > 0) || !std::isfinite(tensor.weight_sq) ||
      !std::isfinite(tensor.update_sq)) {
    return 1.0f;
  }
  return static_cast<float>(std::sqrt(tensor.weight_sq) / std::sqrt(tensor.update_sq));
}

void ApplyLamb(const OptimizerConfig& config, float lr, int64_t step, int64_t n, const float* grad, float* param,
               float* const* state, const LambNorms& tensor) {
  if (n <= 0) return;
  LambLoop(LambStepOf(config, step), lr * LambTrustRatio(tensor), n, grad, param, state[0], state[1]);
}

}  // namespace fulcrum
