#include "server/buffer_pool.h"

#include <utility>

namespace fulcrum {

FloatBufferPool::Buffer& FloatBufferPool::Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    if (pool_ != nullptr && data_ != nullptr) pool_->Return(std::move(data_), capacity_);
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::move(other.data_);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

FloatBufferPool::Buffer::~Buffer() {
  if (pool_ != nullptr && data_ != nullptr) pool_->Return(std::move(data_), capacity_);
}

FloatBufferPool::Buffer FloatBufferPool::Acquire(int64_t n) {
  Buffer buffer;
  buffer.pool_ = this;
  {
    MutexLock lock(&mu_);
    auto fit = kept_.lower_bound(n);
    if (fit != kept_.end() && fit->first <= 2 * n) {
      buffer.capacity_ = fit->first;
      buffer.data_ = std::move(fit->second);
      kept_bytes_ -= fit->first * static_cast<int64_t>(sizeof(float));
      kept_.erase(fit);
      return buffer;
    }
  }
  buffer.capacity_ = n;
  buffer.data_.reset(new float[static_cast<size_t>(n)]);  // no zero fill: it is overwritten
  return buffer;
}

void FloatBufferPool::Return(std::unique_ptr<float[]> data, int64_t capacity) {
  const int64_t bytes = capacity * static_cast<int64_t>(sizeof(float));
  MutexLock lock(&mu_);
  if (kept_bytes_ + bytes > max_kept_bytes_) return;  // freed as `data` goes
  kept_bytes_ += bytes;
  kept_.emplace(capacity, std::move(data));
}

int64_t FloatBufferPool::kept_bytes() const {
  MutexLock lock(&mu_);
  return kept_bytes_;
}

}  // namespace fulcrum
