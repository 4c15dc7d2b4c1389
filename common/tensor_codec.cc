#include "common/tensor_codec.h"

#include <cstdint>
#include <cstring>
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

absl::Status DecodeValues(v1::WireFormat format, absl::string_view bytes, int64_t expected, float* out,
                          absl::string_view what) {
  const int size = WireBytes(format);
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": unknown wire format ", static_cast<int>(format),
                                                   " (known: WIRE_FP32, WIRE_BF16, WIRE_FP16)"));
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
