// libFuzzer: the tensor codec every push and pull goes through. The first
// byte picks the wire format (known or not) and the expected count; the rest
// is the payload. Properties: no crash, decoding accepts exactly count *
// WireBytes bytes of a known format, and re-encoding what was decoded gives
// the same bytes (fp32), or values that decode to the same floats (16-bit).
// The push encodings of compressed gradients (int8, top-k) decode only
// payloads of their layout and refuse the rest; a decoded top-k payload
// encoded again keeps the same values.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/tensor_codec.h"
#include "common/half.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto format = static_cast<fulcrum::v1::WireFormat>(data[0] & 7);
  const std::string payload(reinterpret_cast<const char*>(data + 1), size - 1);
  if (fulcrum::IsCompressedWire(format)) {
    // A count around the payload's: int8 takes 4 + count bytes; top-k at
    // most count pairs.
    const int64_t count = static_cast<int64_t>(payload.size()) / (format == fulcrum::v1::WIRE_INT8 ? 1 : 4) +
                          ((data[0] & 8) != 0 ? 1 : -4);
    const int64_t expected = count < 0 ? 0 : count;
    std::vector<float> values(static_cast<size_t>(expected) + 1);
    absl::Status decoded = fulcrum::DecodeValues(format, payload, expected, values.data(), "fuzz");
    if (!decoded.ok()) {
      if (decoded.code() != absl::StatusCode::kInvalidArgument) std::abort();
      return 0;
    }
    if (format == fulcrum::v1::WIRE_INT8) {
      if (static_cast<int64_t>(payload.size()) != 4 + expected) std::abort();
      return 0;
    }
    const int64_t pairs = static_cast<int64_t>(payload.size()) / 8;
    std::string encoded;
    fulcrum::EncodeTopK(values.data(), expected, pairs, &encoded);
    std::vector<float> again(static_cast<size_t>(expected) + 1);
    if (!fulcrum::DecodeValues(format, encoded, expected, again.data(), "fuzz").ok()) std::abort();
    for (int64_t i = 0; i < expected; ++i) {
      if (!(std::isnan(values[i]) && std::isnan(again[i])) && values[i] != again[i]) std::abort();
    }
    return 0;
  }
  const int width = fulcrum::WireBytes(format);
  // An expected count that matches the payload, or one that is off by one.
  const int64_t exact = width > 0 ? static_cast<int64_t>(payload.size()) / width : 0;
  const int64_t expected = (data[0] & 8) != 0 ? exact + 1 : exact;
  std::vector<float> values(static_cast<size_t>(expected) + 1);
  absl::Status decoded = fulcrum::DecodeValues(format, payload, expected, values.data(), "fuzz");
  const bool fits = width > 0 && static_cast<int64_t>(payload.size()) == expected * width;
  if (decoded.ok() != fits) std::abort();
  if (!decoded.ok()) {
    if (decoded.code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  std::string encoded;
  fulcrum::EncodeValues(format, values.data(), expected, &encoded);
  if (width == 4) {
    if (encoded != payload) std::abort();
    return 0;
  }
  std::vector<float> again(static_cast<size_t>(expected) + 1);
  if (!fulcrum::DecodeValues(format, encoded, expected, again.data(), "fuzz").ok()) std::abort();
  for (int64_t i = 0; i < expected; ++i) {
    const bool both_nan = std::isnan(values[i]) && std::isnan(again[i]);
    if (!both_nan && fulcrum::FloatBits(values[i]) != fulcrum::FloatBits(again[i])) std::abort();
  }
  std::vector<uint16_t> halves(static_cast<size_t>(expected) + 1);
  if (!fulcrum::DecodeHalves(payload, expected, halves.data(), "fuzz").ok()) std::abort();
  return 0;
}
