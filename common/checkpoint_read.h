// Reading one chunk of a stored checkpoint from the server that holds it,
// shared by servers restoring a checkpoint and `fulcrum export`.
#ifndef FULCRUM_COMMON_CHECKPOINT_READ_H_
#define FULCRUM_COMMON_CHECKPOINT_READ_H_

#include "absl/status/statusor.h"
#include "fulcrum/v1/parameter.grpc.pb.h"

namespace fulcrum {

// ReadCheckpoint of `request`'s chunk, every call within `timeout_seconds`.
// A table bucket's state comes in slices (a server answers at most 4 MiB of
// it a call, each read verified whole there); the answer's table_state holds
// all of it. The RPC's own errors as they come; DATA_LOSS when the slices
// stop short of the size the server gave.
absl::StatusOr<v1::ChunkState> ReadCheckpointChunkFrom(v1::ParameterService::Stub* stub,
                                                       v1::ReadCheckpointRequest request, double timeout_seconds);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_CHECKPOINT_READ_H_
