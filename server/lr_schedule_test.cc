#include "server/lr_schedule.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace fulcrum {
namespace {

// Expected values were computed by hand / once with python3 in double
// precision.
constexpr float kScheduleTol = 1e-7f;

LrScheduleConfig WarmupCosineConfig() {
  LrScheduleConfig c;
  c.kind = LrScheduleKind::kWarmupCosine;
  c.warmup_steps = 10;
  c.total_steps = 110;
  c.min_lr = 0.001f;
  return c;
}

LrScheduleConfig StepDecayConfig(float gamma) {
  LrScheduleConfig c;
  c.kind = LrScheduleKind::kStepDecay;
  c.step_size = 30;
  c.gamma = gamma;
  return c;
}

TEST(LearningRateTest, ConstantIgnoresStep) {
  LrScheduleConfig c;
  EXPECT_EQ(LearningRate(c, 0.1f, 0), 0.1f);
  EXPECT_EQ(LearningRate(c, 0.1f, 12345), 0.1f);
}

TEST(LearningRateTest, WarmupIsLinear) {
  const LrScheduleConfig c = WarmupCosineConfig();
  EXPECT_NEAR(LearningRate(c, 0.1f, 0), 0.01f, kScheduleTol);  // first warmup step
  EXPECT_NEAR(LearningRate(c, 0.1f, 4), 0.05f, kScheduleTol);
  EXPECT_NEAR(LearningRate(c, 0.1f, 9), 0.1f, kScheduleTol);  // last warmup step
}

TEST(LearningRateTest, CosineDecaysToMinLr) {
  const LrScheduleConfig c = WarmupCosineConfig();
  EXPECT_NEAR(LearningRate(c, 0.1f, 10), 0.1f, kScheduleTol);            // cosine start
  EXPECT_NEAR(LearningRate(c, 0.1f, 35), 0.08550178567f, kScheduleTol);  // quarter
  EXPECT_NEAR(LearningRate(c, 0.1f, 60), 0.0505f, kScheduleTol);         // midpoint
  EXPECT_NEAR(LearningRate(c, 0.1f, 85), 0.01549821433f, kScheduleTol);
  EXPECT_NEAR(LearningRate(c, 0.1f, 109), 0.001024425262f, kScheduleTol);
  EXPECT_NEAR(LearningRate(c, 0.1f, 110), 0.001f, kScheduleTol);   // end
  EXPECT_NEAR(LearningRate(c, 0.1f, 1000), 0.001f, kScheduleTol);  // stays at min
}

TEST(LearningRateTest, CosineWithoutWarmup) {
  LrScheduleConfig c = WarmupCosineConfig();
  c.warmup_steps = 0;
  c.total_steps = 100;
  c.min_lr = 0;
  EXPECT_NEAR(LearningRate(c, 0.2f, 0), 0.2f, kScheduleTol);
  EXPECT_NEAR(LearningRate(c, 0.2f, 50), 0.1f, kScheduleTol);
  EXPECT_NEAR(LearningRate(c, 0.2f, 100), 0.0f, kScheduleTol);
}

TEST(LearningRateTest, CosineIsMonotoneNonIncreasingAfterWarmup) {
  const LrScheduleConfig c = WarmupCosineConfig();
  float prev = LearningRate(c, 0.1f, 10);
  for (int64_t step = 11; step < 200; ++step) {
    const float lr = LearningRate(c, 0.1f, step);
    EXPECT_LE(lr, prev) << "step " << step;
    prev = lr;
  }
}

TEST(LearningRateTest, WarmupEqualToTotalDropsToMinLr) {
  LrScheduleConfig c = WarmupCosineConfig();
  c.total_steps = 10;
  EXPECT_NEAR(LearningRate(c, 0.1f, 9), 0.1f, kScheduleTol);
  EXPECT_NEAR(LearningRate(c, 0.1f, 10), 0.001f, kScheduleTol);
}

TEST(LearningRateTest, StepDecayBoundariesExact) {
  const LrScheduleConfig c = StepDecayConfig(0.5f);
  EXPECT_EQ(LearningRate(c, 0.1f, 0), 0.1f);
  EXPECT_EQ(LearningRate(c, 0.1f, 29), 0.1f);
  EXPECT_EQ(LearningRate(c, 0.1f, 30), 0.05f);
  EXPECT_EQ(LearningRate(c, 0.1f, 59), 0.05f);
  EXPECT_EQ(LearningRate(c, 0.1f, 60), 0.025f);
  EXPECT_EQ(LearningRate(c, 0.1f, 89), 0.025f);
  EXPECT_EQ(LearningRate(c, 0.1f, 90), 0.0125f);
}

TEST(LearningRateTest, StepDecayGammaTenth) {
  const LrScheduleConfig c = StepDecayConfig(0.1f);
  EXPECT_NEAR(LearningRate(c, 0.1f, 29), 0.1f, kScheduleTol);
  EXPECT_NEAR(LearningRate(c, 0.1f, 30), 0.01f, kScheduleTol);
  EXPECT_NEAR(LearningRate(c, 0.1f, 60), 0.001f, 1e-9f);
  EXPECT_NEAR(LearningRate(c, 0.1f, 90), 0.0001f, 1e-10f);
}

TEST(LearningRateTest, NegativeStepTreatedAsZero) {
  EXPECT_NEAR(LearningRate(WarmupCosineConfig(), 0.1f, -5), 0.01f, kScheduleTol);
  EXPECT_EQ(LearningRate(StepDecayConfig(0.5f), 0.1f, -5), 0.1f);
}

TEST(LearningRateTest, InvalidStepSizeReturnsBaseLr) {
  LrScheduleConfig c = StepDecayConfig(0.5f);
  c.step_size = 0;
  EXPECT_EQ(LearningRate(c, 0.1f, 100), 0.1f);
}

TEST(ValidateLrScheduleConfigTest, AcceptsValid) {
  EXPECT_TRUE(ValidateLrScheduleConfig(LrScheduleConfig()).ok());
  EXPECT_TRUE(ValidateLrScheduleConfig(WarmupCosineConfig()).ok());
  EXPECT_TRUE(ValidateLrScheduleConfig(StepDecayConfig(0.1f)).ok());
}

TEST(ValidateLrScheduleConfigTest, RejectsInvalid) {
  LrScheduleConfig c = WarmupCosineConfig();
  c.total_steps = 5;  // < warmup_steps
  EXPECT_EQ(ValidateLrScheduleConfig(c).code(),
            absl::StatusCode::kInvalidArgument);
  c = WarmupCosineConfig();
  c.warmup_steps = -1;
  EXPECT_FALSE(ValidateLrScheduleConfig(c).ok());
  c = WarmupCosineConfig();
  c.min_lr = -0.1f;
  EXPECT_FALSE(ValidateLrScheduleConfig(c).ok());
  c = StepDecayConfig(0.1f);
  c.step_size = 0;
  EXPECT_FALSE(ValidateLrScheduleConfig(c).ok());
  c = StepDecayConfig(-0.1f);
  EXPECT_FALSE(ValidateLrScheduleConfig(c).ok());
}

}  // namespace
}  // namespace fulcrum
