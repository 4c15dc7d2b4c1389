// Maps a job spec's model section onto the kernels' model description. Shared
// by the scheduler (tensor layout for the shard map) and the worker (compute).
#ifndef FULCRUM_KERNELS_MODEL_FROM_SPEC_H_
#define FULCRUM_KERNELS_MODEL_FROM_SPEC_H_

#include <vector>

#include "fulcrum/v1/job.pb.h"
#include "kernels/ctr_model.h"
#include "kernels/graph_model.h"
#include "kernels/mlp.h"

namespace fulcrum {

struct ModelLayout {
  kernels::ModelConfig config;
  // The dense tensors: MlpTensors(config), or a click model's
  // CtrDenseTensors(ctr).
  std::vector<kernels::TensorInfo> tensors;
  // The click path (TrainsOnClickPath): the model and its sparse tables.
  bool click = false;
  kernels::CtrModelConfig ctr;
  std::vector<kernels::CtrTableInfo> tables;
  // GRAPH: the layer graph (`ctr` unused), and per table the fields whose
  // ids it reads (the preset kinds' tables read every field).
  bool graph = false;
  kernels::GraphConfig graph_config;
  std::vector<std::vector<int32_t>> table_fields;
};

// A GRAPH's layers as the kernels take them.
std::vector<kernels::GraphLayer> GraphLayersOf(const v1::ModelSpec& model);

// Whether the job trains on the click path (worker/ctr_trainer.cc: the
// layer graph or a preset kind, sparse tables): every click model
// (common/table_spec.h IsClickModel), and a GRAPH over dense data
// (FASHION_MNIST, SYNTHETIC) that is not an MLP's shape (GraphAsMlp, the
// classes unchecked). An MLP-shaped GRAPH trains as kind MLP does.
bool TrainsOnClickPath(const v1::JobSpec& spec);

// A click job's evaluations score its test examples this many at a time.
constexpr int64_t kClickEvalBatch = 1000;
// The largest batch a click model computes at once: a step's (the data's
// batch size) or an evaluation's.
int64_t ClickComputeBatch(const v1::JobSpec& spec);

// The values a click model keeps for one example of a batch (and their
// gradients as many again): its layer graph's every layer and each DOT's
// inputs side by side (a preset kind's as CtrModelAsGraph, which is how a
// GPU worker computes it, and about what the fused host code keeps). 0 for a layout that is not a click
// model's or a preset kind whose config is not valid.
int64_t ClickValuesPerExample(const ModelLayout& layout);

// `features` and `classes` come from the loaded dataset (click models take
// their shape from the spec alone).
ModelLayout LayoutFor(const v1::JobSpec& spec, int features, int classes);

}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_MODEL_FROM_SPEC_H_
