#include "common/param_init.h"

#include <algorithm>
#include <cstdint>

namespace fulcrum {

float BitsToUnitFloat(uint64_t bits) {
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

void FillInit(InitKind kind, float scale, uint64_t seed, uint32_t tensor_index,
              int64_t offset, int64_t count, float* out) {
  if (count <= 0) return;
  if (kind != InitKind::kUniform) {
    std::fill(out, out + count, 0.0f);
    return;
  }
  // Per-tensor key; elements are then a counter-based stream off that key.
  const uint64_t key = SplitMix64(SplitMix64(seed) ^ tensor_index);
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t bits = SplitMix64(key + static_cast<uint64_t>(offset + i));
    out[i] = scale * (2.0f * BitsToUnitFloat(bits) - 1.0f);
  }
}

}  // namespace fulcrum
