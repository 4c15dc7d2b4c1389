#include "server/sparse_shard.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/shard_map.h"
#include "common/status_macros.h"
#include "common/table_spec.h"
#include "fulcrum/v1/parameter.pb.h"
#include "gtest/gtest.h"
#include "server/sparse_tables.h"

namespace fulcrum {
namespace {

constexpr int32_t kBuckets = 8;

// Two tables: "linear" (dim 1, SGD) and "embedding" (dim 4, Adagrad), each
// of kBuckets buckets over `shards` shards.
std::vector<SparseTableSetup> Tables(int64_t expire_after = 0, int32_t shards = 2) {
  std::vector<SparseTableSetup> tables(2);
  tables[0].config.name = "linear";
  tables[0].config.dim = 1;
  tables[0].config.optimizer.kind = SparseOptimizerKind::kSgd;
  tables[0].config.optimizer.lr = 0.5f;
  tables[1].config.name = "embedding";
  tables[1].config.dim = 4;
  tables[1].config.optimizer.kind = SparseOptimizerKind::kAdagrad;
  tables[1].config.optimizer.lr = 0.1f;
  tables[1].config.init = InitKind::kUniform;
  tables[1].config.init_scale = 0.01f;
  tables[1].config.expire_after = expire_after;
  for (SparseTableSetup& table : tables) {
    table.config.seed = 7;
    table.bucket_shards = AssignBucketsToShards(kBuckets, shards);
  }
  return tables;
}

// The shards `shards` of tables over `layout_shards`; `budget`: the bytes
// the tables may take (0: no limit).
std::unique_ptr<SparseShard> Make(const std::set<int32_t>& shards, int64_t budget = 0, int64_t expire_after = 0,
                                  int32_t layout_shards = 2) {
  auto self = std::make_shared<SparseShard*>(nullptr);
  std::function<int64_t()> room;
  if (budget > 0) room = [self, budget] { return budget - (*self)->bytes(); };
  auto shard = SparseShard::Create(Tables(expire_after, layout_shards), shards, /*num_partitions=*/2, room);
  EXPECT_TRUE(shard.ok()) << shard.status();
  if (!shard.ok()) return nullptr;
  *self = shard->get();
  return *std::move(shard);
}

// A server holding the one shard of its tables.
std::unique_ptr<SparseShard> MakeOne(int64_t budget = 0, int64_t expire_after = 0) {
  return Make({0}, budget, expire_after, /*layout_shards=*/1);
}

std::vector<float> Grads(size_t keys, int32_t dim, float scale) {
  std::vector<float> grads(keys * static_cast<size_t>(dim));
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = scale * static_cast<float>(static_cast<int>(i % 7) - 3);
  return grads;
}

SparsePushArgs PushOf(int32_t partition, int64_t step, const std::vector<uint64_t>& keys,
                      const std::vector<float>& linear, const std::vector<float>& embedding) {
  SparsePushArgs args;
  args.partition = partition;
  args.step = step;
  args.tables.push_back(SparseRows{0, keys, linear.data()});
  args.tables.push_back(SparseRows{1, keys, embedding.data()});
  return args;
}

std::vector<float> PullAll(const SparseShard& shard, int32_t table, const std::vector<uint64_t>& keys) {
  std::vector<float> rows(keys.size() * static_cast<size_t>(shard.dim(table)));
  const absl::Status pulled = shard.Pull(table, keys, rows.data());
  EXPECT_TRUE(pulled.ok()) << pulled;
  return rows;
}

// The keys of `keys` whose buckets a shard holds.
std::vector<uint64_t> OnShard(const std::vector<uint64_t>& keys, int32_t shard) {
  std::vector<uint64_t> held;
  for (uint64_t key : keys) {
    if (BucketOf(key, kBuckets) % 2 == shard) held.push_back(key);
  }
  return held;
}

// The share of a push of `keys` (rows `linear` of 1 float, `embedding` of 4)
// that goes to `shard` of two, as a worker splits a push.
struct ShardPart {
  std::vector<uint64_t> keys;
  std::vector<float> linear;
  std::vector<float> embedding;
};
ShardPart PartOnShard(const std::vector<uint64_t>& keys, const std::vector<float>& linear,
                      const std::vector<float>& embedding, int32_t shard) {
  ShardPart part;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (BucketOf(keys[i], kBuckets) % 2 != shard) continue;
    part.keys.push_back(keys[i]);
    part.linear.push_back(linear[i]);
    part.embedding.insert(part.embedding.end(), embedding.begin() + static_cast<std::ptrdiff_t>(i * 4),
                          embedding.begin() + static_cast<std::ptrdiff_t>(i * 4 + 4));
  }
  return part;
}

// A push of `keys` to a server holding both shards: one push per shard, as
// workers send them (the first error, or whether any applied).
absl::StatusOr<SparsePushOutcome> PushBothShards(SparseShard* shard, int32_t partition, int64_t step,
                                                 const std::vector<uint64_t>& keys, const std::vector<float>& linear,
                                                 const std::vector<float>& embedding) {
  SparsePushOutcome outcome = SparsePushOutcome::kDuplicate;
  for (int32_t s = 0; s < 2; ++s) {
    const ShardPart part = PartOnShard(keys, linear, embedding, s);
    SparsePushArgs args = PushOf(partition, step, part.keys, part.linear, part.embedding);
    args.shard = s;
    absl::StatusOr<SparsePushOutcome> pushed = shard->Push(args);
    if (!pushed.ok()) return pushed;
    if (*pushed == SparsePushOutcome::kApplied) outcome = SparsePushOutcome::kApplied;
  }
  return outcome;
}

TEST(SparseShardTest, KeysSplitOverTwoServersTrainAsOnOne) {
  auto whole = Make({0, 1});
  auto first = Make({0});
  auto second = Make({1});
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 64; ++k) keys.push_back(k * 1000003);
  for (int64_t step = 0; step < 3; ++step) {
    const std::vector<float> linear = Grads(keys.size(), 1, 0.1f * static_cast<float>(step + 1));
    const std::vector<float> embedding = Grads(keys.size(), 4, 0.01f);
    ASSERT_EQ(*PushBothShards(whole.get(), 0, step, keys, linear, embedding), SparsePushOutcome::kApplied);
    for (int32_t s = 0; s < 2; ++s) {
      // Each server gets its keys' rows, as a worker splits a push.
      const ShardPart part = PartOnShard(keys, linear, embedding, s);
      SparseShard* server = s == 0 ? first.get() : second.get();
      ASSERT_EQ(*server->Push(PushOf(0, step, part.keys, part.linear, part.embedding)), SparsePushOutcome::kApplied);
    }
  }
  for (int32_t table = 0; table < 2; ++table) {
    for (int32_t s = 0; s < 2; ++s) {
      const std::vector<uint64_t> part = OnShard(keys, s);
      EXPECT_EQ(PullAll(s == 0 ? *first : *second, table, part), PullAll(*whole, table, part)) << table;
    }
  }
  EXPECT_EQ(whole->Stats()[1].rows, 64);
  EXPECT_EQ(first->Stats()[1].rows + second->Stats()[1].rows, 64);
}

TEST(SparseShardTest, KeysInAnyOrderGoToTheirBuckets) {
  auto grouped = MakeOne();
  auto shuffled = MakeOne();
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 40; ++k) keys.push_back(k);
  // Sorted by bucket (as workers send them) and as they come.
  std::vector<uint64_t> by_bucket = keys;
  std::stable_sort(by_bucket.begin(), by_bucket.end(),
                   [](uint64_t a, uint64_t b) { return BucketOf(a, kBuckets) < BucketOf(b, kBuckets); });
  std::vector<float> linear(keys.size()), embedding(keys.size() * 4), sorted_linear, sorted_embedding;
  for (size_t i = 0; i < keys.size(); ++i) {
    linear[i] = 0.01f * static_cast<float>(keys[i]);
    for (int d = 0; d < 4; ++d) embedding[i * 4 + d] = 0.001f * static_cast<float>(keys[i] * 4 + d);
  }
  for (uint64_t key : by_bucket) {
    sorted_linear.push_back(linear[key]);
    for (int d = 0; d < 4; ++d) sorted_embedding.push_back(embedding[key * 4 + d]);
  }
  ASSERT_TRUE(grouped->Push(PushOf(0, 0, by_bucket, sorted_linear, sorted_embedding)).ok());
  ASSERT_TRUE(shuffled->Push(PushOf(0, 0, keys, linear, embedding)).ok());
  EXPECT_EQ(PullAll(*grouped, 1, keys), PullAll(*shuffled, 1, keys));
  EXPECT_EQ(PullAll(*grouped, 0, keys), PullAll(*shuffled, 0, keys));
  // Each key moved by its own gradient (SGD on "linear": -0.5 * g).
  const std::vector<float> rows = PullAll(*shuffled, 0, keys);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_FLOAT_EQ(rows[i], -0.5f * linear[i]) << keys[i];
}

TEST(SparseShardTest, KeysOfBucketsHeldElsewhereAreRefusedAndNothingApplies) {
  auto first = Make({0});
  const std::vector<uint64_t> all = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const std::vector<uint64_t> elsewhere = OnShard(all, 1);
  ASSERT_FALSE(elsewhere.empty());
  std::vector<float> out(4);
  const absl::Status pulled = first->Pull(1, {elsewhere[0]}, out.data());
  EXPECT_EQ(pulled.code(), absl::StatusCode::kAborted) << pulled;
  EXPECT_NE(pulled.message().find("refresh the shard map"), std::string::npos) << pulled;
  const std::vector<float> linear = Grads(all.size(), 1, 1.0f), embedding = Grads(all.size(), 4, 1.0f);
  const auto pushed = first->Push(PushOf(0, 0, all, linear, embedding));
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(first->Stats()[0].rows + first->Stats()[1].rows, 0) << "nothing of the push applied";
}

TEST(SparseShardTest, APartitionStepAppliesOnce) {
  auto shard = MakeOne();
  const std::vector<uint64_t> keys = {5, 6};
  const std::vector<float> linear = {1.0f, 2.0f}, embedding = Grads(2, 4, 0.1f);
  ASSERT_EQ(*shard->Push(PushOf(1, 4, keys, linear, embedding)), SparsePushOutcome::kApplied);
  const std::vector<float> once = PullAll(*shard, 0, keys);
  EXPECT_EQ(*shard->Push(PushOf(1, 4, keys, linear, embedding)), SparsePushOutcome::kDuplicate);
  EXPECT_EQ(*shard->Push(PushOf(1, 3, keys, linear, embedding)), SparsePushOutcome::kDuplicate);
  EXPECT_EQ(PullAll(*shard, 0, keys), once);
  // Another part of the same step is its own, once.
  SparsePushArgs part = PushOf(1, 4, keys, linear, embedding);
  part.part = 1;
  EXPECT_EQ(*shard->Push(part), SparsePushOutcome::kApplied);
  EXPECT_EQ(*shard->Push(part), SparsePushOutcome::kDuplicate);
  const std::vector<float> twice = PullAll(*shard, 0, keys);
  EXPECT_NE(twice, once);
  // Parts of an older step are duplicates once a newer step is in.
  ASSERT_EQ(*shard->Push(PushOf(1, 5, keys, linear, embedding)), SparsePushOutcome::kApplied);
  part.part = 2;
  EXPECT_EQ(*shard->Push(part), SparsePushOutcome::kDuplicate);
  const std::vector<float> before_other = PullAll(*shard, 0, keys);
  // Another partition's step 4 is its own.
  EXPECT_EQ(*shard->Push(PushOf(0, 4, keys, linear, embedding)), SparsePushOutcome::kApplied);
  EXPECT_NE(PullAll(*shard, 0, keys), before_other);
  EXPECT_EQ(shard->Push(PushOf(2, 5, keys, linear, embedding)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->Push(PushOf(-1, 5, keys, linear, embedding)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SparseShardTest, AFaultInOneTableRefusesTheWholePush) {
  auto shard = MakeOne();
  const std::vector<uint64_t> keys = {5, 6, 7};
  const std::vector<float> linear = {1.0f, 2.0f, 3.0f};
  std::vector<float> embedding = Grads(3, 4, 0.1f);
  embedding[9] = std::numeric_limits<float>::quiet_NaN();
  const auto pushed = shard->Push(PushOf(0, 0, keys, linear, embedding));
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(pushed.status().message().find("key 7"), std::string::npos) << pushed.status();
  EXPECT_EQ(shard->Stats()[0].rows, 0) << "the linear table's rows were not applied either";
  // Not a duplicate afterwards: the step was not applied.
  embedding[9] = 0;
  EXPECT_EQ(*shard->Push(PushOf(0, 0, keys, linear, embedding)), SparsePushOutcome::kApplied);
  // Keys listed twice, a table named twice, a table that does not exist.
  const std::vector<uint64_t> twice = {5, 5};
  const std::vector<float> two = {1, 1};
  SparsePushArgs args;
  args.step = 1;
  args.tables.push_back(SparseRows{0, twice, two.data()});
  EXPECT_EQ(shard->Push(args).status().code(), absl::StatusCode::kInvalidArgument);
  args.tables = {SparseRows{0, keys, linear.data()}, SparseRows{0, keys, linear.data()}};
  EXPECT_EQ(shard->Push(args).status().code(), absl::StatusCode::kInvalidArgument);
  args.tables = {SparseRows{2, keys, linear.data()}};
  EXPECT_EQ(shard->Push(args).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> out(3);
  EXPECT_EQ(shard->Pull(2, keys, out.data()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SparseShardTest, APushBeyondTheBudgetIsRefusedNamingTheTable) {
  auto probe = MakeOne();
  const int64_t empty_bytes = probe->bytes();
  auto shard = MakeOne(/*budget=*/empty_bytes + (int64_t{8} << 20));
  std::vector<uint64_t> keys;
  int64_t step = 0;
  absl::Status refused;
  for (uint64_t next = 0; refused.ok() && step < 10000; ++step) {
    keys.clear();
    for (int i = 0; i < 1000; ++i) keys.push_back(next++);
    const std::vector<float> linear = Grads(keys.size(), 1, 0.1f), embedding = Grads(keys.size(), 4, 0.1f);
    const int64_t rows_before = shard->Stats()[1].rows;
    const auto pushed = shard->Push(PushOf(0, step, keys, linear, embedding));
    refused = pushed.status();
    if (!refused.ok()) {
      EXPECT_EQ(shard->Stats()[1].rows, rows_before) << "nothing of the refused push applied";
    }
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("embedding"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("--retain-finished-jobs"), std::string::npos)
      << "says that finished jobs' parameters take budget too: " << refused;
  EXPECT_LE(shard->bytes(), empty_bytes + (int64_t{8} << 20));
  // Rows that exist still train.
  const std::vector<uint64_t> old = {0, 1};
  const std::vector<float> linear = {1, 1}, embedding = Grads(2, 4, 0.1f);
  EXPECT_EQ(*shard->Push(PushOf(1, 0, old, linear, embedding)), SparsePushOutcome::kApplied);
}

// With a frequency filter, keys seen fewer times than admitAfter take filter
// counts, not rows; those count against the budget too, with the hash map's
// growth (it doubles when full), so the tables never pass it.
TEST(SparseShardTest, FilterCountsStayWithinTheBudget) {
  std::vector<SparseTableSetup> tables = Tables(/*expire_after=*/0, /*shards=*/1);
  for (SparseTableSetup& table : tables) table.config.admit_after = 3;
  const int64_t empty_bytes = SparseShard::EmptyBytes(tables, {0});
  const int64_t budget = empty_bytes + (int64_t{4} << 20);
  auto self = std::make_shared<SparseShard*>(nullptr);
  auto made = SparseShard::Create(tables, {0}, /*num_partitions=*/2,
                                  [self, budget] { return budget - (*self)->bytes(); });
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<SparseShard> shard = *std::move(made);
  *self = shard.get();
  std::vector<uint64_t> keys;
  absl::Status refused;
  int64_t step = 0;
  for (uint64_t next = 0; refused.ok() && step < 10000; ++step) {
    keys.clear();
    for (int i = 0; i < 1000; ++i) keys.push_back(next++);  // each key once: a filter count each
    const std::vector<float> linear = Grads(keys.size(), 1, 0.1f), embedding = Grads(keys.size(), 4, 0.1f);
    refused = shard->Push(PushOf(0, step, keys, linear, embedding)).status();
    ASSERT_LE(shard->bytes(), budget) << "after step " << step;
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_GT(step, 20) << "the filter counts took a fair share of the budget first";
  EXPECT_EQ(shard->Stats()[1].rows, 0);
}

TEST(SparseShardTest, RowsNotPushedForExpireAfterStepsAreDropped) {
  auto shard = MakeOne(0, /*expire_after=*/8);
  const std::vector<uint64_t> stale = {100, 101}, live = {200};
  const std::vector<float> two_linear = {1, 1}, two_embedding = Grads(2, 4, 0.1f);
  const std::vector<float> one_linear = {1}, one_embedding = Grads(1, 4, 0.1f);
  ASSERT_TRUE(shard->Push(PushOf(0, 0, stale, two_linear, two_embedding)).ok());
  for (int64_t step = 1; step <= 20; ++step) {
    ASSERT_TRUE(shard->Push(PushOf(0, step, live, one_linear, one_embedding)).ok());
  }
  EXPECT_EQ(shard->Stats()[1].rows, 1) << "only the row pushed lately is left in the expiring table";
  EXPECT_EQ(shard->Stats()[1].expiries, 2);
  EXPECT_EQ(shard->Stats()[0].rows, 3) << "the table without expireAfter keeps its rows";
}

TEST(SparseShardTest, FrozenShardsAnswerPullsButTakeNoPushes) {
  auto shard = MakeOne();
  shard->Freeze("the job succeeded");
  const std::vector<uint64_t> keys = {1};
  const std::vector<float> linear = {1}, embedding = Grads(1, 4, 0.1f);
  const auto pushed = shard->Push(PushOf(0, 0, keys, linear, embedding));
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pushed.status().message().find("succeeded"), std::string::npos);
  EXPECT_EQ(PullAll(*shard, 0, keys).size(), 1u);
}

TEST(SparseShardTest, EmptyBytesAreWhatANewShardHolds) {
  for (const std::set<int32_t>& held : {std::set<int32_t>{0}, std::set<int32_t>{0, 1}}) {
    auto shard = Make(held);
    ASSERT_NE(shard, nullptr);
    EXPECT_EQ(shard->bytes(), SparseShard::EmptyBytes(Tables(), held));
  }
  EXPECT_EQ(SparseShard::EmptyBytes(Tables(), {5}), 0) << "no bucket on shard 5";
}

TEST(SparseShardTest, BadSetupsAreRefused) {
  std::vector<SparseTableSetup> tables = Tables();
  tables[1].config.dim = 0;
  EXPECT_EQ(SparseShard::Create(tables, {0}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  tables = Tables();
  tables[0].bucket_shards.clear();
  EXPECT_EQ(SparseShard::Create(tables, {0}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  tables = Tables();
  tables[0].bucket_shards.assign(kMaxTableBuckets + 1, 0);
  EXPECT_EQ(SparseShard::Create(tables, {0}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  tables = Tables();
  tables.resize(kMaxTables + 1, tables[0]);
  EXPECT_EQ(SparseShard::Create(tables, {0}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SparseShard::Create(Tables(), {0}, 0).status().code(), absl::StatusCode::kInvalidArgument);
}


// A capture restored into a fresh shard, here split over two shards as a
// restore onto more servers does, reads and trains on exactly as the
// original: rows, optimizer state, filter counts, and the steps to run again.
TEST(SparseShardTest, ACaptureRestoredElsewhereTrainsOnExactlyAsTheOriginal) {
  auto original = Make({0, 1});
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 96; ++k) keys.push_back(k * 7919);
  for (int64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(PushBothShards(original.get(), 0, step, keys, Grads(keys.size(), 1, 0.2f), Grads(keys.size(), 4, 0.01f)).ok());
  }
  ASSERT_TRUE(PushBothShards(original.get(), 1, 1, keys, Grads(keys.size(), 1, 0.1f), Grads(keys.size(), 4, 0.02f)).ok());
  const std::vector<std::pair<int32_t, ChunkSnapshot>> captured = original->Capture();
  ASSERT_EQ(captured.size(), 2u * kBuckets);
  for (const auto& [chunk_id, snapshot] : captured) {
    EXPECT_GE(chunk_id, kTableChunkBase);
    EXPECT_EQ(snapshot.partition_steps, (std::vector<int64_t>{2, 1})) << "the last step pushed runs again";
  }
  auto first = Make({0});
  auto second = Make({1});
  for (const auto& [chunk_id, snapshot] : captured) {
    SparseShard* holder = nullptr;
    for (SparseShard* shard : {first.get(), second.get()}) {
      const std::vector<int32_t> ids = shard->chunk_ids();
      if (std::find(ids.begin(), ids.end(), chunk_id) != ids.end()) holder = shard;
    }
    ASSERT_NE(holder, nullptr) << "chunk " << chunk_id;
    ASSERT_TRUE(holder->Restore(chunk_id, snapshot).ok());
    SparseShard* other = holder == first.get() ? second.get() : first.get();
    EXPECT_EQ(other->Restore(chunk_id, snapshot).code(), absl::StatusCode::kInvalidArgument) << "not held there";
  }
  // A resumed job replays partition 0's step 1, which the checkpoint holds:
  // the restored buckets skip it (the original takes it as a duplicate).
  const std::vector<float> ones_linear(keys.size(), 1.0f);
  const std::vector<float> ones_embedding(keys.size() * 4, 1.0f);
  ASSERT_TRUE(PushBothShards(original.get(), 0, 1, keys, ones_linear, ones_embedding).ok());
  for (int32_t s = 0; s < 2; ++s) {
    const ShardPart part = PartOnShard(keys, ones_linear, ones_embedding, s);
    ASSERT_TRUE((s == 0 ? first : second)->Push(PushOf(0, 1, part.keys, part.linear, part.embedding)).ok());
  }
  // One more step on both: the same rows (Adagrad's accumulators came along).
  const std::vector<float> linear = Grads(keys.size(), 1, 0.3f);
  const std::vector<float> embedding = Grads(keys.size(), 4, 0.03f);
  ASSERT_TRUE(PushBothShards(original.get(), 0, 3, keys, linear, embedding).ok());
  for (int32_t s = 0; s < 2; ++s) {
    const ShardPart part = PartOnShard(keys, linear, embedding, s);
    SparseShard* shard = s == 0 ? first.get() : second.get();
    ASSERT_TRUE(shard->Push(PushOf(0, 3, part.keys, part.linear, part.embedding)).ok());
    for (int32_t table = 0; table < 2; ++table) {
      EXPECT_EQ(PullAll(*shard, table, part.keys), PullAll(*original, table, part.keys));
    }
  }
  // A restored shard's captures start from the restored steps.
  for (const auto& [chunk_id, snapshot] : second->Capture()) {
    EXPECT_EQ(snapshot.partition_steps, (std::vector<int64_t>{3, 1})) << chunk_id;
  }
}

TEST(SparseShardTest, ARestoreBeyondTheBudgetIsRefusedNamingTheTable) {
  auto original = Make({0, 1});
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 4000; ++k) keys.push_back(k);
  ASSERT_TRUE(PushBothShards(original.get(), 0, 0, keys, Grads(keys.size(), 1, 0.2f), Grads(keys.size(), 4, 0.01f)).ok());
  auto small = Make({0, 1}, /*budget=*/original->bytes() / 4);
  absl::Status refused = absl::OkStatus();
  for (const auto& [chunk_id, snapshot] : original->Capture()) {
    refused = small->Restore(chunk_id, snapshot);
    if (!refused.ok()) break;
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("sparse table"), std::string::npos) << refused;
}


// Synchronous (BSP) tables: both tables of Tables(), on one shard.
std::unique_ptr<SparseShard> MakeSync(int64_t budget = 0, bool async_embedding = false,
                                      int64_t expire_after = 0) {
  std::vector<SparseTableSetup> tables = Tables(expire_after, /*shards=*/1);
  tables[0].synchronous = true;
  tables[1].synchronous = !async_embedding;
  auto self = std::make_shared<SparseShard*>(nullptr);
  std::function<int64_t()> room;
  if (budget > 0) room = [self, budget] { return budget - (*self)->bytes(); };
  auto shard = SparseShard::Create(std::move(tables), {0}, /*num_partitions=*/2, room);
  EXPECT_TRUE(shard.ok()) << shard.status();
  if (!shard.ok()) return nullptr;
  *self = shard->get();
  return *std::move(shard);
}

SparsePushArgs SyncPushOf(int32_t partition, int64_t step, int32_t part, int32_t parts,
                          const std::vector<uint64_t>& keys, const std::vector<float>& linear,
                          const std::vector<float>& embedding) {
  SparsePushArgs args = PushOf(partition, step, keys, linear, embedding);
  args.part = part;
  args.parts = parts;
  return args;
}

absl::StatusOr<SparsePushOutcome> PushPartitionStep(SparseShard* shard, int32_t partition, int64_t step,
                                                    const std::vector<uint64_t>& keys, float scale) {
  const std::vector<float> linear = Grads(keys.size(), 1, scale);
  const std::vector<float> embedding = Grads(keys.size(), 4, scale);
  return shard->Push(SyncPushOf(partition, step, 0, 1, keys, linear, embedding));
}

TEST(SparseShardSyncTest, AStepAppliesOnceWholeAsThePartitionOrderMeanWhateverTheArrivalOrder) {
  const std::vector<uint64_t> a = {3, 17, 40, 99};   // partition 0's keys
  const std::vector<uint64_t> b = {99, 3, 1234, 8};  // partition 1's: 3 and 99 shared
  const std::vector<uint64_t> all = {3, 17, 40, 99, 1234, 8};
  auto in_order = MakeSync();
  auto reversed = MakeSync();
  ASSERT_NE(in_order, nullptr);
  ASSERT_NE(reversed, nullptr);
  const std::vector<float> initial = PullAll(*in_order, 1, all);
  for (int64_t step = 0; step < 3; ++step) {
    const float sa = 0.37f * static_cast<float>(step + 1), sb = -0.11f * static_cast<float>(step + 2);
    ASSERT_TRUE(PushPartitionStep(in_order.get(), 0, step, a, sa).ok());
    // Gathered, not applied: the rows are as before the step.
    const std::vector<float> mid = PullAll(*in_order, 0, all);
    ASSERT_TRUE(PushPartitionStep(in_order.get(), 1, step, b, sb).ok());
    EXPECT_NE(PullAll(*in_order, 0, all), mid) << "step " << step << " applied once whole";
    ASSERT_TRUE(PushPartitionStep(reversed.get(), 1, step, b, sb).ok());
    ASSERT_TRUE(PushPartitionStep(reversed.get(), 0, step, a, sa).ok());
    if (step == 0) {
      // The linear table (SGD, lr 0.5) after one step: each key less
      // lr x the mean over both partitions (a key one partition left out
      // counts 0 for it), summed in partition order.
      const std::vector<float> ga = Grads(a.size(), 1, sa), gb = Grads(b.size(), 1, sb);
      const std::vector<float> rows = PullAll(*in_order, 0, all);
      for (size_t k = 0; k < all.size(); ++k) {
        float sum = 0.0f;
        for (size_t i = 0; i < a.size(); ++i) sum += a[i] == all[k] ? ga[i] : 0.0f;
        for (size_t i = 0; i < b.size(); ++i) sum += b[i] == all[k] ? gb[i] : 0.0f;
        const float mean = sum * 0.5f;
        EXPECT_EQ(rows[k], 0.0f - 0.5f * mean) << "key " << all[k];
      }
    }
  }
  for (int32_t table : {0, 1}) {
    const std::vector<float> x = PullAll(*in_order, table, all), y = PullAll(*reversed, table, all);
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) {  // bit for bit
      uint32_t a = 0, b = 0;
      std::memcpy(&a, &x[i], sizeof(a));
      std::memcpy(&b, &y[i], sizeof(b));
      EXPECT_EQ(a, b) << "table " << table << " element " << i;
    }
  }
  EXPECT_NE(PullAll(*in_order, 1, all), initial);
}

TEST(SparseShardSyncTest, PartsRepeatsAndStepsOutOfTurnAreRefusedOrDuplicates) {
  auto shard = MakeSync();
  ASSERT_NE(shard, nullptr);
  const std::vector<uint64_t> keys = {5, 6};
  const std::vector<float> linear = Grads(2, 1, 1.0f), embedding = Grads(2, 4, 1.0f);
  // The number of parts must be said, and part must be below it.
  EXPECT_EQ(shard->Push(SyncPushOf(0, 0, 0, 0, keys, linear, embedding)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->Push(SyncPushOf(0, 0, 2, 2, keys, linear, embedding)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Partition 0 in two parts; a repeat of part 0 is a duplicate, a part
  // saying another count is refused.
  ASSERT_EQ(*shard->Push(SyncPushOf(0, 0, 0, 2, {5}, {1.0f}, Grads(1, 4, 1.0f))), SparsePushOutcome::kApplied);
  EXPECT_EQ(*shard->Push(SyncPushOf(0, 0, 0, 2, {5}, {1.0f}, Grads(1, 4, 1.0f))), SparsePushOutcome::kDuplicate);
  EXPECT_EQ(shard->Push(SyncPushOf(0, 0, 1, 3, {6}, {1.0f}, Grads(1, 4, 1.0f))).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A later step arrives out of turn.
  EXPECT_EQ(shard->Push(SyncPushOf(1, 1, 0, 1, keys, linear, embedding)).status().code(), absl::StatusCode::kAborted);
  const std::vector<float> before = PullAll(*shard, 0, keys);
  ASSERT_EQ(*shard->Push(SyncPushOf(1, 0, 0, 1, keys, linear, embedding)), SparsePushOutcome::kApplied);
  EXPECT_EQ(PullAll(*shard, 0, keys), before) << "partition 0's step is not whole yet";
  ASSERT_EQ(*shard->Push(SyncPushOf(0, 0, 1, 2, {6}, {1.0f}, Grads(1, 4, 1.0f))), SparsePushOutcome::kApplied);
  const std::vector<float> after = PullAll(*shard, 0, keys);
  EXPECT_NE(after, before);
  // Step 0 again, any part: duplicates that change nothing.
  EXPECT_EQ(*shard->Push(SyncPushOf(1, 0, 0, 1, keys, linear, embedding)), SparsePushOutcome::kDuplicate);
  EXPECT_EQ(PullAll(*shard, 0, keys), after);
  // An empty push is a partition's whole step when it is its only part.
  ASSERT_EQ(*shard->Push(SyncPushOf(0, 1, 0, 1, {}, {}, {})), SparsePushOutcome::kApplied);
  ASSERT_EQ(*shard->Push(SyncPushOf(1, 1, 0, 1, {}, {}, {})), SparsePushOutcome::kApplied);
  EXPECT_TRUE(PushPartitionStep(shard.get(), 0, 2, keys, 1.0f).ok()) << "step 1 was whole";
}

TEST(SparseShardSyncTest, APullOfAStepReadsTheRowsBeforeItsUpdateAlsoOnceApplied) {
  auto shard = MakeSync();
  ASSERT_NE(shard, nullptr);
  const std::vector<uint64_t> keys = {11, 12, 13}, other = {900};
  auto pull_at = [&](int64_t step, const std::vector<uint64_t>& k, std::vector<float>* rows) {
    rows->assign(k.size() * 4, 0.0f);
    return shard->PullAtStep(1, k, step, rows->data());
  };
  ASSERT_TRUE(PushPartitionStep(shard.get(), 0, 0, keys, 1.0f).ok());
  ASSERT_TRUE(PushPartitionStep(shard.get(), 1, 0, keys, 2.0f).ok());
  const std::vector<float> step1 = PullAll(*shard, 1, keys);
  std::vector<float> rows;
  ASSERT_TRUE(pull_at(1, keys, &rows).ok());
  EXPECT_EQ(rows, step1);
  // Step 1 gathers, then applies: step 1's pulls still read step1's rows.
  ASSERT_TRUE(PushPartitionStep(shard.get(), 0, 1, {12, 13}, 1.5f).ok());
  ASSERT_TRUE(PushPartitionStep(shard.get(), 1, 1, {13}, -0.5f).ok());
  const std::vector<float> step2 = PullAll(*shard, 1, keys);
  EXPECT_NE(step2, step1);
  ASSERT_TRUE(pull_at(1, keys, &rows).ok());
  EXPECT_EQ(rows, step1) << "re-run of step 1";
  ASSERT_TRUE(pull_at(2, keys, &rows).ok());
  EXPECT_EQ(rows, step2);
  // A key the step did not touch reads the same either way.
  std::vector<float> untouched;
  ASSERT_TRUE(pull_at(1, other, &untouched).ok());
  EXPECT_EQ(untouched, PullAll(*shard, 1, other));
  // Older steps are gone; later ones are not there yet. Asynchronous
  // pulls (no step) read the latest.
  EXPECT_EQ(pull_at(0, keys, &rows).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(pull_at(3, keys, &rows).code(), absl::StatusCode::kUnavailable);
}

// Expiry of a synchronous table happens at a step boundary: pulls of a step
// read the same rows whichever partition pushed first (expiring when the
// first push of a step came let a slower partition's pull of that step read
// a dropped row as new), and a late pull of the step reads a row dropped at
// its end as it was.
TEST(SparseShardSyncTest, ExpiryComesBetweenStepsAndLatePullsReadTheDroppedRowsAsTheyWere) {
  auto shard = MakeSync(/*budget=*/0, /*async_embedding=*/false, /*expire_after=*/4);  // every step (4 / 4)
  ASSERT_NE(shard, nullptr);
  const std::vector<uint64_t> old_key = {7}, busy = {8};
  auto pull_at = [&](int64_t step, std::vector<float>* rows) {
    rows->assign(4, 0.0f);
    return shard->PullAtStep(1, old_key, step, rows->data());
  };
  const std::vector<float> fresh = PullAll(*shard, 1, old_key);
  ASSERT_TRUE(PushPartitionStep(shard.get(), 0, 0, old_key, 1.0f).ok());
  ASSERT_TRUE(PushPartitionStep(shard.get(), 1, 0, old_key, 1.0f).ok());
  const std::vector<float> trained = PullAll(*shard, 1, old_key);
  ASSERT_NE(trained, fresh);
  // Key 7, last pushed at step 0, is dropped once a step s has 0 < s - 4.
  std::vector<float> rows;
  for (int64_t step = 1; step <= 5; ++step) {
    ASSERT_TRUE(PushPartitionStep(shard.get(), 0, step, busy, 1.0f).ok());
    ASSERT_TRUE(pull_at(step, &rows).ok());
    EXPECT_EQ(rows, trained) << "step " << step << ", half gathered: the row is as before the step";
    ASSERT_TRUE(PushPartitionStep(shard.get(), 1, step, busy, 1.0f).ok());
    ASSERT_TRUE(pull_at(step, &rows).ok());
    EXPECT_EQ(rows, trained) << "a late pull of step " << step;
  }
  EXPECT_EQ(shard->Stats()[1].expiries, 1);
  EXPECT_EQ(shard->Stats()[1].rows, 1) << "only key 8 is left";
  ASSERT_TRUE(pull_at(6, &rows).ok());
  EXPECT_EQ(rows, fresh) << "step 6 reads the dropped row as a new one";
}

TEST(SparseShardSyncTest, ASumThatIsNotFiniteOrDoesNotFitRefusesTheLastPushAndKeepsTheStep) {
  auto shard = MakeSync();
  ASSERT_NE(shard, nullptr);
  const std::vector<uint64_t> keys = {21};
  const float big = 3.0e38f;
  ASSERT_TRUE(shard->Push(SyncPushOf(0, 0, 0, 1, keys, {big}, {big, 0, 0, 0})).ok());
  const absl::Status summed = shard->Push(SyncPushOf(1, 0, 0, 1, keys, {big}, {big, 0, 0, 0})).status();
  EXPECT_EQ(summed.code(), absl::StatusCode::kInvalidArgument) << summed;
  EXPECT_NE(summed.message().find("summed gradients of step 0"), absl::string_view::npos) << summed;
  EXPECT_EQ(PullAll(*shard, 0, keys), std::vector<float>{0.0f}) << "nothing applied";
  // The refused push is not counted: partition 1 sends its step again.
  ASSERT_EQ(*shard->Push(SyncPushOf(1, 0, 0, 1, keys, {-big}, {-big, 0, 0, 0})), SparsePushOutcome::kApplied);
  EXPECT_EQ(PullAll(*shard, 0, keys), std::vector<float>{0.0f}) << "(big - big) / 2 = 0";

  // A budget the step's new rows do not fit (the gathered pushes do):
  // RESOURCE_EXHAUSTED naming the tables, and the step is still gathered.
  int64_t small_step = 0;
  {
    auto unbounded = MakeSync();
    ASSERT_NE(unbounded, nullptr);
    ASSERT_TRUE(PushPartitionStep(unbounded.get(), 0, 0, {1}, 1.0f).ok());
    ASSERT_TRUE(PushPartitionStep(unbounded.get(), 1, 0, {2}, 1.0f).ok());
    small_step = unbounded->bytes();
  }
  auto small = MakeSync(/*budget=*/small_step + 40 * 1024);
  ASSERT_NE(small, nullptr);
  std::vector<uint64_t> many(1000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = 100000 + i;
  ASSERT_TRUE(PushPartitionStep(small.get(), 0, 0, {1}, 1.0f).ok());
  const absl::Status full = PushPartitionStep(small.get(), 1, 0, many, 1.0f).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("sparse table linear, embedding is full"), absl::string_view::npos) << full;
  ASSERT_EQ(*PushPartitionStep(small.get(), 1, 0, {2}, 1.0f), SparsePushOutcome::kApplied);
  EXPECT_EQ(*PushPartitionStep(small.get(), 1, 1, {2}, 1.0f), SparsePushOutcome::kApplied) << "step 0 was applied";
}

TEST(SparseShardSyncTest, ACheckpointCutsTheTablesAtItsStepAndRestoresThere) {
  auto shard = MakeSync(/*budget=*/0, /*async_embedding=*/true);  // "embedding" asynchronous
  ASSERT_NE(shard, nullptr);
  const std::vector<uint64_t> keys = {31, 32, 33};
  ASSERT_TRUE(PushPartitionStep(shard.get(), 0, 0, keys, 1.0f).ok());
  // The asynchronous table took partition 0's push at once.
  EXPECT_NE(PullAll(*shard, 1, keys), PullAll(*MakeSync(0, true), 1, keys));
  ASSERT_TRUE(shard->ArmCapture(/*checkpoint_id=*/7, /*at_step=*/1).ok());
  EXPECT_EQ(shard->TakeCapture(7, absl::Now() + absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(shard->ArmCapture(7, 1).ok());
  ASSERT_TRUE(PushPartitionStep(shard.get(), 1, 0, keys, 2.0f).ok());  // step 0 whole: the cut is taken
  const std::vector<float> at_cut = PullAll(*shard, 0, keys);
  ASSERT_TRUE(PushPartitionStep(shard.get(), 0, 1, keys, 4.0f).ok());
  ASSERT_TRUE(PushPartitionStep(shard.get(), 1, 1, keys, 4.0f).ok());  // step 1 applied after the cut
  absl::StatusOr<std::vector<std::pair<int32_t, ChunkSnapshot>>> cut = shard->TakeCapture(7, absl::Now());
  ASSERT_TRUE(cut.ok()) << cut.status();
  // Past the step: another capture at it is refused.
  EXPECT_EQ(shard->ArmCapture(8, 1).code(), absl::StatusCode::kAborted);
  auto restored = MakeSync(0, true);
  ASSERT_NE(restored, nullptr);
  for (const auto& [chunk_id, snapshot] : *cut) {
    if (chunk_id < TableChunkId(1, 0)) {
      EXPECT_EQ(snapshot.partition_steps, (std::vector<int64_t>{1, 1})) << "synchronous: at the cut";
      EXPECT_EQ(snapshot.version, 1);
    } else {
      EXPECT_EQ(snapshot.partition_steps, (std::vector<int64_t>{2, 2}))
          << "asynchronous: after the steps pushed whole when taken";
    }
    ASSERT_TRUE(restored->Restore(chunk_id, snapshot).ok());
  }
  EXPECT_EQ(PullAll(*restored, 0, keys), at_cut);
  EXPECT_EQ(PullAll(*restored, 1, keys), PullAll(*shard, 1, keys));
  // The restored tables gather step 1 again; step 0 is a duplicate.
  EXPECT_EQ(*PushPartitionStep(restored.get(), 0, 0, keys, 9.0f), SparsePushOutcome::kDuplicate);
  ASSERT_EQ(*PushPartitionStep(restored.get(), 0, 1, keys, 4.0f), SparsePushOutcome::kApplied);
  ASSERT_EQ(*PushPartitionStep(restored.get(), 1, 1, keys, 4.0f), SparsePushOutcome::kApplied);
  EXPECT_EQ(PullAll(*restored, 0, keys), PullAll(*shard, 0, keys)) << "the same step 1 on the same rows";
  EXPECT_EQ(PullAll(*restored, 1, keys), PullAll(*shard, 1, keys))
      << "the asynchronous table's capture holds step 1 whole: it is not applied again";
}

// An asynchronous capture resumes each partition after its last step once
// every part of that step is in on the bucket's shard, and at that step
// while parts may still come; a restored bucket never says less than it
// was restored from. So a resumed job applies each part once (a step caught
// half in applies its parts that were in again, never loses one).
TEST(SparseShardTest, AnAsynchronousCaptureResumesAfterEveryStepWhoseEveryPartIsIn) {
  auto original = Make({0, 1});
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 64; ++k) keys.push_back(k * 104729);
  const std::vector<float> linear = Grads(keys.size(), 1, 0.1f), embedding = Grads(keys.size(), 4, 0.01f);
  auto push = [&](SparseShard* to, int32_t partition, int64_t step, int32_t on, int32_t part, int32_t parts) {
    const ShardPart rows = PartOnShard(keys, linear, embedding, on);
    SparsePushArgs args = PushOf(partition, step, rows.keys, rows.linear, rows.embedding);
    args.shard = on;
    args.part = part;
    args.parts = parts;
    return to->Push(args);
  };
  // Partition 0, step 4: shard 0's one part, and one of shard 1's two.
  ASSERT_TRUE(push(original.get(), 0, 4, 0, 0, 1).ok());
  ASSERT_TRUE(push(original.get(), 0, 4, 1, 1, 2).ok());
  // Partition 1, step 2: both shards whole; no part count said on shard 1's step 3.
  ASSERT_TRUE(push(original.get(), 1, 2, 0, 0, 1).ok());
  ASSERT_TRUE(push(original.get(), 1, 2, 1, 0, 1).ok());
  ASSERT_TRUE(push(original.get(), 1, 3, 1, 0, 0).ok());
  auto expect_steps = [](SparseShard& holder, const std::vector<int64_t>& on_0,
                         const std::vector<int64_t>& on_1, const std::string& what) {
    for (const auto& [chunk_id, snapshot] : holder.Capture()) {
      EXPECT_EQ(snapshot.partition_steps, holder.ShardOfBucket(chunk_id) == 0 ? on_0 : on_1)
          << what << ", chunk " << chunk_id;
    }
  };
  const std::vector<std::pair<int32_t, ChunkSnapshot>> captured = original->Capture();
  expect_steps(*original, {5, 3}, {4, 3}, "the capture");

  // Restored: each bucket keeps its own floor, and a capture before any push
  // says what each was restored from, not the highest of them.
  auto restored = Make({0, 1});
  for (const auto& [chunk_id, snapshot] : captured) ASSERT_TRUE(restored->Restore(chunk_id, snapshot).ok());
  expect_steps(*restored, {5, 3}, {4, 3}, "a capture after the restore");
  // The original gets the part it lacked; the resumed partition 0 replays
  // step 4: shard 0's buckets skip it (applied once), shard 1's take both
  // parts (the one caught in applies again, the lost one once).
  ASSERT_TRUE(push(original.get(), 0, 4, 1, 0, 2).ok());
  ASSERT_TRUE(push(restored.get(), 0, 4, 0, 0, 1).ok());
  ASSERT_TRUE(push(restored.get(), 0, 4, 1, 0, 2).ok());
  ASSERT_TRUE(push(restored.get(), 0, 4, 1, 1, 2).ok());
  const std::vector<uint64_t> on_0 = PartOnShard(keys, linear, embedding, 0).keys;
  ASSERT_FALSE(on_0.empty());
  for (int32_t table = 0; table < 2; ++table) {
    EXPECT_EQ(PullAll(*restored, table, on_0), PullAll(*original, table, on_0)) << "table " << table;
  }
  expect_steps(*original, {5, 3}, {5, 3}, "the original, step 4 whole");
  expect_steps(*restored, {5, 3}, {5, 3}, "the restored, step 4 whole");
}

// The buckets of one capture's shard restore with equal floors, which a
// server keeps once and a live copy of the shard carries once, naming its
// buckets; the copy skips a replayed step below the floor as its source
// does, whether the state names the buckets in one entry or (written before
// floors were shared) one entry each. A floor of a bucket the copy does not
// hold, or of other partitions, is refused.
TEST(SparseShardTest, RestoredFloorsTravelOncePerDistinctStepsInALiveCopy) {
  auto original = Make({0, 1});
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 64; ++k) keys.push_back(k * 104729);
  auto push = [&](SparseShard* to, int32_t partition, int64_t step, int32_t on, float scale) {
    const std::vector<float> linear = Grads(keys.size(), 1, scale), embedding = Grads(keys.size(), 4, scale);
    const ShardPart rows = PartOnShard(keys, linear, embedding, on);
    SparsePushArgs args = PushOf(partition, step, rows.keys, rows.linear, rows.embedding);
    args.shard = on;
    args.parts = 1;
    return to->Push(args);
  };
  for (int32_t on : {0, 1}) {
    ASSERT_TRUE(push(original.get(), 0, 4, on, 0.1f).ok());
    ASSERT_TRUE(push(original.get(), 1, 2, on, 0.2f).ok());
  }
  auto restored = Make({0, 1});
  for (const auto& [chunk_id, snapshot] : original->Capture()) {
    ASSERT_TRUE(restored->Restore(chunk_id, snapshot).ok());
  }
  std::vector<int32_t> on_1;
  for (int32_t chunk_id : restored->chunk_ids()) {
    if (restored->ShardOfBucket(chunk_id) == 1) on_1.push_back(chunk_id);
  }
  ASSERT_FALSE(on_1.empty());
  absl::StatusOr<ChunkSnapshot> shard_state = restored->CaptureShardState(1);
  ASSERT_TRUE(shard_state.ok()) << shard_state.status();
  v1::TableShardState state;
  ASSERT_TRUE(state.ParseFromString(shard_state->table_state));
  ASSERT_EQ(state.floors_size(), 1) << "one entry for the shard's one floor";
  EXPECT_EQ(std::vector<int32_t>(state.floors(0).chunk_ids().begin(), state.floors(0).chunk_ids().end()),
            on_1);
  EXPECT_EQ(std::vector<int64_t>(state.floors(0).steps().begin(), state.floors(0).steps().end()),
            (std::vector<int64_t>{5, 3}));

  // The same floors, one entry a bucket.
  v1::TableShardState one_each = state;
  one_each.clear_floors();
  for (int32_t chunk_id : on_1) {
    v1::TableShardState::Floors* floors = one_each.add_floors();
    floors->set_chunk_id(chunk_id);
    *floors->mutable_steps() = state.floors(0).steps();
  }
  const std::vector<uint64_t> keys_1 = OnShard(keys, 1);
  for (const v1::TableShardState& form : {state, one_each}) {
    SCOPED_TRACE(form.floors_size() == 1 ? "shared" : "one entry a bucket");
    auto copy = Make({1});
    for (int32_t chunk_id : on_1) {
      absl::StatusOr<ChunkSnapshot> bucket = restored->CaptureBucket(chunk_id);
      ASSERT_TRUE(bucket.ok()) << bucket.status();
      ASSERT_TRUE(copy->AdoptBucket(chunk_id, bucket->table_state).ok());
    }
    ASSERT_TRUE(copy->AdoptShardState(form.SerializeAsString()).ok());
    // Partition 0 replays step 4 (in the rows: skipped), then both go on.
    ASSERT_TRUE(push(copy.get(), 0, 4, 1, 0.1f).ok());
    for (int32_t table : {0, 1}) {
      EXPECT_EQ(PullAll(*copy, table, keys_1), PullAll(*original, table, keys_1))
          << "step 4 once, table " << table;
    }
    ASSERT_TRUE(push(copy.get(), 0, 5, 1, 0.3f).ok());
    ASSERT_TRUE(push(original.get(), 0, 5, 1, 0.3f).ok());
    for (int32_t table : {0, 1}) {
      EXPECT_EQ(PullAll(*copy, table, keys_1), PullAll(*original, table, keys_1))
          << "step 5, table " << table;
    }
    // Back to the rows before step 5, for the next form.
    original = Make({0, 1});
    for (int32_t on : {0, 1}) {
      ASSERT_TRUE(push(original.get(), 0, 4, on, 0.1f).ok());
      ASSERT_TRUE(push(original.get(), 1, 2, on, 0.2f).ok());
    }
  }

  auto refused = [&](const v1::TableShardState& bad) {
    auto copy = Make({1});
    for (int32_t chunk_id : on_1) {
      ASSERT_TRUE(copy->AdoptBucket(chunk_id, restored->CaptureBucket(chunk_id)->table_state).ok());
    }
    EXPECT_EQ(copy->AdoptShardState(bad.SerializeAsString()).code(), absl::StatusCode::kInvalidArgument);
  };
  v1::TableShardState foreign = state;
  foreign.mutable_floors(0)->add_chunk_ids(TableChunkId(0, 0));  // bucket 0 is shard 0's
  refused(foreign);
  v1::TableShardState short_steps = state;
  short_steps.mutable_floors(0)->mutable_steps()->RemoveLast();
  refused(short_steps);
}

// Synchronous tables over two shards, of which a server holds `held` (a
// primary of one shard and a backup of the other holds both).
std::unique_ptr<SparseShard> MakeSyncOn(const std::set<int32_t>& held) {
  std::vector<SparseTableSetup> tables = Tables();
  for (SparseTableSetup& table : tables) table.synchronous = true;
  auto shard = SparseShard::Create(std::move(tables), held, /*num_partitions=*/2);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return shard.ok() ? *std::move(shard) : nullptr;
}

// Pushes come per shard, numbered in parts per shard: a server holding two
// shards (its own and one it backs up, whose pushes its primary forwards)
// applies a step once every shard's parts of every partition are in, and
// ends bit-identical to two servers holding one shard each. A part is
// counted per shard (the same part number of another shard is its own),
// and a key must be of the shard its push names.
TEST(SparseShardSyncTest, AServerHoldingTwoShardsCountsEachShardsParts) {
  auto both = MakeSyncOn({0, 1});
  auto first = MakeSyncOn({0});
  auto second = MakeSyncOn({1});
  ASSERT_TRUE(both && first && second);
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 24; ++k) keys.push_back(k * 7919);
  // Each shard's pushes: shard 0 in one part, shard 1 in two.
  struct Sent {
    int32_t shard, part, parts;
    ShardPart rows;
  };
  auto pushes_of = [&](float scale) {
    const std::vector<float> linear = Grads(keys.size(), 1, scale), embedding = Grads(keys.size(), 4, scale);
    std::vector<Sent> sent;
    sent.push_back({0, 0, 1, PartOnShard(keys, linear, embedding, 0)});
    ShardPart rest = PartOnShard(keys, linear, embedding, 1);
    const size_t half = rest.keys.size() / 2;
    ShardPart a, b;
    a.keys.assign(rest.keys.begin(), rest.keys.begin() + static_cast<std::ptrdiff_t>(half));
    b.keys.assign(rest.keys.begin() + static_cast<std::ptrdiff_t>(half), rest.keys.end());
    a.linear.assign(rest.linear.begin(), rest.linear.begin() + static_cast<std::ptrdiff_t>(half));
    b.linear.assign(rest.linear.begin() + static_cast<std::ptrdiff_t>(half), rest.linear.end());
    a.embedding.assign(rest.embedding.begin(), rest.embedding.begin() + static_cast<std::ptrdiff_t>(half * 4));
    b.embedding.assign(rest.embedding.begin() + static_cast<std::ptrdiff_t>(half * 4), rest.embedding.end());
    sent.push_back({1, 0, 2, a});
    sent.push_back({1, 1, 2, b});
    return sent;
  };
  auto args_of = [](int32_t partition, int64_t step, const Sent& sent) {
    SparsePushArgs args =
        SyncPushOf(partition, step, sent.part, sent.parts, sent.rows.keys, sent.rows.linear, sent.rows.embedding);
    args.shard = sent.shard;
    return args;
  };
  for (int64_t step = 0; step < 2; ++step) {
    const std::vector<float> at_start = PullAll(*both, 1, keys);
    const std::vector<Sent> p0 = pushes_of(0.3f * static_cast<float>(step + 1));
    const std::vector<Sent> p1 = pushes_of(-0.2f);
    for (int32_t partition : {0, 1}) {
      for (const Sent& sent : partition == 0 ? p0 : p1) {
        SparseShard* alone = sent.shard == 0 ? first.get() : second.get();
        ASSERT_EQ(*alone->Push(args_of(partition, step, sent)), SparsePushOutcome::kApplied);
        EXPECT_EQ(PullAll(*both, 1, keys), at_start) << "step " << step << " applied before its last part";
        ASSERT_EQ(*both->Push(args_of(partition, step, sent)), SparsePushOutcome::kApplied);
        // A repeat is a duplicate of its own shard's part only.
        EXPECT_EQ(*both->Push(args_of(partition, step, sent)), SparsePushOutcome::kDuplicate);
      }
    }
    EXPECT_NE(PullAll(*both, 1, keys), at_start) << "step " << step << " applied once whole";
  }
  for (int32_t table : {0, 1}) {
    for (int32_t s : {0, 1}) {
      const std::vector<uint64_t> part = OnShard(keys, s);
      const std::vector<float> x = PullAll(*both, table, part), y = PullAll(s == 0 ? *first : *second, table, part);
      ASSERT_EQ(x.size(), y.size());
      EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << "table " << table << " shard " << s;
    }
  }
  // A push that names no shard, or a shard not held, or holds a key of
  // another shard than it names, is refused.
  const std::vector<Sent> next = pushes_of(1.0f);
  SparsePushArgs unnamed = args_of(0, 2, next[0]);
  unnamed.shard = -1;
  const absl::Status no_shard = both->Push(unnamed).status();
  EXPECT_EQ(no_shard.code(), absl::StatusCode::kInvalidArgument) << no_shard;
  EXPECT_NE(no_shard.message().find("SparsePushRequest.shard"), std::string::npos) << no_shard;
  EXPECT_TRUE(first->Validate(unnamed).ok()) << "a server holding one shard takes it as the push's";
  SparsePushArgs elsewhere = args_of(0, 2, next[0]);
  elsewhere.shard = 1;
  EXPECT_EQ(both->Push(elsewhere).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(both->Validate(elsewhere).code(), absl::StatusCode::kAborted);
  elsewhere.shard = 5;
  EXPECT_EQ(both->Push(elsewhere).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(first->Push(args_of(0, 2, next[1])).status().code(), absl::StatusCode::kAborted) << "shard 1 not held";
}

// A live copy of shard 0's tables from a server holding shards 0 and 1
// (mid-step: one partition's shard-0 part still to come, or every shard-0
// part in while a shard-1 part is missing) onto a fresh server holding
// shard 0 only: from then on both apply every push alike, bit for bit, and
// the copy deduplicates what the source already applied.
TEST(SparseShardSyncTest, ALiveCopyOfAShardMidStepTrainsOnAsItsSource) {
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 40; ++k) keys.push_back(k * 104729);
  auto push = [&](SparseShard* shard, int32_t partition, int64_t step, int32_t on, float scale) {
    const std::vector<float> linear = Grads(keys.size(), 1, scale), embedding = Grads(keys.size(), 4, scale);
    const ShardPart part = PartOnShard(keys, linear, embedding, on);
    SparsePushArgs args = SyncPushOf(partition, step, 0, 1, part.keys, part.linear, part.embedding);
    args.shard = on;
    return shard->Push(args);
  };
  auto copy = [](const SparseShard& source, SparseShard* dest) {
    absl::StatusOr<ChunkSnapshot> first = source.CaptureShardState(0);
    ASSERT_TRUE(first.ok()) << first.status();
    for (int32_t chunk_id : dest->chunk_ids()) {
      absl::StatusOr<ChunkSnapshot> bucket = source.CaptureBucket(chunk_id);
      ASSERT_TRUE(bucket.ok()) << bucket.status();
      EXPECT_EQ(bucket->table_changes, first->table_changes);
      ASSERT_TRUE(dest->AdoptBucket(chunk_id, bucket->table_state).ok());
    }
    ASSERT_TRUE(dest->AdoptShardState(first->table_state).ok());
  };
  const std::vector<uint64_t> shard0 = OnShard(keys, 0);
  auto expect_same = [&](const SparseShard& a, const SparseShard& b, const std::string& when) {
    for (int32_t table : {0, 1}) {
      const std::vector<float> x = PullAll(a, table, shard0), y = PullAll(b, table, shard0);
      ASSERT_EQ(x.size(), y.size());
      EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << when << ", table " << table;
    }
  };
  for (bool shard0_whole : {false, true}) {
    SCOPED_TRACE(shard0_whole ? "every shard-0 part in" : "a shard-0 part to come");
    auto source = MakeSyncOn({0, 1});
    auto dest = MakeSyncOn({0});
    ASSERT_TRUE(source && dest);
    for (int64_t step = 0; step < 2; ++step) {
      for (int32_t p : {0, 1}) {
        for (int32_t on : {0, 1}) ASSERT_TRUE(push(source.get(), p, step, on, 0.1f * static_cast<float>(p + 1)).ok());
      }
    }
    // Step 2, half in.
    ASSERT_TRUE(push(source.get(), 0, 2, 0, 0.5f).ok());
    ASSERT_TRUE(push(source.get(), 0, 2, 1, 0.5f).ok());
    ASSERT_TRUE(push(source.get(), 1, 2, shard0_whole ? 0 : 1, -0.25f).ok());
    const int64_t changes = source->CaptureShardState(0)->table_changes;
    copy(*source, dest.get());
    if (!shard0_whole) {
      // Step 1's rows as step 1 read them came along (a re-run's pull).
      std::vector<float> a(shard0.size() * 4), b(shard0.size() * 4);
      ASSERT_TRUE(source->PullAtStep(1, shard0, 1, a.data()).ok());
      ASSERT_TRUE(dest->PullAtStep(1, shard0, 1, b.data()).ok());
      EXPECT_EQ(a, b);
      EXPECT_NE(a, PullAll(*dest, 1, shard0)) << "step 1 changed them";
    }
    // The missing part arrives at the source (and, of shard 0, at the copy).
    const int32_t missing = shard0_whole ? 1 : 0;
    ASSERT_EQ(*push(source.get(), 1, 2, missing, -0.25f), SparsePushOutcome::kApplied);
    if (missing == 0) {
      ASSERT_EQ(*push(dest.get(), 1, 2, 0, -0.25f), SparsePushOutcome::kApplied);
    }
    EXPECT_GT(source->CaptureShardState(0)->table_changes, changes) << "the step changed shard 0's rows";
    expect_same(*source, *dest, "after step 2");
    // What the source applied is a duplicate on the copy.
    EXPECT_EQ(*push(dest.get(), 0, 2, 0, 0.5f), SparsePushOutcome::kDuplicate);
    // Step 3 on both, and its re-run's pull reads the rows before it.
    for (int32_t p : {0, 1}) {
      ASSERT_TRUE(push(source.get(), p, 3, 0, 0.3f).ok());
      ASSERT_TRUE(push(source.get(), p, 3, 1, 0.3f).ok());
      ASSERT_TRUE(push(dest.get(), p, 3, 0, 0.3f).ok());
    }
    expect_same(*source, *dest, "after step 3");
    std::vector<float> a(shard0.size() * 4), b(shard0.size() * 4);
    ASSERT_TRUE(source->PullAtStep(1, shard0, 3, a.data()).ok());
    ASSERT_TRUE(dest->PullAtStep(1, shard0, 3, b.data()).ok());
    EXPECT_EQ(a, b) << "the undo rows came along";
  }
  // A copy goes only to a server holding that one shard.
  auto both = MakeSyncOn({0, 1});
  absl::StatusOr<ChunkSnapshot> state = both->CaptureShardState(0);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(MakeSyncOn({0, 1})->AdoptShardState(state->table_state).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MakeSyncOn({1})->AdoptShardState(state->table_state).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MakeSyncOn({0})->AdoptShardState("garbage").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(both->CaptureShardState(7).status().code(), absl::StatusCode::kNotFound);
}

// Steps outside what a table keeps (negative, or past kMaxSparseStep) are
// refused in pushes and pulls, and in restored or copied state, before
// they move a partition's position (which would skip its later pushes) or
// overflow the expiry's arithmetic.
TEST(SparseShardTest, StepsOutsideWhatATableKeepsAreRefusedWhereverTheyComeFrom) {
  for (bool synchronous : {false, true}) {
    SCOPED_TRACE(synchronous ? "synchronous" : "asynchronous");
    std::unique_ptr<SparseShard> shard =
        synchronous ? MakeSyncOn({0, 1}) : Make({0, 1}, 0, /*expire_after=*/5);
    ASSERT_TRUE(shard);
    const std::vector<uint64_t> keys = OnShard({104729, 2 * 104729, 3 * 104729, 4 * 104729}, 0);
    ASSERT_FALSE(keys.empty());
    const std::vector<float> linear = Grads(keys.size(), 1, 0.1f), embedding = Grads(keys.size(), 4, 0.1f);
    for (int64_t step : {int64_t{-1}, kMaxSparseStep + 1, std::numeric_limits<int64_t>::max(),
                         std::numeric_limits<int64_t>::min()}) {
      SparsePushArgs args = PushOf(0, step, keys, linear, embedding);
      args.shard = 0;
      args.parts = 1;
      const absl::StatusOr<SparsePushOutcome> pushed = shard->Push(args);
      EXPECT_EQ(pushed.status().code(), absl::StatusCode::kInvalidArgument) << step;
      EXPECT_NE(pushed.status().message().find("steps are in"), std::string::npos) << pushed.status();
      std::vector<float> rows(keys.size() * 4);
      EXPECT_EQ(shard->PullAtStep(1, keys, step, rows.data()).code(), absl::StatusCode::kInvalidArgument)
          << step;
    }
    // Nothing moved: step 0 is still the partition's to push, once.
    SparsePushArgs first = PushOf(0, 0, keys, linear, embedding);
    first.shard = 0;
    first.parts = 1;
    EXPECT_EQ(*shard->Push(first), SparsePushOutcome::kApplied);
    EXPECT_EQ(*shard->Push(first), SparsePushOutcome::kDuplicate);
  }

  // Restored and copied state.
  auto original = Make({0, 1});
  const std::vector<std::pair<int32_t, ChunkSnapshot>> captured = original->Capture();
  ASSERT_FALSE(captured.empty());
  for (int field = 0; field < 3; ++field) {
    ChunkSnapshot bad = captured.front().second;
    const int64_t past = kMaxSparseStep + 2;
    if (field == 0) bad.version = past;
    if (field == 1) bad.partition_steps[1] = past;
    if (field == 2) bad.partition_steps[0] = -1;
    const absl::Status restored = Make({0, 1})->Restore(captured.front().first, bad);
    EXPECT_EQ(restored.code(), absl::StatusCode::kDataLoss) << field << ": " << restored;
  }
  EXPECT_EQ(Make({0, 1})->Restore(captured.front().first, captured.front().second, kMaxSparseStep + 2).code(),
            absl::StatusCode::kDataLoss);
  absl::StatusOr<ChunkSnapshot> shard_state = original->CaptureShardState(1);
  ASSERT_TRUE(shard_state.ok()) << shard_state.status();
  v1::TableShardState state;
  ASSERT_TRUE(state.ParseFromString(shard_state->table_state));
  const std::vector<std::function<void(v1::TableShardState*)>> damages = {
      [](v1::TableShardState* s) { s->set_now(std::numeric_limits<int64_t>::max()); },
      [](v1::TableShardState* s) { s->set_sync_step(-5); },
      [](v1::TableShardState* s) { s->set_undo_step(kMaxSparseStep + 2); },
      [](v1::TableShardState* s) { s->set_next_expiry(-1); },
      [](v1::TableShardState* s) { s->set_restored(0, kMaxSparseStep + 2); },
      [](v1::TableShardState* s) {
        s->mutable_partitions(0)->set_applied_step(std::numeric_limits<int64_t>::max());
      },
      [](v1::TableShardState* s) { s->mutable_partitions(1)->set_parts(kMaxPushParts + 1); },
      [](v1::TableShardState* s) { s->mutable_partitions(1)->add_seen(-1); },
      [](v1::TableShardState* s) { s->mutable_partitions(0)->set_applied_parts_expected(-1); },
  };
  for (size_t i = 0; i < damages.size(); ++i) {
    v1::TableShardState bad = state;
    damages[i](&bad);
    auto copy = Make({1});
    const absl::Status adopted = copy->AdoptShardState(bad.SerializeAsString());
    EXPECT_EQ(adopted.code(), absl::StatusCode::kDataLoss) << "damage " << i << ": " << adopted;
  }
  EXPECT_TRUE(Make({1})->AdoptShardState(state.SerializeAsString()).ok()) << "the undamaged state";
}

// A server's tables of a job: a SparseShard per shard it holds. One holding
// none (its shards hold only dense chunks, or a copy not added yet) refuses
// keys naming the map (ABORTED) and pushes to a shard it does not hold yet
// (UNAVAILABLE: being copied); an empty pull is answered.
TEST(SparseTablesTest, ATableOfNoShardRefusesKeysAndPushes) {
  auto none = SparseTables::Create(Tables(), {}, /*num_partitions=*/2);
  ASSERT_TRUE(none.ok()) << none.status();
  std::vector<float> out(4);
  const std::vector<uint64_t> keys = {5, 6};
  const absl::Status pulled = (*none)->Pull(1, keys, out.data());
  EXPECT_EQ(pulled.code(), absl::StatusCode::kAborted) << pulled;
  EXPECT_NE(pulled.message().find("refresh the shard map"), std::string::npos) << pulled;
  EXPECT_TRUE((*none)->Pull(1, {}, out.data()).ok());
  EXPECT_EQ((*none)->OnlyShard().status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<float> linear = {1, 1}, embedding = Grads(2, 4, 0.1f);
  SparsePushArgs args = PushOf(0, 0, keys, linear, embedding);
  args.shard = 0;
  EXPECT_EQ((*none)->Push(args).status().code(), absl::StatusCode::kUnavailable)
      << "a shard being copied here";
  args.shard = 2;  // of no bucket: retrying cannot help
  const absl::Status bucketless = (*none)->Push(args).status();
  EXPECT_EQ(bucketless.code(), absl::StatusCode::kInvalidArgument) << bucketless;
  EXPECT_NE(bucketless.message().find("holds no bucket"), std::string::npos) << bucketless;
  EXPECT_EQ((*none)->Validate(args).code(), absl::StatusCode::kInvalidArgument);
  // Both shards held: a pull of keys of both is answered row by row as each
  // shard holds them.
  auto both = SparseTables::Create(Tables(), {0, 1}, /*num_partitions=*/2);
  ASSERT_TRUE(both.ok()) << both.status();
  std::vector<uint64_t> many;
  for (uint64_t k = 1; k <= 30; ++k) many.push_back(k * 7919);
  std::vector<float> rows(many.size() * 4);
  ASSERT_TRUE((*both)->Pull(1, many, rows.data()).ok());
  auto first = Make({0});
  auto second = Make({1});
  for (size_t i = 0; i < many.size(); ++i) {
    const std::vector<float> alone = PullAll(BucketOf(many[i], kBuckets) % 2 == 0 ? *first : *second, 1, {many[i]});
    EXPECT_EQ(std::vector<float>(rows.begin() + static_cast<std::ptrdiff_t>(i * 4),
                                 rows.begin() + static_cast<std::ptrdiff_t>(i * 4 + 4)),
              alone)
        << "key " << many[i];
  }
}

// Shards copied from another server (built aside, then added) count once
// against the room: what a copy loaded aside is no longer counted beside the
// server's bytes once the shard is added or thrown away, so a second shard
// that fits is taken. A shard dropped (its server taken out of the group)
// is held no more; a return copies it again.
TEST(SparseTablesTest, CopiedShardsCountOnceAndADroppedShardIsCopiedAgain) {
  auto source = SparseTables::Create(Tables(), {0, 1}, /*num_partitions=*/2);
  ASSERT_TRUE(source.ok()) << source.status();
  for (int32_t shard : {0, 1}) {
    std::vector<uint64_t> keys;
    for (uint64_t k = 1; keys.size() < 200; ++k) {
      if (static_cast<int32_t>(BucketOf(k * 7919, kBuckets) % 2) == shard) keys.push_back(k * 7919);
    }
    const std::vector<float> linear(keys.size(), 0.5f), embedding = Grads(keys.size(), 4, 0.1f);
    SparsePushArgs args = PushOf(0, 0, keys, linear, embedding);
    args.shard = shard;
    ASSERT_TRUE((*source)->Push(args).ok());
  }
  int64_t room = std::numeric_limits<int64_t>::max();
  std::unique_ptr<SparseTables> dest;
  auto copy_of = [&](int32_t shard) -> absl::StatusOr<std::unique_ptr<SparseShard>> {
    auto copy = dest->NewShard(shard);
    if (!copy.ok()) return copy.status();
    for (int32_t chunk_id : (*copy)->chunk_ids()) {
      absl::StatusOr<ChunkSnapshot> bucket = (*source)->CaptureBucket(chunk_id);
      if (!bucket.ok()) return bucket.status();
      RETURN_IF_ERROR((*copy)->AdoptBucket(chunk_id, bucket->table_state));
    }
    return copy;
  };
  // The room as a server's store gives it: its budget less what it holds.
  auto make_dest = [&] {
    auto made = SparseTables::Create(Tables(), {}, 2, [&] { return room - dest->bytes(); });
    EXPECT_TRUE(made.ok()) << made.status();
    dest = *std::move(made);
  };
  make_dest();
  std::vector<int64_t> sizes;  // each shard's rows once added
  for (int32_t shard : {0, 1}) {
    const int64_t before = dest->bytes();
    auto copy = copy_of(shard);
    ASSERT_TRUE(copy.ok()) << copy.status();
    ASSERT_TRUE(dest->AddShard(shard, *std::move(copy)).ok());
    sizes.push_back(dest->bytes() - before);
  }
  // Room for both, with a margin smaller than either.
  room = sizes[0] + sizes[1] + std::min(sizes[0], sizes[1]) / 2;
  make_dest();
  {
    // A copy thrown away (its source died, or another copy added the shard
    // first) gives back what it loaded.
    auto thrown = copy_of(0);
    ASSERT_TRUE(thrown.ok()) << thrown.status();
  }
  for (int32_t shard : {0, 1}) {
    auto copy = copy_of(shard);
    ASSERT_TRUE(copy.ok()) << "shard " << shard << ": " << copy.status();
    ASSERT_TRUE(dest->AddShard(shard, *std::move(copy)).ok());
  }
  // Taken out of shard 1: dropped, shard 0 kept.
  std::vector<std::shared_ptr<SparseShard>> dropped = dest->DropShardsExcept({0});
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_TRUE(dest->Holds(0));
  EXPECT_FALSE(dest->Holds(1));
  const std::vector<uint64_t> no_keys;
  const std::vector<float> no_rows;
  SparsePushArgs late = PushOf(0, 1, no_keys, no_rows, no_rows);
  late.shard = 1;
  EXPECT_EQ(dest->Push(late).status().code(), absl::StatusCode::kUnavailable) << "to be copied again";
  dropped.clear();
  auto again = copy_of(1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(dest->AddShard(1, *std::move(again)).ok());
}

// A server that holds no bucket of the synchronous tables (a table of 1
// bucket over 2 shards) has no step to cut at: its part of a checkpoint at
// any step is taken at once, not waited for until the deadline.
TEST(SparseShardSyncTest, AServerWithoutSynchronousBucketsCapturesAtOnce) {
  std::vector<SparseTableSetup> tables = Tables();
  for (SparseTableSetup& table : tables) {
    table.synchronous = true;
    table.bucket_shards = {0};  // one bucket, on shard 0
  }
  auto shard = SparseShard::Create(std::move(tables), {1}, /*num_partitions=*/2);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_TRUE((*shard)->ArmCapture(/*checkpoint_id=*/3, /*at_step=*/40).ok());
  absl::StatusOr<std::vector<std::pair<int32_t, ChunkSnapshot>>> cut =
      (*shard)->TakeCapture(3, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_TRUE(cut->empty());
}

}  // namespace
}  // namespace fulcrum
