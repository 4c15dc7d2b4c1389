#include "scheduler/checkpoint_coordinator.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/sync.h"
#include "common/table_spec.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

// Two shards (chunk 0 on shard 0, chunk 1 on shard 1), each led by one
// server and backed up by the other.
v1::CheckpointManifest Skeleton(int32_t partitions) {
  v1::CheckpointManifest manifest;
  manifest.set_job_id("job-0001");
  manifest.set_num_partitions(partitions);
  v1::ShardMap* map = manifest.mutable_shard_map();
  for (int s = 0; s < 2; ++s) {
    v1::ShardLocation* shard = map->add_shards();
    shard->set_shard(s);
    shard->set_server_id(s == 0 ? "a" : "b");
    shard->add_backup_ids(s == 0 ? "b" : "a");
    v1::ChunkLocation* chunk = map->add_chunks();
    chunk->set_chunk_id(s);
    chunk->set_shard(s);
  }
  return manifest;
}

v1::CheckpointChunk Chunk(int32_t id, uint32_t checksum, std::vector<int64_t> partition_steps = {}) {
  v1::CheckpointChunk chunk;
  chunk.set_chunk_id(id);
  chunk.set_checksum(checksum);
  chunk.set_bytes(100);
  for (int64_t s : partition_steps) chunk.add_partition_steps(s);
  return chunk;
}

// The value stored under exactly `key`, if any.
std::optional<std::string> Stored(KvStore* store, const std::string& key) {
  auto entries = store->Scan(key);
  if (!entries.ok()) return std::nullopt;
  for (const auto& [k, v] : *entries) {
    if (k == key) return v;
  }
  return std::nullopt;
}

TEST(AssembleManifestTest, PrimaryCopiesWithMatchingReplicasAsHolders) {
  std::map<std::string, v1::CheckpointResponse> responses;
  *responses["a"].add_chunks() = Chunk(0, 11);
  *responses["a"].add_chunks() = Chunk(1, 22);
  *responses["b"].add_chunks() = Chunk(0, 11);
  *responses["b"].add_chunks() = Chunk(1, 99);  // chunk 1's replicas differ
  v1::CheckpointManifest manifest = Skeleton(2);
  ASSERT_TRUE(AssembleManifest(/*synchronous=*/true, /*cut=*/12, responses, &manifest).ok());
  ASSERT_EQ(manifest.chunks_size(), 2);
  EXPECT_EQ(manifest.chunks(0).checksum(), 11u);
  EXPECT_EQ(std::vector<std::string>(manifest.chunks(0).server_ids().begin(), manifest.chunks(0).server_ids().end()),
            (std::vector<std::string>{"a", "b"}));
  // Chunk 1's primary is b: its copy (99) is the checkpoint's, a differs.
  EXPECT_EQ(manifest.chunks(1).checksum(), 99u);
  ASSERT_EQ(manifest.chunks(1).server_ids_size(), 1);
  EXPECT_EQ(manifest.chunks(1).server_ids(0), "b");
  EXPECT_EQ(manifest.info().step(), 12);
  EXPECT_EQ(manifest.info().bytes(), 400);
  EXPECT_EQ(std::vector<int64_t>(manifest.partition_steps().begin(), manifest.partition_steps().end()),
            (std::vector<int64_t>{12, 12}));
}

TEST(AssembleManifestTest, AsynchronousResumesEachPartitionAtItsLowestStep) {
  std::map<std::string, v1::CheckpointResponse> responses;
  *responses["a"].add_chunks() = Chunk(0, 1, {5, 9});
  *responses["b"].add_chunks() = Chunk(1, 2, {7, 3});
  v1::CheckpointManifest manifest = Skeleton(2);
  ASSERT_TRUE(AssembleManifest(/*synchronous=*/false, 0, responses, &manifest).ok());
  EXPECT_EQ(std::vector<int64_t>(manifest.partition_steps().begin(), manifest.partition_steps().end()),
            (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(manifest.info().step(), 3);
}

// A server lists a capture's steps once: chunks after it say they have the
// same. Those steps hold back the positions like listed ones; the manifest's
// entries carry no steps of their own.
TEST(AssembleManifestTest, StepsSharedWithTheChunkBeforeCountAndEntriesCarryNone) {
  v1::CheckpointManifest manifest = Skeleton(2);
  manifest.mutable_shard_map()->mutable_chunks(1)->set_shard(0);  // both chunks on a
  std::map<std::string, v1::CheckpointResponse> responses;
  *responses["a"].add_chunks() = Chunk(0, 1, {5, 9});
  *responses["a"].add_chunks() = Chunk(1, 2);
  responses["a"].mutable_chunks(1)->set_same_partition_steps(true);
  *responses["b"].add_chunks() = Chunk(0, 1, {1, 1});  // a backup's: not the checkpoint's
  ASSERT_TRUE(AssembleManifest(/*synchronous=*/false, 0, responses, &manifest).ok());
  EXPECT_EQ(std::vector<int64_t>(manifest.partition_steps().begin(), manifest.partition_steps().end()),
            (std::vector<int64_t>{5, 9}));
  for (const v1::CheckpointChunk& chunk : manifest.chunks()) {
    EXPECT_EQ(chunk.partition_steps_size(), 0) << chunk.chunk_id();
    EXPECT_FALSE(chunk.same_partition_steps()) << chunk.chunk_id();
  }
  // Its own steps, lower, hold the positions back further.
  responses["a"].mutable_chunks(1)->set_same_partition_steps(false);
  responses["a"].mutable_chunks(1)->add_partition_steps(2);
  responses["a"].mutable_chunks(1)->add_partition_steps(20);
  v1::CheckpointManifest lower = Skeleton(2);
  lower.mutable_shard_map()->mutable_chunks(1)->set_shard(0);
  ASSERT_TRUE(AssembleManifest(/*synchronous=*/false, 0, responses, &lower).ok());
  EXPECT_EQ(std::vector<int64_t>(lower.partition_steps().begin(), lower.partition_steps().end()),
            (std::vector<int64_t>{2, 9}));
}

// Table buckets are chunks of the checkpoint too, on their shard's primary;
// their steps hold back where each partition resumes.
TEST(AssembleManifestTest, TableBucketsAreChunksOfTheirShardsPrimary) {
  v1::CheckpointManifest manifest = Skeleton(2);
  v1::TableLayout* table = manifest.mutable_shard_map()->add_tables();
  table->set_name("embedding");
  table->set_buckets(2);
  table->add_bucket_shards(0);
  table->add_bucket_shards(1);
  std::map<std::string, v1::CheckpointResponse> responses;
  *responses["a"].add_chunks() = Chunk(0, 1, {5, 9});
  *responses["a"].add_chunks() = Chunk(TableChunkId(0, 0), 3, {4, 9});
  *responses["b"].add_chunks() = Chunk(1, 2, {7, 8});
  *responses["b"].add_chunks() = Chunk(TableChunkId(0, 1), 4, {6, 2});
  ASSERT_TRUE(AssembleManifest(/*synchronous=*/false, 0, responses, &manifest).ok());
  ASSERT_EQ(manifest.chunks_size(), 4);
  EXPECT_EQ(manifest.chunks(2).chunk_id(), TableChunkId(0, 0));
  EXPECT_EQ(manifest.chunks(2).server_ids(0), "a");
  EXPECT_EQ(manifest.chunks(3).chunk_id(), TableChunkId(0, 1));
  EXPECT_EQ(manifest.chunks(3).server_ids(0), "b");
  EXPECT_EQ(std::vector<int64_t>(manifest.partition_steps().begin(), manifest.partition_steps().end()),
            (std::vector<int64_t>{4, 2}));

  responses["b"].mutable_chunks()->RemoveLast();  // bucket 1 missing from its primary
  v1::CheckpointManifest again = Skeleton(2);
  *again.mutable_shard_map()->add_tables() = *table;
  const absl::Status missing = AssembleManifest(false, 0, responses, &again);
  EXPECT_EQ(missing.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(missing.message(), "bucket 1 of table embedding")) << missing;
}

// A bucket stored as its changes since the base checkpoint carries the
// base's entry of it (which says where that copy is), the manifest the
// base's holders' addresses and its chain; the servers are asked to build
// on the buckets whose committed copy is theirs.
TEST(AssembleManifestTest, IncrementalBucketsCarryTheirBasesEntry) {
  v1::CheckpointManifest base = Skeleton(2);
  v1::TableLayout* table = base.mutable_shard_map()->add_tables();
  table->set_name("embedding");
  table->set_buckets(2);
  table->add_bucket_shards(0);
  table->add_bucket_shards(1);
  base.mutable_info()->set_id(4);
  base.mutable_info()->set_chain(2);
  (*base.mutable_server_addresses())["gone"] = "10.0.0.9:1";
  v1::CheckpointChunk* bucket0 = base.add_chunks();
  *bucket0 = Chunk(TableChunkId(0, 0), 3, {4, 4});
  bucket0->add_server_ids("a");
  bucket0->add_server_ids("b");
  bucket0->add_server_ids("gone");
  v1::CheckpointChunk* bucket1 = base.add_chunks();
  *bucket1 = Chunk(TableChunkId(0, 1), 5);
  bucket1->add_server_ids("b");
  v1::CheckpointChunk* dense = base.add_chunks();
  *dense = Chunk(0, 1);
  dense->add_server_ids("a");
  // Bucket 0's replicas now (a, b) both hold the base's copy; bucket 1's
  // backup (a) does not: it would store it whole, so every replica does.
  EXPECT_EQ(BaseChunksByServer(base, base.shard_map()),
            (std::map<std::string, std::vector<int32_t>>{{"a", {TableChunkId(0, 0)}}, {"b", {TableChunkId(0, 0)}}}))
      << "table buckets only, where every replica holds the base";

  std::map<std::string, v1::CheckpointResponse> responses;
  *responses["a"].add_chunks() = Chunk(0, 1);
  *responses["a"].add_chunks() = Chunk(TableChunkId(0, 0), 7);
  responses["a"].mutable_chunks(1)->set_base_checkpoint_id(4);
  responses["a"].mutable_chunks(1)->mutable_base()->set_chunk_id(77);  // a server's say is not taken
  responses["a"].mutable_chunks(0)->mutable_base()->set_chunk_id(78);
  *responses["b"].add_chunks() = Chunk(1, 2);
  *responses["b"].add_chunks() = Chunk(TableChunkId(0, 1), 8);  // stored whole
  v1::CheckpointManifest manifest = Skeleton(2);
  *manifest.mutable_shard_map()->add_tables() = *table;
  ASSERT_TRUE(AssembleManifest(true, 12, responses, &manifest, &base).ok());
  ASSERT_EQ(manifest.chunks_size(), 4);
  EXPECT_EQ(manifest.chunks(2).base_checkpoint_id(), 4);
  EXPECT_EQ(manifest.chunks(2).base().checksum(), 3u);
  EXPECT_EQ(manifest.chunks(2).base().server_ids_size(), 3);
  EXPECT_EQ(manifest.chunks(2).base().partition_steps_size(), 0) << "a link carries what a reader needs only";
  EXPECT_FALSE(manifest.chunks(0).has_base()) << "dense chunks are whole";
  EXPECT_EQ(manifest.chunks(3).base_checkpoint_id(), 0);
  EXPECT_FALSE(manifest.chunks(3).has_base());
  EXPECT_EQ(manifest.info().base_id(), 4);
  EXPECT_EQ(manifest.info().chain(), 3);
  EXPECT_EQ(manifest.server_addresses().at("gone"), "10.0.0.9:1") << "the base's holder can still be read";

  // A bucket on a base that is not this checkpoint's fails it.
  responses["a"].mutable_chunks(1)->set_base_checkpoint_id(3);
  v1::CheckpointManifest wrong = Skeleton(2);
  *wrong.mutable_shard_map()->add_tables() = *table;
  const absl::Status status = AssembleManifest(true, 12, responses, &wrong, &base);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(status.message(), "since checkpoint 3")) << status;
  v1::CheckpointManifest no_base = Skeleton(2);
  *no_base.mutable_shard_map()->add_tables() = *table;
  EXPECT_EQ(AssembleManifest(true, 12, responses, &no_base).code(), absl::StatusCode::kInternal);
}

// A chain stops at full_every, and before a manifest would pass a message:
// an incremental manifest nests its base's entries, so each link grows it.
TEST(AssembleManifestTest, AChainStopsAtFullEveryOrWhenItsManifestGrowsLarge) {
  v1::CheckpointManifest latest = Skeleton(1);
  latest.mutable_info()->set_state(v1::CheckpointInfo::COMPLETE);
  latest.mutable_info()->set_chain(2);
  EXPECT_TRUE(ChainsOnto(latest, 4));
  EXPECT_FALSE(ChainsOnto(latest, 3)) << "the fourth link of full_every 3";
  EXPECT_FALSE(ChainsOnto(latest, 1)) << "full_every 1 is always whole";
  latest.mutable_info()->set_state(v1::CheckpointInfo::CORRUPT);
  EXPECT_FALSE(ChainsOnto(latest, 4)) << "never on a corrupt checkpoint";
  latest.mutable_info()->set_state(v1::CheckpointInfo::COMPLETE);
  // Buckets whose entries nest a long chain: past the bound, whole again.
  v1::CheckpointChunk bucket;
  v1::CheckpointChunk* link = &bucket;
  for (int depth = 0; depth < 32; ++depth) {
    link->set_chunk_id(TableChunkId(0, 1));
    link->set_base_checkpoint_id(depth + 1);
    link->add_server_ids("server-0");
    link = link->mutable_base();
  }
  // Each entry takes its bytes and a tag and length of at most 4 bytes.
  const size_t fit = (kMaxChainedManifestBytes - latest.ByteSizeLong()) / (bucket.ByteSizeLong() + 4);
  for (size_t i = 0; i < fit; ++i) *latest.add_chunks() = bucket;
  ASSERT_LE(latest.ByteSizeLong(), kMaxChainedManifestBytes);
  EXPECT_TRUE(ChainsOnto(latest, 64)) << latest.ByteSizeLong() << " bytes";
  while (latest.ByteSizeLong() <= kMaxChainedManifestBytes) *latest.add_chunks() = bucket;
  EXPECT_FALSE(ChainsOnto(latest, 64));
}

TEST(AssembleManifestTest, AChunkMissingFromItsPrimaryFailsTheCheckpoint) {
  std::map<std::string, v1::CheckpointResponse> responses;
  *responses["a"].add_chunks() = Chunk(0, 1);
  *responses["a"].add_chunks() = Chunk(1, 2);  // but b leads chunk 1 and sent nothing
  v1::CheckpointManifest manifest = Skeleton(1);
  absl::Status status = AssembleManifest(true, 4, responses, &manifest);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(status.message(), "chunk 1")) << status;
}

// Servers "a" and "b" holding chunk 0 (a leads) and chunk 1 (b leads) at
// version `version`; a cut below that answers ABORTED (the job outran it).
class CoordinatorServers : public ServerControl {
 public:
  absl::Status SetupJob(const std::string&, const v1::SetupJobRequest&) override { return absl::OkStatus(); }
  absl::Status DropJob(const std::string&, const std::string&, const std::string&, bool, int64_t) override {
    return absl::OkStatus();
  }
  absl::Status Reconfigure(const std::string&, const std::string&, const v1::ShardMap&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<v1::CheckpointResponse> Checkpoint(const std::string& address,
                                                    const v1::CheckpointRequest& request) override {
    MutexLock lock(&mu_);
    requests.push_back(request);
    v1::CheckpointResponse response;
    response.set_max_version(version);
    if (request.at_version() < 0) return response;  // a probe
    if (request.at_version() < version + outrun) {
      version += outrun;  // the job went past the cut while it was armed
      outrun = 0;
      return absl::AbortedError("chunk 0 is past the cut");
    }
    for (int32_t id : {0, 1}) *response.add_chunks() = Chunk(id, 7);
    (void)address;
    return response;
  }
  absl::Status DeleteCheckpoint(const std::string& address, const std::string& job_id, int64_t id) override {
    MutexLock lock(&mu_);
    deleted.push_back(address + " " + job_id + "/" + std::to_string(id));
    return absl::OkStatus();
  }

  Mutex mu_;
  int64_t version = 10;
  int64_t outrun = 0;  // > 0: the first cut is missed by this many steps
  std::vector<v1::CheckpointRequest> requests;
  std::vector<std::string> deleted;
};

class CheckpointCoordinatorTest : public ::testing::Test {
 protected:
  CheckpointCoordinator::Hooks Hooks() {
    return {[this](const CheckpointTask& task) -> absl::StatusOr<CheckpointPlan> {
              if (!plan_error_.ok()) return plan_error_;
              CheckpointPlan plan;
              plan.servers = {{"a", "host-a"}, {"b", "host-b"}};
              plan.manifest = Skeleton(2);
              plan.manifest.mutable_info()->set_id(task.id);
              plan.synchronous = true;
              plan.total_steps = total_steps_;
              return plan;
            },
            [this](const CheckpointTask& task, const absl::Status& status, const v1::CheckpointManifest& manifest,
                   absl::Duration) {
              outcomes_.push_back(status);
              manifests_.push_back(manifest);
              std::vector<ExpiredCheckpoint> expired;
              if (status.ok() && task.id > 1) expired.push_back({task.id - 1, {{"a", "host-a"}}});
              return expired;
            }};
  }

  CoordinatorServers servers_;
  std::unique_ptr<KvStore> store_ = NewMemoryStore();
  absl::Status plan_error_;
  int64_t total_steps_ = 1000;
  std::vector<absl::Status> outcomes_;
  std::vector<v1::CheckpointManifest> manifests_;
};

TEST_F(CheckpointCoordinatorTest, CutsAheadOfTheHighestVersionAndCommitsTheManifest) {
  CheckpointCoordinator coordinator(&servers_, store_.get(), Hooks());
  coordinator.Enqueue({"job-0001", 1});
  coordinator.RunQueued();
  ASSERT_EQ(outcomes_.size(), 1u);
  ASSERT_TRUE(outcomes_[0].ok()) << outcomes_[0];
  EXPECT_EQ(manifests_[0].info().step(), 12) << "two steps ahead of the highest version";
  EXPECT_EQ(manifests_[0].info().state(), v1::CheckpointInfo::COMPLETE);
  std::optional<std::string> committed = Stored(store_.get(), CheckpointManifestKey("job-0001", 1));
  ASSERT_TRUE(committed.has_value());
  v1::CheckpointManifest stored;
  ASSERT_TRUE(stored.ParseFromString(*committed));
  EXPECT_EQ(stored.chunks_size(), 2);
  EXPECT_TRUE(servers_.deleted.empty());
}

TEST_F(CheckpointCoordinatorTest, AMissedCutIsRetriedFurtherAheadAndTheAttemptDeleted) {
  servers_.outrun = 5;
  CheckpointCoordinator coordinator(&servers_, store_.get(), Hooks());
  coordinator.Enqueue({"job-0001", 1});
  coordinator.RunQueued();
  ASSERT_EQ(outcomes_.size(), 1u);
  ASSERT_TRUE(outcomes_[0].ok()) << outcomes_[0];
  EXPECT_EQ(manifests_[0].info().step(), 15 + 2 + 8) << "the second attempt cuts further ahead";
  EXPECT_FALSE(servers_.deleted.empty()) << "the missed attempt's data was not deleted";
}

TEST_F(CheckpointCoordinatorTest, NearTheEndIsOutOfRangeAndNothingIsKept) {
  total_steps_ = 12;
  CheckpointCoordinator coordinator(&servers_, store_.get(), Hooks());
  coordinator.Enqueue({"job-0001", 1});
  coordinator.RunQueued();
  ASSERT_EQ(outcomes_.size(), 1u);
  EXPECT_EQ(outcomes_[0].code(), absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(Stored(store_.get(), CheckpointManifestKey("job-0001", 1)).has_value());
  EXPECT_EQ(servers_.deleted.size(), 2u) << "each server is told to delete the attempt";
}

TEST_F(CheckpointCoordinatorTest, AnUnplannableTaskCallsNoServer) {
  plan_error_ = absl::FailedPreconditionError("the job stopped training");
  CheckpointCoordinator coordinator(&servers_, store_.get(), Hooks());
  coordinator.Enqueue({"job-0001", 1});
  coordinator.RunQueued();
  ASSERT_EQ(outcomes_.size(), 1u);
  EXPECT_EQ(outcomes_[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(servers_.requests.empty());
}

TEST_F(CheckpointCoordinatorTest, ExpiredCheckpointsLoseTheirManifestAndData) {
  CheckpointCoordinator coordinator(&servers_, store_.get(), Hooks());
  coordinator.Enqueue({"job-0001", 1});
  coordinator.Enqueue({"job-0001", 2});
  coordinator.RunQueued();
  ASSERT_EQ(outcomes_.size(), 2u);
  EXPECT_FALSE(Stored(store_.get(), CheckpointManifestKey("job-0001", 1)).has_value()) << "checkpoint 1 expired";
  EXPECT_TRUE(Stored(store_.get(), CheckpointManifestKey("job-0001", 2)).has_value());
  EXPECT_EQ(servers_.deleted, (std::vector<std::string>{"host-a job-0001/1"}));
}

TEST_F(CheckpointCoordinatorTest, TakesQueuedTasksOnItsThreadAndStops) {
  Notification done;
  CheckpointCoordinator::Hooks hooks = Hooks();
  auto finish = hooks.finish;
  hooks.finish = [&, finish](const CheckpointTask& task, const absl::Status& status,
                             const v1::CheckpointManifest& manifest, absl::Duration took) {
    auto expired = finish(task, status, manifest, took);
    done.Notify();
    return expired;
  };
  CheckpointCoordinator coordinator(&servers_, store_.get(), hooks);
  coordinator.Start();
  coordinator.Enqueue({"job-0001", 1});
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  coordinator.Stop();
  ASSERT_EQ(outcomes_.size(), 1u);
  EXPECT_TRUE(outcomes_[0].ok()) << outcomes_[0];
}

}  // namespace
}  // namespace fulcrum
