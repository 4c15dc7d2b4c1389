// Deterministic, counter-based parameter initialization.
//
// The value of element i of tensor t depends only on (seed, t, i), never on
// how the tensor is split into chunks or on which process fills it. This lets
// parameter-server shards initialize their slices independently and still
// agree bit-for-bit with a single-process initialization.

#ifndef FULCRUM_COMMON_PARAM_INIT_H_
#define FULCRUM_COMMON_PARAM_INIT_H_

#include <cstdint>

namespace fulcrum {

// How a tensor is initialized. kZeros: all 0. kUniform: independent values in
// [-scale, scale].
enum class InitKind { kZeros, kUniform };

// The splitmix64 finalizer applied to x + 0x9e3779b97f4a7c15: a fast,
// well-mixed 64-bit bijection. Also usable as a counter-based random stream:
// SplitMix64(key + i) for i = 0, 1, ... .
// Inline: sparse tables hash every key of a push with it, several times.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Returns a uniformly distributed float in [0, 1) built from the top 24 bits
// of `bits` (so every value is exactly representable).
float BitsToUnitFloat(uint64_t bits);

// Writes out[i] = value of element (offset + i) of tensor `tensor_index` for
// i in [0, count). For kUniform, values lie in [-scale, scale]; scale is
// ignored for kZeros. count <= 0 writes nothing. `out` must hold count floats.
void FillInit(InitKind kind, float scale, uint64_t seed, uint32_t tensor_index,
              int64_t offset, int64_t count, float* out);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_PARAM_INIT_H_
