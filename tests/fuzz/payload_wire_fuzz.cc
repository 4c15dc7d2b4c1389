// libFuzzer: the reader of the data RPCs' bytes (common/payload_wire.h),
// against protobuf's own parser. Byte 0 picks the message (PushRequest,
// PullResponse, SparsePushRequest or SparsePullResponse) and how the rest is
// cut into slices (as gRPC hands them over); the rest is the message.
// Properties: no crash; the reader accepts exactly what protobuf accepts;
// then every field and every part's payload agrees with protobuf's parse
// (copied, viewed, and read back row by row), and a message rebuilt by
// PayloadWriter from the received slices parses to the same message.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "common/payload_wire.h"

namespace {

using fulcrum::v1::ChunkData;
using fulcrum::v1::SparseKeys;

// The parts of each message.
const auto& PartsOf(const fulcrum::v1::PushRequest& message) { return message.chunks(); }
const auto& PartsOf(const fulcrum::v1::PullResponse& message) { return message.chunks(); }
const auto& PartsOf(const fulcrum::v1::SparsePushRequest& message) { return message.tables(); }
const auto& PartsOf(const fulcrum::v1::SparsePullResponse& message) { return message.tables(); }
void ClearParts(fulcrum::v1::PushRequest* message) { message->clear_chunks(); }
void ClearParts(fulcrum::v1::PullResponse* message) { message->clear_chunks(); }
void ClearParts(fulcrum::v1::SparsePushRequest* message) { message->clear_tables(); }
void ClearParts(fulcrum::v1::SparsePullResponse* message) { message->clear_tables(); }

// Part c's payload read back as rows of `row_bytes` must be the payload,
// every row once, in order.
template <typename Part>
void CheckRows(const fulcrum::BasicPayloadReader<Part>& reader, int c, size_t row_bytes, const std::string& want) {
  std::string rows;
  size_t next = 0;
  reader.ForEachRows(c, row_bytes, [&](size_t first, const char* bytes, size_t n) {
    if (first != next || n == 0) std::abort();
    next = first + n;
    rows.append(bytes, n * row_bytes);
  });
  if (rows != want) std::abort();
}

template <typename Message, typename Part>
void Check(const std::string& bytes, size_t piece, int chunks_field) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    slices.emplace_back(bytes.data() + at, std::min(piece, bytes.size() - at));
  }
  const grpc::ByteBuffer buffer(slices.data(), slices.size());
  Message expected;
  const bool parses = expected.ParseFromString(bytes);
  fulcrum::BasicPayloadReader<Part> reader;
  Message header;
  const absl::Status status = reader.Parse(buffer, chunks_field, &header);
  if (status.ok() != parses) std::abort();
  if (!status.ok()) {
    if (status.code() != absl::StatusCode::kInvalidArgument) std::abort();
    return;
  }
  if (reader.chunks() != PartsOf(expected).size() || !PartsOf(header).empty()) std::abort();
  Message rebuilt_expected = expected;
  ClearParts(&rebuilt_expected);
  if (header.SerializeAsString() != rebuilt_expected.SerializeAsString()) std::abort();
  fulcrum::PayloadWriter writer(header, chunks_field);
  for (int c = 0; c < reader.chunks(); ++c) {
    const Part& want = PartsOf(expected)[c];
    std::string got(static_cast<size_t>(reader.payload_size(c)), '\0');
    reader.CopyPayload(c, got.data());
    const std::string& payload_of_want = fulcrum::PayloadFieldOf<Part>::Of(want);
    if (got != payload_of_want) std::abort();
    const std::optional<absl::string_view> view = reader.PayloadView(c);
    if (view.has_value() && *view != payload_of_want) std::abort();
    CheckRows(reader, c, 1, payload_of_want);
    if (payload_of_want.size() % 12 == 0) CheckRows(reader, c, 12, payload_of_want);
    Part fields = want;
    fulcrum::PayloadFieldOf<Part>::Clear(&fields);
    if (reader.chunk(c).SerializeAsString() != fields.SerializeAsString()) std::abort();
    std::vector<grpc::Slice> payload;
    reader.AppendPayloadSlices(c, &payload);
    writer.AddPart(reader.chunk(c), std::move(payload));
  }
  grpc::Slice whole;
  if (!writer.Finish().DumpToSingleSlice(&whole).ok()) std::abort();
  Message rebuilt;
  if (!rebuilt.ParseFromArray(whole.begin(), static_cast<int>(whole.size()))) std::abort();
  if (rebuilt.SerializeAsString() != expected.SerializeAsString()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fulcrum::v1;
  if (size < 1) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t piece = 1 + (data[0] >> 2) * 14;  // 1 .. 883 bytes a slice
  switch (data[0] & 3) {
    case 0:
      Check<PushRequest, ChunkData>(bytes, piece, PushRequest::kChunksFieldNumber);
      break;
    case 1:
      Check<PullResponse, ChunkData>(bytes, piece, PullResponse::kChunksFieldNumber);
      break;
    case 2:
      Check<SparsePushRequest, SparseKeys>(bytes, piece, SparsePushRequest::kTablesFieldNumber);
      break;
    default:
      Check<SparsePullResponse, SparseKeys>(bytes, piece, SparsePullResponse::kTablesFieldNumber);
      break;
  }
  return 0;
}
