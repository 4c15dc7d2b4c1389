// The array conversions (F16C where the CPU has it) give exactly the scalar
// functions' bits. The scalar functions themselves are checked against
// hand-worked values in kernels/backend_test.cc (the CPU backend's PackHalf).
#include "common/half.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/test_util.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

// Encodes `values` with FloatsToFp16 (as one array, and again from an odd
// offset so that blocks of 8 fall elsewhere) and compares every result with
// FloatToFp16. Returns the number of mismatches (the first few are reported).
int CountFp16Mismatches(const std::vector<float>& values) {
  std::vector<uint16_t> bulk(values.size()), shifted(values.size());
  FloatsToFp16(values.data(), static_cast<int64_t>(values.size()), bulk.data());
  if (values.size() > 3) FloatsToFp16(values.data() + 3, static_cast<int64_t>(values.size()) - 3, shifted.data() + 3);
  int mismatches = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t expected = FloatToFp16(values[i]);
    const bool ok = bulk[i] == expected && (i < 3 || values.size() <= 3 || shifted[i] == expected);
    if (!ok && ++mismatches <= 5) {
      ADD_FAILURE() << "float 0x" << std::hex << FloatBits(values[i]) << ": FloatToFp16 gives 0x" << expected
                    << ", FloatsToFp16 0x" << bulk[i] << " / 0x" << shifted[i];
    }
  }
  return mismatches;
}

TEST(HalfArrayTest, Fp16EncodingMatchesTheScalarOneOnEveryFloatThatCanRoundToAFiniteHalf) {
  std::printf("F16C: %s\n", HasHardwareFp16() ? "used" : "not available, scalar loops");
  // Every float with a biased exponent in [101, 143] (|x| from 2^-26, which
  // rounds to zero, to 2^17, which overflows), both signs: every rounding case
  // of the subnormal and normal ranges and the overflow edge at 65520. In
  // slices of 2^23 (one exponent) to bound memory.
  std::vector<float> slice(size_t{1} << 23);
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t exponent = 101; exponent <= 143; ++exponent) {
      for (uint32_t m = 0; m < slice.size(); ++m) slice[m] = BitsFloat(sign | (exponent << 23) | m);
      ASSERT_EQ(CountFp16Mismatches(slice), 0) << "exponent " << exponent << (sign ? ", negative" : "");
    }
  }
}

TEST(HalfArrayTest, Fp16EncodingMatchesOnTheRestOfTheFloatsSampledAndOnNaNs) {
  std::vector<float> values;
  // Every 997th bit pattern (a prime stride: all exponents and mantissa
  // residues), the infinities and NaNs of every kind, and blocks that mix a
  // NaN with ordinary values (the scalar fallback for that block).
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 997) values.push_back(BitsFloat(static_cast<uint32_t>(bits)));
  for (uint32_t special : {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FBFFFFFu,
                           0xFFFFFFFFu, 0x7FC02000u, 0x7F802000u}) {
    for (int i = 0; i < 11; ++i) values.push_back(i % 4 == 0 ? BitsFloat(special) : 1.5f * i);
  }
  EXPECT_EQ(CountFp16Mismatches(values), 0);
}

TEST(HalfArrayTest, Fp16DecodingMatchesTheScalarOneOnEveryPattern) {
  std::vector<uint16_t> all(65536 + 5);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> bulk(all.size());
  Fp16sToFloats(all.data(), static_cast<int64_t>(all.size()), bulk.data());
  int mismatches = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const uint32_t expected = FloatBits(Fp16ToFloat(all[i]));
    if (FloatBits(bulk[i]) != expected && ++mismatches <= 5) {
      ADD_FAILURE() << "half 0x" << std::hex << all[i] << ": Fp16ToFloat gives 0x" << expected
                    << ", Fp16sToFloats 0x" << FloatBits(bulk[i]);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(HalfArrayTest, Bf16ArraysMatchTheScalarFunctions) {
  std::vector<float> values;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 4099) values.push_back(BitsFloat(static_cast<uint32_t>(bits)));
  std::vector<uint16_t> halves(values.size());
  FloatsToBf16(values.data(), static_cast<int64_t>(values.size()), halves.data());
  std::vector<float> back(values.size());
  Bf16sToFloats(halves.data(), static_cast<int64_t>(halves.size()), back.data());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(halves[i], FloatToBf16(values[i])) << std::hex << FloatBits(values[i]);
    ASSERT_EQ(FloatBits(back[i]), FloatBits(Bf16ToFloat(halves[i])));
  }
}

TEST(HalfArrayTest, EmptyAndShortArraysAreFine) {
  FloatsToFp16(nullptr, 0, nullptr);
  Fp16sToFloats(nullptr, 0, nullptr);
  const float values[3] = {1.0f, -2.0f, 65504.0f};
  uint16_t halves[3] = {0, 0, 0};
  FloatsToFp16(values, 3, halves);
  EXPECT_EQ(halves[0], 0x3C00);
  EXPECT_EQ(halves[1], 0xC000);
  EXPECT_EQ(halves[2], 0x7BFF);
}

}  // namespace
}  // namespace fulcrum
