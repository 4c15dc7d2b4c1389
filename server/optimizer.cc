#include "server/optimizer.h"

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

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

// Returns wd * w + g, or g unchanged when there is no L2 penalty.
inline float WithL2(float g, float w, float weight_decay) {
  return weight_decay != 0 ? g + weight_decay * w : g;
}

void ApplySgd(const OptimizerConfig& c, float lr, int64_t n, const float* grad,
              float* param, float* const* state) {
  if (c.momentum <= 0) {
    for (int64_t i = 0; i < n; ++i) {
      param[i] -= lr * WithL2(grad[i], param[i], c.weight_decay);
    }
    return;
  }
  float* velocity = state[0];
  for (int64_t i = 0; i < n; ++i) {
    const float g = WithL2(grad[i], param[i], c.weight_decay);
    velocity[i] = c.momentum * velocity[i] + g;
    const float update = c.nesterov ? g + c.momentum * velocity[i]
                                    : velocity[i];
    param[i] -= lr * update;
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
  const float one_minus_b1 = 1.0f - c.beta1;
  const float one_minus_b2 = 1.0f - c.beta2;
  float* m = state[0];
  float* v = state[1];
  for (int64_t i = 0; i < n; ++i) {
    const float g = WithL2(grad[i], param[i], l2);
    m[i] = c.beta1 * m[i] + one_minus_b1 * g;
    v[i] = c.beta2 * v[i] + one_minus_b2 * (g * g);
    const float denom = std::sqrt(v[i]) / bias2_sqrt + c.epsilon;
    param[i] -= step_size * (m[i] / denom);
  }
}

void ApplyAdamW(const OptimizerConfig& c, float lr, int64_t step, int64_t n,
                const float* grad, float* param, float* const* state) {
  if (c.weight_decay != 0) {
    const float keep = 1.0f - lr * c.weight_decay;
    for (int64_t i = 0; i < n; ++i) param[i] *= keep;
  }
  ApplyAdamMoments(c, lr, step, /*l2=*/0, n, grad, param, state);
}

void ApplyAdagrad(const OptimizerConfig& c, float lr, int64_t n,
                  const float* grad, float* param, float* const* state) {
  float* sum = state[0];
  for (int64_t i = 0; i < n; ++i) {
    const float g = WithL2(grad[i], param[i], c.weight_decay);
    sum[i] += g * g;
    param[i] -= lr * (g / (std::sqrt(sum[i]) + c.epsilon));
  }
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
  if (absl::Status s =
          CheckFiniteNonNegative("weight_decay", config.weight_decay);
      !s.ok()) {
    return s;
  }
  return CheckFiniteNonNegative("initial_accumulator",
                                config.initial_accumulator);
}

int OptimizerStateSlots(const OptimizerConfig& config) {
  switch (config.kind) {
    case OptimizerKind::kSgd:
      return config.momentum > 0 ? 1 : 0;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return 2;
    case OptimizerKind::kAdagrad:
      return 1;
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
  }
}

}  // namespace fulcrum
