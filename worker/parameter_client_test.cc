// ParameterClient's checks before anything is sent: the shard map points at
// a port nobody listens on, so a request that went out would come back
// UNAVAILABLE, not the errors asserted here. And a pull that one server
// fails while another holds it for the version: the held part is cancelled.
#include "worker/parameter_client.h"

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc.h"
#include "common/test_util.h"
#include "fulcrum/v1/parameter.grpc.pb.h"
#include "gtest/gtest.h"
#include "common/sync.h"

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

  std::unique_ptr<ParameterClient::PushStream> listed_twice = client.StartPush(3, 0, 0, absl::Seconds(1));
  listed_twice->Send({0, 0, 1}, grads);
  status = listed_twice->Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_TRUE(Contains(status.message(), "tensor 0 is out of range, sent twice")) << status;

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

  std::unique_ptr<ParameterClient::PullStream> listed_twice = client.StartPull(1, absl::Seconds(1), &params);
  listed_twice->Fetch({1, 1, 0});
  status = listed_twice->Finish(nullptr);
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

// A parameter server whose step never completes: it holds every Pull until
// the client cancels it, and counts the pulls held and cancelled.
class HoldingParameterService : public v1::ParameterService::CallbackService {
 public:
  // Called with the number of pulls held so far, after each new one.
  std::function<void(int)> on_held;

  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext*, const v1::PullRequest*, v1::PullResponse*) override {
    int held = 0;
    {
      MutexLock lock(&mu_);
      held = ++held_;
    }
    auto* reactor = new Held(this);
    if (on_held) on_held(held);
    return reactor;
  }
  // True once `n` pulls were cancelled (waits up to 30 s for that).
  bool WaitForCancelled(int n) {
    MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return cancelled_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(30));
  }

 private:
  class Held : public grpc::ServerUnaryReactor {
   public:
    explicit Held(HoldingParameterService* service) : service_(service) {}
    void OnCancel() override {
      {
        MutexLock lock(&service_->mu_);
        ++service_->cancelled_;
      }
      Finish(grpc::Status::CANCELLED);
    }
    void OnDone() override { delete this; }

   private:
    HoldingParameterService* service_;
  };

  Mutex mu_;
  int held_ ABSL_GUARDED_BY(mu_) = 0;
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;
};

// A parameter server that is going away: it answers its n-th Pull with
// UNAVAILABLE once its peer holds n pulls, so the failure comes while the
// peer holds its part of the same pull. Nothing blocks a callback thread.
class FailingParameterService : public v1::ParameterService::CallbackService {
 public:
  explicit FailingParameterService(HoldingParameterService* peer) {
    peer->on_held = [this](int held) {
      {
        MutexLock lock(&mu_);
        peer_held_ = held;
      }
      Answer();
    };
  }
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context, const v1::PullRequest*,
                                 v1::PullResponse*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    {
      MutexLock lock(&mu_);
      waiting_.push_back(reactor);
    }
    Answer();
    return reactor;
  }

 private:
  void Answer() {
    std::vector<grpc::ServerUnaryReactor*> ready;
    {
      MutexLock lock(&mu_);
      while (!waiting_.empty() && answered_ < peer_held_) {
        ready.push_back(waiting_.front());
        waiting_.pop_front();
        ++answered_;
      }
    }
    for (grpc::ServerUnaryReactor* reactor : ready) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "shutting down"));
    }
  }

  Mutex mu_;
  std::deque<grpc::ServerUnaryReactor*> waiting_ ABSL_GUARDED_BY(mu_);
  int answered_ ABSL_GUARDED_BY(mu_) = 0;
  int peer_held_ ABSL_GUARDED_BY(mu_) = 0;
};

// TwoTensorMap with "w" on `live` and "b" on `failing`.
v1::ShardMap LiveAndFailingMap(int live, int failing) {
  v1::ShardMap map = TwoTensorMap();
  map.mutable_shards(0)->set_address(absl::StrCat("127.0.0.1:", live));
  v1::ShardLocation* other = map.add_shards();
  other->set_server_id("ps-1");
  other->set_address(absl::StrCat("127.0.0.1:", failing));
  map.mutable_chunks(1)->set_shard(1);
  return map;
}

TEST(ParameterClientTest, AFailedServerCancelsThePullItsPeersHold) {
  HoldingParameterService holding;
  FailingParameterService failing(&holding);
  absl::StatusOr<RunningServer> live = StartGrpcServer("127.0.0.1", 0, {&holding});
  ASSERT_TRUE(live.ok()) << live.status();
  absl::StatusOr<RunningServer> going = StartGrpcServer("127.0.0.1", 0, {&failing});
  ASSERT_TRUE(going.ok()) << going.status();
  const std::string going_address = absl::StrCat("127.0.0.1:", going->port);
  // A newer map is known: no backoff before a retry, the first failure returns.
  ParameterClient client(LiveAndFailingMap(live->port, going->port), "job", "w0", [] { return true; });
  std::vector<std::vector<float>> params = client.MakeBuffers();

  const absl::Time start = absl::Now();
  absl::Status status = client.Pull(1, absl::Seconds(60), &params);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(Contains(status.message(), absl::StrCat("pull from ", going_address, ": shutting down")))
      << status << ": the failed server's error, not CANCELLED";
  EXPECT_TRUE(holding.WaitForCancelled(1)) << "the held pull was never cancelled";
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "the held pull was waited out";

  std::unique_ptr<ParameterClient::PullStream> stream = client.StartPull(1, absl::Seconds(60), &params);
  stream->Fetch({0});
  stream->Fetch({1});
  status = stream->Finish(nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(Contains(status.message(), absl::StrCat("pull from ", going_address, ": shutting down"))) << status;
  EXPECT_TRUE(holding.WaitForCancelled(2)) << "the held prefetch was never cancelled";
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "the held prefetch was waited out";
  live->server->Shutdown();
  going->server->Shutdown();
}

TEST(ParameterClientTest, PullStreamNeedsBuffersOfTheWireFormat) {
  ParameterClient client(TwoTensorMap(), "job", "w0");
  std::vector<std::vector<uint16_t>> halves = client.MakeBuffers<uint16_t>();
  EXPECT_EQ(client.StartPull(1, absl::Seconds(1), &halves), nullptr);
}

}  // namespace
}  // namespace fulcrum
