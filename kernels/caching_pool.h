// A caching allocator by size class, shared by the CPU backend (host memory)
// and the CUDA backend (device memory).
//
// Requests are rounded up to a size class (256 bytes, powers of two up to
// 1 MiB, then multiples of 1 MiB). A freed block goes to its class's free
// list and the next request of that class gets it back, so a training loop
// that repeats the same shapes stops calling the system allocator after its
// first step. When the raw allocator is out of memory, the pool gives its
// cached blocks back and tries once more.
//
// Not thread-safe (backends are used from one thread). The pool releases every
// block, cached or live, when destroyed.

#ifndef FULCRUM_KERNELS_CACHING_POOL_H_
#define FULCRUM_KERNELS_CACHING_POOL_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace fulcrum {
namespace kernels {

// RawAllocator provides
//   absl::StatusOr<void*> Allocate(size_t bytes);  // 256-byte aligned
//   void Free(void* block);
// and reports exhaustion as RESOURCE_EXHAUSTED.
template <typename RawAllocator>
class CachingPool {
 public:
  static constexpr size_t kMinClass = 256;
  static constexpr size_t kLargeGranule = size_t{1} << 20;

  struct Stats {
    size_t live_bytes = 0;        // handed out and not yet freed
    size_t cached_bytes = 0;      // on the free lists
    int64_t raw_allocations = 0;  // calls that reached the raw allocator
  };

  // Frees go back to the raw allocator instead of the free lists once the
  // cache would hold more than `max_cached_bytes`.
  CachingPool(RawAllocator raw, size_t max_cached_bytes)
      : raw_(std::move(raw)), max_cached_bytes_(max_cached_bytes) {}
  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;
  ~CachingPool() { ReleaseAll(); }

  // The size a request of `bytes` is served with; 0 if it overflows.
  static size_t SizeClass(size_t bytes) {
    if (bytes <= kMinClass) return kMinClass;
    if (bytes <= kLargeGranule) {
      size_t size = kMinClass;
      while (size < bytes) size <<= 1;
      return size;
    }
    if (bytes > std::numeric_limits<size_t>::max() - kLargeGranule) return 0;
    return (bytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
  }

  absl::StatusOr<void*> Allocate(size_t bytes) {
    const size_t size = SizeClass(bytes);
    if (size == 0)
      return absl::ResourceExhaustedError(absl::StrCat("Allocate: ", bytes, " bytes is too large"));
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      void* block = it->second.back();
      it->second.pop_back();
      stats_.cached_bytes -= size;
      return Hand(block, size);
    }
    absl::StatusOr<void*> block = raw_.Allocate(size);
    if (!block.ok() && absl::IsResourceExhausted(block.status()) && stats_.cached_bytes > 0) {
      ReleaseCached();
      block = raw_.Allocate(size);
    }
    if (!block.ok()) return block.status();
    ++stats_.raw_allocations;
    return Hand(*block, size);
  }

  // Takes `block` back; false (and nothing done) when the pool did not hand
  // it out. nullptr is accepted and ignored.
  bool Free(void* block) {
    if (block == nullptr) return true;
    auto it = live_.find(block);
    if (it == live_.end()) return false;
    const size_t size = it->second;
    live_.erase(it);
    stats_.live_bytes -= size;
    if (stats_.cached_bytes + size > max_cached_bytes_) {
      raw_.Free(block);
    } else {
      free_[size].push_back(block);
      stats_.cached_bytes += size;
    }
    return true;
  }

  // Gives every cached (free) block back to the raw allocator.
  void ReleaseCached() {
    for (auto& entry : free_) {
      for (void* block : entry.second) raw_.Free(block);
    }
    free_.clear();
    stats_.cached_bytes = 0;
  }

  const Stats& stats() const { return stats_; }
  RawAllocator& raw() { return raw_; }

 private:
  void* Hand(void* block, size_t size) {
    live_[block] = size;
    stats_.live_bytes += size;
    return block;
  }

  void ReleaseAll() {
    ReleaseCached();
    for (auto& entry : live_) raw_.Free(entry.first);
    live_.clear();
    stats_.live_bytes = 0;
  }

  RawAllocator raw_;
  const size_t max_cached_bytes_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // size class -> blocks
  std::unordered_map<void*, size_t> live_;               // block -> size class
  Stats stats_;
};

}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_CACHING_POOL_H_
