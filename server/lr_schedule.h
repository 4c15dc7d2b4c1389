// Learning-rate schedules evaluated by the parameter server before each
// optimizer update.

#ifndef FULCRUM_SERVER_LR_SCHEDULE_H_
#define FULCRUM_SERVER_LR_SCHEDULE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace fulcrum {

enum class LrScheduleKind { kConstant, kWarmupCosine, kStepDecay };

struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  // warmup_cosine: for step < warmup_steps the rate is
  // base_lr * (step + 1) / warmup_steps (linear, reaching base_lr on the last
  // warmup step). 0 disables warmup.
  int64_t warmup_steps = 0;
  // warmup_cosine: over [warmup_steps, total_steps) the rate follows
  // min_lr + (base_lr - min_lr) * (1 + cos(pi * p)) / 2 with
  // p = (step - warmup_steps) / (total_steps - warmup_steps); it is min_lr for
  // step >= total_steps (and so right after warmup if
  // total_steps <= warmup_steps).
  int64_t total_steps = 0;
  float min_lr = 0;
  // step_decay: base_lr * gamma^floor(step / step_size).
  int64_t step_size = 0;
  float gamma = 0.1f;
};

// Returns InvalidArgument if `config` cannot be evaluated meaningfully:
// negative warmup_steps or total_steps, total_steps < warmup_steps,
// non-finite or negative min_lr for warmup_cosine, step_size <= 0 or
// non-finite/negative gamma for step_decay.
absl::Status ValidateLrScheduleConfig(const LrScheduleConfig& config);

// Learning rate for the update that follows `step` already-applied updates
// (step is 0-based; negative steps are treated as 0). Pure and deterministic.
// For configs that fail ValidateLrScheduleConfig the result is still defined
// but unspecified beyond: never NaN for finite inputs; step_decay with
// step_size <= 0 returns base_lr.
float LearningRate(const LrScheduleConfig& config, float base_lr,
                   int64_t step);

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_LR_SCHEDULE_H_
