#include "common/payload_wire.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"

namespace fulcrum {
namespace {

using google::protobuf::internal::WireFormatLite;

// Payloads smaller than this are copied in with the fields around them: a
// slice of their own would cost more than the copy.
constexpr size_t kInlinePayload = 1024;

// Reads a list of slices as one stream, without copying.
class SliceStream final : public google::protobuf::io::ZeroCopyInputStream {
 public:
  explicit SliceStream(const std::vector<grpc::Slice>& slices) : slices_(slices) {}

  bool Next(const void** data, int* size) override {
    while (index_ < slices_.size()) {
      const grpc::Slice& slice = slices_[index_];
      if (offset_ < slice.size()) {
        *data = slice.begin() + offset_;
        *size = static_cast<int>(slice.size() - offset_);
        count_ += *size;
        offset_ = slice.size();
        return true;
      }
      ++index_;
      offset_ = 0;
    }
    return false;
  }
  // (Within the slice the last Next returned, as the interface requires.)
  void BackUp(int count) override {
    offset_ -= static_cast<size_t>(count);
    count_ -= count;
  }
  bool Skip(int count) override {
    while (count > 0) {
      if (index_ >= slices_.size()) return false;
      const size_t left = slices_[index_].size() - offset_;
      if (left == 0) {
        ++index_;
        offset_ = 0;
        continue;
      }
      const size_t take = std::min(left, static_cast<size_t>(count));
      offset_ += take;
      count_ += static_cast<int64_t>(take);
      count -= static_cast<int>(take);
    }
    return true;
  }
  int64_t ByteCount() const override { return count_; }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t offset_ = 0;
  int64_t count_ = 0;
};

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

size_t VarintSize(uint64_t value) {
  size_t size = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++size;
  }
  return size;
}

void DeleteString(void* text) { delete static_cast<std::string*>(text); }

// `lent` (optional): chunk i's payload where lent[i] is not empty.
template <typename Message>
grpc::ByteBuffer SerializeMoving(Message* message, int chunks_field, std::vector<grpc::Slice>* lent = nullptr) {
  google::protobuf::RepeatedPtrField<v1::ChunkData> chunks;
  chunks.Swap(message->mutable_chunks());
  PayloadWriter writer(*message, chunks_field);
  for (int i = 0; i < chunks.size(); ++i) {
    v1::ChunkData& chunk = chunks[i];
    if (lent != nullptr && static_cast<size_t>(i) < lent->size() && (*lent)[i].size() > 0) {
      writer.AddPart(chunk, {std::move((*lent)[i])});
      continue;
    }
    auto* data = new std::string();
    data->swap(*chunk.mutable_data());
    std::vector<grpc::Slice> payload;
    if (data->empty()) {
      delete data;
    } else {
      payload.emplace_back(data->data(), data->size(), &DeleteString, data);
    }
    writer.AddPart(chunk, std::move(payload));
  }
  chunks.Swap(message->mutable_chunks());
  return writer.Finish();
}

// Tags and lengths as protobuf's own parser takes them: at most 5 bytes
// (CodedInputStream also reads longer encodings, dropping the high bits),
// lengths below 2^31. ReadTag is false at the end of the message (or of a
// limit) and for a tag too long (*bad).
bool ReadTag(google::protobuf::io::CodedInputStream* in, uint32_t* tag, bool* bad) {
  const int before = in->CurrentPosition();
  *tag = in->ReadTag();
  *bad = *tag != 0 && in->CurrentPosition() - before > 5;
  return *tag != 0 && !*bad;
}

bool ReadLength(google::protobuf::io::CodedInputStream* in, uint32_t* length) {
  const int before = in->CurrentPosition();
  uint64_t value = 0;  // all 35 bits of a 5-byte encoding: ReadVarint32 drops those above 32
  if (!in->ReadVarint64(&value) || in->CurrentPosition() - before > 5 || value > 0x7fffffffu) return false;
  *length = static_cast<uint32_t>(value);
  return true;
}

// WireFormatLite::SkipField, except that a group's fields are read with
// ReadTag's check: protobuf's parser refuses a tag longer than 5 bytes
// anywhere, where WireFormatLite's group skipper reads it truncated (the
// payload_wire fuzzer found a group holding such a tag accepted here and
// refused by protobuf).
bool SkipField(google::protobuf::io::CodedInputStream* in, uint32_t tag,
               google::protobuf::io::CodedOutputStream* out) {
  if (WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
    // The length as protobuf's parser reads it (WireFormatLite's skipper
    // takes a 10-byte length with its high bits dropped: the payload_wire
    // fuzzer found such a field accepted here and refused by protobuf).
    uint32_t length = 0;
    std::string bytes;
    if (!ReadLength(in, &length) || !in->ReadString(&bytes, static_cast<int>(length))) return false;
    out->WriteVarint32(tag);
    out->WriteVarint32(length);
    out->WriteString(bytes);
    return true;
  }
  if (WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_START_GROUP) {
    return WireFormatLite::SkipField(in, tag, out);
  }
  if (!in->IncrementRecursionDepth()) return false;
  out->WriteVarint32(tag);
  uint32_t field = 0;
  bool bad = false;
  while (ReadTag(in, &field, &bad)) {
    if (WireFormatLite::GetTagWireType(field) == WireFormatLite::WIRETYPE_END_GROUP) {
      in->DecrementRecursionDepth();
      if (WireFormatLite::GetTagFieldNumber(field) != WireFormatLite::GetTagFieldNumber(tag)) return false;
      out->WriteVarint32(field);
      return true;
    }
    if (!SkipField(in, field, out)) return false;
  }
  return false;  // the input (or a valid tag) ended inside the group
}

absl::Status NotA(const google::protobuf::MessageLite& message) {
  return absl::InvalidArgumentError(
      absl::StrCat("the message is not a valid ", message.GetTypeName(), " (it does not parse)"));
}

}  // namespace

grpc::ByteBuffer SerializeMovingPayloads(v1::PushRequest* message) {
  return SerializeMoving(message, v1::PushRequest::kChunksFieldNumber);
}

grpc::ByteBuffer SerializeMovingPayloads(v1::PullResponse* message) {
  return SerializeMoving(message, v1::PullResponse::kChunksFieldNumber);
}

grpc::ByteBuffer SerializeMovingPayloads(v1::PullResponse* message, std::vector<grpc::Slice> lent) {
  return SerializeMoving(message, v1::PullResponse::kChunksFieldNumber, &lent);
}

grpc::Slice NewPayloadSlice(size_t size, char** data) {
  char* bytes = new char[std::max<size_t>(size, 1)];
  *data = bytes;
  return grpc::Slice(bytes, size, [](void* owned) { delete[] static_cast<char*>(owned); });
}

grpc::ByteBuffer SerializeMessage(const google::protobuf::MessageLite& message) {
  std::string bytes = message.SerializeAsString();
  if (bytes.size() < kInlinePayload) {
    grpc::Slice copied(bytes);
    return grpc::ByteBuffer(&copied, 1);
  }
  auto* owned = new std::string(std::move(bytes));
  grpc::Slice slice(owned->data(), owned->size(), &DeleteString, owned);
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return NotA(*message);
  SliceStream stream(slices);
  if (!message->ParseFromZeroCopyStream(&stream)) return NotA(*message);
  return absl::OkStatus();
}

template <typename Part>
absl::Status BasicPayloadReader<Part>::Parse(const grpc::ByteBuffer& buffer, int chunks_field,
                                             google::protobuf::MessageLite* header) {
  slices_.clear();
  starts_.clear();
  chunks_.clear();
  if (!buffer.Dump(&slices_).ok()) return NotA(*header);
  int64_t start = 0;
  for (const grpc::Slice& slice : slices_) {
    starts_.push_back(start);
    start += static_cast<int64_t>(slice.size());
  }
  SliceStream stream(slices_);
  std::string header_bytes;
  {
    google::protobuf::io::CodedInputStream in(&stream);
    google::protobuf::io::StringOutputStream header_stream(&header_bytes);
    google::protobuf::io::CodedOutputStream header_out(&header_stream);
    uint32_t tag = 0;
    bool bad = false;
    while (ReadTag(&in, &tag, &bad)) {
      if (WireFormatLite::GetTagFieldNumber(tag) != chunks_field ||
          WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        if (!SkipField(&in, tag, &header_out)) return NotA(*header);
        continue;
      }
      uint32_t length = 0;
      if (!ReadLength(&in, &length)) return NotA(*header);
      const auto limit = in.PushLimit(static_cast<int>(length));
      Chunk chunk;
      std::string fields;
      {
        google::protobuf::io::StringOutputStream fields_stream(&fields);
        google::protobuf::io::CodedOutputStream fields_out(&fields_stream);
        uint32_t field = 0;
        while (ReadTag(&in, &field, &bad)) {
          if (WireFormatLite::GetTagFieldNumber(field) == PayloadFieldOf<Part>::kNumber &&
              WireFormatLite::GetTagWireType(field) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
            uint32_t size = 0;
            if (!ReadLength(&in, &size)) return NotA(*header);
            chunk.offset = in.CurrentPosition();
            chunk.size = size;
            if (!in.Skip(static_cast<int>(size))) return NotA(*header);
          } else if (!SkipField(&in, field, &fields_out)) {
            return NotA(*header);
          }
        }
        // (Input that ends before the chunk's length is a truncated message,
        // though ReadTag ends there as at the limit.)
        if (bad || !in.ConsumedEntireMessage() || in.BytesUntilLimit() != 0) return NotA(*header);
      }
      in.PopLimit(limit);
      if (!chunk.fields.ParseFromString(fields)) return NotA(*header);
      chunks_.push_back(std::move(chunk));
    }
    if (bad || !in.ConsumedEntireMessage()) return NotA(*header);
  }
  if (!header->ParseFromString(header_bytes)) return NotA(*header);
  return absl::OkStatus();
}

template <typename Part>
template <typename Piece>
void BasicPayloadReader<Part>::ForEachPiece(int i, Piece piece) const {
  int64_t offset = chunks_[i].offset;
  int64_t left = chunks_[i].size;
  size_t s = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin()) - 1;
  while (left > 0) {
    const grpc::Slice& slice = slices_[s];
    const int64_t at = offset - starts_[s];
    const int64_t take = std::min<int64_t>(left, static_cast<int64_t>(slice.size()) - at);
    piece(slice, static_cast<size_t>(at), static_cast<size_t>(take));
    offset += take;
    left -= take;
    ++s;
  }
}

template <typename Part>
void BasicPayloadReader<Part>::CopyPayload(int i, char* out) const {
  ForEachPiece(i, [&out](const grpc::Slice& slice, size_t at, size_t take) {
    std::memcpy(out, slice.begin() + at, take);
    out += take;
  });
}

template <typename Part>
std::optional<absl::string_view> BasicPayloadReader<Part>::PayloadView(int i) const {
  const Chunk& chunk = chunks_[i];
  if (chunk.size == 0) return absl::string_view();
  const size_t s =
      static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), chunk.offset) - starts_.begin()) - 1;
  const int64_t at = chunk.offset - starts_[s];
  if (at + chunk.size > static_cast<int64_t>(slices_[s].size())) return std::nullopt;
  return absl::string_view(reinterpret_cast<const char*>(slices_[s].begin()) + at, static_cast<size_t>(chunk.size));
}

template <typename Part>
absl::string_view BasicPayloadReader<Part>::ContiguousPayload(int i, std::string* scratch) const {
  if (std::optional<absl::string_view> view = PayloadView(i); view.has_value()) return *view;
  const Chunk& chunk = chunks_[i];
  scratch->resize(static_cast<size_t>(chunk.size));
  CopyPayload(i, scratch->data());
  return *scratch;
}

template <typename Part>
absl::Status BasicPayloadReader<Part>::DecodePayload(int i, v1::WireFormat format, int64_t expected, float* out,
                                                     absl::string_view what, std::string* scratch) const {
#ifdef ABSL_IS_LITTLE_ENDIAN
  // Little-endian float32 is the wire's own layout: one copy, no staging.
  if (WireBytes(format) == 4 && expected >= 0 && chunks_[i].size == expected * 4) {
    CopyPayload(i, reinterpret_cast<char*>(out));
    return absl::OkStatus();
  }
#endif
  return DecodeValues(format, ContiguousPayload(i, scratch), expected, out, what);
}

template <typename Part>
void BasicPayloadReader<Part>::AppendPayloadSlices(int i, std::vector<grpc::Slice>* out) const {
  ForEachPiece(i, [out](const grpc::Slice& slice, size_t at, size_t take) {
    out->push_back(slice.sub(at, at + take));
  });
}

template <typename Part>
void BasicPayloadReader<Part>::ForEachRows(
    int i, size_t row_bytes, absl::FunctionRef<void(size_t first, const char* bytes, size_t n)> rows) const {
  if (row_bytes == 0) return;
  std::string split;  // a row split between slices, as it is put together
  size_t row = 0;     // the next whole row
  ForEachPiece(i, [&](const grpc::Slice& slice, size_t at, size_t take) {
    const char* bytes = reinterpret_cast<const char*>(slice.begin()) + at;
    if (!split.empty()) {  // the rest of a row begun in the slice before
      const size_t rest = std::min(row_bytes - split.size(), take);
      split.append(bytes, rest);
      bytes += rest;
      take -= rest;
      if (split.size() < row_bytes) return;
      rows(row++, split.data(), 1);
      split.clear();
    }
    const size_t whole = take / row_bytes;
    if (whole > 0) rows(row, bytes, whole);
    row += whole;
    split.assign(bytes + whole * row_bytes, take - whole * row_bytes);
  });
}

template class BasicPayloadReader<v1::ChunkData>;
template class BasicPayloadReader<v1::SparseKeys>;

std::vector<int32_t> ChunkIdsOf(const PayloadReader& chunks) {
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(chunks.chunks()));
  for (int i = 0; i < chunks.chunks(); ++i) ids.push_back(chunks.chunk(i).chunk_id());
  return ids;
}

std::optional<int32_t> ListedTwice(std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end());
  auto twice = std::adjacent_find(ids.begin(), ids.end());
  if (twice == ids.end()) return std::nullopt;
  return *twice;
}

PayloadWriter::PayloadWriter(const google::protobuf::MessageLite& header, int chunks_field)
    : chunks_field_(chunks_field) {
  header.AppendToString(&pending_);
}

void PayloadWriter::AddEncoded(const std::string& meta, int payload_field, std::vector<grpc::Slice> payload) {
  size_t payload_size = 0;
  for (const grpc::Slice& slice : payload) payload_size += slice.size();
  const size_t inner = meta.size() + 1 + VarintSize(payload_size) + payload_size;
  AppendVarint(WireFormatLite::MakeTag(chunks_field_, WireFormatLite::WIRETYPE_LENGTH_DELIMITED), &pending_);
  AppendVarint(inner, &pending_);
  pending_ += meta;
  AppendVarint(WireFormatLite::MakeTag(payload_field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED), &pending_);
  AppendVarint(payload_size, &pending_);
  if (payload_size < kInlinePayload) {
    for (const grpc::Slice& slice : payload) pending_.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    return;
  }
  if (!pending_.empty()) {
    slices_.emplace_back(pending_);
    pending_.clear();
  }
  for (grpc::Slice& slice : payload) slices_.push_back(std::move(slice));
}

grpc::ByteBuffer PayloadWriter::Finish() {
  if (!pending_.empty() || slices_.empty()) {
    slices_.emplace_back(pending_);
    pending_.clear();
  }
  return grpc::ByteBuffer(slices_.data(), slices_.size());
}

}  // namespace fulcrum
