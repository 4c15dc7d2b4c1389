#include "common/table_state.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace fulcrum {
namespace {

constexpr int32_t kStride = 2;

struct Row {
  uint64_t key;
  int64_t step;
  std::vector<float> floats;
};

std::string Whole(const std::vector<Row>& rows, TableStateCounters counters = {3, 4, 5}) {
  std::string out;
  AppendTableStateHeader(kStride, counters, rows.size(), &out);
  for (const Row& row : rows) AppendTableStateRow(row.key, row.step, row.floats, &out);
  AppendTableStateCandidates(1, &out);
  AppendTableStateCandidate(99, 1, 7, &out);
  return out;
}

// Rows changed (with their values) or as in the base (floats empty).
std::string Delta(int64_t base, const std::vector<Row>& rows, TableStateCounters counters = {3, 4, 5}) {
  std::string out;
  AppendTableDeltaHeader(base, kStride, counters, rows.size(), &out);
  for (const Row& row : rows) {
    if (row.floats.empty()) {
      AppendTableDeltaSame(row.key, &out);
    } else {
      AppendTableDeltaRow(row.key, row.step, row.floats, &out);
    }
  }
  AppendTableStateCandidates(1, &out);
  AppendTableStateCandidate(99, 1, 7, &out);
  return out;
}

TEST(TableStateTest, AnIncrementalStateOnItsBaseIsTheWholeStateOfItsTime) {
  const std::string base = Whole({{1, 10, {1, 2}}, {2, 11, {3, 4}}, {3, 12, {5, 6}}});
  // Key 2 expired, key 3 moved into its place and changed, key 4 is new.
  const std::string delta = Delta(7, {{1, 0, {}}, {3, 20, {7, 8}}, {4, 21, {9, 10}}}, {6, 7, 8});
  absl::StatusOr<std::string> whole = ComposeTableState(base, delta, "t");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(*whole, Whole({{1, 10, {1, 2}}, {3, 20, {7, 8}}, {4, 21, {9, 10}}}, {6, 7, 8}));
  EXPECT_LT(Delta(7, {{1, 0, {}}, {2, 0, {}}, {3, 0, {}}}).size(), base.size());
}

TEST(TableStateTest, TheBaseOfAStateIsZeroForAWholeOne) {
  EXPECT_EQ(*TableStateBase(Whole({}), "t"), 0);
  EXPECT_EQ(*TableStateBase(Delta(42, {}), "t"), 42);
  EXPECT_EQ(TableStateBase("ab", "t").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(TableStateBase(Delta(0, {}), "t").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(TableStateBase(Delta(42, {}).substr(0, 8), "t").status().code(), absl::StatusCode::kDataLoss);
}

TEST(TableStateTest, AnIncrementalStateIsNotReadAsAWholeOne) {
  TableStateVisitor visit;
  visit.begin = [](uint64_t, const TableStateCounters&) { return absl::OkStatus(); };
  visit.row = [](uint64_t, int64_t, absl::Span<const float>) { return absl::OkStatus(); };
  absl::Status parsed = ParseTableState(Delta(3, {{1, 5, {1, 2}}}), "t", kStride, visit);
  EXPECT_EQ(parsed.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(parsed.message().find("incremental"), std::string::npos) << parsed;
}

TEST(TableStateTest, CompositionsThatDoNotFitAreDataLossNamingTheFault) {
  const std::string base = Whole({{1, 10, {1, 2}}, {2, 11, {3, 4}}});
  const struct {
    std::string base, delta, says;
  } cases[] = {
      {base, Delta(7, {{5, 0, {}}}), "key 5"},                          // "as in the base", which lacks it
      {base, Delta(7, {{1, 0, {}}, {1, 0, {}}}), "listed twice"},       // a key twice
      {base, Whole({}), "not an incremental"},                          // not a delta
      {Delta(3, {}), Delta(7, {}), "itself incremental"},               // a delta on a delta
      {base, Delta(7, {{1, 0, {}}}) + "x", "unexpected bytes"},         // trailing
      {base + "x", Delta(7, {{1, 0, {}}}), "unexpected bytes"},         // trailing base
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::string> whole = ComposeTableState(c.base, c.delta, "t");
    EXPECT_EQ(whole.status().code(), absl::StatusCode::kDataLoss) << c.says;
    EXPECT_NE(whole.status().message().find(c.says), std::string::npos) << whole.status();
  }
  // Rows of another width.
  std::string wide;
  AppendTableDeltaHeader(7, kStride + 1, {}, 0, &wide);
  AppendTableStateCandidates(0, &wide);
  EXPECT_EQ(ComposeTableState(base, wide, "t").status().code(), absl::StatusCode::kDataLoss);
  // A row flag other than 0 or 1.
  std::string flagged = Delta(7, {{1, 0, {}}});
  flagged[48 + 8] = 2;  // after the mark, base, width, counters, row count (48 bytes) and the first key
  absl::StatusOr<std::string> bad_flag = ComposeTableState(base, flagged, "t");
  EXPECT_EQ(bad_flag.status().code(), absl::StatusCode::kDataLoss);
  // Every truncation of either input.
  const std::string delta = Delta(7, {{1, 0, {}}, {3, 20, {7, 8}}});
  ASSERT_TRUE(ComposeTableState(base, delta, "t").ok());
  for (size_t n = 0; n < delta.size(); ++n) {
    EXPECT_EQ(ComposeTableState(base, delta.substr(0, n), "t").status().code(), absl::StatusCode::kDataLoss) << n;
  }
  for (size_t n = 0; n < base.size(); ++n) {
    EXPECT_EQ(ComposeTableState(base.substr(0, n), delta, "t").status().code(), absl::StatusCode::kDataLoss) << n;
  }
}

TEST(TableStateTest, ARowCountBeyondTheBytesIsRefusedBeforeAnyAllocation) {
  std::string delta;
  AppendTableDeltaHeader(7, kStride, {}, uint64_t{1} << 60, &delta);
  absl::StatusOr<std::string> whole = ComposeTableState(Whole({}), delta, "t");
  EXPECT_EQ(whole.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(whole.status().message().find("claims"), std::string::npos) << whole.status();
}

}  // namespace
}  // namespace fulcrum
