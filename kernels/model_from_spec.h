// Maps a job spec's model section onto the kernels' model description. Shared
// by the scheduler (tensor layout for the shard map) and the worker (compute).
#ifndef FULCRUM_KERNELS_MODEL_FROM_SPEC_H_
#define FULCRUM_KERNELS_MODEL_FROM_SPEC_H_

#include <vector>

#include "fulcrum/v1/job.pb.h"
#include "kernels/mlp.h"

namespace fulcrum {

struct ModelLayout {
  kernels::ModelConfig config;
  std::vector<kernels::TensorInfo> tensors;  // MlpTensors(config)
};

// `features` and `classes` come from the loaded dataset.
ModelLayout LayoutFor(const v1::JobSpec& spec, int features, int classes);

}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_MODEL_FROM_SPEC_H_
