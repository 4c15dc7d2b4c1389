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
#ifndef FULCRUM_COMMON_TABLE_STATE_H_
#define FULCRUM_COMMON_TABLE_STATE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
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
  // Per row: its key, last step and floats (finite, `stride` of them).
  std::function<absl::Status(uint64_t key, int64_t last_step, absl::Span<const float> floats)> row;
  // Per frequency-filter count (may be null: skipped).
  std::function<absl::Status(uint64_t key, int32_t count, int64_t last_step)> candidate;
};

// Writing, in the layout's order: the header (with the row count), each
// row (`floats`: its stride of them), then the filter counts' number and
// each count.
void AppendTableStateHeader(int32_t stride, const TableStateCounters& counters, uint64_t rows, std::string* out);
void AppendTableStateRow(uint64_t key, int64_t last_step, absl::Span<const float> floats, std::string* out);
void AppendTableStateCandidates(uint64_t candidates, std::string* out);
void AppendTableStateCandidate(uint64_t key, int32_t count, int64_t last_step, std::string* out);

// Reads a table state whose rows must be `stride` floats. DATA_LOSS naming
// `table`, the field and the offset for bytes that are truncated or
// trailing, of another row width, with a count larger than the bytes left or
// a non-finite float.
absl::Status ParseTableState(absl::string_view bytes, const std::string& table, int32_t stride,
                             const TableStateVisitor& visit);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_TABLE_STATE_H_
