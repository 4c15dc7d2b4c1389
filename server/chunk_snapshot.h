// A chunk's whole state as checkpoints and restores move it: a dense
// chunk's values and optimizer state, or one table bucket's rows. No gRPC
// here.
#ifndef FULCRUM_SERVER_CHUNK_SNAPSHOT_H_
#define FULCRUM_SERVER_CHUNK_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fulcrum {

// LAMB: the squared norms of the last step a chunk applied (step -1: none).
struct LambLastNorms {
  int64_t step = -1;
  double weight_sq = 0;
  double update_sq = 0;
};

// Everything a replica of a chunk holds: what a new backup copies from the
// primary before it joins the replica group.
struct ChunkSnapshot {
  std::vector<float> values;
  std::vector<std::vector<float>> optimizer_state;
  int64_t version = 0;
  std::vector<std::vector<float>> pending;  // BSP: this step's gradients by partition
  // BSP: the values at version - 1 (empty before the first step, and in
  // checkpoints, which never need them).
  std::vector<float> previous_values;
  std::vector<std::pair<std::string, int64_t>> watermarks;
  std::vector<int64_t> partition_steps;
  // Examples behind the accepted gradients, and the sum of their digests.
  int64_t examples_seen = 0;
  uint64_t examples_digest = 0;
  LambLastNorms lamb_last;
  // A table bucket's checkpoint (SparseTable::AppendState); empty for a
  // dense chunk.
  std::string table_state;
  // A table bucket's checkpoint that is incremental (only what changed
  // since an earlier checkpoint of the job): that checkpoint's id; 0 for a
  // whole state.
  int64_t table_base = 0;
  // A live capture of a bucket or a shard's tables: the changes of its
  // shard's rows on the server so far (SparseShard::CaptureShardState).
  int64_t table_changes = 0;
};

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_CHUNK_SNAPSHOT_H_
