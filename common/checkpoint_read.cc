#include "common/checkpoint_read.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc.h"

namespace fulcrum {

absl::StatusOr<v1::ChunkState> ReadSlicedChunk(
    int32_t chunk_id, const std::function<absl::StatusOr<v1::ChunkState>(int64_t offset, uint64_t capture)>& read) {
  std::string table_state;
  int64_t size = -1;
  uint64_t capture = 0;
  for (;;) {
    const auto have = static_cast<int64_t>(table_state.size());
    absl::StatusOr<v1::ChunkState> state = read(have, capture);
    if (!state.ok()) return state.status();
    if (size >= 0 && (state->table_state_size() != size || state->capture() != capture)) {
      return absl::DataLossError(absl::StrCat("chunk ", chunk_id, ": a later slice is of another state (",
                                              state->table_state_size(), " bytes, capture ", state->capture(),
                                              ") than the first (", size, " bytes, capture ", capture, ")"));
    }
    size = state->table_state_size();
    capture = state->capture();
    if (have + static_cast<int64_t>(state->table_state().size()) > size) {
      return absl::DataLossError(absl::StrCat("chunk ", chunk_id, ": the table state runs past its ", size,
                                              " bytes"));
    }
    table_state.append(state->table_state());
    if (static_cast<int64_t>(table_state.size()) >= size) {
      state->set_table_state(std::move(table_state));
      return state;
    }
    if (state->table_state().empty()) {
      return absl::DataLossError(absl::StrCat("chunk ", chunk_id, ": the table state stops at ", have, " of its ",
                                              size, " bytes"));
    }
  }
}

absl::StatusOr<v1::ChunkState> ReadCheckpointChunkFrom(v1::ParameterService::Stub* stub,
                                                       v1::ReadCheckpointRequest request, double timeout_seconds) {
  return ReadSlicedChunk(request.chunk_id(), [&](int64_t offset, uint64_t) -> absl::StatusOr<v1::ChunkState> {
    request.set_table_state_offset(offset);
    v1::ChunkState state;
    grpc::ClientContext context;
    SetDeadline(&context, timeout_seconds);
    absl::Status status = FromGrpcStatus(stub->ReadCheckpoint(&context, request, &state));
    if (!status.ok()) return status;
    return state;
  });
}

}  // namespace fulcrum
