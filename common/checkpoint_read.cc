#include "common/checkpoint_read.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc.h"

namespace fulcrum {

absl::StatusOr<v1::ChunkState> ReadCheckpointChunkFrom(v1::ParameterService::Stub* stub,
                                                       v1::ReadCheckpointRequest request, double timeout_seconds) {
  std::string table_state;
  request.set_table_state_offset(0);
  for (;;) {
    v1::ChunkState state;
    grpc::ClientContext context;
    SetDeadline(&context, timeout_seconds);
    absl::Status status = FromGrpcStatus(stub->ReadCheckpoint(&context, request, &state));
    if (!status.ok()) return status;
    table_state.append(state.table_state());
    const auto have = static_cast<int64_t>(table_state.size());
    if (have >= state.table_state_size()) {
      state.set_table_state(std::move(table_state));
      return state;
    }
    if (state.table_state().empty()) {
      return absl::DataLossError(absl::StrCat("chunk ", request.chunk_id(), ": the table state stops at ", have,
                                              " of its ", state.table_state_size(), " bytes"));
    }
    request.set_table_state_offset(have);
  }
}

}  // namespace fulcrum
