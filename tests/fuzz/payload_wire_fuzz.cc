// libFuzzer: the reader of the data RPCs' bytes (common/payload_wire.h),
// against protobuf's own parser. Byte 0 picks the message (PushRequest or
// PullResponse) and how the rest is cut into slices (as gRPC hands them
// over); the rest is the message. Properties: no crash; the reader accepts
// exactly what protobuf accepts; then every field and every chunk's payload
// agrees with protobuf's parse, and a message rebuilt by PayloadWriter from
// the received slices parses to the same message.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/payload_wire.h"

namespace {

template <typename Message>
void Check(const std::string& bytes, size_t piece, int chunks_field) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    slices.emplace_back(bytes.data() + at, std::min(piece, bytes.size() - at));
  }
  const grpc::ByteBuffer buffer(slices.data(), slices.size());
  Message expected;
  const bool parses = expected.ParseFromString(bytes);
  fulcrum::PayloadReader reader;
  Message header;
  const absl::Status status = reader.Parse(buffer, chunks_field, &header);
  if (status.ok() != parses) std::abort();
  if (!status.ok()) {
    if (status.code() != absl::StatusCode::kInvalidArgument) std::abort();
    return;
  }
  if (reader.chunks() != expected.chunks_size() || header.chunks_size() != 0) std::abort();
  Message rebuilt_expected = expected;
  rebuilt_expected.clear_chunks();
  if (header.SerializeAsString() != rebuilt_expected.SerializeAsString()) std::abort();
  fulcrum::PayloadWriter writer(header, chunks_field);
  for (int c = 0; c < reader.chunks(); ++c) {
    const fulcrum::v1::ChunkData& want = expected.chunks(c);
    std::string got(static_cast<size_t>(reader.payload_size(c)), '\0');
    reader.CopyPayload(c, got.data());
    if (got != want.data()) std::abort();
    fulcrum::v1::ChunkData fields = want;
    fields.clear_data();
    if (reader.chunk(c).SerializeAsString() != fields.SerializeAsString()) std::abort();
    std::vector<grpc::Slice> payload;
    reader.AppendPayloadSlices(c, &payload);
    writer.AddChunk(reader.chunk(c), std::move(payload));
  }
  grpc::Slice whole;
  if (!writer.Finish().DumpToSingleSlice(&whole).ok()) std::abort();
  Message rebuilt;
  if (!rebuilt.ParseFromArray(whole.begin(), static_cast<int>(whole.size()))) std::abort();
  if (rebuilt.SerializeAsString() != expected.SerializeAsString()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t piece = 1 + (data[0] >> 1) * 7;  // 1 .. 890 bytes a slice
  if ((data[0] & 1) == 0) {
    Check<fulcrum::v1::PushRequest>(bytes, piece, fulcrum::v1::PushRequest::kChunksFieldNumber);
  } else {
    Check<fulcrum::v1::PullResponse>(bytes, piece, fulcrum::v1::PullResponse::kChunksFieldNumber);
  }
  return 0;
}
