// The replication unit without sockets: fencing, forwarding a push's chunks
// to their backups, cancelling forwards on a role change and adopting chunks
// copied from other replicas, against fake peers.
#include "server/replication.h"

#include <gtest/gtest.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "common/payload_wire.h"
#include "common/rpc.h"
#include "common/sync.h"
#include "common/tensor_codec.h"

namespace fulcrum {
namespace {

constexpr int64_t kChunkElems = 4;

JobShardConfig TwoChunkJob(const std::string& job_id = "job") {
  JobShardConfig config;
  config.job_id = job_id;
  config.server_id = "server-a";
  config.optimizer.kind = OptimizerKind::kSgd;
  config.lr = 0.5f;
  config.synchronous = false;
  config.num_partitions = 1;
  for (int32_t id : {0, 1}) {
    ChunkConfig chunk;
    chunk.chunk_id = id;
    chunk.shard = id;
    chunk.offset = id * kChunkElems;
    chunk.length = kChunkElems;
    config.chunks.push_back(chunk);
  }
  return config;
}

// A push of `values` to every chunk in `chunk_ids`, as received: its bytes
// parsed by a PayloadReader.
struct ReceivedPush {
  v1::PushRequest header;
  PayloadReader chunks;
  grpc::ByteBuffer bytes;
};

std::unique_ptr<ReceivedPush> Received(const std::string& job_id, int64_t map_version,
                                       const std::vector<int32_t>& chunk_ids, float value = 1.0f) {
  v1::PushRequest request;
  request.set_job_id(job_id);
  request.set_worker_id("worker-0");
  request.set_seq(7);
  request.set_map_version(map_version);
  for (int32_t id : chunk_ids) {
    v1::ChunkData* chunk = request.add_chunks();
    chunk->set_chunk_id(id);
    const std::vector<float> values(kChunkElems, value + static_cast<float>(id));
    EncodeFloats(values.data(), kChunkElems, chunk->mutable_data());
  }
  auto received = std::make_unique<ReceivedPush>();
  received->bytes = SerializeMovingPayloads(&request);
  EXPECT_TRUE(received->chunks.Parse(received->bytes, v1::PushRequest::kChunksFieldNumber, &received->header).ok());
  return received;
}

// Peers that answer from a table and record what they were sent.
class FakePeers final : public ReplicaPeers {
 public:
  class FakeForward final : public Forward {
   public:
    FakeForward(absl::Status outcome, bool hold) : outcome_(std::move(outcome)), held_(hold) {}
    void Cancel() override {
      MutexLock lock(&mu_);
      cancelled_ = true;
    }
    absl::Status Wait() override {
      MutexLock lock(&mu_);
      mu_.Await(absl::Condition(+[](FakeForward* f) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !f->held_ || f->cancelled_; },
                                this));
      return cancelled_ ? absl::CancelledError("cancelled") : outcome_;
    }

   private:
    Mutex mu_;
    const absl::Status outcome_;
    const bool held_;  // until cancelled
    bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  };

  std::unique_ptr<Forward> Replicate(const std::string& address, Method method, grpc::ByteBuffer request,
                                     absl::Duration) override {
    MutexLock lock(&mu_);
    if (method == Method::kSparseReplicate) {
      EXPECT_TRUE(ParseMessage(request, &sparse_sent_[address]).ok());
      ++started_;
      auto outcome = outcomes_.find(address);
      return std::make_unique<FakeForward>(outcome != outcomes_.end() ? outcome->second : absl::OkStatus(),
                                           held_.count(address) > 0);
    }
    v1::PushRequest header;
    PayloadReader chunks;
    EXPECT_TRUE(chunks.Parse(request, v1::PushRequest::kChunksFieldNumber, &header).ok());
    Sent& sent = sent_[address];
    sent.job_id = header.job_id();
    sent.seq = header.seq();
    for (int i = 0; i < chunks.chunks(); ++i) {
      std::string payload(static_cast<size_t>(chunks.payload_size(i)), '\0');
      chunks.CopyPayload(i, payload.data());
      sent.payloads[chunks.chunk(i).chunk_id()] = payload;
    }
    ++started_;
    auto outcome = outcomes_.find(address);
    return std::make_unique<FakeForward>(outcome != outcomes_.end() ? outcome->second : absl::OkStatus(),
                                         held_.count(address) > 0);
  }

  absl::StatusOr<v1::ChunkState> CopyChunk(const std::string& address, const v1::CopyChunkRequest& request,
                                           absl::Duration) override {
    MutexLock lock(&mu_);
    copies_.push_back(address + "/" + std::to_string(request.chunk_id()));
    auto state = states_.find({address, request.chunk_id()});
    if (state == states_.end()) return absl::UnavailableError("connection refused");
    return state->second;
  }

  struct Sent {
    std::string job_id;
    int64_t seq = 0;
    std::map<int32_t, std::string> payloads;  // chunk id -> bytes
  };
  Mutex mu_;
  std::map<std::string, Sent> sent_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, v1::SparsePushRequest> sparse_sent_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status> outcomes_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> held_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int32_t>, v1::ChunkState> states_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> copies_ ABSL_GUARDED_BY(mu_);
  int started_ ABSL_GUARDED_BY(mu_) = 0;
};

class ReplicationTest : public testing::Test {
 protected:
  void SetUp() override {
    Replicator::Options options;
    options.lease_valid = [this] { return lease_.load(); };
    options.refused = &prometheus::BuildCounter().Name("refused").Register(registry_).Add({});
    refused_ = options.refused;
    replicator_ = std::make_unique<Replicator>(&peers_, std::move(options));
    auto shard = JobShard::Create(TwoChunkJob());
    ASSERT_TRUE(shard.ok()) << shard.status();
    // Map version 3: primary of chunk 0 (backups b1 and b2), backup of chunk 1.
    std::map<int32_t, JobShard::ShardRole> roles;
    roles[0] = {true, {"b1", "b2"}};
    roles[1] = {false, {}};
    ASSERT_TRUE((*shard)->Configure(3, roles).ok());
    shard_ = std::move(*shard);
  }

  prometheus::Registry registry_;
  prometheus::Counter* refused_ = nullptr;
  std::atomic<bool> lease_{true};
  FakePeers peers_;
  std::unique_ptr<Replicator> replicator_;
  std::unique_ptr<JobShard> shard_;
};

TEST_F(ReplicationTest, WritesPassFencingOnlyWithTheLeaseTheMapVersionAndTheRole) {
  auto push = Received("job", 3, {0});
  EXPECT_TRUE(replicator_->CheckWrite(*shard_, push->header, push->chunks, /*as_primary=*/true).ok());
  auto replication = Received("job", 3, {1});
  EXPECT_TRUE(replicator_->CheckWrite(*shard_, replication->header, replication->chunks, /*as_primary=*/false).ok());

  auto expect = [&](const ReceivedPush& write, bool as_primary, absl::StatusCode code, const std::string& says) {
    absl::Status status = replicator_->CheckWrite(*shard_, write.header, write.chunks, as_primary);
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), says)) << status;
  };
  expect(*Received("job", 2, {0}), true, absl::StatusCode::kAborted, "shard map version 2, this server is at 3");
  expect(*Received("job", 4, {0}), true, absl::StatusCode::kUnavailable, "has not received shard map version 4");
  expect(*Received("job", 3, {1}), true, absl::StatusCode::kAborted, "this server is not its primary");
  expect(*Received("job", 3, {0}), false, absl::StatusCode::kAborted, "this server is not its backup");
  expect(*Received("job", 3, {0, 0}), true, absl::StatusCode::kInvalidArgument, "more than once");
  expect(*Received("job", 3, {0, 1, 0}), true, absl::StatusCode::kInvalidArgument, "chunk 0 more than once");
  expect(*Received("job", 3, {5}), true, absl::StatusCode::kNotFound, "chunk 5");
  // Every chunk of a push is checked, whichever comes first.
  expect(*Received("job", 3, {0, 1}), true, absl::StatusCode::kAborted,
         "chunk 1 of job job: this server is not its primary");
  expect(*Received("job", 3, {1, 0}), false, absl::StatusCode::kAborted,
         "chunk 0 of job job: this server is not its backup");
  expect(*Received("job", 3, {0, 5}), true, absl::StatusCode::kNotFound, "chunk 5");
  EXPECT_EQ(refused_->Value(), 1);  // the older map
  lease_ = false;
  expect(*Received("job", 3, {0}), true, absl::StatusCode::kUnavailable, "lost its lease");
  EXPECT_EQ(refused_->Value(), 2);
}

// A chunk moved to a shard this server does not hold is refused in any push
// that names it, also beside chunks it does hold; one never configured is
// held as its lone primary.
TEST_F(ReplicationTest, AChunkMovedAwayIsRefusedInAnyPushThatNamesIt) {
  std::map<int32_t, JobShard::ShardRole> roles;
  roles[0] = {true, {"b1"}};
  ASSERT_TRUE(shard_->Configure(4, roles, {{1, 7}}).ok());
  for (const std::vector<int32_t>& ids : {std::vector<int32_t>{1}, {0, 1}, {1, 0}}) {
    auto push = Received("job", 4, ids);
    absl::Status status = replicator_->CheckWrite(*shard_, push->header, push->chunks, /*as_primary=*/true);
    EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "chunk 1 of job job moved to shard 7")) << status;
  }
  auto push = Received("job", 4, {0});
  EXPECT_TRUE(replicator_->CheckWrite(*shard_, push->header, push->chunks, /*as_primary=*/true).ok());

  auto alone = JobShard::Create(TwoChunkJob());
  ASSERT_TRUE(alone.ok()) << alone.status();
  auto both = Received("job", 0, {0, 1});
  EXPECT_TRUE(replicator_->CheckWrite(**alone, both->header, both->chunks, /*as_primary=*/true).ok());
  absl::StatusOr<JobShard::ChunkRoles> lone = (*alone)->RolesOf({0, 1});
  ASSERT_TRUE(lone.ok()) << lone.status();
  EXPECT_EQ(lone->shard_of, (std::vector<int32_t>{0, 1}));
  ASSERT_EQ(lone->roles.size(), 2u);
  EXPECT_TRUE(lone->roles.at(0).primary && lone->roles.at(1).primary);
}

// A chunk moved to another shard stays whole here until its move is
// committed (a handover undone gives it back as it is), then its memory
// goes; a later map that gives it back brings a copy of it.
TEST_F(ReplicationTest, AChunkMovedAwayIsFreedOnlyOnceItsMoveIsCommitted) {
  auto never_configured = JobShard::Create(TwoChunkJob());
  ASSERT_TRUE(never_configured.ok()) << never_configured.status();
  EXPECT_EQ((*never_configured)->FreeChunksWithoutRole(0), 0) << "a lone replica holds every shard";

  const int64_t chunk_bytes = JobShard::ChunkBytes(kChunkElems, shard_->config());
  EXPECT_EQ(shard_->FreeChunksWithoutRole(3), 0) << "a role in both chunks' shards";
  const int64_t whole = shard_->bytes();
  std::map<int32_t, JobShard::ShardRole> roles;
  roles[0] = {true, {"b1"}};
  ASSERT_TRUE(shard_->Configure(4, roles, {{1, 7}}).ok());
  EXPECT_EQ(shard_->bytes(), whole) << "kept until the move is committed";
  absl::StatusOr<ChunkSnapshot> kept = shard_->Snapshot(1);
  ASSERT_TRUE(kept.ok()) << kept.status();

  EXPECT_EQ(shard_->FreeChunksWithoutRole(3), 0) << "told of map 3's moves, it holds map 4";
  EXPECT_EQ(shard_->bytes(), whole);
  EXPECT_EQ(shard_->FreeChunksWithoutRole(4), chunk_bytes);
  EXPECT_EQ(shard_->bytes(), whole - chunk_bytes);
  absl::StatusOr<ChunkSnapshot> gone = shard_->Snapshot(1);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kAborted) << gone.status();
  EXPECT_TRUE(absl::StrContains(gone.status().message(), "chunk 1 of job job moved to shard 7"))
      << gone.status();
  EXPECT_TRUE(shard_->Snapshot(0).ok());
  // Pushes naming it are still refused for the move, not for a missing chunk.
  auto push = Received("job", 4, {1});
  absl::Status refused = replicator_->CheckWrite(*shard_, push->header, push->chunks, /*as_primary=*/true);
  EXPECT_TRUE(absl::StrContains(refused.message(), "chunk 1 of job job moved to shard 7")) << refused;
  EXPECT_EQ(shard_->FreeChunksWithoutRole(4), 0) << "freed once";

  // Map 5 gives shard 7 to this server with a copy of the chunk.
  roles[7] = {false, {}};
  ASSERT_TRUE(shard_->Configure(5, roles).ok());
  ChunkConfig back = TwoChunkJob().chunks[1];
  back.shard = 7;
  kept->values.assign(kept->values.size(), 2.5f);
  ASSERT_TRUE(shard_->AdoptChunks({back}, {*kept}).ok());
  absl::StatusOr<ChunkSnapshot> copied = shard_->Snapshot(1);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(copied->values, kept->values);
  EXPECT_EQ(shard_->bytes(), whole);
  EXPECT_EQ(shard_->FreeChunksWithoutRole(5), 0);
}

TEST_F(ReplicationTest, AForwardSendsEachBackupItsChunksBytesUnchanged) {
  // Map version 4: also primary of chunk 1, whose only backup is b2.
  std::map<int32_t, JobShard::ShardRole> roles;
  roles[0] = {true, {"b1", "b2"}};
  roles[1] = {true, {"b2"}};
  ASSERT_TRUE(shard_->Configure(4, roles).ok());
  auto push = Received("job", 4, {0, 1}, 10.0f);
  ASSERT_TRUE(replicator_->Forward(*shard_, push->header, push->chunks).ok());
  MutexLock lock(&peers_.mu_);
  ASSERT_EQ(peers_.sent_.size(), 2u);
  const FakePeers::Sent& b1 = peers_.sent_["b1"];
  const FakePeers::Sent& b2 = peers_.sent_["b2"];
  EXPECT_EQ(b1.job_id, "job");
  EXPECT_EQ(b1.seq, 7);  // the worker's own sequence number: backups deduplicate alike
  ASSERT_EQ(b1.payloads.size(), 1u);
  ASSERT_EQ(b2.payloads.size(), 2u);
  for (int32_t id : {0, 1}) {
    std::string expected;
    const std::vector<float> values(kChunkElems, 10.0f + static_cast<float>(id));
    EncodeFloats(values.data(), kChunkElems, &expected);
    EXPECT_EQ(b2.payloads.at(id), expected) << id;
  }
  EXPECT_EQ(b1.payloads.at(0), b2.payloads.at(0));
}

TEST_F(ReplicationTest, ABackupAtANewerMapFencesThePrimaryAndOtherFailuresAreRetried) {
  auto push = Received("job", 3, {0});
  {
    MutexLock lock(&peers_.mu_);
    peers_.outcomes_["b2"] = absl::AbortedError("request made with shard map version 3, this server is at 4");
  }
  absl::Status fenced = replicator_->Forward(*shard_, push->header, push->chunks);
  EXPECT_EQ(fenced.code(), absl::StatusCode::kAborted) << fenced;
  EXPECT_TRUE(absl::StrContains(fenced.message(), "replicating to backup b2")) << fenced;
  {
    MutexLock lock(&peers_.mu_);
    peers_.outcomes_["b2"] = absl::DeadlineExceededError("deadline exceeded");
  }
  absl::Status retried = replicator_->Forward(*shard_, push->header, push->chunks);
  EXPECT_EQ(retried.code(), absl::StatusCode::kUnavailable) << retried;
  // No backups: nothing to wait for.
  std::map<int32_t, JobShard::ShardRole> alone;
  alone[0] = {true, {}};
  alone[1] = {true, {}};
  ASSERT_TRUE(shard_->Configure(5, alone).ok());
  auto lone = Received("job", 5, {0, 1});
  const int started = [&] { MutexLock lock(&peers_.mu_); return peers_.started_; }();
  EXPECT_TRUE(replicator_->Forward(*shard_, lone->header, lone->chunks).ok());
  MutexLock lock(&peers_.mu_);
  EXPECT_EQ(peers_.started_, started);
}

// Sparse pushes: fenced by the lease, the map and the role in the shard the
// push names; forwarded whole to that shard's backups only; a backup whose
// tables are full answers RESOURCE_EXHAUSTED through the primary.
TEST_F(ReplicationTest, SparseWritesAreFencedByTheirShardAndForwardedToItsBackups) {
  EXPECT_TRUE(replicator_->CheckSparseWrite(*shard_, "job", 3, /*shard_id=*/0, /*as_primary=*/true).ok());
  EXPECT_TRUE(replicator_->CheckSparseWrite(*shard_, "job", 3, /*shard_id=*/1, /*as_primary=*/false).ok());
  auto expect = [&](int64_t version, int32_t shard, bool as_primary, absl::StatusCode code, const std::string& says) {
    absl::Status status = replicator_->CheckSparseWrite(*shard_, "job", version, shard, as_primary);
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), says)) << status;
  };
  expect(2, 0, true, absl::StatusCode::kAborted, "shard map version 2, this server is at 3");
  expect(4, 0, true, absl::StatusCode::kUnavailable, "has not received shard map version 4");
  expect(3, 1, true, absl::StatusCode::kAborted, "this server is not its primary");
  expect(3, 0, false, absl::StatusCode::kAborted, "this server is not its backup");
  expect(3, 7, true, absl::StatusCode::kAborted, "shard 7 of job job is not held by this server");

  v1::SparsePushRequest push;
  push.set_job_id("job");
  push.set_partition(1);
  push.set_step(4);
  push.set_shard(0);
  push.set_part(1);
  push.set_parts(2);
  v1::SparseKeys* table = push.add_tables();
  table->set_keys(std::string(16, 'k'));
  table->set_rows(std::string(8, 'r'));
  ASSERT_TRUE(replicator_->ForwardSparse(*shard_, 0, "job", SerializeMessage(push)).ok());
  {
    MutexLock lock(&peers_.mu_);
    ASSERT_EQ(peers_.sparse_sent_.size(), 2u);
    for (const char* backup : {"b1", "b2"}) {
      EXPECT_EQ(peers_.sparse_sent_[backup].SerializeAsString(), push.SerializeAsString()) << backup;
    }
    peers_.sparse_sent_.clear();
    peers_.outcomes_["b1"] = absl::ResourceExhaustedError("sparse table embedding is full on this server");
  }
  const absl::Status full = replicator_->ForwardSparse(*shard_, 0, "job", SerializeMessage(push));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_TRUE(absl::StrContains(full.message(), "replicating to backup b1")) << full;
  EXPECT_FALSE(IsServerBusy(full)) << "a full table is not sent again";
  // A busy backup (gRPC refused the call, its threads all taken): the push
  // is refused as busy here too, which the worker sends again.
  {
    MutexLock lock(&peers_.mu_);
    peers_.outcomes_["b1"] = absl::ResourceExhaustedError(kGrpcThreadsExhausted);
  }
  const absl::Status busy = replicator_->ForwardSparse(*shard_, 0, "job", SerializeMessage(push));
  EXPECT_TRUE(IsServerBusy(busy)) << busy;
  EXPECT_TRUE(absl::StrContains(busy.message(), "replicating to backup b1")) << busy;
  // Another backup's worse answer wins over a busy one: a backup away is a
  // failover to notice, not a refusal to send again until the deadline.
  {
    MutexLock lock(&peers_.mu_);
    peers_.outcomes_["b2"] = absl::UnavailableError("connection refused");
  }
  const absl::Status away = replicator_->ForwardSparse(*shard_, 0, "job", SerializeMessage(push));
  EXPECT_EQ(away.code(), absl::StatusCode::kUnavailable) << away;
  EXPECT_TRUE(absl::StrContains(away.message(), "replicating to backup b2")) << away;
  // Whatever their addresses' order, a backup that fences wins over one
  // away, and a full one over one away: b1 (first by address) away, b2
  // fencing or full.
  for (const absl::Status& worse :
       {absl::AbortedError("request made with shard map version 3, this server is at 4"),
        absl::ResourceExhaustedError("sparse table embedding is full on this server")}) {
    {
      MutexLock lock(&peers_.mu_);
      peers_.outcomes_["b1"] = absl::UnavailableError("connection refused");
      peers_.outcomes_["b2"] = worse;
    }
    const absl::Status answer = replicator_->ForwardSparse(*shard_, 0, "job", SerializeMessage(push));
    EXPECT_EQ(answer.code(), worse.code()) << answer;
    EXPECT_TRUE(absl::StrContains(answer.message(), "replicating to backup b2")) << answer;
  }
  // A shard without backups (this server backs shard 1 up; its primary
  // forwards): nothing is sent.
  std::map<int32_t, JobShard::ShardRole> alone;
  alone[0] = {true, {}};
  ASSERT_TRUE(shard_->Configure(4, alone).ok());
  const int started = [&] { MutexLock lock(&peers_.mu_); return peers_.started_; }();
  EXPECT_TRUE(replicator_->ForwardSparse(*shard_, 0, "job", SerializeMessage(push)).ok());
  MutexLock lock(&peers_.mu_);
  EXPECT_EQ(peers_.started_, started);
}

TEST_F(ReplicationTest, CancelForwardsEndsTheJobsForwardsInFlightOnly) {
  {
    MutexLock lock(&peers_.mu_);
    peers_.held_ = {"b1", "b2"};  // backups that never answer
  }
  auto push = Received("job", 3, {0});
  absl::Status outcome = absl::UnknownError("not finished");
  Notification done;
  std::thread forward([&] {
    outcome = replicator_->Forward(*shard_, push->header, push->chunks);
    done.Notify();
  });
  {
    MutexLock lock(&peers_.mu_);
    peers_.mu_.Await(absl::Condition(+[](int* n) { return *n == 2; }, &peers_.started_));
  }
  replicator_->CancelForwards("another-job");
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  replicator_->CancelForwards("job");
  done.WaitForNotification();
  forward.join();
  EXPECT_EQ(outcome.code(), absl::StatusCode::kUnavailable) << outcome;  // the worker retries on the new map
}

TEST_F(ReplicationTest, CopiesComeFromEachChunksSourceAndAreAdoptedWhole) {
  // The primaries' states: chunk 0 at "p0" (version 5), chunk 1 at "p1".
  for (int32_t id : {0, 1}) {
    ChunkSnapshot snapshot;
    snapshot.values.assign(kChunkElems, 1.5f + static_cast<float>(id));
    snapshot.version = 5 + id;
    snapshot.partition_steps = {snapshot.version};
    snapshot.watermarks = {{"worker-0", 40 + id}};
    v1::ChunkState state;
    ToChunkState(snapshot, id, &state);
    MutexLock lock(&peers_.mu_);
    peers_.states_[{id == 0 ? "p0" : "p1", id}] = state;
  }
  ParameterStore store;
  JobShardConfig config = TwoChunkJob("copied");
  std::map<int32_t, JobShard::ShardRole> roles;
  roles[0] = {false, {}};
  roles[1] = {false, {}};
  ASSERT_TRUE(replicator_->AdoptCopies(&store, config, 9, roles, {}, "p0", {{1, "p1"}}).ok());
  auto shard = store.Find("copied");
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ((*shard)->map_version(), 9);
  for (int32_t id : {0, 1}) {
    auto snapshot = (*shard)->Snapshot(id);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    EXPECT_EQ(snapshot->values, std::vector<float>(kChunkElems, 1.5f + static_cast<float>(id)));
    EXPECT_EQ(snapshot->version, 5 + id);
    EXPECT_EQ(snapshot->watermarks, (std::vector<std::pair<std::string, int64_t>>{{"worker-0", 40 + id}}));
  }
  // A source that cannot be reached: UNAVAILABLE naming the chunk and the
  // server, and nothing installed.
  absl::Status failed = replicator_->AdoptCopies(&store, TwoChunkJob("lost"), 9, roles, {}, "p0", {{1, "gone"}});
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_TRUE(absl::StrContains(failed.message(), "copying chunk 1 of job lost from gone")) << failed;
  EXPECT_FALSE(store.Find("lost").ok());
  // A copied state of the wrong shape is refused, not adopted.
  {
    ChunkSnapshot wrong;
    wrong.values.assign(kChunkElems + 1, 0.0f);
    wrong.partition_steps = {0};
    v1::ChunkState state;
    ToChunkState(wrong, 0, &state);
    MutexLock lock(&peers_.mu_);
    peers_.states_[{"bad", 0}] = state;
  }
  EXPECT_EQ(replicator_->AdoptCopies(&store, TwoChunkJob("bent"), 9, roles, {}, "bad", {{1, "p1"}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(store.Find("bent").ok());
}

}  // namespace
}  // namespace fulcrum
