// IEEE binary16 (fp16) and bfloat16 conversions of float32, rounding to
// nearest even: the CPU backend's PackHalf/UnpackHalf and the 16-bit wire
// formats (common/tensor_codec.h) use these, and the CUDA kernels match them
// bit for bit (kernels/backend_test.cc). Values beyond fp16's range (65504
// plus half an ulp) become +-inf; NaN stays NaN (quiet).
#ifndef FULCRUM_COMMON_HALF_H_
#define FULCRUM_COMMON_HALF_H_

#include <cstdint>
#include <cstring>

namespace fulcrum {

// A float's bit pattern, and the float of a bit pattern.
inline uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

inline float BitsFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

namespace half_internal {

// Rounds `value` right by `shift` bits to nearest, ties to even.
inline uint32_t ShiftRoundEven(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
}

}  // namespace half_internal

inline uint16_t FloatToFp16(float f) {
  const uint32_t bits = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7FFFFFFF;
  if (magnitude > 0x7F800000) {  // NaN: stay quiet, keep the top payload bits
    return static_cast<uint16_t>(sign | 0x7E00 | ((magnitude >> 13) & 0x3FF));
  }
  // 65520 = 65504 + half an ulp: from there on (and for inf) round to inf.
  if (magnitude >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);
  if (magnitude >= 0x38800000) {  // normal in fp16 (>= 2^-14)
    // Rebias the exponent (127 -> 15); a mantissa carry rolls into it.
    return static_cast<uint16_t>(sign | half_internal::ShiftRoundEven(magnitude - ((127 - 15) << 23), 13));
  }
  // Subnormal in fp16: units of 2^-24. value = mantissa * 2^(exponent - 150).
  const int exponent = static_cast<int>(magnitude >> 23);
  const int shift = 126 - exponent;  // 2^-24 / 2^(exponent - 150) as a shift
  if (shift > 24) return sign;       // below 2^-25: rounds to zero
  const uint32_t mantissa = (magnitude & 0x7FFFFF) | 0x800000;
  // A carry into 0x400 is exactly the smallest normal, as it should be.
  return static_cast<uint16_t>(sign | half_internal::ShiftRoundEven(mantissa, shift));
}

inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FF;
  if (exponent == 0x1F) return BitsFloat(sign | 0x7F800000 | (mantissa << 13));  // inf / NaN
  if (exponent != 0) return BitsFloat(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24 is exact in float.
  const float value = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return sign ? -value : value;
}

inline uint16_t FloatToBf16(float f) {
  const uint32_t bits = FloatBits(f);
  if ((bits & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((bits >> 16) | 0x0040);  // quiet NaN
  // bf16 is float's top half; rounding the low half carries correctly into the
  // exponent, up to inf, and through float subnormals.
  return static_cast<uint16_t>(half_internal::ShiftRoundEven(bits, 16));
}

inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

// Whole arrays, with exactly the results of the functions above. On x86-64
// CPUs with F16C the fp16 ones convert 8 values an instruction (a block of 8
// holding a NaN goes through the scalar path, which keeps NaN payloads as
// above); elsewhere they loop over the scalar functions. `in` and `out` must
// not overlap.
void FloatsToFp16(const float* in, int64_t n, uint16_t* out);
void Fp16sToFloats(const uint16_t* in, int64_t n, float* out);
void FloatsToBf16(const float* in, int64_t n, uint16_t* out);
void Bf16sToFloats(const uint16_t* in, int64_t n, float* out);
// Whether FloatsToFp16 / Fp16sToFloats use F16C on this CPU.
bool HasHardwareFp16();

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_HALF_H_
