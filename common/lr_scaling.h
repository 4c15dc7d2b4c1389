// The factor OptimizerSpec.lr_scaling multiplies a job's learning rates by,
// one definition for the scheduler's validation and the servers' optimizer.
#ifndef FULCRUM_COMMON_LR_SCALING_H_
#define FULCRUM_COMMON_LR_SCALING_H_

#include <algorithm>

#include "common/data_partition.h"
#include "fulcrum/v1/job.pb.h"

namespace fulcrum {

// 1, or with LINEAR the examples one update applies (BSP: every data
// partition's step; ASP and SSP: one step; a step being batch_size times
// data.gradient_accumulation examples) over base_batch_size.
inline double LrScale(const v1::JobSpec& spec) {
  const v1::OptimizerSpec& optimizer = spec.optimizer();
  if (optimizer.lr_scaling() != v1::OptimizerSpec::LINEAR || optimizer.base_batch_size() <= 0) return 1;
  const bool synchronous = spec.mode() == v1::BSP || spec.mode() == v1::MODE_UNSPECIFIED;
  const double partitions = synchronous ? std::max(1, std::max(spec.max_workers(), spec.num_workers())) : 1;
  return static_cast<double>(StepBatchSize(spec)) * partitions / optimizer.base_batch_size();
}

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_LR_SCALING_H_
