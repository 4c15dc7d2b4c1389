#include "common/tensor_codec.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/half.h"
#include "common/test_util.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

TEST(TensorCodecTest, RoundTripIsBitExactIncludingSpecialValues) {
  const std::vector<float> in = {
      0.0f,
      -0.0f,
      1.0f,
      -2.5f,
      3.14159265f,
      std::numeric_limits<float>::max(),
      std::numeric_limits<float>::lowest(),
      std::numeric_limits<float>::min(),
      std::numeric_limits<float>::denorm_min(),
      -std::numeric_limits<float>::denorm_min(),
      BitsFloat(0x00012345u),  // another denormal
      std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::quiet_NaN(),
      BitsFloat(0x7fa00001u),  // signalling NaN payload
      BitsFloat(0xffc12345u),  // negative NaN with payload
  };
  std::string bytes;
  EncodeFloats(in.data(), static_cast<int64_t>(in.size()), &bytes);
  ASSERT_EQ(bytes.size(), in.size() * 4);

  std::vector<float> out(in.size(), 99.0f);
  ASSERT_TRUE(DecodeFloats(bytes, static_cast<int64_t>(in.size()), out.data(),
                           "values")
                  .ok());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(FloatBits(out[i]), FloatBits(in[i])) << "index " << i;
  }
}

TEST(TensorCodecTest, EmptyRoundTrip) {
  std::string bytes = "garbage";
  EncodeFloats(nullptr, 0, &bytes);
  EXPECT_TRUE(bytes.empty());
  EXPECT_TRUE(DecodeFloats(bytes, 0, nullptr, "empty").ok());
}

TEST(TensorCodecTest, EncodeReplacesPreviousContents) {
  std::string bytes(100, 'x');
  const float v[2] = {1.0f, 2.0f};
  EncodeFloats(v, 2, &bytes);
  EXPECT_EQ(bytes.size(), 8u);
}

TEST(TensorCodecTest, ByteLayoutIsLittleEndian) {
  // 1.0f is 0x3f800000.
  const float one = 1.0f;
  std::string bytes;
  EncodeFloats(&one, 1, &bytes);
  ASSERT_EQ(bytes.size(), 4u);
  EXPECT_EQ(static_cast<uint8_t>(bytes[0]), 0x00);
  EXPECT_EQ(static_cast<uint8_t>(bytes[1]), 0x00);
  EXPECT_EQ(static_cast<uint8_t>(bytes[2]), 0x80);
  EXPECT_EQ(static_cast<uint8_t>(bytes[3]), 0x3f);

  // And decoding hand-written little-endian bytes gives the value back.
  const std::string le("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8);  // 1.0, -2.0
  float out[2];
  ASSERT_TRUE(DecodeFloats(le, 2, out, "le").ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
}

TEST(TensorCodecTest, SizeMismatchIsInvalidArgumentNamingWhat) {
  const float v[3] = {1.0f, 2.0f, 3.0f};
  std::string bytes;
  EncodeFloats(v, 3, &bytes);
  float out[4];

  absl::Status too_few = DecodeFloats(bytes, 4, out, "gradient of chunk 7");
  EXPECT_EQ(too_few.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(too_few.message(), "gradient of chunk 7"));

  absl::Status too_many = DecodeFloats(bytes, 2, out, "weights");
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(too_many.message(), "weights"));

  absl::Status partial =
      DecodeFloats(bytes.substr(0, 5), 1, out, "odd-sized payload");
  EXPECT_EQ(partial.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(partial.message(), "odd-sized payload"));

  absl::Status nonempty_for_zero = DecodeFloats(bytes, 0, out, "nothing");
  EXPECT_EQ(nonempty_for_zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(nonempty_for_zero.message(), "nothing"));
}

TEST(TensorCodecTest, SixteenBitFormatsRoundToNearestEvenAndWidenExactly) {
  // bf16 has 7 fraction bits: 1 + 2^-8 lies halfway between its neighbours
  // 1 and 1 + 2^-7 and ties to the even one (1).
  const std::vector<float> in = {1.0f, -2.5f, 1.0f + 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, 65504.0f, 0x1p-24f};
  std::string bf16, fp16;
  EncodeValues(v1::WIRE_BF16, in.data(), static_cast<int64_t>(in.size()), &bf16);
  EncodeValues(v1::WIRE_FP16, in.data(), static_cast<int64_t>(in.size()), &fp16);
  ASSERT_EQ(bf16.size(), in.size() * 2);
  ASSERT_EQ(fp16.size(), in.size() * 2);
  // Little-endian 16-bit values: bf16(1.0) = 0x3F80.
  EXPECT_EQ(static_cast<uint8_t>(bf16[0]), 0x80);
  EXPECT_EQ(static_cast<uint8_t>(bf16[1]), 0x3F);

  std::vector<float> out(in.size());
  ASSERT_TRUE(DecodeValues(v1::WIRE_BF16, bf16, static_cast<int64_t>(in.size()), out.data(), "bf16").ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.5f);
  EXPECT_EQ(out[2], 1.0f);                 // a tie goes to the even neighbour
  EXPECT_EQ(out[3], 1.0f + 0x1p-7f);       // just above the tie rounds up
  EXPECT_EQ(out[4], 65536.0f);             // 65504 is not a bf16 value
  EXPECT_EQ(out[5], 0x1p-24f);             // bf16 keeps float's range
  ASSERT_TRUE(DecodeValues(v1::WIRE_FP16, fp16, static_cast<int64_t>(in.size()), out.data(), "fp16").ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[2], 1.0f + 0x1p-8f);       // fp16 has 10 fraction bits: exact
  EXPECT_EQ(out[4], 65504.0f);             // fp16's largest finite value
  EXPECT_EQ(out[5], 0x1p-24f);             // its smallest subnormal

  // Values packed elsewhere (a device) travel as they are.
  const std::vector<uint16_t> halves = {0x3F80, 0xC020};
  std::string raw;
  EncodeHalves(halves.data(), 2, &raw);
  EXPECT_EQ(raw, std::string("\x80\x3F\x20\xC0", 4));
  std::vector<uint16_t> back(2);
  ASSERT_TRUE(DecodeHalves(raw, 2, back.data(), "halves").ok());
  EXPECT_EQ(back, halves);
  ASSERT_TRUE(DecodeValues(v1::WIRE_BF16, raw, 2, out.data(), "bf16").ok());
  EXPECT_EQ(out[1], -2.5f);
}

TEST(TensorCodecTest, WireFormatsHaveTheirSizesAndFloat32IsTheDefault) {
  EXPECT_EQ(WireBytes(v1::WIRE_FORMAT_UNSPECIFIED), 4);
  EXPECT_EQ(WireBytes(v1::WIRE_FP32), 4);
  EXPECT_EQ(WireBytes(v1::WIRE_BF16), 2);
  EXPECT_EQ(WireBytes(v1::WIRE_FP16), 2);
  EXPECT_EQ(WireBytes(static_cast<v1::WireFormat>(9)), 0);
  const float v[2] = {1.5f, -3.0f};
  std::string a, b;
  EncodeValues(v1::WIRE_FORMAT_UNSPECIFIED, v, 2, &a);
  EncodeFloats(v, 2, &b);
  EXPECT_EQ(a, b);
}

TEST(TensorCodecTest, SixteenBitSizeMismatchAndUnknownFormatAreInvalidArgument) {
  const float v[3] = {1.0f, 2.0f, 3.0f};
  std::string fp32;
  EncodeFloats(v, 3, &fp32);
  float out[6];
  absl::Status wrong = DecodeValues(v1::WIRE_BF16, fp32, 3, out, "push to chunk 2");
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(wrong.message(), "push to chunk 2: payload has 12 bytes, expected 6 (3 bf16 values)"))
      << wrong.message();
  absl::Status unknown = DecodeValues(static_cast<v1::WireFormat>(7), fp32, 3, out, "push to chunk 2");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(unknown.message(), "unknown wire format 7")) << unknown.message();
  uint16_t halves[3];
  EXPECT_EQ(DecodeHalves(fp32, 3, halves, "pulled chunk").code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorCodecTest, Int8KeepsEachValueWithinHalfAScaleStepAndTheLargestExactly) {
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(static_cast<float>(i)) * 0.37f;
  values[123] = -2.5f;  // the largest magnitude
  std::string bytes;
  EncodeInt8(values.data(), 1000, &bytes);
  ASSERT_EQ(bytes.size(), 1004u);  // a scale and one byte a value
  std::vector<float> back(1000);
  ASSERT_TRUE(DecodeValues(v1::WIRE_INT8, bytes, 1000, back.data(), "test").ok());
  const float scale = 2.5f / 127.0f;
  EXPECT_EQ(back[123], -2.5f);
  for (size_t i = 0; i < values.size(); ++i) EXPECT_LE(std::fabs(back[i] - values[i]), scale / 2 * 1.001f) << i;
  // All zeros: a zero scale and zeros back.
  std::vector<float> zeros(5, 0.0f);
  EncodeInt8(zeros.data(), 5, &bytes);
  ASSERT_TRUE(DecodeValues(v1::WIRE_INT8, bytes, 5, back.data(), "test").ok());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(back[i], 0.0f);
}

TEST(TensorCodecTest, Int8OfANonFiniteGradientDecodesNonFiniteSoTheServerRefusesIt) {
  const float values[3] = {1.0f, std::numeric_limits<float>::infinity(), 0.5f};
  std::string bytes;
  EncodeInt8(values, 3, &bytes);
  float back[3];
  ASSERT_TRUE(DecodeValues(v1::WIRE_INT8, bytes, 3, back, "test").ok());
  EXPECT_TRUE(std::isnan(back[0]) && std::isnan(back[2]));
  EXPECT_EQ(DecodeValues(v1::WIRE_INT8, bytes, 4, back, "push to chunk 1").code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorCodecTest, TopKSendsTheLargestMagnitudesLowerIndexFirstOnTies) {
  const float values[8] = {0.1f, -5.0f, 3.0f, -3.0f, 0.0f, 3.0f, 4.0f, -0.2f};
  std::string bytes;
  EncodeTopK(values, 8, 4, &bytes);
  ASSERT_EQ(bytes.size(), 32u);  // 4 pairs of (index, value)
  float back[8];
  ASSERT_TRUE(DecodeValues(v1::WIRE_TOPK, bytes, 8, back, "test").ok());
  // -5, 4, then two of the three 3s: indices 2 and 3.
  const float expected[8] = {0, -5.0f, 3.0f, -3.0f, 0, 0, 4.0f, 0};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(back[i], expected[i]) << i;
  // A NaN counts as largest, so the server sees it and refuses the push.
  const float with_nan[3] = {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f};
  EncodeTopK(with_nan, 3, 1, &bytes);
  ASSERT_TRUE(DecodeValues(v1::WIRE_TOPK, bytes, 3, back, "test").ok());
  EXPECT_TRUE(std::isnan(back[1]));
  EXPECT_EQ(back[2], 0.0f);
  // k beyond n sends everything; k 0 nothing.
  EncodeTopK(values, 8, 100, &bytes);
  EXPECT_EQ(bytes.size(), 64u);
  EncodeTopK(values, 8, 0, &bytes);
  EXPECT_TRUE(bytes.empty());
}

TEST(TensorCodecTest, TopKPayloadsOutOfShapeAreInvalidArgument) {
  auto pair = [](uint32_t index, float value) {
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &index, 4);  // (the test runs on little-endian hosts)
    std::memcpy(bytes.data() + 4, &value, 4);
    return bytes;
  };
  float out[4];
  EXPECT_TRUE(DecodeValues(v1::WIRE_TOPK, pair(0, 1.0f) + pair(3, 2.0f), 4, out, "t").ok());
  EXPECT_EQ(out[3], 2.0f);
  for (const std::string& bad : {pair(4, 1.0f),                                   // index out of range
                                 pair(2, 1.0f) + pair(2, 1.0f),                   // repeated
                                 pair(2, 1.0f) + pair(1, 1.0f),                   // decreasing
                                 pair(0, 1.0f).substr(0, 7),                      // not whole pairs
                                 pair(0, 1) + pair(1, 1) + pair(2, 1) + pair(3, 1) + pair(3, 1)}) {  // > n pairs
    absl::Status status = DecodeValues(v1::WIRE_TOPK, bad, 4, out, "push to chunk 9");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status.message();
    EXPECT_TRUE(Contains(status.message(), "push to chunk 9")) << status.message();
  }
}

// Sparse rows: gathered by row number into the wire bytes, scattered back
// to their rows, in one copy each.
TEST(TensorCodecTest, GatheredRowsScatterBackToTheirPlaces) {
  const std::vector<float> rows = {0, 1, 10, 11, 20, 21, 30, 31};  // 4 rows of 2
  const std::vector<uint32_t> positions = {3, 0, 2};
  std::string bytes(3 * 2 * 4, 'x');
  GatherFloatRows(rows.data(), positions, 2, bytes.data());
  std::vector<float> wire(6);
  ASSERT_TRUE(DecodeFloats(bytes, 6, wire.data(), "wire").ok());
  EXPECT_EQ(wire, (std::vector<float>{30, 31, 0, 1, 20, 21}));
  std::vector<float> out(8, -1.0f);
  ScatterFloatRows(bytes.data(), positions, 2, out.data());
  EXPECT_EQ(out, (std::vector<float>{0, 1, -1, -1, 20, 21, 30, 31})) << "row 1 untouched";
}

}  // namespace
}  // namespace fulcrum
