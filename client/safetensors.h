// Reads and writes float32 (and uint64) tensors in the safetensors format
// (https://github.com/huggingface/safetensors), the file `fulcrum export`
// produces so that PyTorch, JAX and NumPy can load a trained model:
//
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   JSON header, padded with spaces to a multiple of 8 bytes:
//             {"__metadata__": {"k": "v", ...},
//              "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
//   rest      raw little-endian data; data_offsets are relative to its start
//
// The reader is independent of the writer (a small hand-written JSON parser
// limited to what the header needs), so that tests and export verification
// do not just check the writer against itself. All functions are thread-safe.
#ifndef FULCRUM_CLIENT_SAFETENSORS_H_
#define FULCRUM_CLIENT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fulcrum {

struct SafetensorsTensor {
  enum class Dtype { kF32, kU64 };
  SafetensorsTensor() = default;
  // An F32 tensor.
  SafetensorsTensor(std::string name_in, std::vector<int64_t> shape_in, std::vector<float> data_in)
      : name(std::move(name_in)), shape(std::move(shape_in)), data(std::move(data_in)) {}
  // A U64 tensor.
  static SafetensorsTensor Ids(std::string name, std::vector<int64_t> shape, std::vector<uint64_t> ids) {
    SafetensorsTensor t(std::move(name), std::move(shape), {});
    t.dtype = Dtype::kU64;
    t.u64 = std::move(ids);
    return t;
  }

  std::string name;
  std::vector<int64_t> shape;  // [] is a scalar (one value)
  std::vector<float> data;     // F32: row-major, size == product(shape)
  Dtype dtype = Dtype::kF32;
  std::vector<uint64_t> u64;   // U64 (a sparse table's ids): size == product(shape)
};

// Serializes `tensors`, laid out in the order given, and `metadata` (the
// "__metadata__" entry, left out when empty, as the reference writer does).
// INVALID_ARGUMENT naming the tensor for an empty, duplicate, reserved
// ("__metadata__") or non-UTF-8 name, a negative dimension, or a data size
// that is not the product of the shape; also for non-UTF-8 metadata.
absl::StatusOr<std::string> EncodeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata);

// Encodes and writes to `path` atomically (a temp file beside it, then
// rename), so a reader never sees a partial file. Errors name the path:
// EncodeSafetensors' INVALID_ARGUMENT, or UNAVAILABLE if the file cannot be
// written.
absl::Status WriteSafetensorsFile(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata);

// Parses and validates a safetensors file held in `bytes`: every tensor F32
// or U64, shape product * 4 (U64: 8) == its byte length, offsets in order, contiguous and
// covering the data section exactly. Returns the tensors sorted by data
// offset (header order among equal offsets) and, if `metadata` is non-null,
// replaces *metadata with the "__metadata__" entry.
// DATA_LOSS when the bytes disagree with the header about their length (a
// truncated file, trailing bytes); INVALID_ARGUMENT when the header itself is
// malformed (bad JSON, unknown keys, unsupported dtype, overlapping offsets,
// ...). Messages name the tensor and the problem.
absl::StatusOr<std::vector<SafetensorsTensor>> DecodeSafetensors(
    absl::string_view bytes, std::map<std::string, std::string>* metadata = nullptr);

// Reads `path` and decodes it. NOT_FOUND if it cannot be opened; decoding
// errors as above, prefixed with the path.
absl::StatusOr<std::vector<SafetensorsTensor>> ReadSafetensorsFile(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

}  // namespace fulcrum

#endif  // FULCRUM_CLIENT_SAFETENSORS_H_
