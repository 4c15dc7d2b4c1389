// libFuzzer: the checkpoint record reader, on what a disk (or a peer server's
// ReadCheckpoint) may hand it. Odd first byte: the input is a whole record
// (header, checksum, payload); even: a payload, sealed by the harness with a
// valid header and checksum so that the payload parser itself is reached.
// Properties: no crash, a clear error (DATA_LOSS / INVALID_ARGUMENT), and a
// record that decodes re-encodes to a record that decodes to the same state.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/checkpoint_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string input(reinterpret_cast<const char*>(data + 1), size - 1);
  absl::StatusOr<fulcrum::ChunkSnapshot> snapshot =
      (data[0] & 1) != 0 ? fulcrum::DecodeChunkRecord(input) : fulcrum::DecodeChunkSnapshot(input);
  if (!snapshot.ok()) {
    const absl::StatusCode code = snapshot.status().code();
    if (code != absl::StatusCode::kDataLoss && code != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  uint32_t checksum = 0;
  const std::string record = fulcrum::EncodeChunkRecord(*snapshot, &checksum);
  absl::StatusOr<uint32_t> verified = fulcrum::VerifyChunkRecord(record);
  if (!verified.ok() || *verified != checksum) std::abort();
  absl::StatusOr<fulcrum::ChunkSnapshot> again = fulcrum::DecodeChunkRecord(record);
  if (!again.ok() || fulcrum::EncodeChunkSnapshot(*again) != fulcrum::EncodeChunkSnapshot(*snapshot)) std::abort();
  return 0;
}
