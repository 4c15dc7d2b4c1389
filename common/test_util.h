// Helpers shared by the unit tests.
#ifndef FULCRUM_COMMON_TEST_UTIL_H_
#define FULCRUM_COMMON_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "fulcrum/v1/job.pb.h"

namespace fulcrum {

// EXPECT_TRUE(Contains(status.message(), "data.batchSize"));
inline ::testing::AssertionResult Contains(absl::string_view haystack, absl::string_view needle) {
  if (haystack.find(needle) != absl::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << haystack << "\" does not contain \"" << needle << "\"";
}

// Appends a layer to a GRAPH model: model->layers += {name, type, inputs}.
inline v1::LayerSpec* AddLayer(v1::ModelSpec* model, const std::string& name, v1::LayerSpec::Type type,
                               const std::vector<std::string>& inputs = {}) {
  v1::LayerSpec* layer = model->add_layers();
  layer->set_name(name);
  layer->set_type(type);
  for (const std::string& input : inputs) layer->add_inputs(input);
  return layer;
}

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_TEST_UTIL_H_
