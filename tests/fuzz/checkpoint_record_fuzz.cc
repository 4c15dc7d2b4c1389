// libFuzzer: the checkpoint record reader, on what a disk (or a peer server's
// ReadCheckpoint) may hand it. Odd first byte: the input is a whole record
// (header, checksum, payload); even: a payload, sealed by the harness with a
// valid header and checksum so that the payload parser itself is reached.
// Properties: no crash, a clear error (DATA_LOSS / INVALID_ARGUMENT), and a
// record that decodes re-encodes to a record that decodes to the same state.
// A table bucket's state (common/table_state.h) is loaded into a table of
// rows of 8 floats (dim 4, Adagrad, admitAfter 3): a clear error and an
// empty table, or a table whose own state loads again into another with the
// same rows, and whose incremental capture on that state composes back to
// it. An incremental state (the changes since another checkpoint) is
// composed on a fixed base state first: a clear DATA_LOSS, or a whole state
// that is loaded as above.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/table_state.h"
#include "server/checkpoint_store.h"
#include "server/sparse_table.h"

namespace {

std::unique_ptr<fulcrum::SparseTable> NewTable() {
  fulcrum::SparseTableConfig config;
  config.name = "fuzzed";
  config.dim = 4;
  config.optimizer.kind = fulcrum::SparseOptimizerKind::kAdagrad;
  config.optimizer.lr = 0.1f;
  config.admit_after = 3;  // filter counts of 1 and 2 are valid
  config.memory_budget = 64 << 20;
  auto table = fulcrum::SparseTable::Create(config);
  if (!table.ok()) std::abort();
  return *std::move(table);
}

void LoadTableState(const std::string& state) {
  std::unique_ptr<fulcrum::SparseTable> table = NewTable();
  const absl::Status loaded = table->LoadState(state);
  if (!loaded.ok()) {
    if (!absl::IsDataLoss(loaded) && !absl::IsResourceExhausted(loaded)) std::abort();
    if (table->rows() != 0) std::abort();  // nothing kept
    return;
  }
  std::string saved;
  table->AppendState(&saved);
  std::unique_ptr<fulcrum::SparseTable> copy = NewTable();
  if (!copy->LoadState(saved).ok() || copy->rows() != table->rows()) std::abort();
  std::vector<uint64_t> keys;
  table->ForEachRow([&](uint64_t key, absl::Span<const float>) { keys.push_back(key); });
  std::vector<float> a(keys.size() * 4), b(keys.size() * 4);
  table->Pull(keys, a.data());
  copy->Pull(keys, b.data());
  // Bit for bit: a diverged row's NaN loads as it was.
  if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0) std::abort();
  // Unchanged since it was loaded: its incremental capture composes to it.
  table->MarkCheckpoint(1);
  std::string changes;
  if (table->AppendCheckpointState(2, 1, /*base_is_stored_here=*/true, &changes) != 1) std::abort();
  absl::StatusOr<std::string> composed = fulcrum::ComposeTableState(saved, changes, "fuzzed");
  if (!composed.ok() || *composed != saved) std::abort();
}

// The base the fuzzed incremental states are composed on: the seed's two
// rows (keys 11 and 2^63) and one filter count (key 99).
std::string FixedBase() {
  std::string base;
  fulcrum::AppendTableStateHeader(8, fulcrum::TableStateCounters{5, 2, 0}, 2, &base);
  const float first[8] = {0.1f, -0.2f, 0.3f, 0.0f, 0.5f, 0.5f, 0.5f, 0.5f};
  const float second[8] = {1.0f, 2.0f, 3.0f, 4.0f, 0.1f, 0.1f, 0.1f, 0.1f};
  fulcrum::AppendTableStateRow(11, 4, first, &base);
  fulcrum::AppendTableStateRow(uint64_t{1} << 63, 3, second, &base);
  fulcrum::AppendTableStateCandidates(1, &base);
  fulcrum::AppendTableStateCandidate(99, 1, 4, &base);
  return base;
}

void LoadStoredState(const std::string& state) {
  absl::StatusOr<int64_t> base = fulcrum::TableStateBase(state, "fuzzed");
  if (!base.ok()) {
    if (!absl::IsDataLoss(base.status())) std::abort();
    return;
  }
  if (*base == 0) {
    LoadTableState(state);
    return;
  }
  // Applied in place on a table holding the base (as a restore does): all or
  // nothing, and what it leaves is what the composition says.
  std::unique_ptr<fulcrum::SparseTable> applied = NewTable();
  if (!applied->LoadState(FixedBase()).ok()) std::abort();
  const absl::Status status = applied->ApplyChanges(state);
  if (!status.ok() && !absl::IsDataLoss(status) && !absl::IsResourceExhausted(status)) std::abort();
  if (!status.ok() && applied->rows() != 2) std::abort();  // the base as it was
  absl::StatusOr<std::string> whole = fulcrum::ComposeTableState(FixedBase(), state, "fuzzed");
  if (!whole.ok()) {
    if (!absl::IsDataLoss(whole.status())) std::abort();
    if (status.ok()) std::abort();  // applied what does not compose
    return;
  }
  if (whole->size() > FixedBase().size() + state.size()) std::abort();  // no more than the inputs hold
  std::unique_ptr<fulcrum::SparseTable> composed = NewTable();
  if (composed->LoadState(*whole).ok() && status.ok()) {
    std::vector<uint64_t> keys;
    composed->ForEachRow([&](uint64_t key, absl::Span<const float>) { keys.push_back(key); });
    std::vector<float> a(keys.size() * 4), b(keys.size() * 4);
    composed->Pull(keys, a.data());
    applied->Pull(keys, b.data());
    // Bit for bit: a diverged row's NaN is kept as it was.
    if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0 || composed->rows() != applied->rows()) {
      std::abort();
    }
  }
  LoadTableState(*whole);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string input(reinterpret_cast<const char*>(data + 1), size - 1);
  absl::StatusOr<fulcrum::ChunkSnapshot> snapshot =
      (data[0] & 1) != 0 ? fulcrum::DecodeChunkRecord(input) : fulcrum::DecodeChunkSnapshot(input);
  if (!snapshot.ok()) {
    const absl::StatusCode code = snapshot.status().code();
    if (code != absl::StatusCode::kDataLoss && code != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  uint32_t checksum = 0;
  const std::string record = fulcrum::EncodeChunkRecord(*snapshot, &checksum);
  absl::StatusOr<uint32_t> verified = fulcrum::VerifyChunkRecord(record);
  if (!verified.ok() || *verified != checksum) std::abort();
  absl::StatusOr<fulcrum::ChunkSnapshot> again = fulcrum::DecodeChunkRecord(record);
  if (!again.ok() || fulcrum::EncodeChunkSnapshot(*again) != fulcrum::EncodeChunkSnapshot(*snapshot)) std::abort();
  if (!snapshot->table_state.empty()) LoadStoredState(snapshot->table_state);
  return 0;
}
