// Helpers shared by the unit tests.
#ifndef FULCRUM_COMMON_TEST_UTIL_H_
#define FULCRUM_COMMON_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"

namespace fulcrum {

// EXPECT_TRUE(Contains(status.message(), "data.batchSize"));
inline ::testing::AssertionResult Contains(absl::string_view haystack, absl::string_view needle) {
  if (haystack.find(needle) != absl::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << haystack << "\" does not contain \"" << needle << "\"";
}

// A float's bit pattern, and the float of a bit pattern.
inline uint32_t ToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

inline float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_TEST_UTIL_H_
