#include "common/finite.h"

#include <cmath>
#include <cstring>

#include "common/vector_clones.h"

namespace fulcrum {
namespace {

// Whether any of n floats is an infinity or NaN: the largest magnitude bits
// (a max reduction, which vectorizes) reach the all-ones exponent.
FULCRUM_VECTOR_CLONES bool AnyNonFinite(int64_t n, const float* __restrict values) {
  uint32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof(bits));
    bits &= 0x7fffffffu;
    largest = bits > largest ? bits : largest;
  }
  return largest >= 0x7f800000u;
}

}  // namespace

int64_t FirstNonFinite(const float* values, int64_t n) {
  if (n <= 0 || !AnyNonFinite(n, values)) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(values[i])) return i;
  }
  return -1;
}

}  // namespace fulcrum
