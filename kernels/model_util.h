// What the CPU models share (Mlp, kernels/mlp.h; the click models CtrModel,
// kernels/ctr_model.h, and GraphModel, kernels/graph_model.h): the click
// models' limits on their inputs, the checks of the pointer lists their
// calls take, and a sigmoid that does not overflow.

#ifndef FULCRUM_KERNELS_MODEL_UTIL_H_
#define FULCRUM_KERNELS_MODEL_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fulcrum {
namespace kernels {

// Categorical fields and dense features a click model takes at most.
inline constexpr int64_t kMaxClickFields = 4096;
inline constexpr int64_t kMaxClickDense = 65536;

template <typename T>
bool AnyNull(const std::vector<T*>& pointers) {
  return std::any_of(pointers.begin(), pointers.end(), [](T* p) { return p == nullptr; });
}

// INVALID_ARGUMENT from `model` when a call gave `actual` pointers of `what`
// where it takes `expected` (`see`: where the list is described), or a null
// one.
inline absl::Status CheckPointers(absl::string_view model, absl::string_view see, absl::string_view what,
                                  size_t expected, size_t actual, bool any_null) {
  if (actual != expected) {
    return absl::InvalidArgumentError(absl::StrCat(model, ": got ", actual, " ", what, " pointers, expected ",
                                                   expected, " (see ", see, ")"));
  }
  if (any_null) return absl::InvalidArgumentError(absl::StrCat(model, ": a ", what, " pointer is null"));
  return absl::OkStatus();
}

// 1 / (1 + e^-z), without overflow for large |z|.
inline float Sigmoid(float z) {
  if (z >= 0.0f) return 1.0f / (1.0f + std::exp(-z));
  const float e = std::exp(z);
  return e / (1.0f + e);
}

}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_MODEL_UTIL_H_
