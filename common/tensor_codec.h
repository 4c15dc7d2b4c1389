// Raw little-endian float32 encoding of tensor payloads (never `repeated float`).
#ifndef FULCRUM_COMMON_TENSOR_CODEC_H_
#define FULCRUM_COMMON_TENSOR_CODEC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace fulcrum {

// Appends n floats as little-endian bytes to *out (resizes it to exactly 4n).
void EncodeFloats(const float* values, int64_t n, std::string* out);

// Decodes exactly `expected` floats from `bytes` into out. InvalidArgument
// naming `what` if the byte count is not 4 * expected.
absl::Status DecodeFloats(absl::string_view bytes, int64_t expected, float* out,
                          absl::string_view what);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_TENSOR_CODEC_H_
