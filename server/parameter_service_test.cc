// The gRPC edge of the parameter server, end to end over loopback: each test
// starts ParameterServiceImpl in this process on port 0 (with an in-memory
// checkpoint store and a lease the test toggles) and talks to it through a
// real v1::ParameterService stub.
#include "server/parameter_service.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/checkpoint_read.h"
#include "common/half.h"
#include "common/kv_store.h"
#include "common/memory_budget.h"
#include "common/metrics.h"
#include "common/param_init.h"
#include "common/rpc.h"
#include "common/sync.h"
#include "common/table_spec.h"
#include "common/tensor_codec.h"
#include "common/test_util.h"
#include "common/unread_call.h"
#include "fulcrum/v1/parameter.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/checkpoint_store.h"
#include "server/parameter_store.h"

namespace fulcrum {
namespace {

constexpr int kNumChunks = 2;
constexpr int64_t kChunkLength = 4;
constexpr float kServiceLr = 0.5f;  // SGD without momentum: values -= 0.5 * gradient, exact in float
constexpr double kRpcSeconds = 10.0;

// One metrics endpoint for every server of the test binary, never destroyed:
// stopping an endpoint's HTTP server takes about 2 s, once per server and test
// otherwise. The services register the same metric families in it (prometheus
// merges them); tests that read them compare before and after.
absl::StatusOr<MetricsEndpoint*> SharedMetrics() {
  static const absl::StatusOr<MetricsEndpoint*>* const metrics = [] {
    auto started = MetricsEndpoint::Start("127.0.0.1", 0);
    if (!started.ok()) return new absl::StatusOr<MetricsEndpoint*>(started.status());
    return new absl::StatusOr<MetricsEndpoint*>(started->release());
  }();
  return *metrics;
}

// One parameter server in this process. The gRPC server is shut down before
// the service and the stores it uses go away.
class TestServer {
 public:
  // `with_checkpoints`: whether the service gets a CheckpointStore (what
  // fulcrum-server does with --data-dir).
  // `memory_budget`: the bytes its jobs may take (0: no limit).
  // `limits`: what gRPC lets its callers claim.
  static absl::StatusOr<std::unique_ptr<TestServer>> Start(const std::string& id, bool with_checkpoints,
                                                           int64_t memory_budget = 0,
                                                           const ServerLimits& limits = ServerLimits()) {
    auto metrics = SharedMetrics();
    if (!metrics.ok()) return metrics.status();
    std::unique_ptr<TestServer> server(new TestServer(id, memory_budget));
    if (with_checkpoints) {
      server->kv_ = NewMemoryStore();
      server->checkpoints_ = std::make_unique<CheckpointStore>(server->kv_.get());
    }
    TestServer* raw = server.get();
    server->service_ = std::make_unique<ParameterServiceImpl>(
        &server->store_, *metrics, [raw] { return raw->lease_valid_.load(); }, server->checkpoints_.get());
    auto running =
        StartGrpcServer("127.0.0.1", 0, {server->service_.get()}, *metrics, /*plaintext=*/false, limits);
    if (!running.ok()) return running.status();
    server->running_ = *std::move(running);
    server->address_ = absl::StrCat("127.0.0.1:", server->running_.port);
    server->stub_ = v1::ParameterService::NewStub(MakeChannel(server->address_));
    return server;
  }

  ~TestServer() {
    if (running_.server != nullptr) running_.server->Shutdown();
  }

  const std::string& id() const { return id_; }
  const std::string& address() const { return address_; }
  v1::ParameterService::Stub* stub() { return stub_.get(); }
  ParameterServiceImpl* service() { return service_.get(); }
  // Cancels calls whose answers are not read (ServerLimits::answer_wait).
  CallWatch* answers() { return running_.answers.get(); }
  const ParameterStore& store() const { return store_; }
  void set_lease_valid(bool valid) { lease_valid_ = valid; }

 private:
  TestServer(std::string id, int64_t memory_budget) : id_(std::move(id)), store_(memory_budget) {}

  const std::string id_;
  std::atomic<bool> lease_valid_{true};
  std::unique_ptr<KvStore> kv_;
  std::unique_ptr<CheckpointStore> checkpoints_;
  ParameterStore store_;
  std::unique_ptr<ParameterServiceImpl> service_;
  RunningServer running_;
  std::string address_;
  std::unique_ptr<v1::ParameterService::Stub> stub_;
};

// A replica group as a shard map names it: (id, address) of the primary and
// of each backup.
struct Replica {
  std::string id;
  std::string address;
};
struct ReplicaGroup {
  Replica primary;
  std::vector<Replica> backups;
};

// One tensor of kNumChunks * kChunkLength floats; chunk i at offset
// i * kChunkLength, every chunk on shard 0, led by `group`.
v1::ShardMap MakeShardMap(int64_t version, const ReplicaGroup& group) {
  v1::ShardMap map;
  map.set_version(version);
  map.set_chunk_elems(kChunkLength);
  v1::TensorLayout* tensor = map.add_tensors();
  tensor->set_name("weights");
  tensor->add_shape(kNumChunks * kChunkLength);
  tensor->set_size(kNumChunks * kChunkLength);
  for (int i = 0; i < kNumChunks; ++i) {
    v1::ChunkLocation* chunk = map.add_chunks();
    chunk->set_chunk_id(i);
    chunk->set_tensor(0);
    chunk->set_offset(i * kChunkLength);
    chunk->set_length(kChunkLength);
    chunk->set_shard(0);
  }
  v1::ShardLocation* shard = map.add_shards();
  shard->set_shard(0);
  shard->set_server_id(group.primary.id);
  shard->set_address(group.primary.address);
  for (const Replica& backup : group.backups) {
    shard->add_backup_ids(backup.id);
    shard->add_backup_addresses(backup.address);
  }
  return map;
}

// What the scheduler sends `server_id` (JobManager::SetupRequestFor followed
// by AddChunkSetup for each chunk of the map): zero-initialized chunks, SGD.
v1::SetupJobRequest MakeSetup(const std::string& job_id, v1::Mode mode, const v1::ShardMap& map,
                              const std::string& server_id) {
  v1::SetupJobRequest request;
  request.set_job_id(job_id);
  request.mutable_spec()->set_mode(mode);
  request.mutable_spec()->mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  request.mutable_spec()->mutable_optimizer()->set_lr(kServiceLr);
  request.set_num_partitions(1);
  request.set_total_steps(100);
  *request.mutable_shard_map() = map;
  request.set_server_id(server_id);
  for (const v1::ChunkLocation& chunk : map.chunks()) {
    v1::ChunkSetup* setup = request.add_chunks();
    setup->set_chunk_id(chunk.chunk_id());
    setup->set_shard(chunk.shard());
    setup->set_tensor(chunk.tensor());
    setup->set_offset(chunk.offset());
    setup->set_length(chunk.length());
    setup->set_init(v1::ChunkSetup::ZEROS);
  }
  return request;
}

std::string Floats(const std::vector<float>& values) {
  std::string bytes;
  EncodeFloats(values.data(), static_cast<int64_t>(values.size()), &bytes);
  return bytes;
}

// A push from worker "w0" of partition 0.
v1::PushRequest MakePush(const std::string& job_id, int64_t seq, int64_t step, int64_t map_version,
                         const std::vector<std::pair<int32_t, std::vector<float>>>& gradients) {
  v1::PushRequest request;
  request.set_job_id(job_id);
  request.set_worker_id("w0");
  request.set_partition(0);
  request.set_seq(seq);
  request.set_step(step);
  request.set_map_version(map_version);
  for (const auto& [chunk_id, gradient] : gradients) {
    v1::ChunkData* chunk = request.add_chunks();
    chunk->set_chunk_id(chunk_id);
    chunk->set_data(Floats(gradient));
  }
  return request;
}

const std::vector<float> kGradient = {1, 2, 3, 4};
const std::vector<float> kOneStep = {-0.5f, -1.0f, -1.5f, -2.0f};  // zeros after one kGradient step
const std::vector<float> kZeros(kChunkLength, 0.0f);

grpc::Status Push(v1::ParameterService::Stub* stub, const v1::PushRequest& request,
                  v1::PushResponse* response = nullptr) {
  v1::PushResponse ignored;
  grpc::ClientContext context;
  SetDeadline(&context, kRpcSeconds);
  return stub->Push(&context, request, response != nullptr ? response : &ignored);
}

grpc::Status Replicate(v1::ParameterService::Stub* stub, const v1::PushRequest& request) {
  v1::PushResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, kRpcSeconds);
  return stub->Replicate(&context, request, &response);
}

grpc::Status SetupJob(v1::ParameterService::Stub* stub, const v1::SetupJobRequest& request) {
  v1::SetupJobResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, kRpcSeconds);
  return stub->SetupJob(&context, request, &response);
}

grpc::Status DropJob(v1::ParameterService::Stub* stub, const std::string& job_id) {
  v1::DropJobRequest request;
  request.set_job_id(job_id);
  request.set_reason("the test is done with it");
  v1::DropJobResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, kRpcSeconds);
  return stub->DropJob(&context, request, &response);
}

grpc::Status Reconfigure(v1::ParameterService::Stub* stub, const std::string& job_id,
                         const v1::ShardMap& map) {
  v1::ReconfigureRequest request;
  request.set_job_id(job_id);
  *request.mutable_shard_map() = map;
  v1::ReconfigureResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, kRpcSeconds);
  return stub->Reconfigure(&context, request, &response);
}

grpc::Status Checkpoint(v1::ParameterService::Stub* stub, const std::string& job_id, int64_t checkpoint_id,
                        int64_t at_version, v1::CheckpointResponse* response) {
  v1::CheckpointRequest request;
  request.set_job_id(job_id);
  request.set_checkpoint_id(checkpoint_id);
  request.set_at_version(at_version);
  request.set_timeout_ms(5000);
  grpc::ClientContext context;
  SetDeadline(&context, kRpcSeconds);
  return stub->Checkpoint(&context, request, response);
}

grpc::Status ReadCheckpoint(v1::ParameterService::Stub* stub, const std::string& job_id,
                            int64_t checkpoint_id, int32_t chunk_id, uint32_t checksum,
                            v1::ChunkState* state) {
  v1::ReadCheckpointRequest request;
  request.set_job_id(job_id);
  request.set_checkpoint_id(checkpoint_id);
  request.set_chunk_id(chunk_id);
  request.set_checksum(checksum);
  grpc::ClientContext context;
  SetDeadline(&context, kRpcSeconds);
  return stub->ReadCheckpoint(&context, request, state);
}

// One chunk as a pull returns it.
struct Pulled {
  grpc::Status status;
  std::vector<float> values;
  int64_t version = -1;
};

Pulled Pull(v1::ParameterService::Stub* stub, const std::string& job_id, int32_t chunk_id,
            int64_t map_version) {
  v1::PullRequest request;
  request.set_job_id(job_id);
  request.add_chunk_ids(chunk_id);
  request.set_map_version(map_version);
  v1::PullResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, kRpcSeconds);
  Pulled pulled;
  pulled.status = stub->Pull(&context, request, &response);
  if (!pulled.status.ok() || response.chunks_size() != 1) return pulled;
  const std::string& data = response.chunks(0).data();
  pulled.values.resize(data.size() / 4);
  pulled.status = ToGrpcStatus(
      DecodeFloats(data, static_cast<int64_t>(pulled.values.size()), pulled.values.data(), "pulled chunk"));
  pulled.version = response.chunks(0).version();
  return pulled;
}

std::vector<float> DecodeValues(const std::string& bytes) {
  std::vector<float> values(bytes.size() / 4);
  EXPECT_TRUE(DecodeFloats(bytes, static_cast<int64_t>(values.size()), values.data(), "chunk state").ok());
  return values;
}

::testing::AssertionResult IsOk(const grpc::Status& status) {
  if (status.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "status " << status.error_code() << ": " << status.error_message();
}

// `status` has `code` and a message naming `needle`.
::testing::AssertionResult HasError(const grpc::Status& status, grpc::StatusCode code,
                                    absl::string_view needle) {
  if (status.error_code() != code) {
    return ::testing::AssertionFailure() << "status code " << status.error_code() << " ("
                                         << status.error_message() << "), expected " << code;
  }
  return Contains(status.error_message(), needle);
}

class ParameterServiceTest : public ::testing::Test {
 protected:
  // The server under test, "ps-0", with a checkpoint store.
  void SetUp() override {
    server_ = StartServer("ps-0", /*with_checkpoints=*/true);
    ASSERT_NE(server_, nullptr);
  }

  std::unique_ptr<TestServer> StartServer(const std::string& id, bool with_checkpoints, int64_t memory_budget = 0) {
    auto server = TestServer::Start(id, with_checkpoints, memory_budget);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return nullptr;
    return *std::move(server);
  }

  // A job on `server` as the lone replica (primary, no backups), map version 1.
  grpc::Status SetUpAlone(TestServer* server, const std::string& job_id, v1::Mode mode) {
    return SetupJob(server->stub(), MakeSetup(job_id, mode, AloneMap(server, 1), server->id()));
  }
  v1::ShardMap AloneMap(TestServer* server, int64_t version) {
    return MakeShardMap(version, ReplicaGroup{{server->id(), server->address()}, {}});
  }

  // Expects `chunk_id` of the job on `server` to hold `values` at `version`.
  void ExpectChunk(TestServer* server, const std::string& job_id, int32_t chunk_id, int64_t map_version,
                   const std::vector<float>& values, int64_t version) {
    Pulled pulled = Pull(server->stub(), job_id, chunk_id, map_version);
    ASSERT_TRUE(IsOk(pulled.status));
    EXPECT_EQ(pulled.values, values) << "chunk " << chunk_id;
    EXPECT_EQ(pulled.version, version) << "chunk " << chunk_id;
  }

  std::unique_ptr<TestServer> server_;
};

TEST_F(ParameterServiceTest, PushForChunkNotHeldIsNotFoundAndServerKeepsServing) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  EXPECT_TRUE(HasError(Push(server_->stub(), MakePush("job", 1, 0, 1, {{7, kGradient}})),
                       grpc::StatusCode::NOT_FOUND, "chunk 7"));
  v1::PushResponse response;
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("job", 2, 0, 1, {{0, kGradient}}), &response)));
  EXPECT_EQ(response.applied(), 1);
  ExpectChunk(server_.get(), "job", 0, 1, kOneStep, 1);
}

TEST_F(ParameterServiceTest, PushToBackupOnlyIsAbortedNotItsPrimary) {
  // "ps-other" leads the shard; this server is only its backup.
  v1::ShardMap map =
      MakeShardMap(1, ReplicaGroup{{"ps-other", "127.0.0.1:1"}, {{server_->id(), server_->address()}}});
  ASSERT_TRUE(IsOk(SetupJob(server_->stub(), MakeSetup("job", v1::ASP, map, server_->id()))));
  EXPECT_TRUE(HasError(Push(server_->stub(), MakePush("job", 1, 0, 1, {{0, kGradient}})),
                       grpc::StatusCode::ABORTED, "chunk 0 of job job: this server is not its primary"));
  ExpectChunk(server_.get(), "job", 0, 1, kZeros, 0);
}

// A map that no longer names this server (it was taken out of the group):
// it must not go on acting as a lone primary.
TEST_F(ParameterServiceTest, ServerTakenOutOfTheGroupRefusesPushes) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  v1::ShardMap moved = MakeShardMap(2, ReplicaGroup{{"ps-other", "127.0.0.1:1"}, {}});
  ASSERT_TRUE(IsOk(Reconfigure(server_->stub(), "job", moved)));
  EXPECT_TRUE(HasError(Push(server_->stub(), MakePush("job", 1, 0, /*map_version=*/2, {{0, kGradient}})),
                       grpc::StatusCode::ABORTED, "which this server does not hold"));
  ExpectChunk(server_.get(), "job", 0, 2, kZeros, 0);
}

TEST_F(ParameterServiceTest, PushWithOlderShardMapIsAbortedAndNothingApplied) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  ASSERT_TRUE(IsOk(Reconfigure(server_->stub(), "job", AloneMap(server_.get(), 2))));
  EXPECT_TRUE(HasError(Push(server_->stub(), MakePush("job", 1, 0, /*map_version=*/1, {{0, kGradient}})),
                       grpc::StatusCode::ABORTED, "shard map version 1, this server is at 2"));
  ExpectChunk(server_.get(), "job", 0, 2, kZeros, 0);
}

TEST_F(ParameterServiceTest, PullWithOlderShardMapIsAborted) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("job", 1, 0, 1, {{0, kGradient}}))));
  ASSERT_TRUE(IsOk(Reconfigure(server_->stub(), "job", AloneMap(server_.get(), 2))));
  EXPECT_TRUE(HasError(Pull(server_->stub(), "job", 0, /*map_version=*/1).status, grpc::StatusCode::ABORTED,
                       "pull made with shard map version 1, this server is at 2"));
  ExpectChunk(server_.get(), "job", 0, 2, kOneStep, 1);
}

// The value of counter `name` with `labels` (among others) in the shared
// registry, summed over the matching series; 0 when there is none.
double CounterValue(const std::string& name, const std::map<std::string, std::string>& labels) {
  auto metrics = SharedMetrics();
  if (!metrics.ok()) return -1;
  double total = 0;
  for (const prometheus::MetricFamily& family : (*metrics)->registry().Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      size_t matched = 0;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        auto wanted = labels.find(label.name);
        if (wanted != labels.end() && wanted->second == label.value) ++matched;
      }
      if (matched == labels.size()) total += metric.counter.value;
    }
  }
  return total;
}

// Waits up to `timeout` for `done`; returns whether it came.
bool Eventually(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= until) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

// A worker that gives up a pull the server holds for a step (it cancels the
// RPC: a peer server failed, a prefetch was dropped) frees the server's
// thread at once, not at the pull's deadline.
TEST_F(ParameterServiceTest, ACancelledHeldPullIsLetGo) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::BSP)));
  const std::map<std::string, std::string> pull = {{"grpc_method", "Pull"}};
  const std::map<std::string, std::string> canceled = {{"grpc_method", "Pull"}, {"grpc_code", "Canceled"}};
  const double started_before = CounterValue("grpc_server_started_total", pull);
  const double canceled_before = CounterValue("grpc_server_handled_total", canceled);

  v1::PullRequest request;
  request.set_job_id("job");
  request.add_chunk_ids(0);
  request.set_map_version(1);
  request.set_min_version(100);  // never reached: nobody pushes
  v1::PullResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, 60.0);
  Notification finished;
  grpc::Status status;
  server_->stub()->async()->Pull(&context, &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    finished.Notify();
  });
  ASSERT_TRUE(Eventually([&] { return CounterValue("grpc_server_started_total", pull) > started_before; },
                         absl::Seconds(20)))
      << "the pull never reached the server";
  context.TryCancel();
  ASSERT_TRUE(finished.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(Eventually([&] { return CounterValue("grpc_server_handled_total", canceled) > canceled_before; },
                         absl::Seconds(20)))
      << "the server still holds the pull (its deadline is 60 s)";
}

int ThreadCount() {
  int threads = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)entry;
    ++threads;
  }
  return threads;
}

// Pulls that can never complete (a step nobody pushes) are held without a
// thread each: 300 of them leave the thread count of the process (client
// and server) about where it was, and all go when their callers cancel.
TEST_F(ParameterServiceTest, HeldPullsDoNotCostAThreadEach) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::BSP)));
  const std::map<std::string, std::string> pull = {{"grpc_method", "Pull"}};
  const std::map<std::string, std::string> canceled = {{"grpc_method", "Pull"}, {"grpc_code", "Canceled"}};
  const double started_before = CounterValue("grpc_server_started_total", pull);
  const double canceled_before = CounterValue("grpc_server_handled_total", canceled);
  const int threads_before = ThreadCount();
  constexpr int kPulls = 300;
  v1::PullRequest request;
  request.set_job_id("job");
  request.add_chunk_ids(0);
  request.set_map_version(1);
  request.set_min_version(1000000);
  struct Call {
    grpc::ClientContext context;
    v1::PullResponse response;
    Notification done;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < kPulls; ++i) {
    calls.push_back(std::make_unique<Call>());
    Call* call = calls.back().get();
    SetDeadline(&call->context, 120.0);
    server_->stub()->async()->Pull(&call->context, &request, &call->response,
                                   [call](grpc::Status) { call->done.Notify(); });
  }
  ASSERT_TRUE(Eventually([&] { return CounterValue("grpc_server_started_total", pull) >= started_before + kPulls; },
                         absl::Seconds(30)))
      << "not every pull reached the server";
  const int threads_holding = ThreadCount();
  EXPECT_LT(threads_holding - threads_before, 30) << "holding " << kPulls << " pulls took "
                                                   << threads_holding - threads_before << " threads";
  for (auto& call : calls) call->context.TryCancel();
  for (auto& call : calls) ASSERT_TRUE(call->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(Eventually(
      [&] { return CounterValue("grpc_server_handled_total", canceled) >= canceled_before + kPulls; },
      absl::Seconds(20)))
      << "the server still holds cancelled pulls";
}

// A request naming one chunk many times is refused whole (the "pull bomb":
// 20,000 copies of one chunk in one pull), as is an answer too big for a
// message; the server keeps serving.
TEST_F(ParameterServiceTest, RepeatedChunksAndOversizedPullsAreRefused) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  v1::PullRequest bomb;
  bomb.set_job_id("job");
  bomb.set_map_version(1);
  for (int i = 0; i < 20000; ++i) bomb.add_chunk_ids(0);
  v1::PullResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, kRpcSeconds);
  EXPECT_TRUE(HasError(server_->stub()->Pull(&context, bomb, &response), grpc::StatusCode::INVALID_ARGUMENT,
                       "more than once"));
  EXPECT_EQ(response.chunks_size(), 0);
  // A push naming a chunk twice: refused, nothing applied (not "one applied,
  // one duplicate").
  v1::PushResponse pushed;
  EXPECT_TRUE(HasError(Push(server_->stub(), MakePush("job", 1, 0, 1, {{0, kGradient}, {0, kGradient}}), &pushed),
                       grpc::StatusCode::INVALID_ARGUMENT, "more than once"));
  ExpectChunk(server_.get(), "job", 0, 1, kZeros, 0);
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("job", 2, 0, 1, {{0, kGradient}}))));
  ExpectChunk(server_.get(), "job", 0, 1, kOneStep, 1);
}

// Pull's messages are handled as bytes on the server (common/payload_wire.h):
// bytes that are not a PullRequest get INVALID_ARGUMENT naming the message,
// and the answer, read by an ordinary protobuf client, holds the values.
// LAMB over gRPC: a whole step waits; a pull with lamb_step gets each
// chunk's norms; a push of their sums applies the step as LAMB over the whole
// tensor. Requests that do not fit are refused before any chunk changes, and
// LAMB requests to a job that does not run LAMB are answered at once.
TEST_F(ParameterServiceTest, LambNormsTravelAsPullsAndPushesAndBadOnesAreRefused) {
  v1::SetupJobRequest setup = MakeSetup("lamb", v1::BSP, AloneMap(server_.get(), 1), server_->id());
  setup.mutable_spec()->mutable_optimizer()->set_kind(v1::OptimizerSpec::LAMB);
  for (v1::ChunkSetup& chunk : *setup.mutable_chunks()) {
    chunk.set_init(v1::ChunkSetup::UNIFORM);
    chunk.set_init_scale(0.5f);
  }
  ASSERT_TRUE(IsOk(SetupJob(server_->stub(), setup)));
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "sgd", v1::ASP)));
  auto lamb_pull = [&](const std::string& job, int64_t step, v1::PullResponse* response) {
    v1::PullRequest request;
    request.set_job_id(job);
    for (int c = 0; c < kNumChunks; ++c) request.add_chunk_ids(c);
    request.set_map_version(1);
    request.set_lamb_step(step);
    grpc::ClientContext context;
    SetDeadline(&context, 2.0);
    return server_->stub()->Pull(&context, request, response);
  };
  auto norms_push = [&](const std::string& job, int64_t step, std::vector<v1::LambNorm> norms,
                        const std::string& data = "", int32_t chunk = 0) {
    v1::PushRequest request = MakePush(job, 100 + step, step, 1, {});
    for (int c = 0; c < kNumChunks; ++c) request.add_chunks()->set_chunk_id(c == 0 ? chunk : c);
    request.mutable_chunks(0)->set_data(data);
    for (const v1::LambNorm& norm : norms) *request.add_lamb_norms() = norm;
    v1::PushResponse response;
    grpc::Status status = Push(server_->stub(), request, &response);
    return std::make_pair(status, response);
  };
  auto norm = [](int32_t tensor, double w, double r) {
    v1::LambNorm n;
    n.set_tensor(tensor);
    n.set_weight_sq(w);
    n.set_update_sq(r);
    return n;
  };
  // Not LAMB: refused at once, not held until the deadline.
  v1::PullResponse response;
  const absl::Time start = absl::Now();
  EXPECT_TRUE(HasError(lamb_pull("sgd", 0, &response), grpc::StatusCode::FAILED_PRECONDITION, "does not run LAMB"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_TRUE(HasError(norms_push("sgd", 0, {norm(0, 1, 1)}).first, grpc::StatusCode::FAILED_PRECONDITION,
                       "does not run LAMB"));
  for (int64_t step : {int64_t{-1}, int64_t{101}, std::numeric_limits<int64_t>::max()}) {
    EXPECT_TRUE(HasError(lamb_pull("lamb", step, &response), grpc::StatusCode::INVALID_ARGUMENT,
                         "the job's steps are in [0, 100]"))
        << step;
  }

  const std::vector<float> before = Pull(server_->stub(), "lamb", 0, 1).values;
  const std::vector<float> before1 = Pull(server_->stub(), "lamb", 1, 1).values;
  const std::vector<float> gradient = {0.5f, -1.0f, 0.25f, 2.0f};
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("lamb", 1, 0, 1, {{0, gradient}, {1, gradient}}))));
  ASSERT_TRUE(IsOk(lamb_pull("lamb", 0, &response)));
  ASSERT_EQ(response.chunks_size(), kNumChunks);
  double w_sq = 0, r_sq = 0;
  for (const v1::ChunkData& chunk : response.chunks()) {
    EXPECT_EQ(chunk.version(), 0);
    EXPECT_TRUE(chunk.data().empty());
    w_sq += chunk.lamb().weight_sq();
    r_sq += chunk.lamb().update_sq();
  }
  EXPECT_GT(w_sq, 0);
  // Bad norms pushes change nothing.
  EXPECT_TRUE(HasError(norms_push("lamb", 0, {norm(0, -1, r_sq)}).first, grpc::StatusCode::INVALID_ARGUMENT,
                       "finite and >= 0"));
  EXPECT_TRUE(HasError(norms_push("lamb", 0, {norm(0, w_sq, r_sq), norm(0, w_sq, r_sq)}).first,
                       grpc::StatusCode::INVALID_ARGUMENT, "more than once"));
  EXPECT_TRUE(HasError(norms_push("lamb", 0, {norm(3, w_sq, r_sq)}).first, grpc::StatusCode::INVALID_ARGUMENT,
                       "no norms of its tensor 0"));
  EXPECT_TRUE(HasError(norms_push("lamb", 0, {norm(0, w_sq, r_sq)}, "abcd").first,
                       grpc::StatusCode::INVALID_ARGUMENT, "carries no gradients"));
  EXPECT_TRUE(HasError(norms_push("lamb", 0, {norm(0, w_sq, r_sq)}, "", 7).first, grpc::StatusCode::NOT_FOUND,
                       "chunk 7"));
  EXPECT_TRUE(HasError(norms_push("lamb", -2, {norm(0, w_sq, r_sq)}).first,
                       grpc::StatusCode::INVALID_ARGUMENT, "the job's steps are in [0, 100]"));
  ExpectChunk(server_.get(), "lamb", 0, 1, before, 0);
  // The sums apply the step, once.
  auto [status, applied] = norms_push("lamb", 0, {norm(0, w_sq, r_sq)});
  ASSERT_TRUE(IsOk(status));
  EXPECT_EQ(applied.applied(), kNumChunks);
  auto [again, duplicate] = norms_push("lamb", 0, {norm(0, w_sq, r_sq)});
  ASSERT_TRUE(IsOk(again));
  EXPECT_EQ(duplicate.duplicates(), kNumChunks);
  OptimizerConfig config;
  config.kind = OptimizerKind::kLamb;
  config.epsilon = 1e-6f;
  for (int c = 0; c < kNumChunks; ++c) {
    std::vector<float> expected = c == 0 ? before : before1;
    std::vector<std::vector<float>> moments(2, std::vector<float>(kChunkLength, 0.0f));
    float* slots[2] = {moments[0].data(), moments[1].data()};
    ApplyLamb(config, kServiceLr, 1, kChunkLength, gradient.data(), expected.data(), slots, {w_sq, r_sq});
    ExpectChunk(server_.get(), "lamb", c, 1, expected, 1);
  }
}

TEST_F(ParameterServiceTest, PullIsServedAsBytesAndGarbageIsInvalidArgument) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  grpc::GenericStub generic(MakeChannel(server_->address()));
  const std::string method = absl::StrCat("/", v1::ParameterService::service_full_name(), "/Pull");
  for (const std::string& garbage : {std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),
                                     std::string("\x0a\x40job", 5)}) {
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext context;
    SetDeadline(&context, kRpcSeconds);
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(&context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    done.WaitForNotification();
    EXPECT_TRUE(HasError(status, grpc::StatusCode::INVALID_ARGUMENT, "fulcrum.v1.PullRequest")) << garbage.size();
  }
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("job", 1, 0, 1, {{0, kGradient}}))));
  ExpectChunk(server_.get(), "job", 0, 1, kOneStep, 1);
}

TEST_F(ParameterServiceTest, PushWithoutLeaseIsUnavailableUntilLeaseReturns) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  const v1::PushRequest push = MakePush("job", 1, 0, 1, {{0, kGradient}});
  server_->set_lease_valid(false);
  EXPECT_TRUE(HasError(Push(server_->stub(), push), grpc::StatusCode::UNAVAILABLE, "lost its lease"));
  ExpectChunk(server_.get(), "job", 0, 1, kZeros, 0);

  server_->set_lease_valid(true);
  v1::PushResponse response;
  ASSERT_TRUE(IsOk(Push(server_->stub(), push, &response)));
  EXPECT_EQ(response.applied(), 1);
  EXPECT_EQ(response.duplicates(), 0);  // the refused push left no watermark behind
  ExpectChunk(server_.get(), "job", 0, 1, kOneStep, 1);
}

// A server set up to lead chunks moved to it (a new shard) with
// await_activation holds their state but takes no write of the new map
// until the scheduler sends that map again (Reconfigure): a handover the
// scheduler abandons before then cannot have a write there to lose.
TEST_F(ParameterServiceTest, ANewShardLeaderAwaitingActivationTakesNoWriteUntilReconfigured) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("job", 1, 0, 1, {{0, kGradient}}))));
  std::unique_ptr<TestServer> newcomer = StartServer("ps-1", /*with_checkpoints=*/false);
  ASSERT_NE(newcomer, nullptr);
  v1::SetupJobRequest setup = MakeSetup("job", v1::ASP, AloneMap(newcomer.get(), 2), newcomer->id());
  for (v1::ChunkSetup& chunk : *setup.mutable_chunks()) chunk.set_copy_from(server_->address());
  setup.set_await_activation(true);
  ASSERT_TRUE(IsOk(SetupJob(newcomer->stub(), setup)));
  EXPECT_TRUE(HasError(Push(newcomer->stub(), MakePush("job", 2, 1, 2, {{0, kGradient}})),
                       grpc::StatusCode::UNAVAILABLE, "has not received shard map version 2"));

  ASSERT_TRUE(IsOk(Reconfigure(newcomer->stub(), "job", AloneMap(newcomer.get(), 2))));
  ExpectChunk(newcomer.get(), "job", 0, 2, kOneStep, 1);  // the copy, and nothing the refused push brought
  v1::PushResponse response;
  ASSERT_TRUE(IsOk(Push(newcomer->stub(), MakePush("job", 2, 1, 2, {{0, kGradient}}), &response)));
  EXPECT_EQ(response.applied(), 1);
}

// Primary "ps-0" (server_) and its backup "ps-1" hold the job at map version 1.
class ParameterServiceReplicationTest : public ParameterServiceTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(ParameterServiceTest::SetUp());
    backup_ = StartServer("ps-1", /*with_checkpoints=*/false);
    ASSERT_NE(backup_, nullptr);
    ASSERT_TRUE(IsOk(SetupJob(backup_->stub(), MakeSetup("job", v1::ASP, Map(1), backup_->id()))));
    ASSERT_TRUE(IsOk(SetupJob(server_->stub(), MakeSetup("job", v1::ASP, Map(1), server_->id()))));
  }
  v1::ShardMap Map(int64_t version) {
    return MakeShardMap(
        version, ReplicaGroup{{server_->id(), server_->address()}, {{backup_->id(), backup_->address()}}});
  }
  std::unique_ptr<TestServer> backup_;
};

TEST_F(ParameterServiceReplicationTest, PushReachesBackupBeforeItIsAcknowledged) {
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("job", 1, 0, 1, {{0, kGradient}}))));
  ExpectChunk(backup_.get(), "job", 0, 1, kOneStep, 1);
  ExpectChunk(server_.get(), "job", 0, 1, kOneStep, 1);
}

TEST_F(ParameterServiceReplicationTest, ReplicateWithOlderShardMapThanBackupsIsAborted) {
  ASSERT_TRUE(IsOk(Reconfigure(backup_->stub(), "job", Map(2))));
  EXPECT_TRUE(HasError(Replicate(backup_->stub(), MakePush("job", 1, 0, /*map_version=*/1, {{0, kGradient}})),
                       grpc::StatusCode::ABORTED, "shard map version 1, this server is at 2"));
  ExpectChunk(backup_.get(), "job", 0, 2, kZeros, 0);
}

TEST_F(ParameterServiceReplicationTest, PrimaryBehindItsBackupsMapIsAbortedAndAppliesNothing) {
  ASSERT_TRUE(IsOk(Reconfigure(backup_->stub(), "job", Map(2))));
  EXPECT_TRUE(HasError(Push(server_->stub(), MakePush("job", 1, 0, 1, {{0, kGradient}})),
                       grpc::StatusCode::ABORTED,
                       absl::StrCat("replicating to backup ", backup_->address())));
  ExpectChunk(server_.get(), "job", 0, 1, kZeros, 0);
  ExpectChunk(backup_.get(), "job", 0, 2, kZeros, 0);
}

TEST_F(ParameterServiceTest, PushWithNanIsInvalidArgumentNamingElementAndAppliesNothing) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Chunk 0's gradient is fine; chunk 1's is not: the whole push is refused.
  EXPECT_TRUE(HasError(Push(server_->stub(), MakePush("job", 1, 0, 1, {{0, kGradient}, {1, {1, 2, nan, 4}}})),
                       grpc::StatusCode::INVALID_ARGUMENT,
                       "chunk 1 of job job has a non-finite gradient (nan) at element 2"));
  ExpectChunk(server_.get(), "job", 0, 1, kZeros, 0);
  ExpectChunk(server_.get(), "job", 1, 1, kZeros, 0);
}

// A push names a step of the job's (MakeSetup: 100 steps): a step past its
// end would be kept as its partition's last, making every later push of
// the partition a silent duplicate; nothing of a refused one applies.
TEST_F(ParameterServiceTest, PushOfAStepOutsideTheJobsIsInvalidArgumentAndMovesNothing) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  int64_t seq = 1;
  for (int64_t step : {int64_t{-1}, int64_t{101}, std::numeric_limits<int64_t>::max()}) {
    EXPECT_TRUE(HasError(Push(server_->stub(), MakePush("job", seq++, step, 1, {{0, kGradient}})),
                         grpc::StatusCode::INVALID_ARGUMENT, "the job's steps are in [0, 100]"))
        << step;
  }
  ExpectChunk(server_.get(), "job", 0, 1, kZeros, 0);
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("job", seq++, 0, 1, {{0, kGradient}}))));
  ExpectChunk(server_.get(), "job", 0, 1, kOneStep, 1);
}

TEST_F(ParameterServiceTest, PushOfWrongSizeIsInvalidArgument) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  EXPECT_TRUE(HasError(Push(server_->stub(), MakePush("job", 1, 0, 1, {{0, {1, 2, 3}}})),
                       grpc::StatusCode::INVALID_ARGUMENT,
                       "push to chunk 0 of job job: payload has 12 bytes, expected 16"));
  ExpectChunk(server_.get(), "job", 0, 1, kZeros, 0);
}

TEST_F(ParameterServiceTest, DuplicatePushIsAcknowledgedNotAppliedTwice) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  const v1::PushRequest push = MakePush("job", 1, 0, 1, {{0, kGradient}});
  v1::PushResponse first;
  ASSERT_TRUE(IsOk(Push(server_->stub(), push, &first)));
  EXPECT_EQ(first.applied(), 1);
  EXPECT_EQ(first.duplicates(), 0);
  v1::PushResponse again;
  ASSERT_TRUE(IsOk(Push(server_->stub(), push, &again)));
  EXPECT_EQ(again.applied(), 0);
  EXPECT_EQ(again.duplicates(), 1);
  ExpectChunk(server_.get(), "job", 0, 1, kOneStep, 1);
}

TEST_F(ParameterServiceTest, CheckpointAtNegativeVersionReportsVersionRange) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("job", 1, 0, 1, {{0, kGradient}}))));
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("job", 2, 1, 1, {{0, kGradient}}))));
  v1::CheckpointResponse response;
  ASSERT_TRUE(IsOk(Checkpoint(server_->stub(), "job", 1, /*at_version=*/-1, &response)));
  EXPECT_EQ(response.min_version(), 0);  // chunk 1
  EXPECT_EQ(response.max_version(), 2);  // chunk 0
  EXPECT_EQ(response.chunks_size(), 0);  // nothing taken
}

TEST_F(ParameterServiceTest, CheckpointWithoutCheckpointStoreIsFailedPrecondition) {
  std::unique_ptr<TestServer> bare = StartServer("ps-bare", /*with_checkpoints=*/false);
  ASSERT_NE(bare, nullptr);
  ASSERT_TRUE(IsOk(SetUpAlone(bare.get(), "job", v1::ASP)));
  v1::CheckpointResponse response;
  EXPECT_TRUE(HasError(Checkpoint(bare->stub(), "job", 1, /*at_version=*/0, &response),
                       grpc::StatusCode::FAILED_PRECONDITION, "--data-dir"));
}

// A checkpoint holds its captured state and the encoded copy until it is
// stored: that counts against the server's memory budget while it lasts, and
// a checkpoint that does not fit fails (the job trains on) instead of taking
// memory past the budget.
TEST_F(ParameterServiceTest, ACheckpointThatDoesNotFitTheBudgetFailsAndHoldsNothing) {
  int64_t state = 0;
  {
    std::unique_ptr<TestServer> probe = StartServer("ps-probe", /*with_checkpoints=*/true);
    ASSERT_NE(probe, nullptr);
    ASSERT_TRUE(IsOk(SetUpAlone(probe.get(), "job", v1::ASP)));
    state = probe->store().bytes();
  }
  ASSERT_GT(state, 0);
  for (const bool fits : {false, true}) {
    SCOPED_TRACE(fits ? "room for the checkpoint" : "no room for it");
    // The job fits either way; a checkpoint's hold of three times its
    // captured state (at most the job's state) fits only the larger budget.
    std::unique_ptr<TestServer> server = StartServer(
        fits ? "ps-roomy" : "ps-tight", /*with_checkpoints=*/true, fits ? 4 * state : state + state / 2);
    ASSERT_NE(server, nullptr);
    ASSERT_TRUE(IsOk(SetUpAlone(server.get(), "job", v1::ASP)));
    ASSERT_TRUE(IsOk(Push(server->stub(), MakePush("job", 1, 0, 1, {{0, kGradient}}))));
    v1::CheckpointResponse response;
    const grpc::Status status = Checkpoint(server->stub(), "job", 1, /*at_version=*/0, &response);
    if (fits) {
      EXPECT_TRUE(IsOk(status));
    } else {
      EXPECT_TRUE(HasError(status, grpc::StatusCode::RESOURCE_EXHAUSTED, "checkpoint 1 of job job needs"));
      EXPECT_TRUE(HasError(status, grpc::StatusCode::RESOURCE_EXHAUSTED, "memory budget"));
    }
    EXPECT_EQ(server->store().bytes(), state) << "the hold is let go once the checkpoint is done";
    // The job trains on.
    EXPECT_TRUE(IsOk(Push(server->stub(), MakePush("job", 2, 1, 1, {{0, kGradient}}))));
  }
}

TEST_F(ParameterServiceTest, AspCheckpointWritesEveryChunkAndReadsBack) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("job", 1, 0, 1, {{0, kGradient}, {1, {-4, -3, -2, -1}}}))));
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("job", 2, 1, 1, {{0, kGradient}}))));
  v1::CheckpointResponse response;
  ASSERT_TRUE(IsOk(Checkpoint(server_->stub(), "job", 1, /*at_version=*/0, &response)));
  ASSERT_EQ(response.chunks_size(), kNumChunks);
  for (const v1::CheckpointChunk& chunk : response.chunks()) {
    SCOPED_TRACE(absl::StrCat("chunk ", chunk.chunk_id()));
    EXPECT_NE(chunk.checksum(), 0u);
    EXPECT_GT(chunk.bytes(), 0);
    Pulled pulled = Pull(server_->stub(), "job", chunk.chunk_id(), 1);
    ASSERT_TRUE(IsOk(pulled.status));
    EXPECT_EQ(chunk.version(), pulled.version);
    v1::ChunkState state;
    ASSERT_TRUE(IsOk(ReadCheckpoint(server_->stub(), "job", 1, chunk.chunk_id(), chunk.checksum(), &state)));
    EXPECT_EQ(DecodeValues(state.values()), pulled.values);
    EXPECT_EQ(state.version(), pulled.version);
  }
}

TEST_F(ParameterServiceTest, BspCheckpointBelowChunkVersionIsAborted) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::BSP)));
  // One partition: every push completes a step.
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("job", 1, 0, 1, {{0, kGradient}, {1, kGradient}}))));
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("job", 2, 1, 1, {{0, kGradient}, {1, kGradient}}))));
  v1::CheckpointResponse response;
  EXPECT_TRUE(HasError(Checkpoint(server_->stub(), "job", 1, /*at_version=*/1, &response),
                       grpc::StatusCode::ABORTED,
                       "chunk 0 of job job is at version 2, past the checkpoint's 1"));
}

TEST_F(ParameterServiceTest, ReadCheckpointWithWrongChecksumIsDataLoss) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  v1::CheckpointResponse response;
  ASSERT_TRUE(IsOk(Checkpoint(server_->stub(), "job", 1, /*at_version=*/0, &response)));
  ASSERT_EQ(response.chunks_size(), kNumChunks);
  v1::ChunkState state;
  EXPECT_TRUE(
      HasError(ReadCheckpoint(server_->stub(), "job", 1, 0, response.chunks(0).checksum() ^ 1u, &state),
               grpc::StatusCode::DATA_LOSS, "chunk 0 of checkpoint 1 of job \"job\""));
}

TEST_F(ParameterServiceTest, DeletedCheckpointIsNotFound) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  v1::CheckpointResponse response;
  ASSERT_TRUE(IsOk(Checkpoint(server_->stub(), "job", 1, /*at_version=*/0, &response)));
  v1::DeleteCheckpointRequest request;
  request.set_job_id("job");
  request.set_checkpoint_id(1);
  v1::DeleteCheckpointResponse deleted;
  grpc::ClientContext context;
  SetDeadline(&context, kRpcSeconds);
  ASSERT_TRUE(IsOk(server_->stub()->DeleteCheckpoint(&context, request, &deleted)));
  v1::ChunkState state;
  EXPECT_TRUE(HasError(ReadCheckpoint(server_->stub(), "job", 1, 0, 0, &state), grpc::StatusCode::NOT_FOUND,
                       "chunk 0 of checkpoint 1 of job \"job\""));
}

// A RestoreSource for checkpoint `checkpoint_id` of `job_id`, written by
// `writer` (the chunks as its Checkpoint response lists them).
v1::RestoreSource RestoreFrom(const std::string& job_id, int64_t checkpoint_id,
                              const v1::CheckpointResponse& written, const TestServer& writer) {
  v1::RestoreSource restore;
  restore.set_job_id(job_id);
  restore.set_checkpoint_id(checkpoint_id);
  for (v1::CheckpointChunk chunk : written.chunks()) {
    chunk.add_server_ids(writer.id());
    *restore.add_chunks() = std::move(chunk);
  }
  (*restore.mutable_server_addresses())[writer.id()] = writer.address();
  return restore;
}

TEST_F(ParameterServiceTest, SetupJobRestoresCheckpointWrittenByThisServer) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "old", v1::ASP)));
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("old", 1, 0, 1, {{0, kGradient}, {1, {-4, -3, -2, -1}}}))));
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("old", 2, 1, 1, {{0, kGradient}}))));
  v1::CheckpointResponse written;
  ASSERT_TRUE(IsOk(Checkpoint(server_->stub(), "old", 5, /*at_version=*/0, &written)));

  v1::SetupJobRequest setup = MakeSetup("new", v1::ASP, AloneMap(server_.get(), 1), server_->id());
  *setup.mutable_restore() = RestoreFrom("old", 5, written, *server_);
  ASSERT_TRUE(IsOk(SetupJob(server_->stub(), setup)));
  ExpectChunk(server_.get(), "new", 0, 1, {-1, -2, -3, -4}, 2);
  ExpectChunk(server_.get(), "new", 1, 1, {2, 1.5f, 1, 0.5f}, 1);
}

TEST_F(ParameterServiceTest, SetupJobRestoresCheckpointFromTheServerThatWroteIt) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "old", v1::ASP)));
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("old", 1, 0, 1, {{0, kGradient}}))));
  v1::CheckpointResponse written;
  ASSERT_TRUE(IsOk(Checkpoint(server_->stub(), "old", 5, /*at_version=*/0, &written)));

  // Another server, whose own checkpoint store lacks checkpoint 5, reads it from ps-0.
  std::unique_ptr<TestServer> other = StartServer("ps-1", /*with_checkpoints=*/true);
  ASSERT_NE(other, nullptr);
  v1::SetupJobRequest setup = MakeSetup("new", v1::ASP, AloneMap(other.get(), 1), other->id());
  *setup.mutable_restore() = RestoreFrom("old", 5, written, *server_);
  ASSERT_TRUE(IsOk(SetupJob(other->stub(), setup)));
  ExpectChunk(other.get(), "new", 0, 1, kOneStep, 1);
  ExpectChunk(other.get(), "new", 1, 1, kZeros, 0);
}

// A SetupJob naming a job that already trained here (a hostile or confused
// caller) must not reset its parameters under its workers.
TEST_F(ParameterServiceTest, SetupJobOfATrainedJobIsAlreadyExistsAndChangesNothing) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job-1", v1::BSP)));
  // Setting a job up again before it trained (a setup the scheduler redoes) is fine.
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job-1", v1::BSP)));
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakePush("job-1", 1, 0, 1, {{0, kGradient}}))));
  EXPECT_TRUE(HasError(SetUpAlone(server_.get(), "job-1", v1::BSP), grpc::StatusCode::ALREADY_EXISTS, "job-1"));
  v1::SetupJobRequest later = MakeSetup("job-1", v1::BSP, AloneMap(server_.get(), 7), server_->id());
  EXPECT_TRUE(HasError(SetupJob(server_->stub(), later), grpc::StatusCode::ALREADY_EXISTS, "DropJob"));
  ExpectChunk(server_.get(), "job-1", 0, 1, kOneStep, 1);
}

// Each chunk of MakeSetup's jobs (SGD without momentum, BSP, 1 partition)
// holds 4 arrays of 4 floats (value, partition buffer, sum, previous values):
// 64 bytes, and its bookkeeping beside them; a job adds its own. An ASP job's
// chunks hold the values alone.
TEST_F(ParameterServiceTest, SetupBeyondTheMemoryBudgetIsResourceExhaustedNamingTheNumbers) {
  constexpr int64_t kBspJob =
      JobShard::kJobFixedBytes + 2 * (64 + JobShard::kChunkFixedBytes + 4 * JobShard::kArrayFixedBytes);
  constexpr int64_t kAspJob =
      JobShard::kJobFixedBytes + 2 * (16 + JobShard::kChunkFixedBytes + JobShard::kArrayFixedBytes);
  constexpr int64_t kBudget = kBspJob + kAspJob + 100;  // not two BSP jobs
  static_assert(2 * kBspJob > kBudget);
  std::unique_ptr<TestServer> small = StartServer("ps-small", /*with_checkpoints=*/false, kBudget);
  ASSERT_NE(small, nullptr);
  ASSERT_TRUE(IsOk(SetUpAlone(small.get(), "job-1", v1::BSP)));
  EXPECT_EQ(small->store().bytes(), kBspJob);
  grpc::Status refused = SetUpAlone(small.get(), "job-2", v1::BSP);
  EXPECT_TRUE(
      HasError(refused, grpc::StatusCode::RESOURCE_EXHAUSTED, "job job-2 needs " + FormatBytes(kBspJob)));
  EXPECT_TRUE(
      HasError(refused, grpc::StatusCode::RESOURCE_EXHAUSTED, "memory budget of " + FormatBytes(kBudget)));
  // The first job is untouched and the server keeps serving.
  ASSERT_TRUE(IsOk(Push(small->stub(), MakePush("job-1", 1, 0, 1, {{0, kGradient}}))));
  ExpectChunk(small.get(), "job-1", 0, 1, kOneStep, 1);
  // An ASP job needs no step buffers: it fits beside.
  EXPECT_TRUE(IsOk(SetUpAlone(small.get(), "job-3", v1::ASP)));
  EXPECT_EQ(small->store().bytes(), kBspJob + kAspJob);
}

// A setup of many tiny chunks counts each chunk's bookkeeping, not only its
// floats: a message of a few MiB cannot make the server hold a hundred times
// what its budget counts.
TEST_F(ParameterServiceTest, ASetupOfManyTinyChunksCountsWhatEachChunkTakes) {
  constexpr int kChunks = 100000;
  std::unique_ptr<TestServer> small =
      StartServer("ps-small", /*with_checkpoints=*/false, /*memory_budget=*/int64_t{32} << 20);
  ASSERT_NE(small, nullptr);
  v1::ShardMap map = AloneMap(small.get(), 1);
  map.set_chunk_elems(1);
  map.clear_chunks();
  map.mutable_tensors(0)->set_size(kChunks);
  map.mutable_tensors(0)->set_shape(0, kChunks);
  for (int c = 0; c < kChunks; ++c) {
    v1::ChunkLocation* chunk = map.add_chunks();
    chunk->set_chunk_id(c);
    chunk->set_offset(c);
    chunk->set_length(1);
  }
  const v1::SetupJobRequest setup = MakeSetup("tiny", v1::ASP, map, small->id());
  ASSERT_EQ(setup.chunks_size(), kChunks);
  ASSERT_LT(setup.ByteSizeLong(), size_t{4} << 20);
  // 100,000 floats, 400 KB of values: more than 100 MB with their
  // bookkeeping, past the 32 MiB budget.
  EXPECT_TRUE(
      HasError(SetupJob(small->stub(), setup), grpc::StatusCode::RESOURCE_EXHAUSTED, "job tiny needs"));
  EXPECT_EQ(small->store().bytes(), 0);
}

TEST_F(ParameterServiceTest, SetupJobWithEmptyChunkIsInvalidArgument) {
  v1::SetupJobRequest setup = MakeSetup("job", v1::ASP, AloneMap(server_.get(), 1), server_->id());
  setup.mutable_chunks(1)->set_length(0);
  EXPECT_TRUE(
      HasError(SetupJob(server_->stub(), setup), grpc::StatusCode::INVALID_ARGUMENT, "chunk 1 has length 0"));
  EXPECT_TRUE(HasError(Pull(server_->stub(), "job", 0, 1).status, grpc::StatusCode::NOT_FOUND,
                       "job job is not set up on this server"));
}

// A chunk whose whole state could not be copied to a new replica in one
// message (here: 2^20 values with a BSP buffer for each of 4 partitions, 28
// MiB) is refused at setup, naming the chunk, not when a copy fails later.
TEST_F(ParameterServiceTest, SetupJobWithAChunkStateBeyondOneMessageIsInvalidArgument) {
  v1::SetupJobRequest setup = MakeSetup("job", v1::BSP, AloneMap(server_.get(), 1), server_->id());
  setup.set_num_partitions(4);
  setup.mutable_chunks(1)->set_length(kMaxChunkElements);
  EXPECT_TRUE(HasError(SetupJob(server_->stub(), setup), grpc::StatusCode::INVALID_ARGUMENT,
                       "chunk 1 of 1048576 values would hold 29360128 bytes"));
  EXPECT_TRUE(HasError(Pull(server_->stub(), "job", 0, 1).status, grpc::StatusCode::NOT_FOUND,
                       "job job is not set up on this server"));
}

// Chunk lengths far out of range (the ParameterService fuzzer's find: a
// length whose state in bytes overflowed int64 while the setup was checked
// against the budgets, before the lengths were) are refused as such.
TEST_F(ParameterServiceTest, SetupJobWithAChunkLengthBeyondAnyBudgetIsInvalidArgument) {
  for (const int64_t length : {int64_t{1} << 61, int64_t{2358024506070530940}, std::numeric_limits<int64_t>::max(),
                               -(int64_t{1} << 62), std::numeric_limits<int64_t>::min()}) {
    v1::SetupJobRequest setup = MakeSetup("job", v1::BSP, AloneMap(server_.get(), 1), server_->id());
    setup.mutable_chunks(1)->set_length(length);
    EXPECT_TRUE(HasError(SetupJob(server_->stub(), setup), grpc::StatusCode::INVALID_ARGUMENT, "chunk 1")) << length;
  }
  EXPECT_TRUE(HasError(Pull(server_->stub(), "job", 0, 1).status, grpc::StatusCode::NOT_FOUND,
                       "job job is not set up on this server"));
}

// Push number `seq` (partition 0's step seq - 1) of `gradient` for chunk 0,
// encoded in `format` (16-bit values rounded to nearest even).
v1::PushRequest MakeWirePush(int64_t seq, v1::WireFormat format, const std::vector<float>& gradient) {
  v1::PushRequest request = MakePush("job", seq, /*step=*/seq - 1, 1, {{0, {}}});
  v1::ChunkData* chunk = request.mutable_chunks(0);
  chunk->set_format(format);
  EncodeValues(format, gradient.data(), static_cast<int64_t>(gradient.size()), chunk->mutable_data());
  return request;
}

// A pull of chunk 0 in `format`.
grpc::Status PullIn(v1::ParameterService::Stub* stub, v1::WireFormat format, v1::PullResponse* response) {
  v1::PullRequest request;
  request.set_job_id("job");
  request.add_chunk_ids(0);
  request.set_map_version(1);
  request.set_format(format);
  grpc::ClientContext context;
  SetDeadline(&context, kRpcSeconds);
  return stub->Pull(&context, request, response);
}

// 16-bit pushes are widened to float32 on arrival (the chunk keeps float32);
// 16-bit pulls get the float32 values rounded to nearest even.
TEST_F(ParameterServiceTest, SixteenBitPushesAreWidenedAndPullsRoundedFromFloat32) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakeWirePush(1, v1::WIRE_BF16, kGradient))));  // exact in bf16
  ExpectChunk(server_.get(), "job", 0, 1, kOneStep, 1);
  // Not a bf16 value: the push carries its rounding, 1 + 2^-7.
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakeWirePush(2, v1::WIRE_BF16, {1.0f + 0x1p-7f + 0x1p-12f, 0, 0, 0}))));
  const std::vector<float> two_steps = {-0.5f - 0.5f * (1.0f + 0x1p-7f), -1.0f, -1.5f, -2.0f};
  ExpectChunk(server_.get(), "job", 0, 1, two_steps, 2);
  // fp16 keeps 10 fraction bits: 2^-10 arrives exactly.
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakeWirePush(3, v1::WIRE_FP16, {0x1p-10f, 0, 0, 0}))));
  std::vector<float> three_steps = two_steps;
  three_steps[0] -= 0.5f * 0x1p-10f;
  ExpectChunk(server_.get(), "job", 0, 1, three_steps, 3);

  for (v1::WireFormat format : {v1::WIRE_BF16, v1::WIRE_FP16}) {
    v1::PullResponse response;
    ASSERT_TRUE(IsOk(PullIn(server_->stub(), format, &response)));
    ASSERT_EQ(response.chunks_size(), 1);
    EXPECT_EQ(response.chunks(0).format(), format);
    ASSERT_EQ(response.chunks(0).data().size(), 2 * kChunkLength) << WireFormatName(format);
    std::vector<float> pulled(kChunkLength);
    ASSERT_TRUE(fulcrum::DecodeValues(format, response.chunks(0).data(), kChunkLength, pulled.data(), "pulled").ok());
    for (int64_t i = 0; i < kChunkLength; ++i) {
      const float expected = format == v1::WIRE_BF16 ? Bf16ToFloat(FloatToBf16(three_steps[i]))
                                                     : Fp16ToFloat(FloatToFp16(three_steps[i]));
      EXPECT_EQ(pulled[i], expected) << WireFormatName(format) << " element " << i;
    }
    EXPECT_EQ(response.chunks(0).version(), 3);
  }
  EXPECT_NE(Bf16ToFloat(FloatToBf16(three_steps[0])), three_steps[0]) << "the bf16 pull must have rounded";
}

TEST_F(ParameterServiceTest, BadSixteenBitPushesAndPullsAreRefusedClearly) {
  ASSERT_TRUE(IsOk(SetUpAlone(server_.get(), "job", v1::ASP)));
  // Beyond fp16's range: the value arrives as inf.
  EXPECT_TRUE(HasError(Push(server_->stub(), MakeWirePush(1, v1::WIRE_FP16, {70000.0f, 0, 0, 0})),
                       grpc::StatusCode::INVALID_ARGUMENT, "beyond fp16's range (wireFormat WIRE_FP16)"));
  // float32 bytes labelled bf16.
  v1::PushRequest mislabelled = MakePush("job", 2, 0, 1, {{0, kGradient}});
  mislabelled.mutable_chunks(0)->set_format(v1::WIRE_BF16);
  EXPECT_TRUE(HasError(Push(server_->stub(), mislabelled), grpc::StatusCode::INVALID_ARGUMENT,
                       "payload has 16 bytes, expected 8 (4 bf16 values)"));
  v1::PushRequest unknown = MakePush("job", 3, 0, 1, {{0, kGradient}});
  unknown.mutable_chunks(0)->set_format(static_cast<v1::WireFormat>(7));
  EXPECT_TRUE(HasError(Push(server_->stub(), unknown), grpc::StatusCode::INVALID_ARGUMENT, "unknown wire format 7"));
  v1::PushRequest bad_topk = MakePush("job", 3, 0, 1, {{0, kGradient}});
  bad_topk.mutable_chunks(0)->set_format(v1::WIRE_TOPK);  // 16 bytes: pairs (0x3f800000, ...), index too big
  EXPECT_TRUE(HasError(Push(server_->stub(), bad_topk), grpc::StatusCode::INVALID_ARGUMENT,
                       "indices must increase and stay below 4"));
  v1::PushRequest short_int8 = MakePush("job", 3, 0, 1, {{0, kGradient}});
  short_int8.mutable_chunks(0)->set_format(v1::WIRE_INT8);
  EXPECT_TRUE(HasError(Push(server_->stub(), short_int8), grpc::StatusCode::INVALID_ARGUMENT,
                       "int8 payload has 16 bytes, expected 8"));
  v1::PullResponse response;
  EXPECT_TRUE(HasError(PullIn(server_->stub(), static_cast<v1::WireFormat>(9), &response),
                       grpc::StatusCode::INVALID_ARGUMENT, "pull asks for unknown wire format 9"));
  EXPECT_TRUE(HasError(PullIn(server_->stub(), v1::WIRE_TOPK, &response), grpc::StatusCode::INVALID_ARGUMENT,
                       "pull asks for wire format topk, a push encoding of compressed gradients"));
  // Nothing was applied, and the server keeps serving.
  ExpectChunk(server_.get(), "job", 0, 1, kZeros, 0);
  ASSERT_TRUE(IsOk(Push(server_->stub(), MakeWirePush(4, v1::WIRE_FP16, kGradient))));
  ExpectChunk(server_.get(), "job", 0, 1, kOneStep, 1);
}

// Dense pulls count against the bound sparse pulls do: each request (twice:
// its bytes and its parse), an answer's own bytes (16-bit values are
// copies), and older values that float32 answers still send once their
// chunk moved on or went away; a float32 answer of a chunk's values as they
// are lends them and costs nothing more. Past the bound a pull is refused
// RESOURCE_EXHAUSTED "server busy", and everything is given back.
constexpr int64_t kWideLength = int64_t{1} << 16;  // 256 KiB a chunk
constexpr int64_t kWideChunkBytes = 4 * kWideLength;

// Job "job" (ASP) on `server` alone, as SetUpAlone sets it up but with
// chunks of kWideLength floats.
grpc::Status SetUpWideJob(TestServer* server) {
  v1::ShardMap map = MakeShardMap(1, ReplicaGroup{{server->id(), server->address()}, {}});
  map.set_chunk_elems(kWideLength);
  map.mutable_tensors(0)->set_shape(0, kNumChunks * kWideLength);
  map.mutable_tensors(0)->set_size(kNumChunks * kWideLength);
  for (int i = 0; i < kNumChunks; ++i) {
    map.mutable_chunks(i)->set_offset(i * kWideLength);
    map.mutable_chunks(i)->set_length(kWideLength);
  }
  return SetupJob(server->stub(), MakeSetup("job", v1::ASP, map, server->id()));
}

// A pull of that job's chunk 0 at map version 1.
v1::PullRequest WidePull() {
  v1::PullRequest request;
  request.set_job_id("job");
  request.add_chunk_ids(0);
  request.set_map_version(1);
  return request;
}

TEST_F(ParameterServiceTest, DensePullsInFlightHoldAtMostTheirBound) {
  ASSERT_TRUE(IsOk(SetUpWideJob(server_.get())));
  ParameterServiceImpl* service = server_->service();
  v1::PullRequest request = WidePull();
  const auto request_bytes = static_cast<int64_t>(request.ByteSizeLong());
  auto pull = [&](v1::WireFormat format) {
    request.set_format(format);
    v1::PullResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, kRpcSeconds);
    grpc::Status status = server_->stub()->Pull(&context, request, &response);
    if (status.ok() &&
        (response.chunks_size() != 1 ||
         response.chunks(0).data().size() != static_cast<size_t>(kWideLength * WireBytes(format)))) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "a wrong answer");
    }
    return status;
  };
  auto given_back = [&](int64_t to) {
    const absl::Time deadline =
        absl::Now() + absl::Seconds(30);  // OnDone runs after the caller has its answer
    while (service->pull_bytes_in_flight() != to && absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(1));
    return service->pull_bytes_in_flight();
  };

  // Room for a request and an answer's framing: float32 answers lend the
  // values, 16-bit ones are copies.
  service->set_max_pull_bytes_in_flight(2 * request_bytes + 1024);
  EXPECT_TRUE(IsOk(pull(v1::WIRE_FP32)));
  EXPECT_EQ(given_back(0), 0);
  EXPECT_TRUE(HasError(pull(v1::WIRE_BF16), grpc::StatusCode::RESOURCE_EXHAUSTED,
                       "bytes of answer: send it again later"));
  EXPECT_EQ(given_back(0), 0);
  service->set_max_pull_bytes_in_flight(request_bytes);
  const grpc::Status refused = pull(v1::WIRE_FP32);
  EXPECT_TRUE(
      HasError(refused, grpc::StatusCode::RESOURCE_EXHAUSTED, "bytes of request: send it again later"));
  EXPECT_TRUE(absl::StartsWith(refused.error_message(), absl::StrCat(kServerBusy, ": pulls in flight hold")))
      << refused.error_message();
  EXPECT_EQ(given_back(0), 0);

  // An answer still sending version 0 (its slices not yet dropped) when a
  // push makes version 1: version 0's bytes count until the answer drops them.
  request.set_format(v1::WIRE_FP32);
  auto lend = [&](v1::PullResponse* response, std::vector<grpc::Slice>* lent) {
    absl::Status finished = absl::UnknownError("not finished");
    auto held = service->StartPull(
        request, response, absl::Now() + absl::Seconds(kRpcSeconds),
        [&](const absl::Status& status) { finished = status; }, lent);
    EXPECT_TRUE(held.ok() && *held == nullptr) << "answered at once";
    EXPECT_TRUE(finished.ok()) << finished;
    ASSERT_EQ(lent->size(), 1U);
    EXPECT_EQ(lent->front().size(), static_cast<size_t>(kWideChunkBytes));
  };
  v1::PullResponse first_response;
  std::vector<grpc::Slice> first_lent;
  lend(&first_response, &first_lent);
  EXPECT_EQ(service->pull_bytes_in_flight(), 0) << "the values the chunk holds cost nothing more";
  ASSERT_TRUE(
      IsOk(Push(server_->stub(), MakePush("job", 1, 0, 1, {{0, std::vector<float>(kWideLength, 1.0f)}}))));
  EXPECT_EQ(service->pull_bytes_in_flight(), kWideChunkBytes);
  service->set_max_pull_bytes_in_flight(kWideChunkBytes + request_bytes);
  const grpc::Status orphaned = pull(v1::WIRE_FP32);
  EXPECT_TRUE(HasError(orphaned, grpc::StatusCode::RESOURCE_EXHAUSTED,
                       absl::StrCat(kWideChunkBytes, " bytes of older values such answers still send")));
  // The job dropped while an answer sends version 1: those bytes count too.
  v1::PullResponse second_response;
  std::vector<grpc::Slice> second_lent;
  lend(&second_response, &second_lent);
  ASSERT_TRUE(IsOk(DropJob(server_->stub(), "job")));
  EXPECT_EQ(given_back(2 * kWideChunkBytes), 2 * kWideChunkBytes);
  std::vector<float> sent(kWideLength);
  ASSERT_TRUE(DecodeFloats(absl::string_view(reinterpret_cast<const char*>(first_lent.front().begin()),
                                             first_lent.front().size()),
                           kWideLength, sent.data(), "lent")
                  .ok());
  EXPECT_EQ(sent, std::vector<float>(kWideLength, 0.0f)) << "version 0, as lent";
  first_lent.clear();
  EXPECT_EQ(service->pull_bytes_in_flight(), kWideChunkBytes);
  second_lent.clear();
  EXPECT_EQ(service->pull_bytes_in_flight(), 0);
}

// A pull held for a step and answered lets go of its job: once the job is
// dropped, an answer its caller has not read yet holds the values it sends
// (counted), not the job's whole state (which nothing would count).
TEST_F(ParameterServiceTest, AnAnsweredHeldPullKeepsOnlyTheValuesItSends) {
  ASSERT_TRUE(IsOk(SetUpWideJob(server_.get())));
  ParameterServiceImpl* service = server_->service();
  v1::PullRequest request = WidePull();
  request.set_min_version(1);  // held until a push makes it
  auto handle = std::make_shared<ParameterServiceImpl::PullHandle>();
  absl::Notification answered;
  absl::Status status;
  grpc::ByteBuffer answer;  // its caller has not read it: it holds the lent values
  service->HandlePull(SerializeMessage(request), absl::Now() + absl::Seconds(kRpcSeconds), handle,
                      [&](const absl::Status& s, grpc::ByteBuffer bytes) {
                        status = s;
                        answer = std::move(bytes);
                        answered.Notify();
                      });
  EXPECT_FALSE(answered.HasBeenNotified()) << "held";
  ASSERT_TRUE(
      IsOk(Push(server_->stub(), MakePush("job", 1, 0, 1, {{0, std::vector<float>(kWideLength, 1.0f)}}))));
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(kRpcSeconds)));
  ASSERT_TRUE(status.ok()) << status;
  const int64_t held_by_the_call = service->pull_bytes_in_flight();
  EXPECT_GT(held_by_the_call, 0) << "its request and its answer's framing";
  EXPECT_LT(held_by_the_call, 1024) << "not the lent values";

  ASSERT_TRUE(IsOk(DropJob(server_->stub(), "job")));
  // The thread that answered may still hold the pull (and so the job) a
  // moment after the answer.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (service->pull_bytes_in_flight() != held_by_the_call + kWideChunkBytes && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(service->pull_bytes_in_flight(), held_by_the_call + kWideChunkBytes)
      << "the dropped job's chunk went; the values the answer sends are counted";
  answer.Clear();
  EXPECT_EQ(service->pull_bytes_in_flight(), held_by_the_call);
  handle.reset();  // gRPC is done with the call
  EXPECT_EQ(service->pull_bytes_in_flight(), 0);
}

}  // namespace
}  // namespace fulcrum

namespace fulcrum {
namespace {

// A job with table "linear" (dim 1, SGD lr 0.5) and table "embedding"
// (dim 16) in 4 buckets each, all on shard 0, led by `group` (as `server_id`
// sets it up).
v1::SetupJobRequest MakeTableSetupOn(const std::string& job_id, const ReplicaGroup& group, const std::string& server_id,
                                     int64_t version = 1) {
  v1::ShardMap map = MakeShardMap(version, group);
  for (auto [name, dim] : {std::pair<const char*, int>{"linear", 1}, {"embedding", 16}}) {
    v1::TableLayout* table = map.add_tables();
    table->set_name(name);
    table->set_dim(dim);
    table->set_buckets(4);
    for (int b = 0; b < 4; ++b) table->add_bucket_shards(0);
  }
  v1::SetupJobRequest setup = MakeSetup(job_id, v1::ASP, map, server_id);
  v1::TableSpec* linear = setup.mutable_spec()->mutable_model()->add_tables();
  linear->set_name("linear");
  linear->mutable_optimizer()->set_kind(v1::SparseOptimizerSpec::SGD);
  linear->mutable_optimizer()->set_lr(0.5f);
  return setup;
}

v1::SetupJobRequest MakeTableSetup(const std::string& job_id, const TestServer& server) {
  return MakeTableSetupOn(job_id, ReplicaGroup{{server.id(), server.address()}, {}}, server.id());
}

std::string Keys(const std::vector<uint64_t>& keys) {
  std::string bytes(keys.size() * 8, '\0');
  for (size_t i = 0; i < keys.size(); ++i) {
    for (int b = 0; b < 8; ++b) bytes[i * 8 + b] = static_cast<char>((keys[i] >> (8 * b)) & 0xff);
  }
  return bytes;
}

std::vector<float> RowsOf(const std::string& bytes) {
  std::vector<float> rows(bytes.size() / 4);
  EXPECT_TRUE(DecodeFloats(bytes, static_cast<int64_t>(rows.size()), rows.data(), "rows").ok());
  return rows;
}

// A call that starts and never sends its request: its status once it ends.
class SilentCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  SilentCall(grpc::GenericStub* stub, const std::string& method) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    stub->PrepareBidiStreamingCall(&context_, method, grpc::StubOptions(), this);
    StartCall();
  }
  ~SilentCall() override {
    context_.TryCancel();
    done_.WaitForNotification();
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }
  // The status once the call ended within `timeout`, else nullopt.
  std::optional<grpc::Status> AwaitEnd(absl::Duration timeout) {
    if (!done_.WaitForNotificationWithTimeout(timeout)) return std::nullopt;
    return status_;
  }

 private:
  grpc::ClientContext context_;
  absl::Notification done_;
  grpc::Status status_;  // written before done_ is notified
};

// Push, Replicate, SparsePush and SparseReplicate hold a gRPC thread from
// when their call starts. A call whose request never comes (no deadline
// needed) is cancelled once its wait is over, and its thread is free.
TEST(ParameterServiceRequestWaitTest, CallsWhoseRequestNeverComesAreCancelledAfterTheirWait) {
  auto server = TestServer::Start("s0", /*with_checkpoints=*/false);
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->service()->set_request_wait(absl::Milliseconds(200));
  const double requests_counted =
      CounterValue("fulcrum_grpc_calls_cancelled_total", {{"waiting_for", "request"}});
  grpc::GenericStub stub(MakeChannel((*server)->address()));
  const std::vector<std::string> methods = {"Push", "Replicate", "SparsePush", "SparseReplicate"};
  std::vector<std::unique_ptr<SilentCall>> calls;
  for (const std::string& method : methods) {
    calls.push_back(
        std::make_unique<SilentCall>(&stub, absl::StrCat("/fulcrum.v1.ParameterService/", method)));
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::optional<grpc::Status> ended = calls[i]->AwaitEnd(absl::Seconds(20));
    ASSERT_TRUE(ended.has_value()) << methods[i] << ": the call still holds its thread";
    EXPECT_EQ(ended->error_code(), grpc::StatusCode::CANCELLED)
        << methods[i] << ": " << ended->error_message();
  }
  EXPECT_EQ((*server)->service()->requests_cancelled(), 4);
  EXPECT_EQ(
      CounterValue("fulcrum_grpc_calls_cancelled_total", {{"waiting_for", "request"}}) - requests_counted, 4);
  // A request that comes in time is served as before.
  v1::PushRequest push;
  push.set_job_id("no-such-job");
  grpc::ClientContext context;
  v1::PushResponse answer;
  const grpc::Status status = (*server)->stub()->Push(&context, push, &answer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  EXPECT_EQ((*server)->service()->requests_cancelled(), 4);
}

// Silent calls that take every thread a server has: past the bound calls
// are refused as busy, and once the silent ones' wait is over their
// threads serve again, though their callers never gave up.
TEST(ParameterServiceRequestWaitTest, SilentCallsGiveTheirThreadsBackAfterTheirWait) {
  ServerLimits limits;
  limits.max_threads = 4;
  auto server = TestServer::Start("s0", /*with_checkpoints=*/false, /*memory_budget=*/0, limits);
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->service()->set_request_wait(absl::Milliseconds(300));
  grpc::GenericStub stub(MakeChannel((*server)->address()));
  std::vector<std::unique_ptr<SilentCall>> calls;
  for (int i = 0; i < 8; ++i)
    calls.push_back(std::make_unique<SilentCall>(&stub, "/fulcrum.v1.ParameterService/Push"));
  int busy = 0, cancelled = 0;
  for (const auto& call : calls) {
    const std::optional<grpc::Status> ended = call->AwaitEnd(absl::Seconds(20));
    ASSERT_TRUE(ended.has_value()) << "a silent call still holds its thread";
    if (IsServerBusy(FromGrpcStatus(*ended))) {
      ++busy;
    } else {
      EXPECT_EQ(ended->error_code(), grpc::StatusCode::CANCELLED) << ended->error_message();
      ++cancelled;
    }
  }
  EXPECT_GE(busy, 1) << "the threads were not all taken";
  EXPECT_GE(cancelled, 1);
  EXPECT_EQ((*server)->service()->requests_cancelled(), cancelled);
  // Every thread is free: a push is served (refused only as busy while the
  // ended calls' threads go back to gRPC's pool).
  grpc::Status status;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  BusyBackoff backoff;
  while (true) {
    v1::PushRequest push;
    push.set_job_id("no-such-job");
    grpc::ClientContext context;
    v1::PushResponse answer;
    status = (*server)->stub()->Push(&context, push, &answer);
    if (!IsServerBusy(FromGrpcStatus(status)) || !backoff.WaitBefore(deadline)) break;
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
}

// Pull and SparsePull answers that their callers never read hold their
// bytes (counted against the pulls in flight, which refuse every pull past
// their bound) only for the answer wait: then the call is cancelled and
// everything it held is given back, though its caller set no deadline.
TEST(ParameterServiceAnswerWaitTest, AnswersNeverReadAreCancelledAfterTheirWait) {
  auto server = TestServer::Start("s0", /*with_checkpoints=*/false);
  ASSERT_TRUE(server.ok()) << server.status();
  ParameterServiceImpl* service = (*server)->service();
  ASSERT_TRUE(IsOk(SetUpWideJob(server->get())));
  grpc::ClientContext setup_context;
  v1::SetupJobResponse setup_response;
  ASSERT_TRUE(
      (*server)->stub()->SetupJob(&setup_context, MakeTableSetup("job-s", **server), &setup_response).ok());
  v1::PullRequest dense = WidePull();
  dense.add_chunk_ids(1);
  dense.set_format(v1::WIRE_BF16);  // a copy of 2 x 128 KiB: the answer's own bytes
  v1::SparsePullRequest sparse;
  sparse.set_job_id("job-s");
  sparse.set_map_version(1);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 20000; ++k) keys.push_back(k * 7919);
  sparse.add_tables()->set_table(1);
  sparse.mutable_tables(0)->set_keys(Keys(keys));  // 1.28 MB of rows
  struct Case {
    std::string method;
    const google::protobuf::Message* request;
    int64_t answer_bytes;  // its rows or values
  };
  const std::vector<Case> pulls = {{"/fulcrum.v1.ParameterService/Pull", &dense, 2 * kWideLength * 2},
                                   {"/fulcrum.v1.ParameterService/SparsePull", &sparse, 20000 * 16 * 4}};
  grpc::GenericStub stub(UnreadCall::Channel((*server)->address()));
  auto holds = [&](int64_t at_least) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (service->pull_bytes_in_flight() < at_least && absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(1));
    return service->pull_bytes_in_flight();
  };
  auto given_back = [&] {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (service->pull_bytes_in_flight() != 0 && absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(1));
    return service->pull_bytes_in_flight();
  };
  const double answers_counted =
      CounterValue("fulcrum_grpc_calls_cancelled_total", {{"waiting_for", "answer"}});
  for (const auto& [method, request, answer_bytes] : pulls) {
    SCOPED_TRACE(method);
    // Without a wait the answer holds its bytes for as long as its caller
    // keeps the call.
    (*server)->answers()->set_wait(absl::InfiniteDuration());
    {
      UnreadCall held(&stub, method, *request);
      EXPECT_GE(holds(answer_bytes), answer_bytes) << "the answer's bytes";
      EXPECT_FALSE(held.AwaitEnd(absl::Milliseconds(500))) << "the answer was sent unread";
      EXPECT_GE(service->pull_bytes_in_flight(), answer_bytes);
    }
    EXPECT_EQ(given_back(), 0) << "given back once its caller gave up";
    // With a wait the call is cancelled once it is over.
    const int64_t cancelled = (*server)->answers()->cancelled();
    (*server)->answers()->set_wait(absl::Milliseconds(200));
    UnreadCall unread(&stub, method, *request);
    EXPECT_GE(holds(answer_bytes), answer_bytes) << "the answer's bytes";
    EXPECT_EQ(given_back(), 0) << "the call was cancelled, though its caller keeps it";
    EXPECT_EQ((*server)->answers()->cancelled(), cancelled + 1);
    // Calls from here on read their answers: the default wait, so that a
    // loaded machine does not cancel them.
    (*server)->answers()->set_wait(CallWatch::kDefaultAnswerWait);
  }
  // Counted for /metrics (the test servers share one registry).
  EXPECT_EQ(CounterValue("fulcrum_grpc_calls_cancelled_total", {{"waiting_for", "answer"}}) - answers_counted,
            2);
  // An answer that is read is sent as before.
  grpc::ClientContext context;
  v1::PullResponse answer;
  ASSERT_TRUE((*server)->stub()->Pull(&context, dense, &answer).ok());
  EXPECT_EQ(answer.chunks_size(), 2);
  EXPECT_EQ((*server)->answers()->cancelled(), 2);
}

// The bytes sparse pulls in flight hold are bounded: a pull whose request
// and answer would pass the bound is answered RESOURCE_EXHAUSTED "server
// busy" (SparseClient sends it again),
// and what a call held is given back once gRPC is done with it, whether
// answered or refused, one call at a time or many at once.
TEST(ParameterServiceSparseTest, SparsePullsInFlightHoldAtMostTheirBound) {
  auto server = TestServer::Start("ps-0", /*with_checkpoints=*/false);
  ASSERT_TRUE(server.ok()) << server.status();
  ParameterServiceImpl* service = (*server)->service();
  EXPECT_EQ(service->pull_bytes_in_flight(), 0);
  grpc::ClientContext setup_context;
  v1::SetupJobResponse setup_response;
  ASSERT_TRUE(
      (*server)->stub()->SetupJob(&setup_context, MakeTableSetup("job-s", **server), &setup_response).ok());
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 1000; ++k) keys.push_back(k * 7919);
  v1::SparsePullRequest pull;
  pull.set_job_id("job-s");
  pull.set_map_version(1);
  v1::SparseKeys* embedding_keys = pull.add_tables();
  embedding_keys->set_table(1);
  embedding_keys->set_keys(Keys(keys));
  const auto request_bytes = static_cast<int64_t>(pull.ByteSizeLong());
  const int64_t answer_rows = 1000 * 16 * 4;
  auto given_back = [&] {
    // OnDone runs on gRPC's thread after the caller has its answer.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (service->pull_bytes_in_flight() != 0 && absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(1));
    return service->pull_bytes_in_flight();
  };

  // Room for the request, not for its answer.
  service->set_max_pull_bytes_in_flight(2 * request_bytes + answer_rows / 2);
  grpc::ClientContext refused_context;
  v1::SparsePullResponse refused;
  const grpc::Status status = (*server)->stub()->SparsePull(&refused_context, pull, &refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_TRUE(absl::StartsWith(status.error_message(), absl::StrCat(kServerBusy, ": pulls in flight hold")))
      << status.error_message();
  EXPECT_TRUE(Contains(status.error_message(), "bytes of answer: send it again later"))
      << status.error_message();
  EXPECT_EQ(given_back(), 0);
  // Not even room for the request.
  service->set_max_pull_bytes_in_flight(request_bytes);
  grpc::ClientContext tiny_context;
  const grpc::Status tiny = (*server)->stub()->SparsePull(&tiny_context, pull, &refused);
  EXPECT_EQ(tiny.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << tiny.error_message();
  EXPECT_TRUE(Contains(tiny.error_message(), "bytes of request: send it again later"))
      << tiny.error_message();
  EXPECT_EQ(given_back(), 0);

  // Room for every request and three answers: of sixteen concurrent pulls
  // each is answered with its rows or refused (the first answer always
  // fits), and everything is given back.
  service->set_max_pull_bytes_in_flight(16 * 2 * request_bytes + 3 * (answer_rows + 1024));
  std::vector<std::thread> callers;
  std::atomic<int> answered{0}, busy{0}, other{0};
  for (int i = 0; i < 16; ++i) {
    callers.emplace_back([&] {
      grpc::ClientContext context;
      v1::SparsePullResponse response;
      const grpc::Status s = (*server)->stub()->SparsePull(&context, pull, &response);
      if (s.ok() && response.tables_size() == 1 &&
          response.tables(0).rows().size() == static_cast<size_t>(answer_rows)) {
        ++answered;
      } else if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
                 absl::StartsWith(s.error_message(), kServerBusy)) {
        ++busy;
      } else {
        ++other;
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(answered + busy, 16);
  EXPECT_EQ(other, 0);
  EXPECT_GE(answered, 1);
  EXPECT_EQ(given_back(), 0);
  // With the bound as it ships, a pull is answered.
  service->set_max_pull_bytes_in_flight(ParameterServiceImpl::kMaxPullBytesInFlight);
  grpc::ClientContext ok_context;
  v1::SparsePullResponse ok;
  ASSERT_TRUE((*server)->stub()->SparsePull(&ok_context, pull, &ok).ok());
  EXPECT_EQ(ok.tables(0).rows().size(), static_cast<size_t>(answer_rows));
  EXPECT_EQ(given_back(), 0);
}

TEST(ParameterServiceSparseTest, PushedRowsAreWhatLaterPullsRead) {
  auto server = TestServer::Start("ps-0", /*with_checkpoints=*/false);
  ASSERT_TRUE(server.ok()) << server.status();
  grpc::ClientContext setup_context;
  v1::SetupJobResponse setup_response;
  ASSERT_TRUE((*server)->stub()->SetupJob(&setup_context, MakeTableSetup("job-s", **server), &setup_response).ok());

  const std::vector<uint64_t> keys = {3, 1ULL << 63, 77};
  v1::SparsePullRequest pull;
  pull.set_job_id("job-s");
  pull.set_map_version(1);
  v1::SparseKeys* linear_keys = pull.add_tables();
  linear_keys->set_table(0);
  linear_keys->set_keys(Keys(keys));
  v1::SparseKeys* embedding_keys = pull.add_tables();
  embedding_keys->set_table(1);
  embedding_keys->set_keys(Keys(keys));
  grpc::ClientContext before_context;
  v1::SparsePullResponse before;
  ASSERT_TRUE((*server)->stub()->SparsePull(&before_context, pull, &before).ok());
  ASSERT_EQ(before.tables_size(), 2);
  EXPECT_EQ(RowsOf(before.tables(0).rows()), std::vector<float>(3, 0.0f)) << "linear starts at zero";
  EXPECT_EQ(RowsOf(before.tables(1).rows()).size(), 48u);

  v1::SparsePushRequest push;
  push.set_job_id("job-s");
  push.set_worker_id("w0");
  push.set_partition(0);
  push.set_step(1);
  push.set_map_version(1);
  v1::SparseKeys* grads = push.add_tables();
  grads->set_table(0);
  grads->set_keys(Keys(keys));
  grads->set_rows(Floats({1.0f, 2.0f, -4.0f}));
  for (bool duplicate : {false, true}) {
    grpc::ClientContext push_context;
    v1::SparsePushResponse pushed;
    const grpc::Status status = (*server)->stub()->SparsePush(&push_context, push, &pushed);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(pushed.duplicate(), duplicate);
  }
  grpc::ClientContext after_context;
  v1::SparsePullResponse after;
  ASSERT_TRUE((*server)->stub()->SparsePull(&after_context, pull, &after).ok());
  EXPECT_EQ(RowsOf(after.tables(0).rows()), (std::vector<float>{-0.5f, -1.0f, 2.0f})) << "applied once";
  EXPECT_EQ(after.tables(1).rows(), before.tables(1).rows()) << "the embedding table was not pushed";

  // A pull of a step is answered from the service's own threads (it may
  // wait for a shard's push lock), not gRPC's callback thread: the same
  // rows (the job's tables are asynchronous), and its errors as any pull's.
  v1::SparsePullRequest at_step = pull;
  at_step.set_step(1);
  grpc::ClientContext step_context;
  v1::SparsePullResponse stepped;
  const grpc::Status step_status = (*server)->stub()->SparsePull(&step_context, at_step, &stepped);
  ASSERT_TRUE(step_status.ok()) << step_status.error_message();
  ASSERT_EQ(stepped.tables_size(), 2);
  EXPECT_EQ(stepped.tables(0).rows(), after.tables(0).rows());
  EXPECT_EQ(stepped.tables(1).rows(), after.tables(1).rows());
  at_step.set_step(-1);
  grpc::ClientContext bad_context;
  v1::SparsePullResponse bad;
  const grpc::Status bad_status = (*server)->stub()->SparsePull(&bad_context, at_step, &bad);
  EXPECT_EQ(bad_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad_status.error_message();
  EXPECT_NE(bad_status.error_message().find("step -1"), std::string::npos) << bad_status.error_message();
}

// Replicated tables over gRPC: a push to the shard's primary is on its
// backup before it is acknowledged, and applied once on both; only the
// primary takes pushes and only a backup takes forwards; a bad push reaches
// no replica; a primary behind its backup's map applies nothing.
TEST(ParameterServiceSparseTest, APushIsOnTheShardsBackupBeforeItIsAcknowledged) {
  auto primary = TestServer::Start("ps-0", /*with_checkpoints=*/false);
  auto backup = TestServer::Start("ps-1", /*with_checkpoints=*/false);
  ASSERT_TRUE(primary.ok() && backup.ok());
  const ReplicaGroup group{{(*primary)->id(), (*primary)->address()}, {{(*backup)->id(), (*backup)->address()}}};
  for (TestServer* server : {backup->get(), primary->get()}) {
    ASSERT_TRUE(IsOk(SetupJob(server->stub(), MakeTableSetupOn("job-r", group, server->id()))));
  }
  const std::vector<uint64_t> keys = {3, 1ULL << 63, 77};
  auto rows_on = [&](TestServer* server) {
    v1::SparsePullRequest pull;
    pull.set_job_id("job-r");
    pull.set_map_version(1);
    v1::SparseKeys* table = pull.add_tables();
    table->set_table(0);
    table->set_keys(Keys(keys));
    grpc::ClientContext context;
    v1::SparsePullResponse answer;
    EXPECT_TRUE(server->stub()->SparsePull(&context, pull, &answer).ok());
    return answer.tables_size() == 1 ? RowsOf(answer.tables(0).rows()) : std::vector<float>();
  };
  auto push_of = [&](int64_t step, std::vector<float> grads) {
    v1::SparsePushRequest push;
    push.set_job_id("job-r");
    push.set_worker_id("w0");
    push.set_partition(0);
    push.set_step(step);
    push.set_shard(0);
    push.set_map_version(1);
    v1::SparseKeys* table = push.add_tables();
    table->set_table(0);
    table->set_keys(Keys(keys));
    table->set_rows(Floats(grads));
    return push;
  };
  auto send = [](TestServer* server, const v1::SparsePushRequest& push, bool replicate,
                 v1::SparsePushResponse* answer) {
    grpc::ClientContext context;
    SetDeadline(&context, kRpcSeconds);
    return replicate ? server->stub()->SparseReplicate(&context, push, answer)
                     : server->stub()->SparsePush(&context, push, answer);
  };
  v1::SparsePushResponse answer;
  ASSERT_TRUE(IsOk(send(primary->get(), push_of(1, {1.0f, 2.0f, -4.0f}), false, &answer)));
  EXPECT_FALSE(answer.duplicate());
  const std::vector<float> once = {-0.5f, -1.0f, 2.0f};
  EXPECT_EQ(rows_on(backup->get()), once) << "on the backup when acknowledged";
  EXPECT_EQ(rows_on(primary->get()), once);
  ASSERT_TRUE(IsOk(send(primary->get(), push_of(1, {1.0f, 2.0f, -4.0f}), false, &answer)));
  EXPECT_TRUE(answer.duplicate());
  EXPECT_EQ(rows_on(backup->get()), once) << "a retry applies nowhere twice";
  // Roles: the backup takes no pushes, the primary no forwards.
  EXPECT_TRUE(HasError(send(backup->get(), push_of(2, {1, 1, 1}), false, &answer), grpc::StatusCode::ABORTED,
                       "this server is not its primary"));
  EXPECT_TRUE(HasError(send(primary->get(), push_of(2, {1, 1, 1}), true, &answer), grpc::StatusCode::ABORTED,
                       "this server is not its backup"));
  // A non-finite gradient is refused by the primary before any forward.
  EXPECT_TRUE(HasError(send(primary->get(), push_of(2, {1.0f, std::nanf(""), 0.0f}), false, &answer),
                       grpc::StatusCode::INVALID_ARGUMENT, "non-finite"));
  EXPECT_EQ(rows_on(backup->get()), once);
  // A backup on a newer map fences its old primary: nothing applies.
  v1::ShardMap newer = MakeTableSetupOn("job-r", group, (*backup)->id(), /*version=*/2).shard_map();
  ASSERT_TRUE(IsOk(Reconfigure((*backup)->stub(), "job-r", newer)));
  EXPECT_TRUE(HasError(send(primary->get(), push_of(2, {1, 1, 1}), false, &answer), grpc::StatusCode::ABORTED,
                       "replicating to backup"));
  EXPECT_EQ(rows_on(primary->get()), once);
}

// A new backup of a shard with tables (a server holding nothing of the job)
// copies the shard's buckets and bookkeeping live from its primary: it then
// holds the same rows, takes every forwarded push, and treats a push the
// primary applied before the copy as the duplicate it is.
TEST(ParameterServiceSparseTest, ANewBackupCopiesTheShardsTablesLive) {
  auto primary = TestServer::Start("ps-0", /*with_checkpoints=*/false);
  auto newcomer = TestServer::Start("ps-1", /*with_checkpoints=*/false);
  ASSERT_TRUE(primary.ok() && newcomer.ok());
  const ReplicaGroup alone{{(*primary)->id(), (*primary)->address()}, {}};
  ASSERT_TRUE(IsOk(SetupJob((*primary)->stub(), MakeTableSetupOn("job-c", alone, (*primary)->id()))));
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 300; ++k) keys.push_back(k * 7919);
  auto push_of = [&](int64_t version, int64_t step, float scale) {
    v1::SparsePushRequest push;
    push.set_job_id("job-c");
    push.set_worker_id("w0");
    push.set_partition(0);
    push.set_step(step);
    push.set_shard(0);
    push.set_map_version(version);
    v1::SparseKeys* table = push.add_tables();
    table->set_table(1);
    table->set_keys(Keys(keys));
    std::vector<float> grads(keys.size() * 16);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = scale * static_cast<float>(static_cast<int>(i % 5) - 2);
    table->set_rows(Floats(grads));
    return push;
  };
  auto push = [&](const v1::SparsePushRequest& request, v1::SparsePushResponse* answer) {
    grpc::ClientContext context;
    SetDeadline(&context, kRpcSeconds);
    return (*primary)->stub()->SparsePush(&context, request, answer);
  };
  auto rows_on = [&](TestServer* server, int64_t version) {
    v1::SparsePullRequest pull;
    pull.set_job_id("job-c");
    pull.set_map_version(version);
    v1::SparseKeys* table = pull.add_tables();
    table->set_table(1);
    table->set_keys(Keys(keys));
    grpc::ClientContext context;
    v1::SparsePullResponse answer;
    EXPECT_TRUE(server->stub()->SparsePull(&context, pull, &answer).ok());
    return answer.tables_size() == 1 ? answer.tables(0).rows() : std::string();
  };
  v1::SparsePushResponse answer;
  for (int64_t step = 0; step < 3; ++step) ASSERT_TRUE(IsOk(push(push_of(1, step, 0.1f), &answer)));
  // Map version 2: ps-1 backs the shard up. The primary takes the map
  // first, then the newcomer is set up as a copy of it.
  const ReplicaGroup group{{(*primary)->id(), (*primary)->address()}, {{(*newcomer)->id(), (*newcomer)->address()}}};
  v1::SetupJobRequest copy = MakeTableSetupOn("job-c", group, (*newcomer)->id(), /*version=*/2);
  ASSERT_TRUE(IsOk(Reconfigure((*primary)->stub(), "job-c", copy.shard_map())));
  EXPECT_TRUE(HasError(push(push_of(2, 3, 0.1f), &answer), grpc::StatusCode::UNAVAILABLE, "replicating to backup"))
      << "the newcomer refuses until it holds its copy";
  copy.set_copy_from((*primary)->address());
  ASSERT_TRUE(IsOk(SetupJob((*newcomer)->stub(), copy)));
  const std::string copied = rows_on(newcomer->get(), 2);
  EXPECT_EQ(copied, rows_on(primary->get(), 2));
  EXPECT_EQ(copied.size(), keys.size() * 16 * 4);
  // Step 2 again: a duplicate on both (the copy knows what was applied).
  ASSERT_TRUE(IsOk(push(push_of(2, 2, 0.1f), &answer)));
  EXPECT_TRUE(answer.duplicate());
  EXPECT_EQ(rows_on(newcomer->get(), 2), copied);
  // Step 3 reaches both.
  ASSERT_TRUE(IsOk(push(push_of(2, 3, 0.1f), &answer)));
  EXPECT_FALSE(answer.duplicate());
  EXPECT_NE(rows_on(newcomer->get(), 2), copied);
  EXPECT_EQ(rows_on(newcomer->get(), 2), rows_on(primary->get(), 2));
  // The same setup again (a scheduler that restarted mid-handover): the
  // shard's tables are held already and stay as they are.
  const std::string now = rows_on(newcomer->get(), 2);
  ASSERT_TRUE(IsOk(SetupJob((*newcomer)->stub(), copy)));
  EXPECT_EQ(rows_on(newcomer->get(), 2), now);
  // Map 3 takes the newcomer out of the group (its handover undone, say)
  // without dropping the job there, and the primary goes on alone: the
  // newcomer drops the shard's tables, which would miss step 4.
  const v1::ShardMap alone_again =
      MakeTableSetupOn("job-c", alone, (*primary)->id(), /*version=*/3).shard_map();
  ASSERT_TRUE(IsOk(Reconfigure((*primary)->stub(), "job-c", alone_again)));
  ASSERT_TRUE(IsOk(Reconfigure((*newcomer)->stub(), "job-c", alone_again)));
  {
    v1::SparsePullRequest pull;
    pull.set_job_id("job-c");
    pull.set_map_version(3);
    pull.add_tables()->set_table(1);
    pull.mutable_tables(0)->set_keys(Keys(keys));
    grpc::ClientContext context;
    v1::SparsePullResponse rows;
    EXPECT_EQ((*newcomer)->stub()->SparsePull(&context, pull, &rows).error_code(), grpc::StatusCode::ABORTED)
        << "the newcomer still answers with the shard's rows";
  }
  ASSERT_TRUE(IsOk(push(push_of(3, 4, 0.3f), &answer)));
  EXPECT_FALSE(answer.duplicate());
  // Map 4 adds it back: it copies the shard again, so it has step 4 and
  // takes step 5 as the primary does.
  v1::SetupJobRequest again = MakeTableSetupOn("job-c", group, (*newcomer)->id(), /*version=*/4);
  ASSERT_TRUE(IsOk(Reconfigure((*primary)->stub(), "job-c", again.shard_map())));
  again.set_copy_from((*primary)->address());
  ASSERT_TRUE(IsOk(SetupJob((*newcomer)->stub(), again)));
  EXPECT_EQ(rows_on(newcomer->get(), 4), rows_on(primary->get(), 4)) << "the stale tables were kept";
  ASSERT_TRUE(IsOk(push(push_of(4, 5, 0.1f), &answer)));
  EXPECT_FALSE(answer.duplicate());
  EXPECT_EQ(rows_on(newcomer->get(), 4), rows_on(primary->get(), 4));
  // Map 5 takes it out again, but its Reconfigure is lost: it still holds
  // map 4, in which it backs the shard up, and keeps the tables, which miss
  // step 6. Map 6 adds it back naming the shard it joins: it copies the
  // shard again rather than keep what it holds.
  const v1::ShardMap out_again =
      MakeTableSetupOn("job-c", alone, (*primary)->id(), /*version=*/5).shard_map();
  ASSERT_TRUE(IsOk(Reconfigure((*primary)->stub(), "job-c", out_again)));
  ASSERT_TRUE(IsOk(push(push_of(5, 6, 0.2f), &answer)));
  EXPECT_FALSE(answer.duplicate());
  v1::SetupJobRequest back = MakeTableSetupOn("job-c", group, (*newcomer)->id(), /*version=*/6);
  ASSERT_TRUE(IsOk(Reconfigure((*primary)->stub(), "job-c", back.shard_map())));
  back.set_copy_from((*primary)->address());
  back.set_joined_shard(0);
  testing::internal::CaptureStderr();
  const grpc::Status copied_back = SetupJob((*newcomer)->stub(), back);
  const std::string log = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(IsOk(copied_back));
  EXPECT_NE(log.find("dropped the tables of 1 shard(s) its copy is stale"), std::string::npos) << log;
  EXPECT_EQ(rows_on(newcomer->get(), 6), rows_on(primary->get(), 6))
      << "the tables that missed step 6 were kept";
  // The same copy again (retried past the scheduler's deadline while the
  // first ran): the tables it finds are live under the copy's map, and
  // stay; dropped, the shard's writes would be refused while they are
  // copied once more.
  testing::internal::CaptureStderr();
  const grpc::Status retried = SetupJob((*newcomer)->stub(), back);
  const std::string retry_log = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(IsOk(retried));
  EXPECT_EQ(retry_log.find("dropped the tables"), std::string::npos) << retry_log;
  EXPECT_EQ(rows_on(newcomer->get(), 6), rows_on(primary->get(), 6));
  ASSERT_TRUE(IsOk(push(push_of(6, 7, 0.1f), &answer)));
  EXPECT_EQ(rows_on(newcomer->get(), 6), rows_on(primary->get(), 6));
}

TEST(ParameterServiceSparseTest, MalformedSparseRequestsAreRefusedWithReasons) {
  auto server = TestServer::Start("ps-0", /*with_checkpoints=*/false);
  ASSERT_TRUE(server.ok()) << server.status();
  grpc::ClientContext setup_context;
  v1::SetupJobResponse setup_response;
  ASSERT_TRUE((*server)->stub()->SetupJob(&setup_context, MakeTableSetup("job-s", **server), &setup_response).ok());
  auto pull_status = [&](const v1::SparsePullRequest& request) {
    grpc::ClientContext context;
    v1::SparsePullResponse response;
    return (*server)->stub()->SparsePull(&context, request, &response);
  };
  auto push_status = [&](const v1::SparsePushRequest& request) {
    grpc::ClientContext context;
    v1::SparsePushResponse response;
    return (*server)->stub()->SparsePush(&context, request, &response);
  };
  v1::SparsePullRequest pull;
  pull.set_job_id("job-s");
  pull.set_map_version(1);
  pull.add_tables()->set_keys("1234567");  // not whole uint64s
  EXPECT_EQ(pull_status(pull).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  pull.mutable_tables(0)->set_keys(Keys({1}));
  pull.mutable_tables(0)->set_table(5);  // no such table
  EXPECT_EQ(pull_status(pull).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  pull.mutable_tables(0)->set_table(1);
  pull.mutable_tables(0)->set_keys(std::string(8 << 20, '\1'));  // an answer beyond a message
  EXPECT_NE(pull_status(pull).error_code(), grpc::StatusCode::OK);
  pull.mutable_tables(0)->set_keys(std::string(4 << 20, '\1'));  // within the message, its answer is not
  const grpc::Status too_big = pull_status(pull);
  EXPECT_EQ(too_big.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(too_big.error_message().find("split its keys"), std::string::npos) << too_big.error_message();
  pull.mutable_tables(0)->set_keys(Keys({1}));
  pull.set_map_version(0);
  EXPECT_EQ(pull_status(pull).error_code(), grpc::StatusCode::ABORTED) << "an older shard map";
  pull.set_map_version(1);
  // Steps outside the job's (MakeSetup: 100 steps).
  auto refuses_outside_steps = [](const std::function<grpc::Status(int64_t)>& at) {
    for (int64_t step : {int64_t{-1}, int64_t{101}, std::numeric_limits<int64_t>::max()}) {
      const grpc::Status refused = at(step);
      EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << step;
      EXPECT_NE(refused.error_message().find("the job's steps are in [0, 100]"), std::string::npos)
          << refused.error_message();
    }
  };
  refuses_outside_steps([&](int64_t step) {
    pull.set_step(step);
    return pull_status(pull);
  });
  pull.clear_step();
  pull.set_job_id("no-such-job");
  EXPECT_EQ(pull_status(pull).error_code(), grpc::StatusCode::NOT_FOUND);

  v1::SparsePushRequest push;
  push.set_job_id("job-s");
  push.set_map_version(1);
  push.set_step(1);
  v1::SparseKeys* grads = push.add_tables();
  grads->set_table(1);
  grads->set_table(0);
  grads->set_keys(Keys({1, 2, 3, 4}));
  grads->set_rows(Floats({1, 2, 3}));  // 4 keys x dim 1 needs 4 floats
  EXPECT_EQ(push_status(push).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  grads->set_rows(Floats({1, 2, 3, std::nanf("")}));
  const grpc::Status nan = push_status(push);
  EXPECT_EQ(nan.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(nan.error_message().find("non-finite"), std::string::npos) << nan.error_message();
  grads->set_rows(Floats({1, 2, 3, 4}));
  push.set_partition(3);  // the job has one partition
  EXPECT_EQ(push_status(push).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  push.set_partition(0);
  (*server)->set_lease_valid(false);
  EXPECT_EQ(push_status(push).error_code(), grpc::StatusCode::UNAVAILABLE) << "fenced without its lease";
  (*server)->set_lease_valid(true);
  refuses_outside_steps([&](int64_t step) {
    push.set_step(step);
    return push_status(push);
  });
  push.set_step(1);
  {
    grpc::ClientContext context;
    v1::SparsePushResponse response;
    ASSERT_TRUE((*server)->stub()->SparsePush(&context, push, &response).ok());
    EXPECT_FALSE(response.duplicate()) << "the refused steps moved nothing: step 1 applies";
  }

  // A setup listing more tables than a job has is refused before any is
  // built (a message of millions of empty tables, matched name by name,
  // would take hours).
  for (bool in_map : {true, false}) {
    v1::SetupJobRequest many = MakeTableSetup("job-many", **server);
    for (int i = 0; i < 100000; ++i) {
      if (in_map) {
        many.mutable_shard_map()->add_tables();
      } else {
        many.mutable_spec()->mutable_model()->add_tables();
      }
    }
    grpc::ClientContext context;
    v1::SetupJobResponse response;
    const grpc::Status refused = (*server)->stub()->SetupJob(&context, many, &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(refused.error_message().find("a job has at most 16"), std::string::npos)
        << refused.error_message();
  }

  // A job without tables answers neither.
  grpc::ClientContext dense_context;
  v1::SetupJobResponse dense_response;
  ASSERT_TRUE((*server)
                  ->stub()
                  ->SetupJob(&dense_context,
                             MakeSetup("job-d", v1::ASP, MakeShardMap(1, ReplicaGroup{{"ps-0", (*server)->address()}, {}}),
                                       "ps-0"),
                             &dense_response)
                  .ok());
  push.set_job_id("job-d");
  EXPECT_EQ(push_status(push).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}


// Tables in checkpoints: every bucket is written with the dense chunks, and a
// job set up from the checkpoint reads the same rows, on the server that
// wrote it and on another one (which reads the buckets from it in slices:
// the embedding buckets here are bigger than one 4 MiB slice).
// Pushes a gradient for every key of `keys` to both tables of a
// MakeTableSetup job, at `step` of partition 0, in 3 parts.
void PushAllKeys(TestServer& server, const std::string& job_id, const std::vector<uint64_t>& all_keys, int64_t step) {
  constexpr int kParts = 3;
  const auto per_part = static_cast<std::ptrdiff_t>(all_keys.size() / kParts);
  for (int part = 0; part < kParts; ++part) {
    const std::vector<uint64_t> keys(all_keys.begin() + part * per_part,
                                     part + 1 == kParts ? all_keys.end() : all_keys.begin() + (part + 1) * per_part);
    v1::SparsePushRequest push;
    push.set_job_id(job_id);
    push.set_worker_id("w0");
    push.set_partition(0);
    push.set_step(step);
    push.set_part(part);
    push.set_map_version(1);
    std::vector<float> linear(keys.size()), embedding(keys.size() * 16);
    for (size_t i = 0; i < linear.size(); ++i) linear[i] = static_cast<float>(i % 7) - 3.0f;
    for (size_t i = 0; i < embedding.size(); ++i) embedding[i] = static_cast<float>(i % 11) * 0.25f - 1.0f;
    v1::SparseKeys* a = push.add_tables();
    a->set_table(0);
    a->set_keys(Keys(keys));
    a->set_rows(Floats(linear));
    v1::SparseKeys* b = push.add_tables();
    b->set_table(1);
    b->set_keys(Keys(keys));
    b->set_rows(Floats(embedding));
    grpc::ClientContext context;
    v1::SparsePushResponse pushed;
    const grpc::Status status = server.stub()->SparsePush(&context, push, &pushed);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
}

TEST(ParameterServiceSparseTest, TablesAreCheckpointedAndRestoredHereAndOnAnotherServer) {
  auto writer = TestServer::Start("ps-0", /*with_checkpoints=*/true);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE(IsOk(SetupJob((*writer)->stub(), MakeTableSetup("old", **writer))));
  constexpr int kKeys = 150000;  // about 5 MiB of Adagrad rows in each embedding bucket
  std::vector<uint64_t> all_keys;
  for (int i = 0; i < kKeys; ++i) all_keys.push_back(SplitMix64(static_cast<uint64_t>(i)));
  ASSERT_NO_FATAL_FAILURE(PushAllKeys(**writer, "old", all_keys, /*step=*/4));
  v1::CheckpointResponse written;
  ASSERT_TRUE(IsOk(Checkpoint((*writer)->stub(), "old", 3, /*at_version=*/0, &written)));
  int buckets = 0, listed = 0;
  const auto steps = PartitionStepsOf(written);
  for (int i = 0; i < written.chunks_size(); ++i) {
    const v1::CheckpointChunk& chunk = written.chunks(i);
    if (chunk.chunk_id() < kTableChunkBase) continue;
    ++buckets;
    listed += chunk.partition_steps_size() > 0 ? 1 : 0;
    ASSERT_EQ(steps[static_cast<size_t>(i)]->size(), 1);
    EXPECT_EQ(steps[static_cast<size_t>(i)]->Get(0), 4) << "step 4 may have more parts: it runs again";
  }
  EXPECT_EQ(buckets, 8) << "2 tables x 4 buckets";
  EXPECT_EQ(listed, 1) << "the buckets of one capture share their steps: listed once";

  // What a pull of some keys reads from a job.
  const std::vector<uint64_t> probe = {all_keys[0], all_keys[77777], all_keys[kKeys - 1], 12345};
  auto pull = [&](TestServer& server, const std::string& job_id) {
    v1::SparsePullRequest request;
    request.set_job_id(job_id);
    request.set_map_version(1);
    for (int t = 0; t < 2; ++t) {
      v1::SparseKeys* keys = request.add_tables();
      keys->set_table(t);
      keys->set_keys(Keys(probe));
    }
    grpc::ClientContext context;
    v1::SparsePullResponse response;
    const grpc::Status status = server.stub()->SparsePull(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<float> rows;
    for (const auto& table : response.tables()) {
      const std::vector<float> r = RowsOf(table.rows());
      rows.insert(rows.end(), r.begin(), r.end());
    }
    return rows;
  };
  const std::vector<float> expected = pull(**writer, "old");
  ASSERT_EQ(expected.size(), probe.size() * 17);
  EXPECT_NE(expected[0], 0.0f) << "the linear row was pushed";

  auto other = TestServer::Start("ps-1", /*with_checkpoints=*/true);
  ASSERT_TRUE(other.ok()) << other.status();
  for (TestServer* server : {writer->get(), other->get()}) {
    SCOPED_TRACE(server->id());
    v1::SetupJobRequest setup = MakeTableSetup("new", *server);
    *setup.mutable_restore() = RestoreFrom("old", 3, written, **writer);
    ASSERT_TRUE(IsOk(SetupJob(server->stub(), setup)));
    EXPECT_EQ(pull(*server, "new"), expected);
  }

  // A checkpoint of other tables does not fit: the setup names the bucket.
  v1::SetupJobRequest mismatched = MakeTableSetup("wrong", **other);
  mismatched.mutable_shard_map()->mutable_tables(1)->set_buckets(5);
  mismatched.mutable_shard_map()->mutable_tables(1)->add_bucket_shards(0);
  *mismatched.mutable_restore() = RestoreFrom("old", 3, written, **writer);
  EXPECT_TRUE(HasError(SetupJob((*other)->stub(), mismatched), grpc::StatusCode::INVALID_ARGUMENT,
                       "has no table bucket chunk"));
}

// CopyChunk of a table bucket (what a live export reads): a capture taken
// between two pushes and served in slices of 4 MiB, every slice of one
// capture even while pushes change the rows; a capture is dropped after its
// last slice, and a slice of one not kept is ABORTED.
TEST(ParameterServiceSparseTest, ATableBucketIsCopiedLiveInSlicesOfOneCapture) {
  auto server = TestServer::Start("ps-0", /*with_checkpoints=*/false);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(IsOk(SetupJob((*server)->stub(), MakeTableSetup("live", **server))));
  std::vector<uint64_t> keys;
  for (int i = 0; i < 150000; ++i) keys.push_back(SplitMix64(static_cast<uint64_t>(i)));
  ASSERT_NO_FATAL_FAILURE(PushAllKeys(**server, "live", keys, /*step=*/4));

  const int32_t chunk = TableChunkId(1, 2);  // an embedding bucket: about 5 MiB
  auto copy = [&](int64_t offset, uint64_t capture, v1::ChunkState* state) {
    v1::CopyChunkRequest request;
    request.set_job_id("live");
    request.set_chunk_id(chunk);
    request.set_table_state_offset(offset);
    request.set_capture(capture);
    grpc::ClientContext context;
    return (*server)->stub()->CopyChunk(&context, request, state);
  };
  v1::ChunkState first, other_first;
  ASSERT_TRUE(IsOk(copy(0, 0, &first)));
  ASSERT_TRUE(IsOk(copy(0, 0, &other_first)));
  ASSERT_GT(first.table_state_size(), static_cast<int64_t>(kTableStateSlice)) << "more than one slice";
  EXPECT_EQ(first.table_state().size(), kTableStateSlice);
  EXPECT_NE(first.capture(), 0u);
  EXPECT_NE(first.capture(), other_first.capture());
  ASSERT_EQ(first.partition_steps_size(), 1);
  EXPECT_EQ(first.partition_steps(0), 4);

  // Another step changes every row; the captures' later slices are still of before it.
  ASSERT_NO_FATAL_FAILURE(PushAllKeys(**server, "live", keys, /*step=*/5));
  v1::ChunkState rest, other_rest;
  ASSERT_TRUE(IsOk(copy(static_cast<int64_t>(kTableStateSlice), first.capture(), &rest)));
  ASSERT_TRUE(IsOk(copy(static_cast<int64_t>(kTableStateSlice), other_first.capture(), &other_rest)));
  const std::string before = first.table_state() + rest.table_state();
  EXPECT_EQ(static_cast<int64_t>(before.size()), first.table_state_size());
  EXPECT_EQ(before, other_first.table_state() + other_rest.table_state());
  v1::ChunkState after, after_rest;
  ASSERT_TRUE(IsOk(copy(0, 0, &after)));
  EXPECT_NE(after.table_state(), first.table_state()) << "a new capture sees step 5";
  EXPECT_EQ(after.partition_steps(0), 5);
  ASSERT_TRUE(IsOk(copy(static_cast<int64_t>(kTableStateSlice), after.capture(), &after_rest)));
  EXPECT_NE(after_rest.table_state(), rest.table_state()) << "the first capture's later slice was not of step 4";

  // Served whole: no longer kept. A capture never made is not either.
  v1::ChunkState again;
  EXPECT_TRUE(HasError(copy(static_cast<int64_t>(kTableStateSlice), first.capture(), &again),
                       grpc::StatusCode::ABORTED, "copy the bucket again from offset 0"));
  EXPECT_TRUE(HasError(copy(100, 987654321, &again), grpc::StatusCode::ABORTED, "no longer kept"));
  // Beyond the state, a bucket of no table, a job without tables.
  v1::ChunkState fresh;
  ASSERT_TRUE(IsOk(copy(0, 0, &fresh)));
  EXPECT_TRUE(HasError(copy(fresh.table_state_size() + 1, fresh.capture(), &again),
                       grpc::StatusCode::OUT_OF_RANGE, "outside the bucket"));
  v1::CopyChunkRequest missing;
  missing.set_job_id("live");
  missing.set_chunk_id(TableChunkId(5, 0));
  grpc::ClientContext context;
  EXPECT_TRUE(HasError((*server)->stub()->CopyChunk(&context, missing, &again), grpc::StatusCode::NOT_FOUND,
                       "no table bucket held here"));

  // A server whose memory budget has less room left than the bucket's state
  // will not keep a capture of it to send in slices.
  auto tight = TestServer::Start("ps-1", /*with_checkpoints=*/false,
                                 (*server)->store().bytes() + (int64_t{2} << 20));
  ASSERT_TRUE(tight.ok()) << tight.status();
  ASSERT_TRUE(IsOk(SetupJob((*tight)->stub(), MakeTableSetup("live", **tight))));
  ASSERT_NO_FATAL_FAILURE(PushAllKeys(**tight, "live", keys, /*step=*/4));
  ASSERT_NO_FATAL_FAILURE(PushAllKeys(**tight, "live", keys, /*step=*/5));
  v1::CopyChunkRequest request;
  request.set_job_id("live");
  request.set_chunk_id(chunk);
  grpc::ClientContext tight_context;
  EXPECT_TRUE(HasError((*tight)->stub()->CopyChunk(&tight_context, request, &again),
                       grpc::StatusCode::RESOURCE_EXHAUSTED, "more than this server can keep"));
}

}  // namespace
}  // namespace fulcrum
