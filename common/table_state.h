// The bytes of one sparse table bucket's state, as checkpoints hold it
// (server/sparse_table.h SparseTable::AppendState writes it with the
// functions below), and their reader, shared by the servers (restores) and `fulcrum export`.
//
// Layout, all little-endian:
//   u32 floats per row (dim x (1 + optimizer state slots)),
//   i64 pushes, i64 admissions, i64 expiries,
//   u64 rows, then per row: u64 key, i64 last pushed step, the row's floats
//     (its dim values, then each state slot's dim floats);
//   u64 filter counts, then per count: u64 key, i32 count, i64 last step.
//
// An incremental state (a checkpoint of the bucket's changes since an
// earlier checkpoint of the same job, its base) differs in its header and
// rows:
//   u32 0xFFFFFFFF (kTableDeltaMark: no row is that wide), i64 base
//   checkpoint id (> 0), then the header above (floats per row, counters,
//   rows), then per row, in the table's order: u64 key, u8 1 followed by the
//   i64 last pushed step and floats of a row changed since the base, or u8 0
//   for a row as the base holds it; then the filter counts, whole.
// ComposeTableState turns a base (whole) and an incremental state into the
// whole state the table had when the incremental one was taken, byte for
// byte what AppendTableState* would have written then.
#ifndef FULCRUM_COMMON_TABLE_STATE_H_
#define FULCRUM_COMMON_TABLE_STATE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace fulcrum {

struct TableStateCounters {
  int64_t pushes = 0;
  int64_t admissions = 0;
  int64_t expiries = 0;
};

// What ParseTableState calls, in the order of the bytes. A callback's error
// stops the parse and is returned as it is.
struct TableStateVisitor {
  // Once, with the row count (checked against the bytes left) and counters.
  std::function<absl::Status(uint64_t rows, const TableStateCounters&)> begin;
  // Per row: its key, last step and floats (`stride` of them, as stored:
  // a diverged row's may be non-finite).
  std::function<absl::Status(uint64_t key, int64_t last_step, absl::Span<const float> floats)> row;
  // Per frequency-filter count (may be null: skipped).
  std::function<absl::Status(uint64_t key, int32_t count, int64_t last_step)> candidate;
  // Per row of an incremental state that is as its base holds it (`row` is
  // called for the changed ones). Null: an incremental state is refused.
  std::function<absl::Status(uint64_t key)> same;
};

// Writing, in the layout's order: the header (with the row count), each
// row (`floats`: its stride of them), then the filter counts' number and
// each count.
void AppendTableStateHeader(int32_t stride, const TableStateCounters& counters, uint64_t rows, std::string* out);
void AppendTableStateRow(uint64_t key, int64_t last_step, absl::Span<const float> floats, std::string* out);
void AppendTableStateCandidates(uint64_t candidates, std::string* out);
void AppendTableStateCandidate(uint64_t key, int32_t count, int64_t last_step, std::string* out);

constexpr uint32_t kTableDeltaMark = 0xFFFFFFFFu;

// An incremental state: its mark, base and the header of a whole one, then
// per row AppendTableDeltaRow (changed: with its step and floats) or
// AppendTableDeltaSame; then the filter counts as in a whole state.
void AppendTableDeltaHeader(int64_t base_checkpoint_id, int32_t stride, const TableStateCounters& counters,
                            uint64_t rows, std::string* out);
void AppendTableDeltaRow(uint64_t key, int64_t last_step, absl::Span<const float> floats, std::string* out);
void AppendTableDeltaSame(uint64_t key, std::string* out);

// The base checkpoint id of an incremental state; 0 for a whole one.
// DATA_LOSS naming `table` for bytes too short to say, or an incremental
// state whose base is not positive.
absl::StatusOr<int64_t> TableStateBase(absl::string_view bytes, const std::string& table);

// The whole state of `delta` (incremental) applied on `base` (whole).
// DATA_LOSS naming `table` for either one truncated, trailing or malformed,
// rows of different widths, a row "as in the base" that the base does not
// hold or that is named twice. Never allocates more than the two inputs
// could hold. (A key written out twice is refused by the reader of the
// whole state, SparseTable::LoadState.)
absl::StatusOr<std::string> ComposeTableState(absl::string_view base, absl::string_view delta,
                                              const std::string& table);

// Reads a table state whose rows must be `stride` floats (an incremental
// one only with visit.same). DATA_LOSS naming `table`, the field and the
// offset for bytes that are truncated or trailing, of another row width,
// with a count larger than the bytes left, or a step or counter outside
// what a table keeps (kMaxSparseStep; counters in [0, 2^62]).
absl::Status ParseTableState(absl::string_view bytes, const std::string& table, int32_t stride,
                             const TableStateVisitor& visit);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_TABLE_STATE_H_
