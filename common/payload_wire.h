// Tensor bytes of the data RPCs (Push, Replicate, Pull, and the sparse
// tables' SparsePull, SparsePush, SparseReplicate) outside protobuf's
// copies. A PushRequest or PullResponse goes out as a grpc::ByteBuffer in
// which every chunk's payload (ChunkData.data) is a slice of its own, handed
// to gRPC without a copy, as do a SparsePushRequest's or SparsePullResponse's
// rows (SparseKeys.rows); it is read back by parsing every other field with
// protobuf and copying each payload from the received slices straight to
// where it belongs. The bytes on the wire are exactly protobuf's encoding of
// the message, so any gRPC client or server reads and writes them as
// ordinary messages.
#ifndef FULCRUM_COMMON_PAYLOAD_WIRE_H_
#define FULCRUM_COMMON_PAYLOAD_WIRE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fulcrum/v1/parameter.pb.h"

namespace fulcrum {

// Serializes `message`, moving each chunk's data into a slice of its own (no
// copy of the bytes); the message keeps its other fields.
grpc::ByteBuffer SerializeMovingPayloads(v1::PushRequest* message);
grpc::ByteBuffer SerializeMovingPayloads(v1::PullResponse* message);
// ... with chunk i's payload `lent[i]` instead where that slice is not empty
// (memory lent to gRPC, such as a chunk's values; that chunk's data is empty).
grpc::ByteBuffer SerializeMovingPayloads(v1::PullResponse* message, std::vector<grpc::Slice> lent);

// A slice of `size` bytes, not initialized, that gRPC frees once it is done
// with them: *data is where to write them (aligned for any scalar).
grpc::Slice NewPayloadSlice(size_t size, char** data);

// A message without payload slices to and from a ByteBuffer. Its serialized
// bytes are copied into the slice when small, else the slice owns them (no
// copy): gRPC may keep a request's bytes after the call ended (a write stuck
// on a paused peer), so they live until gRPC lets the slice go.
grpc::ByteBuffer SerializeMessage(const google::protobuf::MessageLite& message);
// INVALID_ARGUMENT naming the message type when the bytes do not parse.
absl::Status ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message);

// The field of a part that holds its payload: a dense chunk's data
// (ChunkData), a sparse table's rows (SparseKeys); its number, its bytes and
// how to clear it.
template <typename Part>
struct PayloadFieldOf;
template <>
struct PayloadFieldOf<v1::ChunkData> {
  static constexpr int kNumber = v1::ChunkData::kDataFieldNumber;
  static const std::string& Of(const v1::ChunkData& part) { return part.data(); }
  static void Clear(v1::ChunkData* part) { part->clear_data(); }
};
template <>
struct PayloadFieldOf<v1::SparseKeys> {
  static constexpr int kNumber = v1::SparseKeys::kRowsFieldNumber;
  static const std::string& Of(const v1::SparseKeys& part) { return part.rows(); }
  static void Clear(v1::SparseKeys* part) { part->clear_rows(); }
};

// A received message whose field `chunks_field` is a repeated Part (a
// ChunkData in PushRequest: 6, PullResponse: 1; a SparseKeys in
// SparsePullResponse: 1, SparsePushRequest: 6), parsed without copying the
// parts' payloads.
template <typename Part>
class BasicPayloadReader {
 public:
  // Parses every field but the parts' payloads into `header` (its parts are
  // left empty) and chunk(i). INVALID_ARGUMENT naming the message type for
  // bytes that are not such a message.
  absl::Status Parse(const grpc::ByteBuffer& buffer, int chunks_field, google::protobuf::MessageLite* header);

  int chunks() const { return static_cast<int>(chunks_.size()); }
  // Part i's fields but its payload (mutable: to move them out).
  const Part& chunk(int i) const { return chunks_[i].fields; }
  Part* mutable_chunk(int i) { return &chunks_[i].fields; }
  int64_t payload_size(int i) const { return chunks_[i].size; }
  // Copies part i's payload (payload_size(i) bytes) to `out`.
  void CopyPayload(int i, char* out) const;
  // Part i's payload as a view of the received memory, when it lies in one
  // slice (else nullopt).
  std::optional<absl::string_view> PayloadView(int i) const;
  // Part i's payload as one run of bytes: a view of the received memory
  // when the payload lies in one slice, else a copy in *scratch.
  absl::string_view ContiguousPayload(int i, std::string* scratch) const;
  // Decodes part i's payload as DecodeValues does (`expected` values in
  // `format`, errors naming `what`), float32 straight from the received
  // slices into `out`; `scratch` as for ContiguousPayload.
  absl::Status DecodePayload(int i, v1::WireFormat format, int64_t expected, float* out, absl::string_view what,
                             std::string* scratch) const;
  // Part i's payload as slices that share the received memory.
  void AppendPayloadSlices(int i, std::vector<grpc::Slice>* out) const;
  // Part i's payload as rows of `row_bytes` (payload_size(i) must be a
  // multiple of it): rows(first, bytes, n) for each run of n whole rows,
  // starting at row `first`, in order. Runs are views of the received
  // memory; a row split between slices comes alone, from a copy.
  void ForEachRows(int i, size_t row_bytes,
                   absl::FunctionRef<void(size_t first, const char* bytes, size_t n)> rows) const;

 private:
  // Calls piece(slice, offset in it, bytes) for each part of part i's
  // payload, in order.
  template <typename Piece>
  void ForEachPiece(int i, Piece piece) const;

  struct Chunk {
    Part fields;
    int64_t offset = 0;  // of the payload in the message
    int64_t size = 0;
  };
  std::vector<grpc::Slice> slices_;
  std::vector<int64_t> starts_;  // offset of each slice in the message
  std::vector<Chunk> chunks_;
};

extern template class BasicPayloadReader<v1::ChunkData>;
extern template class BasicPayloadReader<v1::SparseKeys>;
using PayloadReader = BasicPayloadReader<v1::ChunkData>;
using SparsePayloadReader = BasicPayloadReader<v1::SparseKeys>;

// The chunk ids of a push's parts, in their order.
std::vector<int32_t> ChunkIdsOf(const PayloadReader& chunks);
// An id that `ids` lists more than once (the lowest such), if any.
std::optional<int32_t> ListedTwice(std::vector<int32_t> ids);

// Builds a message with payload slices from parts: the fields of `header`
// (its own parts must be empty), then, for each part (a ChunkData or a
// SparseKeys), its fields and its payload given as slices (which may share
// memory with a reader's buffer: a forward without a copy).
class PayloadWriter {
 public:
  PayloadWriter(const google::protobuf::MessageLite& header, int chunks_field);
  // A part's fields (a payload field of theirs is left out) and its payload.
  template <typename Part>
  void AddPart(const Part& fields, std::vector<grpc::Slice> payload) {
    std::string meta;
    if (PayloadFieldOf<Part>::Of(fields).empty()) {
      fields.AppendToString(&meta);
    } else {
      Part without = fields;
      PayloadFieldOf<Part>::Clear(&without);
      without.AppendToString(&meta);
    }
    AddEncoded(meta, PayloadFieldOf<Part>::kNumber, std::move(payload));
  }
  grpc::ByteBuffer Finish();

 private:
  // A part whose fields but the payload are `meta`, its payload field
  // `payload_field`.
  void AddEncoded(const std::string& meta, int payload_field, std::vector<grpc::Slice> payload);

  const int chunks_field_;
  std::vector<grpc::Slice> slices_;
  std::string pending_;  // small bytes not yet in a slice
};

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_PAYLOAD_WIRE_H_
