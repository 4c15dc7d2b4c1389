#include "common/half.h"

#include <cstdint>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace fulcrum {
namespace {

#if defined(__x86_64__)
// F16C converts with IEEE round to nearest even, subnormals and overflow to
// infinity included: the scalar functions' results. NaN payloads may differ
// (a signalling fp16 NaN comes back quiet), so any block of 8 with a NaN is
// left to the scalar path.
__attribute__((target("avx,f16c"))) int64_t FloatsToFp16F16c(const float* in, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      for (int64_t j = i; j < i + 8; ++j) out[j] = FloatToFp16(in[j]);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  return i;
}

__attribute__((target("avx,f16c"))) int64_t Fp16sToFloatsF16c(const uint16_t* in, int64_t n, float* out) {
  const __m128i magnitude_mask = _mm_set1_epi16(0x7FFF);
  const __m128i infinity = _mm_set1_epi16(0x7C00);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    // |h| > 0x7C00 is a NaN (a signed compare is right: |h| <= 0x7FFF).
    if (_mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(v, magnitude_mask), infinity)) != 0) {
      for (int64_t j = i; j < i + 8; ++j) out[j] = Fp16ToFloat(in[j]);
      continue;
    }
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(v));
  }
  return i;
}

// CPUID leaf 1: ECX bit 29 F16C, bit 28 AVX, bit 27 OSXSAVE; and the OS
// saves the AVX state (XCR0 bits 1 and 2).
bool DetectF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  const bool f16c = (ecx >> 29) & 1, avx = (ecx >> 28) & 1, osxsave = (ecx >> 27) & 1;
  if (!f16c || !avx || !osxsave) return false;
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  return (xcr0_low & 0x6) == 0x6;
}
#endif

}  // namespace

bool HasHardwareFp16() {
#if defined(__x86_64__)
  static const bool has = DetectF16c();
  return has;
#else
  return false;
#endif
}

void FloatsToFp16(const float* in, int64_t n, uint16_t* out) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (HasHardwareFp16()) i = FloatsToFp16F16c(in, n, out);
#endif
  for (; i < n; ++i) out[i] = FloatToFp16(in[i]);
}

void Fp16sToFloats(const uint16_t* in, int64_t n, float* out) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (HasHardwareFp16()) i = Fp16sToFloatsF16c(in, n, out);
#endif
  for (; i < n; ++i) out[i] = Fp16ToFloat(in[i]);
}

void FloatsToBf16(const float* in, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(in[i]);
}

void Bf16sToFloats(const uint16_t* in, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(in[i]);
}

}  // namespace fulcrum
