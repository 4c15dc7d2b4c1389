#include "scheduler/placement.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace fulcrum {
namespace {

std::vector<kernels::TensorInfo> Tensors() {
  return {{"w", {100, 10}, 1000, kernels::InitKind::kUniform, 0.1f}, {"b", {10}, 10, kernels::InitKind::kZeros, 0}};
}

std::vector<ServerRef> Servers(int n) {
  std::vector<ServerRef> servers;
  for (int i = 0; i < n; ++i) servers.push_back({"server-" + std::to_string(i), "host:" + std::to_string(7000 + i)});
  return servers;
}

// Every element of every tensor is in exactly one chunk, every chunk on a
// shard that exists.
void ExpectCovers(const v1::ShardMap& map) {
  std::map<int32_t, int64_t> covered;
  for (const auto& chunk : map.chunks()) {
    covered[chunk.tensor()] += chunk.length();
    EXPECT_GE(chunk.shard(), 0);
    EXPECT_LT(chunk.shard(), map.shards_size());
  }
  for (int t = 0; t < map.tensors_size(); ++t) EXPECT_EQ(covered[t], map.tensors(t).size());
}

TEST(PlacementTest, PlanPutsEachShardOnDistinctReplicas) {
  const v1::ShardMap map = PlanShardMap(Tensors(), Servers(3), /*num_shards=*/0, /*replicas=*/2, 64, 1);
  EXPECT_EQ(map.version(), 1);
  ASSERT_EQ(map.shards_size(), 3);
  ExpectCovers(map);
  std::set<std::string> leaders;
  for (const auto& shard : map.shards()) {
    leaders.insert(shard.server_id());
    ASSERT_EQ(shard.backup_ids_size(), 1);
    EXPECT_NE(shard.backup_ids(0), shard.server_id());
  }
  EXPECT_EQ(leaders.size(), 3u) << "one shard per server";
  // Deterministic.
  EXPECT_EQ(map.SerializeAsString(), PlanShardMap(Tensors(), Servers(3), 0, 2, 64, 1).SerializeAsString());
}

// Every replica holds its shard's share (and its table buckets, which chunk
// counts do not show): with N shards over N servers and R replicas, each
// server holds exactly R of them, whatever the server count.
TEST(PlacementTest, ReplicasSpreadEvenlyOverTheServers) {
  for (int n = 2; n <= 9; ++n) {
    for (int replicas = 2; replicas <= std::min(n, 3); ++replicas) {
      SCOPED_TRACE(testing::Message() << n << " servers, " << replicas << " replicas");
      const v1::ShardMap map = PlanShardMap(Tensors(), Servers(n), /*num_shards=*/0, replicas, 64, 1);
      std::map<std::string, int> held;
      for (const auto& shard : map.shards()) {
        ++held[shard.server_id()];
        for (const std::string& b : shard.backup_ids()) ++held[b];
      }
      ASSERT_EQ(held.size(), static_cast<size_t>(n));
      for (const auto& [server, count] : held) EXPECT_EQ(count, replicas) << server;
    }
  }
}

TEST(PlacementTest, RemovingAPrimaryPromotesABackupThatIsNotCopying) {
  v1::ShardMap map = PlanShardMap(Tensors(), Servers(3), 1, 3, 64, 1);
  ASSERT_EQ(map.shards(0).backup_ids_size(), 2);
  const std::string primary = map.shards(0).server_id();
  const std::string copying = map.shards(0).backup_ids(0);
  const std::string other = map.shards(0).backup_ids(1);
  std::optional<int32_t> lost;
  std::vector<std::string> changes = RemoveServer(&map, primary, HoldingShards(map, std::nullopt), copying, &lost);
  EXPECT_FALSE(lost.has_value());
  EXPECT_EQ(map.shards(0).server_id(), other) << "the copying backup was promoted";
  EXPECT_EQ(map.version(), 2);
  ASSERT_EQ(changes.size(), 1u);
  // With only the copying backup left, losing the primary loses the shard.
  lost.reset();
  const v1::ShardMap before = map;
  RemoveServer(&map, other, HoldingShards(map, std::nullopt), copying, &lost);
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(*lost, 0);
  EXPECT_EQ(map.SerializeAsString(), before.SerializeAsString()) << "the map changed although the shard is lost";
}

TEST(PlacementTest, ANewShardTakesSomeChunksAndUndoPutsThemBack) {
  v1::ShardMap map = PlanShardMap(Tensors(), Servers(2), 0, 1, 64, 1);
  const v1::ShardMap before = map;
  const v1::HandoverRecord handover = AddShard(&map, {"server-9", "host:7009"});
  EXPECT_TRUE(handover.new_shard());
  EXPECT_EQ(handover.shard(), 2);
  EXPECT_GT(handover.moved_from_size(), 0);
  EXPECT_LT(handover.moved_from_size(), map.chunks_size());
  for (const auto& chunk : map.chunks()) {
    const bool moved = handover.moved_from().count(chunk.chunk_id()) > 0;
    EXPECT_EQ(chunk.shard() == 2, moved);
    if (moved) {
      EXPECT_EQ(before.chunks(chunk.chunk_id()).shard(), handover.moved_from().at(chunk.chunk_id()));
    }
  }
  // During the handover the shards the chunks came from still hold them.
  const std::set<int32_t> holding = HoldingShards(map, handover);
  EXPECT_EQ(holding.count(2), 0u);
  ExpectCovers(map);
  UndoHandover(&map, handover);
  ASSERT_EQ(map.shards_size(), 2);
  for (int i = 0; i < map.chunks_size(); ++i) EXPECT_EQ(map.chunks(i).shard(), before.chunks(i).shard());
  EXPECT_GT(map.version(), before.version());
}

TEST(PlacementTest, ABackupIsChosenOutsideTheGroupAndUndone) {
  v1::ShardMap map = PlanShardMap(Tensors(), Servers(3), 1, 1, 64, 1);
  const std::string primary = map.shards(0).server_id();
  EXPECT_FALSE(ChooseBackup(map, 0, {{primary, "x"}}).has_value());
  std::optional<ServerRef> best = ChooseBackup(map, 0, Servers(3));
  ASSERT_TRUE(best.has_value());
  EXPECT_NE(best->id, primary);
  const v1::HandoverRecord handover = AddBackup(&map, 0, *best);
  EXPECT_TRUE(InMap(map, best->id));
  EXPECT_FALSE(ChooseBackup(map, 0, {*best}).has_value()) << "chose a server already in the group";
  UndoHandover(&map, handover);
  EXPECT_FALSE(InMap(map, best->id));
}

}  // namespace
}  // namespace fulcrum
