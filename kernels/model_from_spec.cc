#include "kernels/model_from_spec.h"

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

ModelLayout ClickLayout(const v1::JobSpec& spec) {
  const v1::ModelSpec& model = spec.model();
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
  return layout;
}

}  // namespace

ModelLayout LayoutFor(const v1::JobSpec& spec, int features, int classes) {
  if (IsClickModel(spec.model())) return ClickLayout(spec);
  ModelLayout layout;
  layout.config.input_dim = features;
  layout.config.num_classes = classes;
  if (spec.model().kind() == v1::ModelSpec::MLP) {
    layout.config.hidden.assign(spec.model().hidden_sizes().begin(), spec.model().hidden_sizes().end());
  }
  layout.config.activation = ActivationOf(spec.model().activation());
  layout.tensors = kernels::MlpTensors(layout.config);
  return layout;
}

}  // namespace fulcrum
