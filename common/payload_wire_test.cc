#include "common/payload_wire.h"

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
    writer.AddChunk(reader.chunk(c), std::move(payload));
  }
  v1::PushRequest forwarded;
  ASSERT_TRUE(forwarded.ParseFromString(Flatten(writer.Finish())));
  v1::PushRequest expected = original;
  expected.mutable_chunks()->DeleteSubrange(1, 1);
  EXPECT_EQ(forwarded.SerializeAsString(), expected.SerializeAsString());
}

}  // namespace
}  // namespace fulcrum
