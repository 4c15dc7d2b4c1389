#include "kernels/model_from_spec.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/table_spec.h"

namespace fulcrum {
namespace {

kernels::Activation ActivationOf(v1::Activation activation) {
  switch (activation) {
    case v1::TANH: return kernels::Activation::kTanh;
    case v1::SIGMOID: return kernels::Activation::kSigmoid;
    default: return kernels::Activation::kRelu;
  }
}

// Proto enums onto the kernels' (the scheduler refused numbers outside the
// proto's enums: CheckWellFormed).
kernels::GraphLayer LayerOf(const v1::LayerSpec& spec) {
  kernels::GraphLayer layer;
  layer.name = spec.name();
  layer.type = spec.type() >= v1::LayerSpec::DENSE_INPUT && spec.type() <= v1::LayerSpec::LOSS
                   ? static_cast<kernels::LayerType>(spec.type())
                   : kernels::LayerType::kUnspecified;
  layer.inputs.assign(spec.inputs().begin(), spec.inputs().end());
  layer.units = spec.units();
  layer.table = spec.table();
  layer.dim = spec.dim();
  layer.fields.assign(spec.fields().begin(), spec.fields().end());
  layer.combiner = spec.combiner() == v1::ModelSpec::MEAN ? kernels::BagCombiner::kMean : kernels::BagCombiner::kSum;
  switch (spec.activation()) {
    case v1::RELU: layer.activation = kernels::Activation::kRelu; break;
    case v1::TANH: layer.activation = kernels::Activation::kTanh; break;
    case v1::SIGMOID: layer.activation = kernels::Activation::kSigmoid; break;
    default: layer.activation = kernels::Activation::kNone;
  }
  switch (spec.loss()) {
    case v1::LayerSpec::SOFTMAX_CROSS_ENTROPY: layer.loss = kernels::LossKind::kSoftmaxCrossEntropy; break;
    case v1::LayerSpec::MEAN_SQUARED_ERROR: layer.loss = kernels::LossKind::kMeanSquaredError; break;
    default: layer.loss = kernels::LossKind::kSigmoidCrossEntropy;
  }
  layer.bias = spec.bias();
  return layer;
}

ModelLayout GraphLayout(const v1::JobSpec& spec) {
  ModelLayout layout;
  layout.click = true;
  layout.graph = true;
  kernels::GraphConfig& graph = layout.graph_config;
  graph.num_fields = ClickFields(spec.data());
  graph.num_dense = ClickDense(spec.data());
  graph.layers = GraphLayersOf(spec.model());
  if (!kernels::ValidateGraphConfig(graph).ok()) return layout;  // no tensors or tables: validation says why
  layout.tensors = kernels::GraphDenseTensors(graph);
  layout.tables = kernels::GraphTables(graph);
  layout.table_fields = kernels::GraphTableFields(graph);
  return layout;
}

ModelLayout ClickLayout(const v1::JobSpec& spec) {
  const v1::ModelSpec& model = spec.model();
  if (model.kind() == v1::ModelSpec::GRAPH) return GraphLayout(spec);
  ModelLayout layout;
  layout.click = true;
  kernels::CtrModelConfig& ctr = layout.ctr;
  ctr.num_fields = ClickFields(spec.data());
  ctr.num_dense = ClickDense(spec.data());
  const bool dlrm = model.kind() == v1::ModelSpec::DLRM;
  ctr.linear = !dlrm;
  ctr.fm = model.kind() == v1::ModelSpec::FM || model.kind() == v1::ModelSpec::DEEPFM;
  if (model.kind() == v1::ModelSpec::WIDE_AND_DEEP || model.kind() == v1::ModelSpec::DEEPFM || dlrm) {
    ctr.hidden.assign(model.hidden_sizes().begin(), model.hidden_sizes().end());
  }
  ctr.dot_interaction = dlrm;
  if (dlrm) ctr.bottom.assign(model.bottom_sizes().begin(), model.bottom_sizes().end());
  if (model.kind() != v1::ModelSpec::LOGISTIC_REGRESSION) ctr.embedding_dim = model.embedding_dim();
  ctr.activation = ActivationOf(model.activation());
  ctr.combiner = model.combiner() == v1::ModelSpec::MEAN ? kernels::BagCombiner::kMean : kernels::BagCombiner::kSum;
  layout.tensors = kernels::CtrDenseTensors(ctr);
  layout.tables = kernels::CtrTables(ctr);
  std::vector<int32_t> every_field(static_cast<size_t>(std::max(0, ctr.num_fields)));
  for (size_t f = 0; f < every_field.size(); ++f) every_field[f] = static_cast<int32_t>(f);
  layout.table_fields.assign(layout.tables.size(), every_field);
  return layout;
}

}  // namespace

std::vector<kernels::GraphLayer> GraphLayersOf(const v1::ModelSpec& model) {
  std::vector<kernels::GraphLayer> layers;
  for (const v1::LayerSpec& layer : model.layers()) layers.push_back(LayerOf(layer));
  return layers;
}

int64_t ClickComputeBatch(const v1::JobSpec& spec) {
  return std::max<int64_t>(spec.data().batch_size(), kClickEvalBatch);
}

int64_t ClickValuesPerExample(const ModelLayout& layout) {
  if (layout.graph) return kernels::GraphValuesPerExample(layout.graph_config);
  if (!layout.click || !kernels::ValidateCtrModelConfig(layout.ctr).ok()) return 0;
  return kernels::GraphValuesPerExample(kernels::CtrModelAsGraph(layout.ctr));
}

bool TrainsOnClickPath(const v1::JobSpec& spec) {
  if (IsClickModel(spec)) return true;
  if (spec.model().kind() != v1::ModelSpec::GRAPH) return false;
  std::vector<int> hidden;
  kernels::Activation activation;
  std::vector<std::string> names;
  return !kernels::GraphAsMlp(GraphLayersOf(spec.model()), 0, &hidden, &activation, &names).ok();
}

ModelLayout LayoutFor(const v1::JobSpec& spec, int features, int classes) {
  if (TrainsOnClickPath(spec)) return ClickLayout(spec);
  ModelLayout layout;
  layout.config.input_dim = features;
  layout.config.num_classes = classes;
  if (spec.model().kind() == v1::ModelSpec::MLP) {
    layout.config.hidden.assign(spec.model().hidden_sizes().begin(), spec.model().hidden_sizes().end());
  }
  layout.config.activation = ActivationOf(spec.model().activation());
  std::vector<std::string> names;  // a GRAPH's: its LINEAR layers'
  if (spec.model().kind() == v1::ModelSpec::GRAPH) {
    const std::vector<kernels::GraphLayer> layers = GraphLayersOf(spec.model());
    // An MLP's shape (TrainsOnClickPath took the others).
    if (!kernels::GraphAsMlp(layers, 0, &layout.config.hidden, &layout.config.activation, &names).ok()) return layout;
    // Without hidden layers the activation is unused; the kinds say relu.
    if (layout.config.activation == kernels::Activation::kNone) layout.config.activation = kernels::Activation::kRelu;
  }
  layout.tensors = kernels::MlpTensors(layout.config);
  // The same tensors in the same order as the kind MLP (so the same
  // initial values, which follow the tensor's index), named after the layers.
  for (size_t i = 0; i < names.size() && 2 * i + 1 < layout.tensors.size(); ++i) {
    layout.tensors[2 * i].name = names[i] + ".weight";
    layout.tensors[2 * i + 1].name = names[i] + ".bias";
  }
  return layout;
}

}  // namespace fulcrum
