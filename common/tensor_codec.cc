#include "common/tensor_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "common/half.h"

namespace fulcrum {
namespace {

// Copies n elements of `size` bytes (4 or 2) between host and little-endian order.
void CopyLittleEndian(const void* src, int64_t n, int size, void* dst) {
#if defined(ABSL_IS_BIG_ENDIAN)
  const unsigned char* in = static_cast<const unsigned char*>(src);
  unsigned char* o = static_cast<unsigned char*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    for (int b = 0; b < size; ++b) o[i * size + b] = in[i * size + size - 1 - b];
  }
#else
  std::memcpy(dst, src, static_cast<size_t>(n) * size);
#endif
}

absl::Status CheckSize(absl::string_view bytes, int64_t expected, int size, const char* type,
                       absl::string_view what) {
  if (static_cast<int64_t>(bytes.size()) == expected * size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": payload has ", bytes.size(), " bytes, expected ",
                                                 expected * size, " (", expected, " ", type, " values)"));
}

}  // namespace

void EncodeFloats(const float* values, int64_t n, std::string* out) {
#if defined(ABSL_IS_BIG_ENDIAN)
  out->resize(static_cast<size_t>(n) * 4);
  if (n > 0) CopyLittleEndian(values, n, 4, out->data());
#else
  // One copy, into the capacity the string has (no zero fill first).
  out->assign(reinterpret_cast<const char*>(values), static_cast<size_t>(n) * 4);
#endif
}

absl::Status DecodeFloats(absl::string_view bytes, int64_t expected, float* out,
                          absl::string_view what) {
  if (absl::Status size = CheckSize(bytes, expected, 4, "float32", what); !size.ok()) return size;
  if (expected > 0) CopyLittleEndian(bytes.data(), expected, 4, out);
  return absl::OkStatus();
}

void GatherFloatRows(const float* rows, absl::Span<const uint32_t> positions, int32_t dim, char* out) {
  const size_t row_bytes = static_cast<size_t>(dim) * 4;
  for (size_t k = 0; k < positions.size(); ++k) {
    CopyLittleEndian(rows + static_cast<size_t>(positions[k]) * dim, dim, 4, out + k * row_bytes);
  }
}

void ScatterFloatRows(const char* bytes, absl::Span<const uint32_t> positions, int32_t dim, float* out) {
  const size_t row_bytes = static_cast<size_t>(dim) * 4;
  for (size_t k = 0; k < positions.size(); ++k) {
    CopyLittleEndian(bytes + k * row_bytes, dim, 4, out + static_cast<size_t>(positions[k]) * dim);
  }
}

int WireBytes(v1::WireFormat format) {
  switch (format) {
    case v1::WIRE_FORMAT_UNSPECIFIED:
    case v1::WIRE_FP32:
      return 4;
    case v1::WIRE_BF16:
    case v1::WIRE_FP16:
      return 2;
    default:
      return 0;
  }
}

const char* WireFormatName(v1::WireFormat format) {
  switch (format) {
    case v1::WIRE_FORMAT_UNSPECIFIED:
    case v1::WIRE_FP32:
      return "fp32";
    case v1::WIRE_BF16:
      return "bf16";
    case v1::WIRE_FP16:
      return "fp16";
    case v1::WIRE_INT8:
      return "int8";
    case v1::WIRE_TOPK:
      return "topk";
    default:
      return "unknown";
  }
}

void EncodeValues(v1::WireFormat format, const float* values, int64_t n, std::string* out) {
  if (!IsHalfWire(format)) {
    EncodeFloats(values, n, out);
    return;
  }
  std::vector<uint16_t> halves(static_cast<size_t>(n));
  if (format == v1::WIRE_BF16) {
    FloatsToBf16(values, n, halves.data());
  } else {
    FloatsToFp16(values, n, halves.data());
  }
  EncodeHalves(halves.data(), n, out);
}

void EncodeHalves(const uint16_t* values, int64_t n, std::string* out) {
  out->resize(static_cast<size_t>(n) * 2);
  if (n > 0) CopyLittleEndian(values, n, 2, out->data());
}

void EncodeInt8(const float* values, int64_t n, std::string* out) {
  float largest = 0;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(values[i]);
    largest = std::max(largest, std::fabs(values[i]));
  }
  const float scale = finite ? largest / 127.0f : std::numeric_limits<float>::quiet_NaN();
  out->resize(4 + static_cast<size_t>(std::max<int64_t>(n, 0)));
  CopyLittleEndian(&scale, 1, 4, out->data());
  char* q = out->data() + 4;
  for (int64_t i = 0; i < n; ++i) {
    const float scaled = scale > 0 ? std::nearbyint(values[i] / scale) : 0.0f;  // rounds to even by default
    q[i] = static_cast<char>(static_cast<int8_t>(std::clamp(scaled, -127.0f, 127.0f)));
  }
}

void EncodeTopK(const float* values, int64_t n, int64_t k, std::string* out) {
  n = std::max<int64_t>(n, 0);
  k = std::clamp<int64_t>(k, 0, n);
  // Magnitude bits order as the magnitudes (NaN and infinity above every
  // finite value). The k-th largest is the threshold: every value above it
  // goes, and as many equal to it as are left, lowest index first; one pass
  // in index order writes them already sorted.
  std::vector<uint32_t> magnitude(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(&magnitude[i], &values[i], 4);
    magnitude[i] &= 0x7fffffffu;
  }
  uint32_t threshold = 0;
  int64_t equal_left = k;
  if (k > 0 && k < n) {
    // Radix select: a histogram of the top 11 magnitude bits finds the bin
    // holding the k-th largest, and only that bin's values are ordered.
    constexpr int kShift = 20;
    std::vector<int64_t> bins(size_t{1} << (31 - kShift), 0);
    for (uint32_t m : magnitude) ++bins[m >> kShift];
    int64_t above = 0;  // values in the bins above the one searched
    size_t bin = bins.size() - 1;
    while (above + bins[bin] < k) above += bins[bin--];
    std::vector<uint32_t> candidates;
    candidates.reserve(static_cast<size_t>(bins[bin]));
    for (uint32_t m : magnitude) {
      if ((m >> kShift) == bin) candidates.push_back(m);
    }
    const int64_t rank = k - above - 1;  // of the k-th largest among the candidates
    std::nth_element(candidates.begin(), candidates.begin() + rank, candidates.end(), std::greater<uint32_t>());
    threshold = candidates[rank];
    equal_left = k - above - std::count_if(candidates.begin(), candidates.begin() + rank,
                                           [&](uint32_t m) { return m > threshold; });
  }
  out->resize(static_cast<size_t>(k) * 8);
  char* at = out->data();
  for (int64_t i = 0; i < n && at < out->data() + out->size(); ++i) {
    if (k < n && (magnitude[i] < threshold || (magnitude[i] == threshold && equal_left == 0))) continue;
    if (k < n && magnitude[i] == threshold) --equal_left;
    const auto index = static_cast<uint32_t>(i);
    CopyLittleEndian(&index, 1, 4, at);
    CopyLittleEndian(&values[i], 1, 4, at + 4);
    at += 8;
  }
}

namespace {

absl::Status DecodeInt8(absl::string_view bytes, int64_t expected, float* out, absl::string_view what) {
  if (static_cast<int64_t>(bytes.size()) != 4 + expected) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": int8 payload has ", bytes.size(), " bytes, expected ",
                                                   4 + expected, " (a scale and ", expected, " values)"));
  }
  float scale = 0;
  CopyLittleEndian(bytes.data(), 1, 4, &scale);
  const auto* q = reinterpret_cast<const int8_t*>(bytes.data() + 4);
  for (int64_t i = 0; i < expected; ++i) out[i] = static_cast<float>(q[i]) * scale;
  return absl::OkStatus();
}

absl::Status DecodeTopK(absl::string_view bytes, int64_t expected, float* out, absl::string_view what) {
  const int64_t pairs = static_cast<int64_t>(bytes.size()) / 8;
  if (bytes.size() % 8 != 0 || pairs > expected) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": top-k payload has ", bytes.size(),
                                                   " bytes: not (index, value) pairs of 8 bytes for at most ",
                                                   expected, " values"));
  }
  std::fill(out, out + expected, 0.0f);
  int64_t previous = -1;
  for (int64_t j = 0; j < pairs; ++j) {
    uint32_t index = 0;
    CopyLittleEndian(bytes.data() + 8 * j, 1, 4, &index);
    if (static_cast<int64_t>(index) >= expected || static_cast<int64_t>(index) <= previous) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": top-k pair ", j, " has index ", index,
                                                     ": indices must increase and stay below ", expected));
    }
    CopyLittleEndian(bytes.data() + 8 * j + 4, 1, 4, &out[index]);
    previous = index;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeValues(v1::WireFormat format, absl::string_view bytes, int64_t expected, float* out,
                          absl::string_view what) {
  if (format == v1::WIRE_INT8) return DecodeInt8(bytes, expected, out, what);
  if (format == v1::WIRE_TOPK) return DecodeTopK(bytes, expected, out, what);
  const int size = WireBytes(format);
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": unknown wire format ", static_cast<int>(format),
                                                   " (known: WIRE_FP32, WIRE_BF16, WIRE_FP16; pushes also WIRE_INT8, WIRE_TOPK)"));
  }
  if (size == 4) return DecodeFloats(bytes, expected, out, what);
  const bool bf16 = format == v1::WIRE_BF16;
  if (absl::Status sized = CheckSize(bytes, expected, 2, bf16 ? "bf16" : "fp16", what); !sized.ok()) return sized;
  std::vector<uint16_t> halves(static_cast<size_t>(expected));
  if (expected > 0) CopyLittleEndian(bytes.data(), expected, 2, halves.data());
  if (bf16) {
    Bf16sToFloats(halves.data(), expected, out);
  } else {
    Fp16sToFloats(halves.data(), expected, out);
  }
  return absl::OkStatus();
}

absl::Status DecodeHalves(absl::string_view bytes, int64_t expected, uint16_t* out, absl::string_view what) {
  if (absl::Status sized = CheckSize(bytes, expected, 2, "16-bit", what); !sized.ok()) return sized;
  if (expected > 0) CopyLittleEndian(bytes.data(), expected, 2, out);
  return absl::OkStatus();
}

}  // namespace fulcrum
