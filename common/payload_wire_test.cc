#include "common/payload_wire.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace fulcrum {
namespace {

std::string Bytes(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 31 + seed) & 0xff);
  return s;
}

v1::PushRequest SamplePush() {
  v1::PushRequest request;
  request.set_job_id("job-7");
  request.set_worker_id("worker-2");
  request.set_seq(11);
  request.set_step(5);
  request.set_map_version(3);
  request.set_examples(64);
  request.set_examples_digest(0xfeedbeefcafe);
  for (int c = 0; c < 3; ++c) {
    v1::ChunkData* chunk = request.add_chunks();
    chunk->set_chunk_id(c * 2);
    chunk->set_format(c == 1 ? v1::WIRE_BF16 : v1::WIRE_FP32);
    chunk->set_data(Bytes(c == 2 ? 100 : 300000 + c, c));  // one small payload, inlined
  }
  return request;
}

// The same bytes in slices cut at arbitrary points (as received).
grpc::ByteBuffer Recut(const grpc::ByteBuffer& buffer, size_t piece) {
  grpc::Slice whole;
  EXPECT_TRUE(buffer.DumpToSingleSlice(&whole).ok());
  std::vector<grpc::Slice> pieces;
  for (size_t at = 0; at < whole.size(); at += piece) {
    pieces.push_back(whole.sub(at, std::min(whole.size(), at + piece)));
  }
  return grpc::ByteBuffer(pieces.data(), pieces.size());
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  grpc::Slice whole;
  EXPECT_TRUE(buffer.DumpToSingleSlice(&whole).ok());
  return std::string(reinterpret_cast<const char*>(whole.begin()), whole.size());
}

TEST(PayloadWireTest, ListedTwiceNamesTheLowestIdListedMoreThanOnce) {
  EXPECT_EQ(ListedTwice({}), std::nullopt);
  EXPECT_EQ(ListedTwice({3, 1, 2}), std::nullopt);
  EXPECT_EQ(ListedTwice({3, 1, 3}), 3);
  EXPECT_EQ(ListedTwice({9, 4, 1, 9, 4}), 4);
  EXPECT_EQ(ListedTwice({-1, 5, -1}), -1);
}

TEST(PayloadWireTest, MovedPayloadsAreProtobufsOwnEncoding) {
  const v1::PushRequest original = SamplePush();
  v1::PushRequest moved = original;
  const grpc::ByteBuffer buffer = SerializeMovingPayloads(&moved);
  EXPECT_EQ(moved.chunks_size(), 3);
  EXPECT_TRUE(moved.chunks(0).data().empty());  // moved out, not copied
  v1::PushRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
  EXPECT_EQ(parsed.SerializeAsString(), original.SerializeAsString());
}

TEST(PayloadWireTest, ReaderCopiesEachPayloadOutOfAnySlicing) {
  const v1::PushRequest original = SamplePush();
  for (size_t piece : {size_t{1}, size_t{7}, size_t{4096}, size_t{1} << 30}) {
    const grpc::ByteBuffer buffer = Recut(SerializeMessage(original), piece);
    PayloadReader reader;
    v1::PushRequest header;
    ASSERT_TRUE(reader.Parse(buffer, v1::PushRequest::kChunksFieldNumber, &header).ok()) << piece;
    EXPECT_EQ(header.job_id(), "job-7");
    EXPECT_EQ(header.examples_digest(), 0xfeedbeefcafeu);
    EXPECT_EQ(header.chunks_size(), 0);
    ASSERT_EQ(reader.chunks(), 3);
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(reader.chunk(c).chunk_id(), original.chunks(c).chunk_id());
      EXPECT_EQ(reader.chunk(c).format(), original.chunks(c).format());
      EXPECT_TRUE(reader.chunk(c).data().empty());
      ASSERT_EQ(reader.payload_size(c), static_cast<int64_t>(original.chunks(c).data().size()));
      std::string out(static_cast<size_t>(reader.payload_size(c)), '\0');
      reader.CopyPayload(c, out.data());
      EXPECT_EQ(out, original.chunks(c).data()) << "chunk " << c << ", slices of " << piece;
    }
  }
}

TEST(PayloadWireTest, FieldsInAnyOrderAndRepeatedDataAsProtobufReadsThem) {
  // A ChunkData with its data first, then its id, then data again (the last
  // one counts), written by hand as another client might.
  v1::ChunkData first;
  first.set_data("old");
  v1::ChunkData second;
  second.set_chunk_id(9);
  v1::ChunkData third;
  third.set_data("new bytes");
  const std::string chunk = first.SerializeAsString() + second.SerializeAsString() + third.SerializeAsString();
  v1::PullResponse wrapper;
  std::string message;
  message.push_back(static_cast<char>((v1::PullResponse::kChunksFieldNumber << 3) | 2));
  message.push_back(static_cast<char>(chunk.size()));
  message += chunk;
  ASSERT_TRUE(wrapper.ParseFromString(message));
  grpc::Slice slice(message);
  PayloadReader reader;
  v1::PullResponse header;
  ASSERT_TRUE(reader.Parse(grpc::ByteBuffer(&slice, 1), v1::PullResponse::kChunksFieldNumber, &header).ok());
  ASSERT_EQ(reader.chunks(), 1);
  EXPECT_EQ(reader.chunk(0).chunk_id(), 9);
  std::string out(static_cast<size_t>(reader.payload_size(0)), '\0');
  reader.CopyPayload(0, out.data());
  EXPECT_EQ(out, wrapper.chunks(0).data());
}

// An unknown group is skipped as protobuf skips it, and kept in the header.
TEST(PayloadWireTest, UnknownGroupsAreReadAsProtobufReadsThem) {
  const std::string whole = SamplePush().SerializeAsString() + std::string("\x73\x08\x01\x74", 4);
  v1::PushRequest expected;
  ASSERT_TRUE(expected.ParseFromString(whole));
  grpc::Slice slice(whole);
  PayloadReader reader;
  v1::PushRequest header;
  ASSERT_TRUE(reader.Parse(grpc::ByteBuffer(&slice, 1), v1::PushRequest::kChunksFieldNumber, &header).ok());
  EXPECT_EQ(reader.chunks(), expected.chunks_size());
  expected.clear_chunks();
  EXPECT_EQ(header.SerializeAsString(), expected.SerializeAsString());
}

TEST(PayloadWireTest, GarbageIsInvalidArgumentNamingTheMessage) {
  const std::string whole = SamplePush().SerializeAsString();
  for (const std::string& bad : {std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),
                                 whole.substr(0, whole.size() / 2), std::string("\x32\x05\x12\x10", 4),
                                 std::string("\x00", 1),
                                 // A chunk whose length runs past the end (found by payload_wire_fuzz).
                                 std::string("\x32\x05\x08\x03", 4),
                                 // A tag encoded in 6 bytes (protobuf refuses it; found by the fuzzer).
                                 std::string("\xf0\xf5\xe5\xfd\xcf\x2e\xff\xdf\x5d", 9),
                                 // The same inside an unknown group (field 14), and a group
                                 // whose end names another field (found by the fuzzer too).
                                 std::string("\x73\xf0\xf5\xe5\xfd\xcf\x2e\x00\x74", 9),
                                 std::string("\x73\x08\x01\x7c", 4)}) {
    grpc::Slice slice(bad);
    PayloadReader reader;
    v1::PushRequest header;
    const absl::Status status = reader.Parse(grpc::ByteBuffer(&slice, 1), v1::PushRequest::kChunksFieldNumber, &header);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("fulcrum.v1.PushRequest"), std::string::npos) << status;
    v1::PushRequest plain;
    EXPECT_EQ(ParseMessage(grpc::ByteBuffer(&slice, 1), &plain).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(PayloadWireTest, AForwardBuiltFromReceivedSlicesIsTheSameMessage) {
  const v1::PushRequest original = SamplePush();
  const grpc::ByteBuffer buffer = Recut(SerializeMessage(original), 5000);
  PayloadReader reader;
  v1::PushRequest header;
  ASSERT_TRUE(reader.Parse(buffer, v1::PushRequest::kChunksFieldNumber, &header).ok());
  PayloadWriter writer(header, v1::PushRequest::kChunksFieldNumber);
  for (int c = 0; c < reader.chunks(); c += 2) {  // chunks 0 and 2 only
    std::vector<grpc::Slice> payload;
    reader.AppendPayloadSlices(c, &payload);
    writer.AddPart(reader.chunk(c), std::move(payload));
  }
  v1::PushRequest forwarded;
  ASSERT_TRUE(forwarded.ParseFromString(Flatten(writer.Finish())));
  v1::PushRequest expected = original;
  expected.mutable_chunks()->DeleteSubrange(1, 1);
  EXPECT_EQ(forwarded.SerializeAsString(), expected.SerializeAsString());
}


// A sparse push as a worker writes it (each table's rows in a slice of its
// own) is protobuf's encoding of the message; read back from any slicing,
// every table's keys are fields and its rows come back whole, row by row,
// also rows split between slices.
TEST(PayloadWireTest, SparseRowsComeBackWholeFromAnySlicing) {
  v1::SparsePushRequest original;
  original.set_job_id("job-3");
  original.set_step(9);
  original.set_shard(1);
  const size_t row_bytes = 12;  // rows of 3 floats
  for (int t = 0; t < 3; ++t) {
    v1::SparseKeys* table = original.add_tables();
    table->set_table(t);
    table->set_keys(Bytes(8 * (t + 1), t));
    table->set_rows(Bytes(row_bytes * (t == 1 ? 2 : 5000 + t), t + 10));  // table 1's rows are inlined
  }
  v1::SparsePushRequest header = original;
  header.clear_tables();
  PayloadWriter writer(header, v1::SparsePushRequest::kTablesFieldNumber);
  for (const v1::SparseKeys& table : original.tables()) {
    char* rows = nullptr;
    grpc::Slice slice = NewPayloadSlice(table.rows().size(), &rows);
    std::copy(table.rows().begin(), table.rows().end(), rows);
    writer.AddPart(table, {std::move(slice)});  // (its rows field is left out)
  }
  const grpc::ByteBuffer written = writer.Finish();
  v1::SparsePushRequest parsed;  // (the header's fields come first: not protobuf's field order)
  ASSERT_TRUE(parsed.ParseFromString(Flatten(written)));
  EXPECT_TRUE(parsed.SerializeAsString() == original.SerializeAsString());
  for (size_t piece : {size_t{1}, size_t{5}, size_t{7}, size_t{4096}, size_t{1} << 30}) {
    SparsePayloadReader reader;
    v1::SparsePushRequest read;
    ASSERT_TRUE(reader.Parse(Recut(written, piece), v1::SparsePushRequest::kTablesFieldNumber, &read).ok());
    EXPECT_EQ(read.job_id(), "job-3");
    EXPECT_EQ(read.shard(), 1);
    EXPECT_EQ(read.tables_size(), 0);
    ASSERT_EQ(reader.chunks(), 3);
    for (int t = 0; t < 3; ++t) {
      EXPECT_EQ(reader.chunk(t).table(), t);
      EXPECT_TRUE(reader.chunk(t).keys() == original.tables(t).keys());
      EXPECT_TRUE(reader.chunk(t).rows().empty());
      std::string rows;
      size_t next = 0;
      reader.ForEachRows(t, row_bytes, [&](size_t first, const char* bytes, size_t n) {
        EXPECT_EQ(first, next) << "rows in order, none left out";
        next = first + n;
        rows.append(bytes, n * row_bytes);
      });
      EXPECT_TRUE(rows == original.tables(t).rows()) << "table " << t << ", slices of " << piece;
      const std::optional<absl::string_view> view = reader.PayloadView(t);
      if (piece > Flatten(written).size()) {
        ASSERT_TRUE(view.has_value());
        EXPECT_TRUE(*view == original.tables(t).rows());
      } else if (piece < row_bytes) {
        EXPECT_FALSE(view.has_value()) << "rows in many slices are no view";
      }
    }
  }
}

}  // namespace
}  // namespace fulcrum
