// Encoding of tensor payloads on the wire (never `repeated float`): raw
// little-endian float32, or 16-bit values (bfloat16 / IEEE half) for jobs
// with a 16-bit JobSpec.wire_format.
#ifndef FULCRUM_COMMON_TENSOR_CODEC_H_
#define FULCRUM_COMMON_TENSOR_CODEC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "fulcrum/v1/job.pb.h"

namespace fulcrum {

// Appends n floats as little-endian bytes to *out (resizes it to exactly 4n).
void EncodeFloats(const float* values, int64_t n, std::string* out);

// Decodes exactly `expected` floats from `bytes` into out. InvalidArgument
// naming `what` if the byte count is not 4 * expected.
absl::Status DecodeFloats(absl::string_view bytes, int64_t expected, float* out,
                          absl::string_view what);

// Rows of `dim` floats gathered and scattered by row number (sparse rows on
// the wire), into and out of memory the caller sized: GatherFloatRows
// writes rows[positions[k]] as row k at `out` (4 x positions.size() x dim
// bytes); ScatterFloatRows writes row k at `bytes` to out[positions[k]].
// One copy each.
void GatherFloatRows(const float* rows, absl::Span<const uint32_t> positions, int32_t dim, char* out);
void ScatterFloatRows(const char* bytes, absl::Span<const uint32_t> positions, int32_t dim, float* out);

// Bytes per element of `format` (UNSPECIFIED is float32): 4 or 2; 0 for a
// value this build does not know.
int WireBytes(v1::WireFormat format);
// "fp32", "bf16", "fp16" (or "unknown").
const char* WireFormatName(v1::WireFormat format);
// True for the 16-bit formats.
inline bool IsHalfWire(v1::WireFormat format) { return WireBytes(format) == 2; }

// The push encodings of compressed gradients (see WireFormat): not element
// formats (WireBytes 0), never pulled.
inline bool IsCompressedWire(v1::WireFormat format) {
  return format == v1::WIRE_INT8 || format == v1::WIRE_TOPK;
}
// Writes n floats as WIRE_INT8: scale = max |value| / 127, each value
// divided by it and rounded to nearest even. A non-finite value makes the
// scale NaN, so the receiver refuses the gradient as it would the value.
void EncodeInt8(const float* values, int64_t n, std::string* out);
// CompressionSpec.topk_ratio when a TOPK job leaves it unset.
constexpr double kDefaultTopkRatio = 0.01;
// Writes the k values of largest magnitude (ties: the lower index; a NaN or
// infinity counts as largest) as WIRE_TOPK pairs; k is clamped to [0, n].
void EncodeTopK(const float* values, int64_t n, int64_t k, std::string* out);

// Writes n floats in `format` to *out (resized to exactly n * WireBytes):
// 16-bit formats round to nearest even (fp16: beyond +-65504 becomes inf).
// `format` must be known (WireBytes > 0).
void EncodeValues(v1::WireFormat format, const float* values, int64_t n, std::string* out);
// Writes n already packed 16-bit values as little-endian bytes (2n).
void EncodeHalves(const uint16_t* values, int64_t n, std::string* out);

// Decodes exactly `expected` values encoded in `format` into float32.
// InvalidArgument naming `what` for an unknown format or a byte count other
// than expected * WireBytes(format); for WIRE_INT8 other than 4 + expected;
// for WIRE_TOPK not a multiple of 8, more pairs than values, an index out of
// range or not above the one before.
absl::Status DecodeValues(v1::WireFormat format, absl::string_view bytes, int64_t expected, float* out,
                          absl::string_view what);
// Copies exactly `expected` 16-bit little-endian values (no conversion);
// InvalidArgument naming `what` if the byte count is not 2 * expected.
absl::Status DecodeHalves(absl::string_view bytes, int64_t expected, uint16_t* out, absl::string_view what);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_TENSOR_CODEC_H_
