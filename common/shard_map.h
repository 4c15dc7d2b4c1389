// Placement of dense tensors onto parameter-server shards and of shards onto
// servers.
//
// Dense tensors are cut into fixed-size chunks. Each chunk is mapped to one of
// `num_shards` shards and each shard to a server, both by rendezvous
// (highest-random-weight) hashing: an item goes to the candidate with the
// highest Mix(item_key, candidate_id). Rendezvous hashing needs no ring or
// virtual nodes, balances well with a good mixer, and moves the minimum
// number of items when the candidate set changes:
//   * adding a candidate moves only the items that now pick the new one
//     (about 1/(N+1) of them);
//   * removing a candidate moves only the items it held.
// All functions are pure and deterministic across processes, builds and
// platforms (integer arithmetic only).

#ifndef FULCRUM_COMMON_SHARD_MAP_H_
#define FULCRUM_COMMON_SHARD_MAP_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fulcrum {

// A contiguous run of elements of one dense tensor.
struct ChunkSpan {
  int32_t tensor_index;  // Index into the tensor list given to CutIntoChunks.
  int64_t offset;        // First element, in elements.
  int64_t length;        // Number of elements, in [1, chunk_elems].
};

// Cuts tensors (sizes in elements) into chunks of at most `chunk_elems`
// elements, ordered by tensor index, then by offset. Each tensor of size S
// yields ceil(S / chunk_elems) chunks; all but its last are exactly
// chunk_elems long. Every element is covered by exactly one chunk. Tensors of
// size <= 0 yield no chunks. Precondition: chunk_elems > 0; if violated, the
// result is empty.
std::vector<ChunkSpan> CutIntoChunks(const std::vector<int64_t>& tensor_sizes,
                                     int64_t chunk_elems);

// Stable 64-bit key of a chunk, derived only from its job-independent
// identity (tensor index and element offset), so a chunk keeps its key across
// restarts and as long as the chunk size and tensor list are unchanged.
uint64_t ChunkKey(int32_t tensor_index, int64_t offset);

// Stable 64-bit key of a shard id, used as the item key when placing shards on
// servers.
uint64_t ShardKey(int32_t shard_id);

// Rendezvous weight of `key` on candidate `node`: a splitmix64-based mix of
// both, so that for a fixed key the weights of distinct nodes behave like
// independent uniform draws.
uint64_t RendezvousScore(uint64_t key, uint64_t node);

// Rendezvous hashing: returns the index into `nodes` of the node with the
// highest RendezvousScore(key, node); ties (only possible for duplicate node
// ids, or with negligible probability otherwise) go to the lowest index.
// Precondition: `nodes` is non-empty; if violated, returns 0.
size_t RendezvousPick(uint64_t key, const std::vector<uint64_t>& nodes);

// Assigns each chunk to one of `num_shards` shards by rendezvous hashing of
// ChunkKey over shard ids 0..num_shards-1. Returns one shard index per chunk,
// in chunk order. Growing num_shards from S to S+1 moves only chunks that now
// land on shard S. Precondition: num_shards > 0; if violated, returns an
// empty vector.
std::vector<int32_t> AssignChunksToShards(const std::vector<ChunkSpan>& chunks,
                                          int32_t num_shards);

// Assigns each shard 0..num_shards-1 to a server by rendezvous hashing of
// ShardKey over `server_ids` (stable ids, e.g. from registration; not
// positions). Returns, per shard, an index into `server_ids`. Precondition:
// `server_ids` non-empty; if violated (or num_shards <= 0), returns an empty
// vector.
// Like AssignShardsToServers, but with bounded loads: every server gets
// floor or ceil of num_shards / servers shards. Shard s takes, among the
// servers still below that bound, the one rendezvous hashing ranks highest,
// so placements stay mostly stable as servers come and go. Used for the
// shard map, where one shard per server is the default and must not put two
// shards on one server.
std::vector<size_t> BalancedShardPlacement(int32_t num_shards, const std::vector<uint64_t>& server_ids);

std::vector<size_t> AssignShardsToServers(
    int32_t num_shards, const std::vector<uint64_t>& server_ids);

// Sparse tables: the bucket in [0, buckets) of a key (a mix of the key, so
// that consecutive or patterned ids spread evenly), and the shard of each
// bucket: bucket b on shard b mod num_shards, which balances any count.
// Preconditions: buckets > 0, num_shards > 0 (else 0 / empty).
int32_t BucketOf(uint64_t key, int32_t buckets);
std::vector<int32_t> AssignBucketsToShards(int32_t buckets, int32_t num_shards);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_SHARD_MAP_H_
