#include "kernels/model_from_spec.h"

namespace fulcrum {

ModelLayout LayoutFor(const v1::JobSpec& spec, int features, int classes) {
  ModelLayout layout;
  layout.config.input_dim = features;
  layout.config.num_classes = classes;
  if (spec.model().kind() == v1::ModelSpec::MLP) {
    layout.config.hidden.assign(spec.model().hidden_sizes().begin(), spec.model().hidden_sizes().end());
  }
  switch (spec.model().activation()) {
    case v1::TANH: layout.config.activation = kernels::Activation::kTanh; break;
    case v1::SIGMOID: layout.config.activation = kernels::Activation::kSigmoid; break;
    default: layout.config.activation = kernels::Activation::kRelu; break;
  }
  layout.tensors = kernels::MlpTensors(layout.config);
  return layout;
}

}  // namespace fulcrum
