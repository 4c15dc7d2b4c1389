// SparseClient against two real parameter services in this process
// (InProcessTransport): keys go to the servers of their buckets, answers
// come back in the keys' order, and a push too big for one request per
// server is sent in parts that each apply once.
#include "worker/sparse_client.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "common/rpc.h"
#include "common/shard_map.h"
#include "common/test_metrics.h"
#include "gtest/gtest.h"
#include "kernels/model_from_spec.h"
#include "scheduler/job_spec.h"
#include "scheduler/placement.h"
#include "server/parameter_service.h"
#include "server/parameter_store.h"
#include "worker/in_process_transport.h"
#include "worker/parameter_client.h"

namespace fulcrum {
namespace {

constexpr char kSparseJob[] = "job-sparse";
constexpr int kDim = 1024;  // 4 KiB a row: 3000 keys take several requests per server

// An FM job whose tables both update by SGD with lr 1 from zeros: after a
// push of g, a key's row is -g.
v1::JobSpec Spec() {
  v1::JobSpec spec;
  spec.mutable_model()->set_kind(v1::ModelSpec::FM);
  spec.mutable_model()->set_embedding_dim(kDim);
  for (const char* name : {"linear", "embedding"}) {
    v1::TableSpec* table = spec.mutable_model()->add_tables();
    table->set_name(name);
    table->mutable_optimizer()->set_kind(v1::SparseOptimizerSpec::SGD);
    table->mutable_optimizer()->set_lr(1.0f);
    table->set_init_scale(0.0f);
  }
  spec.mutable_data()->set_dataset(v1::DataSpec::SYNTHETIC_CTR);
  spec.mutable_data()->mutable_synthetic_ctr()->set_examples(1000);
  spec.mutable_data()->set_batch_size(10);
  spec.mutable_optimizer()->set_lr(0.1f);
  spec.set_replicas(1);
  ApplyJobSpecDefaults(&spec);
  return spec;
}

class SparseClientTest : public testing::Test {
 protected:
  void SetUp() override {
    std::vector<ServerRef> refs;
    for (int i = 0; i < 2; ++i) {
      stores_.push_back(std::make_unique<ParameterStore>());
      services_.push_back(std::make_unique<ParameterServiceImpl>(stores_.back().get(), SharedTestMetrics()));
      refs.push_back({absl::StrCat("server-", i), absl::StrCat("in-process:", i)});
      transport_.Serve(refs.back().address, services_.back().get());
    }
    const ModelLayout layout = LayoutFor(spec_, 0, 0);
    map_ = PlanShardMap(layout.tensors, refs, /*num_shards=*/0, /*replicas=*/1, 1 << 16, /*version=*/1);
    AddTableLayouts(layout.tables, spec_, &map_);
    for (size_t i = 0; i < services_.size(); ++i) {
      v1::SetupJobRequest request;
      request.set_job_id(kSparseJob);
      *request.mutable_spec() = spec_;
      request.set_num_partitions(1);
      request.set_total_steps(10);
      *request.mutable_shard_map() = map_;
      request.set_server_id(refs[i].id);
      for (const v1::ChunkLocation& chunk : map_.chunks()) {
        if (map_.shards(chunk.shard()).server_id() == refs[i].id) AddChunkSetup(chunk, layout, &request);
      }
      v1::SetupJobResponse response;
      const grpc::Status status = services_[i]->SetupJob(nullptr, &request, &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
    }
  }

  const v1::JobSpec spec_ = Spec();
  std::vector<std::unique_ptr<ParameterStore>> stores_;
  std::vector<std::unique_ptr<ParameterServiceImpl>> services_;
  InProcessTransport transport_;
  v1::ShardMap map_;
};

TEST_F(SparseClientTest, PushesInPartsApplyOnceAndPullsAnswerInKeyOrder) {
  ASSERT_EQ(map_.tables_size(), 2);
  SparseClient client(map_, kSparseJob, "w0", &transport_);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 3000; ++k) keys.push_back(k * 7919 + 13);
  const std::vector<std::vector<uint64_t>> both = {keys, keys};
  std::vector<std::vector<float>> grads(2);
  for (int t = 0; t < 2; ++t) {
    const int dim = client.dim(t);
    for (size_t i = 0; i < keys.size(); ++i) {
      for (int d = 0; d < dim; ++d) grads[t].push_back(static_cast<float>(i % 97) + 0.001f * static_cast<float>(d));
    }
  }
  ASSERT_TRUE(client.Push(0, 0, both, grads, absl::Seconds(10)).ok());
  // A retry of the whole step (every part) changes nothing.
  ASSERT_TRUE(client.Push(0, 0, both, grads, absl::Seconds(10)).ok());
  std::vector<std::vector<float>> rows;
  ASSERT_TRUE(client.Pull(both, &rows, absl::Seconds(10)).ok());
  for (int t = 0; t < 2; ++t) {
    ASSERT_EQ(rows[t].size(), grads[t].size());
    for (size_t i = 0; i < rows[t].size(); ++i) ASSERT_EQ(rows[t][i], -grads[t][i]) << "table " << t << " float " << i;
  }
  // Both servers hold rows, each only its buckets'.
  int64_t held = 0;
  for (const auto& store : stores_) {
    auto shard = store->Find(kSparseJob);
    ASSERT_TRUE(shard.ok());
    const int64_t rows_here = (*shard)->sparse()->Stats()[1].rows;
    EXPECT_GT(rows_here, 0);
    held += rows_here;
  }
  EXPECT_EQ(held, 3000);
  // The next step applies.
  ASSERT_TRUE(client.Push(0, 1, both, grads, absl::Seconds(10)).ok());
  ASSERT_TRUE(client.Pull(both, &rows, absl::Seconds(10)).ok());
  EXPECT_EQ(rows[0][5], -2 * grads[0][5]);
}

TEST_F(SparseClientTest, AServerThatIsGoneFailsTheCallNamingIt) {
  SparseClient client(map_, kSparseJob, "w0", &transport_);
  transport_.Serve(map_.shards(0).address(), nullptr);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 64; ++k) keys.push_back(k);
  std::vector<std::vector<float>> rows;
  const absl::Status pulled = client.Pull({keys, keys}, &rows, absl::Seconds(1));
  EXPECT_EQ(pulled.code(), absl::StatusCode::kUnavailable) << pulled;
  EXPECT_NE(pulled.message().find(map_.shards(0).address()), std::string::npos) << pulled;
}

// A newer shard map (the worker daemon's heartbeat, through the job's
// ParameterClient) supersedes the sparse client too: a call in flight that
// it cancels answers ABORTED, which the trainer takes as "refresh the map",
// and later calls fail so at once without reaching a server (they used to
// wait out their deadline on a paused server).
TEST_F(SparseClientTest, ASupersededClientsCallsAnswerAbortedAtOnce) {
  SparseClient client(map_, kSparseJob, "w0", &transport_);
  ParameterClient dense(map_, kSparseJob, "w0", nullptr, v1::WIRE_FP32, &transport_);
  dense.set_also_supersede([&client] { client.Supersede(); });
  int reached = 0;
  transport_.set_fault([&](const std::string&, ParameterTransport::Method method,
                           InProcessTransport::Stage stage) -> absl::Status {
    if (method != ParameterTransport::Method::kSparsePull ||
        stage != InProcessTransport::Stage::kBeforeServer) {
      return absl::OkStatus();
    }
    ++reached;
    dense.Supersede();  // the heartbeat with a newer map, while the call is out
    return absl::CancelledError("cancelled by the client");  // what gRPC answers a cancelled call
  });
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 64; ++k) keys.push_back(k);
  std::vector<std::vector<float>> rows;
  const absl::Status cut = client.Pull({keys, keys}, &rows, absl::Seconds(60));
  EXPECT_EQ(cut.code(), absl::StatusCode::kAborted) << cut;
  EXPECT_NE(cut.message().find("superseded"), std::string::npos) << cut;
  ASSERT_GT(reached, 0);
  const int before = reached;
  const absl::Status later = client.Pull({keys, keys}, &rows, absl::Seconds(60));
  EXPECT_EQ(later.code(), absl::StatusCode::kAborted) << later;
  EXPECT_EQ(reached, before) << "a superseded client's call reached a server";
}

// A server whose sparse pulls in flight are at their bound answers
// RESOURCE_EXHAUSTED "server busy": the client sends those requests again,
// alone, after a backoff, and the pull completes with every row. So is a
// push refused as busy (as gRPC refuses a call with its threads all taken),
// applied once; any other RESOURCE_EXHAUSTED (a table full) is not sent
// again: it fails naming the server. A pull refused until its deadline
// fails DEADLINE_EXCEEDED.
TEST_F(SparseClientTest, PullsRefusedAsBusyAreSentAgainUntilAnswered) {
  SparseClient client(map_, kSparseJob, "w0", &transport_);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 3000; ++k) keys.push_back(k * 7919 + 13);  // several requests per server
  std::vector<std::vector<float>> grads(2);
  for (int t = 0; t < 2; ++t) grads[t].assign(keys.size() * static_cast<size_t>(client.dim(t)), 0.25f);
  ASSERT_TRUE(client.Push(0, 0, {keys, keys}, grads, absl::Seconds(10)).ok());
  int pulls = 0, refused = 0, pushes_refused = 0;
  std::atomic<bool> always_busy{false};
  transport_.set_fault([&](const std::string&, ParameterTransport::Method method,
                           InProcessTransport::Stage stage) -> absl::Status {
    if (stage != InProcessTransport::Stage::kBeforeServer) return absl::OkStatus();
    // The first three pushes are refused, as gRPC refuses a call when the
    // server's threads are all taken.
    if (method == ParameterTransport::Method::kSparsePush) {
      if (pushes_refused == 3) return absl::OkStatus();
      ++pushes_refused;
      return absl::ResourceExhaustedError(kGrpcThreadsExhausted);
    }
    // The first five pulls are refused (the first round's, then again).
    if (method != ParameterTransport::Method::kSparsePull) return absl::OkStatus();
    ++pulls;
    if (refused == 5 && !always_busy) return absl::OkStatus();
    ++refused;
    return absl::ResourceExhaustedError(absl::StrCat(kServerBusy, ": sparse pulls in flight hold 5 bytes"));
  });
  std::vector<std::vector<float>> rows;
  const absl::Status pulled = client.Pull({keys, keys}, &rows, absl::Seconds(30));
  ASSERT_TRUE(pulled.ok()) << pulled;
  EXPECT_EQ(refused, 5);
  EXPECT_GT(pulls, 5) << "the refused requests were sent again";
  for (int t = 0; t < 2; ++t) {
    ASSERT_EQ(rows[t].size(), grads[t].size());
    for (size_t i = 0; i < rows[t].size(); ++i)
      ASSERT_EQ(rows[t][i], -0.25f) << "table " << t << " float " << i;
  }
  // Pushes refused as busy are sent again too (a server applies each
  // (partition, step, shard, part) once, so one sent again after all is
  // never applied twice); before, the push failed.
  const absl::Status pushed = client.Push(0, 1, {keys, keys}, grads, absl::Seconds(10));
  ASSERT_TRUE(pushed.ok()) << pushed;
  EXPECT_EQ(pushes_refused, 3);
  std::vector<std::vector<float>> after;
  transport_.set_fault(nullptr);
  ASSERT_TRUE(client.Pull({keys, keys}, &after, absl::Seconds(30)).ok());
  for (int t = 0; t < 2; ++t) {
    for (size_t i = 0; i < after[t].size(); ++i)
      ASSERT_EQ(after[t][i], -0.5f) << "two pushes of 0.25 by SGD with lr 1: table " << t << " float " << i;
  }
  transport_.set_fault([&](const std::string&, ParameterTransport::Method method,
                           InProcessTransport::Stage stage) -> absl::Status {
    if (stage != InProcessTransport::Stage::kBeforeServer ||
        method != ParameterTransport::Method::kSparsePush) {
      return absl::OkStatus();
    }
    return absl::ResourceExhaustedError("sparse table t0 is full on this server");
  });
  const absl::Status full = client.Push(0, 2, {keys, keys}, grads, absl::Seconds(10));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_TRUE(absl::StrContains(full.message(), "server in-process:")) << full;
  transport_.set_fault([&](const std::string&, ParameterTransport::Method method,
                           InProcessTransport::Stage stage) -> absl::Status {
    if (stage != InProcessTransport::Stage::kBeforeServer ||
        method != ParameterTransport::Method::kSparsePull) {
      return absl::OkStatus();
    }
    return absl::ResourceExhaustedError(absl::StrCat(kServerBusy, ": sparse pulls in flight hold 5 bytes"));
  });
  // Refused until the deadline: a slow step to the training loop (not a
  // failure of the job, as RESOURCE_EXHAUSTED is), naming the refusal.
  always_busy = true;
  const absl::Status late = client.Pull({keys, keys}, &rows, absl::Milliseconds(300));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_TRUE(absl::StrContains(late.message(), kServerBusy)) << late;
  transport_.set_fault(nullptr);
}

// A table of one float a row: a key's 8 bytes are two thirds of a push, and
// count toward a request's bytes as its row does. Requests used to stop at
// 3 MiB of rows alone, which with their keys is 9 MiB, past gRPC's 8 MiB
// message limit: a large batch's push of such a table failed.
TEST_F(SparseClientTest, RequestsOfATableOfOneFloatARowStayWithinTheirBytesKeysIncluded) {
  ASSERT_EQ(map_.tables(0).dim(), 1);
  SparseClient client(map_, kSparseJob, "w0", &transport_);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 600000; ++k) keys.push_back(k * 7919 + 13);
  std::vector<std::vector<float>> grads = {std::vector<float>(keys.size()), {}};
  for (size_t i = 0; i < keys.size(); ++i) grads[0][i] = static_cast<float>(i % 101);
  transport_.set_keep([](ParameterTransport::Method method) {
    return method == ParameterTransport::Method::kSparsePush ||
           method == ParameterTransport::Method::kSparsePull;
  });
  ASSERT_TRUE(client.Push(0, 0, {keys, {}}, grads, absl::Seconds(30)).ok());
  std::vector<std::vector<float>> rows;
  ASSERT_TRUE(client.Pull({keys, {}}, &rows, absl::Seconds(30)).ok());
  transport_.set_keep(nullptr);
  ASSERT_EQ(rows[0].size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) ASSERT_EQ(rows[0][i], -grads[0][i]) << "key " << i;
  const std::vector<InProcessTransport::Kept> kept = transport_.TakeKept();
  ASSERT_EQ(kept.size(), 8u) << "per server, its 300,000 keys in two pushes and two pulls";
  for (const InProcessTransport::Kept& request : kept) {
    // A request's other fields take a few hundred bytes.
    EXPECT_LE(request.sent.size(), static_cast<size_t>(SparseClient::kMaxRequestBytes + 1024));
  }
}

// gRPC may hold a request's bytes after its call ended (a write stuck on a
// paused peer): a kept sparse request's bytes stay what was sent after the
// client returned and made other requests (they are the request's own).
TEST_F(SparseClientTest, RequestsKeptPastTheirCallKeepTheirBytes) {
  SparseClient client(map_, kSparseJob, "w0", &transport_);
  transport_.set_keep([](ParameterTransport::Method method) {
    return method == ParameterTransport::Method::kSparsePush || method == ParameterTransport::Method::kSparsePull;
  });
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 500; ++k) keys.push_back(k * 31 + 7);
  std::vector<std::vector<float>> grads = {std::vector<float>(keys.size(), 0.5f),
                                           std::vector<float>(keys.size() * kDim, 0.25f)};
  std::vector<std::vector<float>> rows;
  for (int64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(client.Push(0, step, {keys, keys}, grads, absl::Seconds(10)).ok());
    ASSERT_TRUE(client.Pull({keys, keys}, &rows, absl::Seconds(10)).ok());
    for (auto& table : grads) std::fill(table.begin(), table.end(), static_cast<float>(step + 2));
  }
  transport_.set_keep(nullptr);
  const std::vector<InProcessTransport::Kept> kept = transport_.TakeKept();
  ASSERT_GE(kept.size(), 6u);
  for (const InProcessTransport::Kept& request : kept) {
    EXPECT_TRUE(BufferBytes(request.request) == request.sent) << "a kept request changed after it was sent";
  }
}

}  // namespace
}  // namespace fulcrum
