#include "common/repeated_key.h"

#include <random>
#include <vector>

#include "common/param_init.h"

namespace fulcrum {
namespace {

constexpr size_t kKeptSlots = size_t{1} << 16;

}  // namespace

uint64_t ProcessHashSeed() {
  static const uint64_t seed = [] {
    std::random_device device;
    return (uint64_t{device()} << 32) ^ device();
  }();
  return seed;
}

int64_t FirstRepeatedKey(absl::Span<const uint64_t> keys) {
  if (keys.size() < 2) return -1;
  size_t slots = 16;
  while (slots < 2 * keys.size()) slots *= 2;
  thread_local std::vector<uint64_t> kept;
  std::vector<uint64_t> own;
  std::vector<uint64_t>& set = slots <= kKeptSlots ? kept : own;
  // 0 marks an empty slot; the key 0 is tracked beside the set.
  set.assign(slots, 0);
  const uint64_t seed = ProcessHashSeed();
  const size_t mask = slots - 1;
  bool zero_seen = false;
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t key = keys[i];
    if (key == 0) {
      if (zero_seen) return static_cast<int64_t>(i);
      zero_seen = true;
      continue;
    }
    for (size_t slot = static_cast<size_t>(SplitMix64(key ^ seed)) & mask;; slot = (slot + 1) & mask) {
      if (set[slot] == 0) {
        set[slot] = key;
        break;
      }
      if (set[slot] == key) return static_cast<int64_t>(i);
    }
  }
  return -1;
}

}  // namespace fulcrum
