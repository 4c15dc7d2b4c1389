#include "server/lr_schedule.h"

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fulcrum {
namespace {

constexpr double kPi = 3.14159265358979323846;

double WarmupCosine(const LrScheduleConfig& c, double base_lr, int64_t step) {
  if (step < c.warmup_steps) {
    return base_lr * static_cast<double>(step + 1) /
           static_cast<double>(c.warmup_steps);
  }
  if (step >= c.total_steps) return c.min_lr;
  const double progress = static_cast<double>(step - c.warmup_steps) /
                          static_cast<double>(c.total_steps - c.warmup_steps);
  return c.min_lr +
         (base_lr - c.min_lr) * 0.5 * (1.0 + std::cos(kPi * progress));
}

double StepDecay(const LrScheduleConfig& c, double base_lr, int64_t step) {
  if (c.step_size <= 0) return base_lr;
  const int64_t decays = step / c.step_size;
  return base_lr * std::pow(static_cast<double>(c.gamma),
                            static_cast<double>(decays));
}

}  // namespace

absl::Status ValidateLrScheduleConfig(const LrScheduleConfig& config) {
  switch (config.kind) {
    case LrScheduleKind::kConstant:
      return absl::OkStatus();
    case LrScheduleKind::kWarmupCosine:
      if (config.warmup_steps < 0 || config.total_steps < 0 ||
          config.total_steps < config.warmup_steps) {
        return absl::InvalidArgumentError(absl::StrCat(
            "warmup_cosine needs 0 <= warmup_steps <= total_steps, got ",
            config.warmup_steps, " and ", config.total_steps));
      }
      if (!std::isfinite(config.min_lr) || config.min_lr < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("min_lr must be finite and >= 0, got ",
                         config.min_lr));
      }
      return absl::OkStatus();
    case LrScheduleKind::kStepDecay:
      if (config.step_size <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "step_decay needs step_size > 0, got ", config.step_size));
      }
      if (!std::isfinite(config.gamma) || config.gamma < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gamma must be finite and >= 0, got ", config.gamma));
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown LrScheduleKind");
}

float LearningRate(const LrScheduleConfig& config, float base_lr,
                   int64_t step) {
  if (step < 0) step = 0;
  switch (config.kind) {
    case LrScheduleKind::kConstant:
      return base_lr;
    case LrScheduleKind::kWarmupCosine:
      return static_cast<float>(WarmupCosine(config, base_lr, step));
    case LrScheduleKind::kStepDecay:
      return static_cast<float>(StepDecay(config, base_lr, step));
  }
  return base_lr;
}

}  // namespace fulcrum
