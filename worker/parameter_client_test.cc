// ParameterClient's checks before anything is sent: the shard map points at
// a port nobody listens on, so a request that went out would come back
// UNAVAILABLE, not the errors asserted here.
#include "worker/parameter_client.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/test_util.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

// Two tensors, "w" (6 elements) and "b" (2), one chunk each, on one shard.
v1::ShardMap TwoTensorMap() {
  v1::ShardMap map;
  map.set_version(1);
  map.set_chunk_elems(8);
  const int64_t sizes[] = {6, 2};
  const char* names[] = {"w", "b"};
  for (int t = 0; t < 2; ++t) {
    v1::TensorLayout* tensor = map.add_tensors();
    tensor->set_name(names[t]);
    tensor->add_shape(sizes[t]);
    tensor->set_size(sizes[t]);
    v1::ChunkLocation* chunk = map.add_chunks();
    chunk->set_chunk_id(t);
    chunk->set_tensor(t);
    chunk->set_length(sizes[t]);
  }
  v1::ShardLocation* shard = map.add_shards();
  shard->set_server_id("ps-0");
  shard->set_address("127.0.0.1:1");
  return map;
}

TEST(ParameterClientTest, Fp16GradientBeyondItsRangeIsRefusedNamingTheTensor) {
  ParameterClient client(TwoTensorMap(), "job", "w0", nullptr, v1::WIRE_FP16);
  std::vector<std::vector<float>> grads = client.MakeBuffers();
  grads[1][1] = -70000.0f;
  absl::Status status = client.Push(1, 0, 0, grads, absl::Seconds(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(Contains(status.message(), "gradient of b has -70000 at element 1, beyond fp16's range"));

  // Packed on a device: the overflow is already an infinity (0xFC00 = -inf).
  std::vector<std::vector<uint16_t>> packed = client.MakeBuffers<uint16_t>();
  packed[0][4] = 0xFC00;
  status = client.Push(2, 0, 0, packed, absl::Seconds(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(Contains(status.message(), "gradient of w overflowed fp16 at element 4"));
}

TEST(ParameterClientTest, SixteenBitBuffersNeedASixteenBitWireFormat) {
  ParameterClient client(TwoTensorMap(), "job", "w0");
  EXPECT_EQ(client.format(), v1::WIRE_FP32);
  std::vector<std::vector<uint16_t>> halves = client.MakeBuffers<uint16_t>();
  EXPECT_EQ(client.Push(1, 0, 0, halves, absl::Seconds(1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client.Pull(0, absl::Seconds(1), &halves).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ParameterClientTest, SixteenBitFormatsHalveThePayload) {
  EXPECT_EQ(ParameterClient(TwoTensorMap(), "job", "w0").total_bytes(), 32);
  EXPECT_EQ(ParameterClient(TwoTensorMap(), "job", "w0", nullptr, v1::WIRE_BF16).total_bytes(), 16);
  EXPECT_EQ(ParameterClient(TwoTensorMap(), "job", "w0", nullptr, v1::WIRE_FP16).total_bytes(), 16);
}

TEST(ParameterClientTest, PushStreamRefusesAPartialPush) {
  ParameterClient client(TwoTensorMap(), "job", "w0");
  std::vector<std::vector<float>> grads = client.MakeBuffers();
  std::unique_ptr<ParameterClient::PushStream> push = client.StartPush(1, 0, 0, absl::Seconds(1));
  push->Send({1}, grads);
  const absl::Status status = push->Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_TRUE(Contains(status.message(), "tensor w was never sent")) << status;
}

TEST(ParameterClientTest, PushStreamRefusesATensorSentTwiceOrOfTheWrongSize) {
  ParameterClient client(TwoTensorMap(), "job", "w0");
  std::vector<std::vector<float>> grads = client.MakeBuffers();
  std::unique_ptr<ParameterClient::PushStream> twice = client.StartPush(1, 0, 0, absl::Seconds(1));
  twice->Send({0}, grads);
  twice->Send({0, 1}, grads);
  absl::Status status = twice->Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_TRUE(Contains(status.message(), "tensor 0 is out of range, sent twice or of the wrong size")) << status;

  grads[1].push_back(0.0f);
  std::unique_ptr<ParameterClient::PushStream> wrong_size = client.StartPush(2, 0, 0, absl::Seconds(1));
  wrong_size->Send({0, 1}, grads);
  status = wrong_size->Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_TRUE(Contains(status.message(), "tensor 1 is out of range")) << status;
}

TEST(ParameterClientTest, PullStreamRefusesAPartialOrDoubledPrefetch) {
  ParameterClient client(TwoTensorMap(), "job", "w0");
  std::vector<std::vector<float>> params = client.MakeBuffers();
  std::unique_ptr<ParameterClient::PullStream> partial = client.StartPull(1, absl::Seconds(1), &params);
  ASSERT_NE(partial, nullptr);
  partial->Fetch({0});
  absl::Status status = partial->Finish(nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_TRUE(Contains(status.message(), "tensor b was never fetched")) << status;

  std::unique_ptr<ParameterClient::PullStream> twice = client.StartPull(1, absl::Seconds(1), &params);
  twice->Fetch({1});
  twice->Fetch({0, 1});
  status = twice->Finish(nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_TRUE(Contains(status.message(), "tensor 1 is out of range or fetched twice")) << status;
}

TEST(ParameterClientTest, PullStreamReportsAnUnreachableServerWithoutRetrying) {
  ParameterClient client(TwoTensorMap(), "job", "w0");
  std::vector<std::vector<float>> params = client.MakeBuffers();
  params[0][0] = 7.0f;
  std::unique_ptr<ParameterClient::PullStream> stream = client.StartPull(1, absl::Seconds(30), &params);
  stream->Fetch({0, 1});
  const absl::Time start = absl::Now();
  const absl::Status status = stream->Finish(nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(Contains(status.message(), "pull from 127.0.0.1:1")) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "no retries with backoff, no waiting out the deadline";
  EXPECT_EQ(params[0][0], 7.0f) << "nothing decoded";
}

TEST(ParameterClientTest, PullStreamNeedsBuffersOfTheWireFormat) {
  ParameterClient client(TwoTensorMap(), "job", "w0");
  std::vector<std::vector<uint16_t>> halves = client.MakeBuffers<uint16_t>();
  EXPECT_EQ(client.StartPull(1, absl::Seconds(1), &halves), nullptr);
}

}  // namespace
}  // namespace fulcrum
