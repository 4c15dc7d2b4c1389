// Helpers shared by the unit tests.
#ifndef FULCRUM_COMMON_TEST_UTIL_H_
#define FULCRUM_COMMON_TEST_UTIL_H_

#include <gtest/gtest.h>

#include "absl/strings/string_view.h"

namespace fulcrum {

// EXPECT_TRUE(Contains(status.message(), "data.batchSize"));
inline ::testing::AssertionResult Contains(absl::string_view haystack, absl::string_view needle) {
  if (haystack.find(needle) != absl::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << haystack << "\" does not contain \"" << needle << "\"";
}

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_TEST_UTIL_H_
