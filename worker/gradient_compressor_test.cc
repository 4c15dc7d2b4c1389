#include "worker/gradient_compressor.h"

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/tensor_codec.h"

namespace fulcrum {
namespace {

// What the servers take from one encoded chunk.
std::vector<float> Decoded(const GradientCompressor& compressor, const std::string& bytes, int64_t n) {
  std::vector<float> values(static_cast<size_t>(n));
  EXPECT_TRUE(DecodeValues(compressor.format(), bytes, n, values.data(), "test").ok());
  return values;
}

TEST(GradientCompressorTest, TopKDeliversWhatItLeavesOutInLaterPushes) {
  // One tensor of 10 values, 2 sent a push: a constant gradient's values all
  // arrive in the end, the largest first, and nothing is lost on the way.
  GradientCompressor compressor(v1::CompressionSpec::TOPK, 0.2, {10});
  const std::vector<float> grad = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<float> delivered(10, 0.0f);
  for (int step = 0; step < 40; ++step) {  // value 1 first goes at step 21
    std::string bytes;
    ASSERT_TRUE(compressor.Encode(/*partition=*/0, /*tensor=*/0, 0, grad.data(), 10, &bytes).ok());
    EXPECT_EQ(bytes.size(), 16u);
    std::vector<float> sent = Decoded(compressor, bytes, 10);
    for (int i = 0; i < 10; ++i) delivered[i] += sent[i];
    // Sent plus kept is everything pushed so far, value by value.
    std::vector<float> kept = compressor.Residual(0, 0);
    for (int i = 0; i < 10; ++i) {
      EXPECT_FLOAT_EQ(delivered[i] + kept[i], grad[i] * static_cast<float>(step + 1)) << "step " << step << " i " << i;
    }
  }
  for (int i = 0; i < 10; ++i) EXPECT_GT(delivered[i], 0.0f) << "value " << i << " never sent";
}

TEST(GradientCompressorTest, Int8CarriesTheRoundingIntoTheNextPush) {
  GradientCompressor compressor(v1::CompressionSpec::INT8, 0, {4});
  const std::vector<float> grad = {1.0f, 0.003f, -0.5f, 0.3f};
  std::string bytes;
  ASSERT_TRUE(compressor.Encode(0, 0, 0, grad.data(), 4, &bytes).ok());
  EXPECT_EQ(bytes.size(), 8u);
  std::vector<float> sent = Decoded(compressor, bytes, 4);
  std::vector<float> kept = compressor.Residual(0, 0);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(sent[i] + kept[i], grad[i]);
  EXPECT_EQ(sent[1], 0.0f);  // below half a step (0.5 / 127): kept for later
  // Over many pushes the small value gets through.
  float delivered = sent[1];
  for (int step = 0; step < 10; ++step) {
    ASSERT_TRUE(compressor.Encode(0, 0, 0, grad.data(), 4, &bytes).ok());
    delivered += Decoded(compressor, bytes, 4)[1];
  }
  EXPECT_NEAR(delivered, 11 * 0.003f, 1.0f / 127);
  EXPECT_GT(delivered, 0.0f);
}

TEST(GradientCompressorTest, ChunksOfATensorAndPartitionsKeepTheirOwnResiduals) {
  GradientCompressor compressor(v1::CompressionSpec::TOPK, 0.5, {4, 2});
  const float grad[4] = {4, 3, 2, 1};
  std::string bytes;
  // Chunk [2, 4) of tensor 0 from partition 1: keeps 1 at offset 3 only.
  ASSERT_TRUE(compressor.Encode(1, 0, 2, grad + 2, 2, &bytes).ok());
  EXPECT_EQ(compressor.Residual(1, 0), (std::vector<float>{0, 0, 0, 1}));
  EXPECT_TRUE(compressor.Residual(0, 0).empty());
  EXPECT_TRUE(compressor.Residual(1, 1).empty());
  ASSERT_TRUE(compressor.Encode(0, 0, 0, grad, 2, &bytes).ok());
  EXPECT_EQ(compressor.Residual(0, 0), (std::vector<float>{0, 3, 0, 0}));
  EXPECT_EQ(compressor.Residual(1, 0), (std::vector<float>{0, 0, 0, 1}));
}

TEST(GradientCompressorTest, KeepsTheResidualsOfTheMostRecentPartitionsOnly) {
  GradientCompressor compressor(v1::CompressionSpec::TOPK, 0.5, {2});
  const float grad[2] = {2, 1};
  std::string bytes;
  for (int32_t p = 0; p <= GradientCompressor::kMaxPartitions; ++p) {
    ASSERT_TRUE(compressor.Encode(p, 0, 0, grad, 2, &bytes).ok());
  }
  EXPECT_TRUE(compressor.Residual(0, 0).empty()) << "the oldest partition's residual is dropped";
  for (int32_t p = 1; p <= GradientCompressor::kMaxPartitions; ++p) {
    EXPECT_EQ(compressor.Residual(p, 0), (std::vector<float>{0, 1})) << p;
  }
}

TEST(GradientCompressorTest, ForGivesNoneForNoCompressionAndTheDefaultRatio) {
  EXPECT_EQ(GradientCompressor::For(v1::CompressionSpec(), {10}), nullptr);
  v1::CompressionSpec topk;
  topk.set_kind(v1::CompressionSpec::TOPK);
  auto compressor = GradientCompressor::For(topk, {1000});
  ASSERT_NE(compressor, nullptr);
  EXPECT_EQ(compressor->format(), v1::WIRE_TOPK);
  std::vector<float> grad(1000, 1.0f);
  std::string bytes;
  ASSERT_TRUE(compressor->Encode(0, 0, 0, grad.data(), 1000, &bytes).ok());
  EXPECT_EQ(bytes.size(), 80u);  // 1% of 1000 values, 8 bytes each
}

}  // namespace
}  // namespace fulcrum
