#include "scheduler/loss_curve.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace fulcrum {
namespace {

v1::StepLoss Loss(int64_t step, int32_t partition, float loss) {
  v1::StepLoss l;
  l.set_step(step);
  l.set_partition(partition);
  l.set_loss(loss);
  return l;
}

std::vector<float> Points(const v1::LossCurve& curve) { return {curve.loss().begin(), curve.loss().end()}; }

TEST(LossCurveTest, AStepIsTheMeanOfItsPartitionsOnceEveryPartitionIsThatFar) {
  LossCurveBuilder builder(2);
  v1::LossCurve curve;
  builder.Add(Loss(0, 0, 1.0f), &curve);
  builder.Add(Loss(1, 0, 3.0f), &curve);
  EXPECT_EQ(curve.steps(), 0) << "step 0 added before partition 1 reported it";
  builder.Add(Loss(0, 1, 2.0f), &curve);
  EXPECT_EQ(Points(curve), (std::vector<float>{1.5f}));
  builder.Add(Loss(1, 1, 5.0f), &curve);
  EXPECT_EQ(Points(curve), (std::vector<float>{1.5f, 4.0f}));
  EXPECT_EQ(curve.steps(), 2);
  EXPECT_EQ(curve.steps_per_point(), 1);
}

// A step recomputed after a failure (a worker died with its push half sent)
// is reported twice: it counts once. Steps already in the curve, unknown
// partitions and non-finite losses are ignored.
TEST(LossCurveTest, RepeatsAndGarbageAreIgnored) {
  LossCurveBuilder builder(2);
  v1::LossCurve curve;
  builder.Add(Loss(0, 0, 1.0f), &curve);
  builder.Add(Loss(0, 0, 100.0f), &curve);
  builder.Add(Loss(0, 7, 100.0f), &curve);
  builder.Add(Loss(0, -1, 100.0f), &curve);
  builder.Add(Loss(0, 1, std::nanf("")), &curve);
  builder.Add(Loss(0, 1, 3.0f), &curve);
  builder.Add(Loss(0, 1, 50.0f), &curve);  // already in the curve
  EXPECT_EQ(Points(curve), (std::vector<float>{2.0f}));
}

// ASP: partitions run at their own pace; a step goes in once the slowest
// partition has passed it, and a step whose loss from one partition was lost
// (a scheduler restart) goes in with the others' once every partition is
// further on.
TEST(LossCurveTest, AStepGoesInOnceTheSlowestPartitionIsPastIt) {
  LossCurveBuilder builder(2);
  v1::LossCurve curve;
  for (int64_t s = 0; s < 5; ++s) builder.Add(Loss(s, 0, 1.0f), &curve);
  EXPECT_EQ(curve.steps(), 0);
  builder.Add(Loss(1, 1, 3.0f), &curve);  // partition 1's step 0 was lost
  EXPECT_EQ(Points(curve), (std::vector<float>{1.0f, 2.0f}));
  builder.Flush(&curve);  // the job ended
  EXPECT_EQ(Points(curve), (std::vector<float>{1.0f, 2.0f, 1.0f, 1.0f, 1.0f}));
}

// Past kMaxPoints neighbours merge; each point stays the mean of the steps
// it covers.
TEST(LossCurveTest, LongCurvesMergeNeighboursAndStayMeans) {
  LossCurveBuilder builder(1);
  v1::LossCurve curve;
  const int64_t steps = 3 * LossCurveBuilder::kMaxPoints + 5;
  for (int64_t s = 0; s < steps; ++s) builder.Add(Loss(s, 0, static_cast<float>(s % 4)), &curve);
  EXPECT_EQ(curve.steps(), steps);
  EXPECT_EQ(curve.steps_per_point(), 4);
  EXPECT_LE(curve.loss_size(), LossCurveBuilder::kMaxPoints);
  EXPECT_EQ(curve.loss_size(), (steps + 3) / 4);
  for (int i = 0; i + 1 < curve.loss_size(); ++i) ASSERT_FLOAT_EQ(curve.loss(i), 1.5f) << "point " << i;
  EXPECT_FLOAT_EQ(curve.loss(curve.loss_size() - 1), 0.0f);  // the last holds step 3*8192+4 alone (0)
  LossCurveBuilder::Coarsen(100, &curve);
  EXPECT_LE(curve.loss_size(), 100);
  EXPECT_EQ(curve.steps(), steps);
  for (int i = 0; i + 1 < curve.loss_size(); ++i) ASSERT_FLOAT_EQ(curve.loss(i), 1.5f) << "point " << i;
}

// Bounded: a partition that never reports cannot make the others' losses
// pile up without end.
TEST(LossCurveTest, PendingLossesAreBounded) {
  LossCurveBuilder builder(2);
  v1::LossCurve curve;
  for (int64_t s = 0; s < LossCurveBuilder::kMaxPending + 10; ++s) builder.Add(Loss(s, 0, 1.0f), &curve);
  EXPECT_EQ(curve.steps(), 10);
}

}  // namespace
}  // namespace fulcrum
