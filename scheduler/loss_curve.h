// A job's per-step loss curve (JobStatus.loss_curve), built from the step
// losses workers report: each step's loss is the mean over its partitions,
// added in step order once every partition has reported a step at least as
// far, so steps recomputed after a failure count once. Bounded: at most
// kMaxPoints points (neighbours merge as the job goes on) and kMaxPending
// losses waiting for their step's other partitions. Not thread-safe (the
// JobManager's lock guards it).
#ifndef FULCRUM_SCHEDULER_LOSS_CURVE_H_
#define FULCRUM_SCHEDULER_LOSS_CURVE_H_

#include <cstdint>
#include <map>
#include <vector>

#include "fulcrum/v1/cluster.pb.h"
#include "fulcrum/v1/job.pb.h"

namespace fulcrum {

class LossCurveBuilder {
 public:
  static constexpr int kMaxPoints = 8192;
  static constexpr int kMaxPending = 1 << 16;

  explicit LossCurveBuilder(int32_t num_partitions);

  // Takes one partition step's loss into `curve` (the job's, which may hold
  // points already: a restored record; later steps are appended). Steps
  // already in the curve, partitions out of range and non-finite losses are
  // ignored.
  void Add(const v1::StepLoss& loss, v1::LossCurve* curve);
  // Adds every step still waiting with the partitions it has (the job ended).
  void Flush(v1::LossCurve* curve);
  // Merges neighbouring points until at most `max_points` are left (what a
  // finished job keeps once its parameters are released).
  static void Coarsen(int max_points, v1::LossCurve* curve);

 private:
  void AddReady(v1::LossCurve* curve);
  // Adds the oldest waiting step with the partitions it has.
  void AppendOldest(v1::LossCurve* curve);
  static void Append(int64_t step, double loss, v1::LossCurve* curve);
  static void AppendOne(double loss, v1::LossCurve* curve);
  static void Halve(v1::LossCurve* curve);

  const int32_t num_partitions_;
  // Per partition, the furthest step it reported (-1: none yet).
  std::vector<int64_t> furthest_;
  // Steps not in the curve yet: partition -> loss.
  std::map<int64_t, std::map<int32_t, float>> pending_;
  int pending_count_ = 0;
};

}  // namespace fulcrum

#endif  // FULCRUM_SCHEDULER_LOSS_CURVE_H_
