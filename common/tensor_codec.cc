#include "common/tensor_codec.h"

#include <cstring>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"

namespace fulcrum {
namespace {

uint32_t ByteSwap(uint32_t v) { return __builtin_bswap32(v); }

void CopyLittleEndian(const void* src, int64_t n, void* dst) {
#if defined(ABSL_IS_BIG_ENDIAN)
  const uint32_t* in = static_cast<const uint32_t*>(src);
  uint32_t* o = static_cast<uint32_t*>(dst);
  for (int64_t i = 0; i < n; ++i) o[i] = ByteSwap(in[i]);
#else
  (void)ByteSwap;
  std::memcpy(dst, src, static_cast<size_t>(n) * 4);
#endif
}

}  // namespace

void EncodeFloats(const float* values, int64_t n, std::string* out) {
  out->resize(static_cast<size_t>(n) * 4);
  if (n > 0) CopyLittleEndian(values, n, out->data());
}

absl::Status DecodeFloats(absl::string_view bytes, int64_t expected, float* out,
                          absl::string_view what) {
  if (static_cast<int64_t>(bytes.size()) != expected * 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": payload has ", bytes.size(), " bytes, expected ", expected * 4,
        " (", expected, " float32 values)"));
  }
  if (expected > 0) CopyLittleEndian(bytes.data(), expected, out);
  return absl::OkStatus();
}

}  // namespace fulcrum
