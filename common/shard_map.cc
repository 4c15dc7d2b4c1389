#include "common/shard_map.h"

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/param_init.h"

namespace fulcrum {
namespace {

// Domain-separation salts so chunk keys, shard keys and node ids never share
// a hash input space.
constexpr uint64_t kChunkSalt = 0x6a09e667f3bcc909ULL;
constexpr uint64_t kShardSalt = 0xbb67ae8584caa73bULL;
constexpr uint64_t kBucketSalt = 0x3c6ef372fe94f82bULL;
constexpr uint64_t kNodeSalt = 0x3c6ef372fe94f82bULL;

}  // namespace

std::vector<ChunkSpan> CutIntoChunks(const std::vector<int64_t>& tensor_sizes,
                                     int64_t chunk_elems) {
  std::vector<ChunkSpan> chunks;
  if (chunk_elems <= 0) return chunks;
  for (size_t t = 0; t < tensor_sizes.size(); ++t) {
    const int64_t size = tensor_sizes[t];
    for (int64_t offset = 0; offset < size; offset += chunk_elems) {
      const int64_t remaining = size - offset;
      chunks.push_back({static_cast<int32_t>(t), offset,
                        remaining < chunk_elems ? remaining : chunk_elems});
    }
  }
  return chunks;
}

uint64_t ChunkKey(int32_t tensor_index, int64_t offset) {
  const uint64_t t = static_cast<uint32_t>(tensor_index);
  return SplitMix64(SplitMix64(t ^ kChunkSalt) ^ static_cast<uint64_t>(offset));
}

uint64_t ShardKey(int32_t shard_id) {
  const uint64_t s = static_cast<uint32_t>(shard_id);
  return SplitMix64(s ^ kShardSalt);
}

uint64_t RendezvousScore(uint64_t key, uint64_t node) {
  return SplitMix64(key ^ SplitMix64(node ^ kNodeSalt));
}

size_t RendezvousPick(uint64_t key, const std::vector<uint64_t>& nodes) {
  size_t best = 0;
  uint64_t best_score = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const uint64_t score = RendezvousScore(key, nodes[i]);
    if (i == 0 || score > best_score) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

std::vector<int32_t> AssignChunksToShards(const std::vector<ChunkSpan>& chunks,
                                          int32_t num_shards) {
  std::vector<int32_t> shard_of_chunk;
  if (num_shards <= 0) return shard_of_chunk;
  std::vector<uint64_t> shard_ids(num_shards);
  for (int32_t s = 0; s < num_shards; ++s) shard_ids[s] = s;
  shard_of_chunk.reserve(chunks.size());
  for (const ChunkSpan& chunk : chunks) {
    const uint64_t key = ChunkKey(chunk.tensor_index, chunk.offset);
    shard_of_chunk.push_back(
        static_cast<int32_t>(RendezvousPick(key, shard_ids)));
  }
  return shard_of_chunk;
}

std::vector<size_t> BalancedShardPlacement(int32_t num_shards, const std::vector<uint64_t>& server_ids) {
  std::vector<size_t> placement;
  if (num_shards <= 0 || server_ids.empty()) return placement;
  const size_t n = server_ids.size();
  const size_t low = static_cast<size_t>(num_shards) / n;
  const size_t extra = static_cast<size_t>(num_shards) % n;  // servers that get low + 1
  std::vector<size_t> load(n, 0);
  size_t at_high = 0;
  for (int32_t s = 0; s < num_shards; ++s) {
    size_t best = n;
    uint64_t best_score = 0;
    for (size_t i = 0; i < n; ++i) {
      bool eligible = load[i] < low || (load[i] == low && at_high < extra);
      if (!eligible) continue;
      uint64_t score = RendezvousScore(ShardKey(s), server_ids[i]);
      if (best == n || score > best_score) {
        best = i;
        best_score = score;
      }
    }
    if (++load[best] == low + 1) ++at_high;
    placement.push_back(best);
  }
  return placement;
}

std::vector<size_t> AssignShardsToServers(
    int32_t num_shards, const std::vector<uint64_t>& server_ids) {
  std::vector<size_t> server_of_shard;
  if (num_shards <= 0 || server_ids.empty()) return server_of_shard;
  server_of_shard.reserve(num_shards);
  for (int32_t s = 0; s < num_shards; ++s) {
    server_of_shard.push_back(RendezvousPick(ShardKey(s), server_ids));
  }
  return server_of_shard;
}

int32_t BucketOf(uint64_t key, int32_t buckets) {
  if (buckets <= 0) return 0;
  // The high half of mix * buckets: uniform over [0, buckets) without a division.
  const uint64_t mix = SplitMix64(key ^ kBucketSalt) >> 32;
  return static_cast<int32_t>((mix * static_cast<uint64_t>(buckets)) >> 32);
}

std::vector<int32_t> AssignBucketsToShards(int32_t buckets, int32_t num_shards) {
  std::vector<int32_t> shards;
  if (buckets <= 0 || num_shards <= 0) return shards;
  shards.reserve(buckets);
  for (int32_t b = 0; b < buckets; ++b) shards.push_back(b % num_shards);
  return shards;
}

}  // namespace fulcrum
