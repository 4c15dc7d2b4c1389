#include "common/param_init.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace fulcrum {
namespace {

std::vector<float> Fill(InitKind kind, float scale, uint64_t seed,
                        uint32_t tensor, int64_t offset, int64_t count) {
  std::vector<float> out(count, -1234.0f);
  FillInit(kind, scale, seed, tensor, offset, count, out.data());
  return out;
}

TEST(ParamInitTest, ChunkIndependent) {
  const int64_t n = 1000;
  const std::vector<float> whole = Fill(InitKind::kUniform, 0.5f, 42, 3, 0, n);
  for (int64_t split : {int64_t{1}, int64_t{333}, n - 1}) {
    std::vector<float> pieces = Fill(InitKind::kUniform, 0.5f, 42, 3, 0, split);
    const std::vector<float> rest =
        Fill(InitKind::kUniform, 0.5f, 42, 3, split, n - split);
    pieces.insert(pieces.end(), rest.begin(), rest.end());
    EXPECT_EQ(pieces, whole) << "split at " << split;
  }
}

TEST(ParamInitTest, UniformStaysInRangeAndIsCentered) {
  const float scale = 0.25f;
  const std::vector<float> v = Fill(InitKind::kUniform, scale, 7, 0, 0, 100000);
  double sum = 0, min = scale, max = -scale;
  for (float x : v) {
    ASSERT_GE(x, -scale);
    ASSERT_LE(x, scale);
    sum += x;
    min = std::min<double>(min, x);
    max = std::max<double>(max, x);
  }
  EXPECT_NEAR(sum / v.size(), 0.0, 0.01 * scale);
  EXPECT_LT(min, -0.99 * scale);
  EXPECT_GT(max, 0.99 * scale);
}

TEST(ParamInitTest, Deterministic) {
  EXPECT_EQ(Fill(InitKind::kUniform, 1.0f, 9, 1, 5, 64),
            Fill(InitKind::kUniform, 1.0f, 9, 1, 5, 64));
}

TEST(ParamInitTest, SeedsAndTensorsGiveDifferentValues) {
  const std::vector<float> base = Fill(InitKind::kUniform, 1.0f, 1, 0, 0, 64);
  EXPECT_NE(base, Fill(InitKind::kUniform, 1.0f, 2, 0, 0, 64));
  EXPECT_NE(base, Fill(InitKind::kUniform, 1.0f, 1, 1, 0, 64));
}

TEST(ParamInitTest, ZerosIgnoresScaleAndSeed) {
  EXPECT_EQ(Fill(InitKind::kZeros, 3.0f, 11, 2, 100, 17),
            std::vector<float>(17, 0.0f));
}

TEST(ParamInitTest, NonPositiveCountWritesNothing) {
  float sentinel = 5.0f;
  FillInit(InitKind::kUniform, 1.0f, 1, 0, 0, 0, &sentinel);
  FillInit(InitKind::kZeros, 1.0f, 1, 0, 0, -3, &sentinel);
  EXPECT_EQ(sentinel, 5.0f);
}

}  // namespace
}  // namespace fulcrum
