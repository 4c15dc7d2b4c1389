// Reused float buffers for the gradients of pushes. A push's values are
// decoded into memory an earlier push already used (faulted in and warm in
// the caches) instead of into a fresh allocation per request, which the
// kernel maps and zeroes page by page and takes back when it is freed: on a
// data plane moving gigabytes a second that churn, not the bytes, was the
// cost. Thread-safe.
#ifndef FULCRUM_SERVER_BUFFER_POOL_H_
#define FULCRUM_SERVER_BUFFER_POOL_H_

#include <cstdint>
#include <map>
#include <memory>

#include "common/sync.h"

namespace fulcrum {

class FloatBufferPool {
 public:
  // Keeps at most `max_kept_bytes` of returned buffers; beyond that a
  // returned buffer is freed.
  explicit FloatBufferPool(int64_t max_kept_bytes) : max_kept_bytes_(max_kept_bytes) {}
  FloatBufferPool(const FloatBufferPool&) = delete;
  FloatBufferPool& operator=(const FloatBufferPool&) = delete;

  // Room for some floats, uninitialized; back to the pool when destroyed.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&& other) noexcept { *this = std::move(other); }
    Buffer& operator=(Buffer&& other) noexcept;
    ~Buffer();

    float* data() const { return data_.get(); }
    int64_t capacity() const { return capacity_; }

   private:
    friend class FloatBufferPool;
    FloatBufferPool* pool_ = nullptr;
    std::unique_ptr<float[]> data_;
    int64_t capacity_ = 0;
  };

  // A buffer of at least n floats: the smallest kept one that is big enough
  // and at most twice n, else a new one of n.
  Buffer Acquire(int64_t n);

  int64_t kept_bytes() const;

 private:
  void Return(std::unique_ptr<float[]> data, int64_t capacity);

  const int64_t max_kept_bytes_;
  mutable Mutex mu_;
  std::multimap<int64_t, std::unique_ptr<float[]>> kept_ ABSL_GUARDED_BY(mu_);  // by capacity
  int64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_BUFFER_POOL_H_
