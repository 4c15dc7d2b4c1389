// A counter-based stream of random variates: value i of the stream keyed by
// `key` is a function of (key, i) alone, so any process makes the same
// values in any order. For seeded synthetic data.
#ifndef FULCRUM_COMMON_COUNTER_RNG_H_
#define FULCRUM_COMMON_COUNTER_RNG_H_

#include <cmath>
#include <cstdint>

#include "common/param_init.h"

namespace fulcrum {

class CounterRng {
 public:
  explicit CounterRng(uint64_t key) : key_(key) {}

  uint64_t NextBits() { return SplitMix64(key_ + counter_++); }

  // Uniform in (0, 1].
  double Uniform() { return (static_cast<double>(NextBits() >> 11) + 1.0) * 0x1.0p-53; }

  // Standard normal (Box-Muller, one value per pair of uniforms).
  double Normal() {
    constexpr double kTwoPi = 6.283185307179586;
    const double radius = std::sqrt(-2.0 * std::log(Uniform()));
    return radius * std::cos(kTwoPi * Uniform());
  }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_COUNTER_RNG_H_
