#include "common/checkpoint_read.h"

#include <string>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/table_state.h"

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

std::vector<const google::protobuf::RepeatedField<int64_t>*> PartitionStepsOf(
    const v1::CheckpointResponse& response) {
  static const google::protobuf::RepeatedField<int64_t> kNone;
  std::vector<const google::protobuf::RepeatedField<int64_t>*> steps;
  steps.reserve(static_cast<size_t>(response.chunks_size()));
  for (const v1::CheckpointChunk& chunk : response.chunks()) {
    const bool same = chunk.same_partition_steps();
    steps.push_back(same ? (steps.empty() ? &kNone : steps.back()) : &chunk.partition_steps());
  }
  return steps;
}

absl::StatusOr<std::vector<TableLink>> TableChainOf(int64_t checkpoint_id, const v1::CheckpointChunk& chunk) {
  std::vector<TableLink> links = {{checkpoint_id, &chunk}};
  while (links.back().entry->base_checkpoint_id() != 0) {
    const v1::CheckpointChunk& entry = *links.back().entry;
    if (!entry.has_base() || entry.base().chunk_id() != chunk.chunk_id()) {
      return absl::DataLossError(absl::StrCat("bucket chunk ", chunk.chunk_id(), ": the entry of checkpoint ",
                                              links.back().checkpoint_id, " names checkpoint ",
                                              entry.base_checkpoint_id(), " as its base but not its entry there"));
    }
    if (links.size() > static_cast<size_t>(kMaxCheckpointChain)) {
      return absl::DataLossError(absl::StrCat("bucket chunk ", chunk.chunk_id(), ": a chain of more than ",
                                              kMaxCheckpointChain, " incremental checkpoints"));
    }
    links.push_back({entry.base_checkpoint_id(), &entry.base()});
  }
  return links;
}

absl::Status CheckTableLink(absl::string_view state, const TableLink& link) {
  const std::string name = absl::StrCat("bucket chunk ", link.entry->chunk_id(), " of checkpoint ", link.checkpoint_id);
  ASSIGN_OR_RETURN(const int64_t base, TableStateBase(state, name));
  if (base == link.entry->base_checkpoint_id()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(name, " is stored ",
                                          base == 0 ? std::string("whole")
                                                    : absl::StrCat("as the changes since checkpoint ", base),
                                          " but its manifest entry says ",
                                          link.entry->base_checkpoint_id() == 0
                                              ? std::string("whole")
                                              : absl::StrCat("on checkpoint ", link.entry->base_checkpoint_id())));
}

absl::Status ReplayTableChain(std::string newest, int64_t checkpoint_id, const v1::CheckpointChunk& chunk,
                              const ReadTableState& read_base,
                              const std::function<absl::Status(std::string state, bool whole)>& use) {
  ASSIGN_OR_RETURN(const std::vector<TableLink> links, TableChainOf(checkpoint_id, chunk));
  RETURN_IF_ERROR(CheckTableLink(newest, links.front()));
  for (size_t i = links.size(); i-- > 1;) {
    absl::StatusOr<std::string> read = read_base(links[i].checkpoint_id, *links[i].entry);
    if (!read.ok()) {
      return absl::Status(read.status().code(),
                          absl::StrCat("bucket chunk ", chunk.chunk_id(), ": reading its base, checkpoint ",
                                       links[i].checkpoint_id, ": ", read.status().message()));
    }
    RETURN_IF_ERROR(CheckTableLink(*read, links[i]));
    RETURN_IF_ERROR(use(*std::move(read), i == links.size() - 1));
  }
  return use(std::move(newest), links.size() == 1);
}

absl::StatusOr<std::string> WholeTableState(std::string state, const v1::CheckpointChunk& chunk,
                                            const ReadTableState& read_base) {
  const std::string name = absl::StrCat("bucket chunk ", chunk.chunk_id());
  std::string whole;
  RETURN_IF_ERROR(ReplayTableChain(std::move(state), 0, chunk, read_base,
                                   [&](std::string link, bool is_whole) -> absl::Status {
                                     if (is_whole) {
                                       whole = std::move(link);
                                     } else {
                                       ASSIGN_OR_RETURN(whole, ComposeTableState(whole, link, name));
                                     }
                                     return absl::OkStatus();
                                   }));
  return whole;
}

}  // namespace fulcrum
