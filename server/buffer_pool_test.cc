#include "server/buffer_pool.h"

#include <gtest/gtest.h>

namespace fulcrum {
namespace {

TEST(FloatBufferPoolTest, AReturnedBufferIsReusedForTheNextRequestOfItsSize) {
  FloatBufferPool pool(1 << 20);
  float* first = nullptr;
  {
    FloatBufferPool::Buffer buffer = pool.Acquire(1000);
    first = buffer.data();
    EXPECT_EQ(buffer.capacity(), 1000);
    EXPECT_EQ(pool.kept_bytes(), 0);
  }
  EXPECT_EQ(pool.kept_bytes(), 4000);
  FloatBufferPool::Buffer again = pool.Acquire(900);
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(again.capacity(), 1000);
  EXPECT_EQ(pool.kept_bytes(), 0);
}

TEST(FloatBufferPoolTest, ABufferMoreThanTwiceTheRequestIsNotHandedOut) {
  FloatBufferPool pool(1 << 20);
  { FloatBufferPool::Buffer big = pool.Acquire(10000); }
  FloatBufferPool::Buffer small = pool.Acquire(100);
  EXPECT_EQ(small.capacity(), 100);
  EXPECT_EQ(pool.kept_bytes(), 40000);  // the big one stays for a big request
}

TEST(FloatBufferPoolTest, KeepsNoMoreThanItsLimit) {
  FloatBufferPool pool(10000);
  {
    FloatBufferPool::Buffer a = pool.Acquire(2000);  // 8000 bytes
    FloatBufferPool::Buffer b = pool.Acquire(2000);
  }
  EXPECT_EQ(pool.kept_bytes(), 8000);  // the second did not fit and was freed
}

TEST(FloatBufferPoolTest, AMovedBufferReturnsOnce) {
  FloatBufferPool pool(1 << 20);
  {
    FloatBufferPool::Buffer a = pool.Acquire(10);
    FloatBufferPool::Buffer b = std::move(a);
    FloatBufferPool::Buffer c = pool.Acquire(10);
    c = std::move(b);  // c's own buffer goes back now
    EXPECT_EQ(pool.kept_bytes(), 40);
  }
  EXPECT_EQ(pool.kept_bytes(), 80);
}

}  // namespace
}  // namespace fulcrum
