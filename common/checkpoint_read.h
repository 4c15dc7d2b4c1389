// Reading one chunk's state whose table state comes in slices: a stored
// checkpoint's chunk (servers restoring a checkpoint, `fulcrum export
// --checkpoint`) or a live table bucket (`fulcrum export`).
#ifndef FULCRUM_COMMON_CHECKPOINT_READ_H_
#define FULCRUM_COMMON_CHECKPOINT_READ_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fulcrum/v1/parameter.grpc.pb.h"

namespace fulcrum {

// Reads chunk `chunk_id` slice by slice: `read(offset, capture)` answers the
// slice of the table state at `offset`, of the capture the first answer
// named (0 before it). The answer's table_state holds all of it. read's
// errors as they come; DATA_LOSS when the slices do not add up: an empty
// slice short of the size, more bytes than the size, or a size or capture
// that changes between slices.
absl::StatusOr<v1::ChunkState> ReadSlicedChunk(
    int32_t chunk_id, const std::function<absl::StatusOr<v1::ChunkState>(int64_t offset, uint64_t capture)>& read);

// ReadCheckpoint of `request`'s chunk, every call within `timeout_seconds`.
// A table bucket's state comes in slices (a server answers at most 4 MiB of
// it a call, each read verified whole there); ReadSlicedChunk's errors.
absl::StatusOr<v1::ChunkState> ReadCheckpointChunkFrom(v1::ParameterService::Stub* stub,
                                                       v1::ReadCheckpointRequest request, double timeout_seconds);

// Each chunk's partition_steps in a CheckpointResponse, in its order: its
// own, or with same_partition_steps those of the chunk before it (empty for
// a first chunk that says so).
std::vector<const google::protobuf::RepeatedField<int64_t>*> PartitionStepsOf(
    const v1::CheckpointResponse& response);

// The longest chain of incremental table checkpoints a reader follows
// (CheckpointSpec.full_every is at most 64).
constexpr int kMaxCheckpointChain = 64;

// One link of a bucket's chain of checkpoints: the checkpoint and its
// manifest entry of the bucket.
struct TableLink {
  int64_t checkpoint_id = 0;
  const v1::CheckpointChunk* entry = nullptr;
};
// The links of the chain a bucket's entry `chunk` (of checkpoint
// `checkpoint_id`) names, newest first: itself, then its `base` entry, ...,
// down to the one stored whole (base_checkpoint_id 0). DATA_LOSS for an
// entry naming a base without its entry (or of another chunk), or more
// than kMaxCheckpointChain links below the first.
absl::StatusOr<std::vector<TableLink>> TableChainOf(int64_t checkpoint_id, const v1::CheckpointChunk& chunk);
// DATA_LOSS unless a link's stored table state is what its entry says:
// incremental on entry->base_checkpoint_id(), or whole when that is 0.
absl::Status CheckTableLink(absl::string_view state, const TableLink& link);

// Walks the chain of stored table states behind a bucket's checkpoint entry
// `chunk` (of checkpoint `checkpoint_id`), whose stored table state
// `newest` the caller has read: each link below it is read with
// `read_base(checkpoint_id, entry)` (its manifest entry), from the chain's
// whole end up, and handed to `use(state, whole)` as soon as it is read,
// one in memory at a time; `newest` last. Every state is checked against
// its entry (CheckTableLink). TableChainOf's and read_base's errors (these
// naming the checkpoint), use's as they are.
using ReadTableState =
    std::function<absl::StatusOr<std::string>(int64_t checkpoint_id, const v1::CheckpointChunk& entry)>;
absl::Status ReplayTableChain(std::string newest, int64_t checkpoint_id, const v1::CheckpointChunk& chunk,
                              const ReadTableState& read_base,
                              const std::function<absl::Status(std::string state, bool whole)>& use);
// The chain composed into the whole state of `chunk` (ReplayTableChain and
// ComposeTableState, whose errors it returns).
absl::StatusOr<std::string> WholeTableState(std::string state, const v1::CheckpointChunk& chunk,
                                            const ReadTableState& read_base);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_CHECKPOINT_READ_H_
