#include "server/sparse_table.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/param_init.h"
#include "common/table_state.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

SparseTableConfig Table(SparseOptimizerKind kind, int32_t dim = 4) {
  SparseTableConfig config;
  config.name = "emb";
  config.dim = dim;
  config.optimizer.kind = kind;
  config.optimizer.lr = 0.1f;
  config.init = kind == SparseOptimizerKind::kFtrl ? InitKind::kZeros : InitKind::kUniform;
  config.init_scale = 0.05f;
  config.seed = 42;
  config.table_index = 1;
  return config;
}

std::unique_ptr<SparseTable> Make(const SparseTableConfig& config) {
  auto table = SparseTable::Create(config);
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? *std::move(table) : nullptr;
}

std::vector<float> PullOne(const SparseTable& table, uint64_t key) {
  std::vector<float> row(static_cast<size_t>(table.config().dim));
  table.Pull({key}, row.data());
  return row;
}

TEST(SparseTableTest, KeysWithoutARowReadAsTheirInitialValuesTheSameOnEveryServer) {
  auto a = Make(Table(SparseOptimizerKind::kSgd));
  auto b = Make(Table(SparseOptimizerKind::kSgd));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<uint64_t> keys = {0, 1, 7, 123456789012345ULL, std::numeric_limits<uint64_t>::max()};
  std::vector<float> from_a(keys.size() * 4), from_b(keys.size() * 4);
  a->Pull(keys, from_a.data());
  b->Pull(keys, from_b.data());
  EXPECT_EQ(from_a, from_b);
  std::set<float> distinct(from_a.begin(), from_a.end());
  EXPECT_EQ(distinct.size(), from_a.size()) << "every key and element its own value";
  for (float v : from_a) EXPECT_LE(std::fabs(v), 0.05f);
  EXPECT_EQ(a->rows(), 0) << "pulls create no rows";
  // Another table of the job starts its keys elsewhere.
  SparseTableConfig other = Table(SparseOptimizerKind::kSgd);
  other.table_index = 2;
  EXPECT_NE(PullOne(*Make(other), 7), PullOne(*a, 7));
}

TEST(SparseTableTest, SgdCreatesRowsOnFirstPushAndAppliesEachPush) {
  auto table = Make(Table(SparseOptimizerKind::kSgd));
  ASSERT_NE(table, nullptr);
  const std::vector<float> init5 = PullOne(*table, 5), init9 = PullOne(*table, 9);
  const std::vector<float> grads = {1, 2, 3, 4, -1, -2, -3, -4};
  ASSERT_TRUE(table->Push(1, {5, 9}, grads.data()).ok());
  EXPECT_EQ(table->rows(), 2);
  EXPECT_EQ(table->admissions(), 2);
  std::vector<float> expected5 = init5, expected9 = init9;
  for (int j = 0; j < 4; ++j) {
    expected5[j] -= 0.1f * grads[j];
    expected9[j] -= 0.1f * grads[4 + j];
  }
  EXPECT_EQ(PullOne(*table, 5), expected5);
  EXPECT_EQ(PullOne(*table, 9), expected9);
  ASSERT_TRUE(table->Push(2, {5}, grads.data()).ok());
  for (int j = 0; j < 4; ++j) expected5[j] -= 0.1f * grads[j];
  EXPECT_EQ(PullOne(*table, 5), expected5);
  EXPECT_EQ(PullOne(*table, 9), expected9);
  EXPECT_EQ(table->rows(), 2);
}

// The sparse optimizers against the update rules worked by hand, one
// coordinate over three pushes.
TEST(SparseTableTest, SparseOptimizersFollowTheirRulesExactly) {
  const std::vector<float> g = {0.5f, -2.0f, 1.0f};
  {  // Adagrad: s += g^2; w -= lr * (g / (sqrt(s) + eps)).
    SparseTableConfig config = Table(SparseOptimizerKind::kAdagrad, 1);
    config.optimizer.initial_accumulator = 0.1f;
    config.optimizer.epsilon = 1e-10f;
    auto table = Make(config);
    float w = PullOne(*table, 3)[0], s = 0.1f;
    for (size_t t = 0; t < g.size(); ++t) {
      ASSERT_TRUE(table->Push(static_cast<int64_t>(t), {3}, &g[t]).ok());
      s += g[t] * g[t];
      w -= 0.1f * (g[t] / (std::sqrt(s) + 1e-10f));
      EXPECT_EQ(PullOne(*table, 3)[0], w) << "push " << t;
    }
  }
  {  // FTRL-proximal, alpha = lr = 0.1, beta = 1, l1 = 0.3, l2 = 0.01, from zero.
    SparseTableConfig config = Table(SparseOptimizerKind::kFtrl, 1);
    config.optimizer.l1 = 0.3f;
    config.optimizer.l2 = 0.01f;
    config.optimizer.beta = 1.0f;
    auto table = Make(config);
    EXPECT_EQ(PullOne(*table, 3)[0], 0.0f);
    // Push 1: n = 0.25, sigma = 0.5 / 0.1 = 5, z = 0.5 - 5 * 0 = 0.5; |z| > l1:
    // w = -(0.5 - 0.3) / ((1 + 0.5) / 0.1 + 0.01) = -0.2 / 15.01.
    ASSERT_TRUE(table->Push(0, {3}, &g[0]).ok());
    EXPECT_FLOAT_EQ(PullOne(*table, 3)[0], -0.2f / 15.01f);
    float z = 0.5f, n = 0.25f, w = PullOne(*table, 3)[0];
    for (size_t t = 1; t < g.size(); ++t) {
      ASSERT_TRUE(table->Push(static_cast<int64_t>(t), {3}, &g[t]).ok());
      const float n_new = n + g[t] * g[t];
      const float sigma = (std::sqrt(n_new) - std::sqrt(n)) / 0.1f;
      z += g[t] - sigma * w;
      n = n_new;
      w = std::fabs(z) <= 0.3f ? 0.0f : -(z - std::copysign(0.3f, z)) / ((1.0f + std::sqrt(n)) / 0.1f + 0.01f);
      EXPECT_EQ(PullOne(*table, 3)[0], w) << "push " << t;
    }
    // A gradient that leaves |z| within l1 gives exactly zero.
    SparseTableConfig sparse = config;
    sparse.optimizer.l1 = 10.0f;
    auto zeroed = Make(sparse);
    ASSERT_TRUE(zeroed->Push(0, {3}, &g[1]).ok());
    EXPECT_EQ(PullOne(*zeroed, 3)[0], 0.0f);
  }
  {  // Lazy Adam (PyTorch SparseAdam's arithmetic), t = the table's pushes.
    SparseTableConfig config = Table(SparseOptimizerKind::kAdam, 1);
    config.optimizer.epsilon = 1e-8f;
    auto table = Make(config);
    float w = PullOne(*table, 3)[0], m = 0, v = 0;
    for (size_t t = 0; t < g.size(); ++t) {
      ASSERT_TRUE(table->Push(static_cast<int64_t>(t), {3}, &g[t]).ok());
      const double step = static_cast<double>(t + 1);
      m += (g[t] - m) * (1.0f - 0.9f);
      v += (g[t] * g[t] - v) * (1.0f - 0.999f);
      const double bias1 = 1.0 - std::pow(static_cast<double>(0.9f), step);
      const double bias2 = 1.0 - std::pow(static_cast<double>(0.999f), step);
      const auto step_size = static_cast<float>(static_cast<double>(0.1f) * std::sqrt(bias2) / bias1);
      w -= step_size * (m / (std::sqrt(v) + 1e-8f));
      EXPECT_EQ(PullOne(*table, 3)[0], w) << "push " << t;
    }
    // Lazy: a row not pushed keeps its moments, and its values, while others move.
    const std::vector<float> before = PullOne(*table, 4);
    ASSERT_TRUE(table->Push(9, {5}, &g[0]).ok());
    EXPECT_EQ(PullOne(*table, 4), before);
  }
}

TEST(SparseTableTest, TheFrequencyFilterAdmitsAKeyAtItsNthPush) {
  SparseTableConfig config = Table(SparseOptimizerKind::kSgd, 2);
  config.admit_after = 3;
  auto table = Make(config);
  const std::vector<float> init = PullOne(*table, 11);
  const std::vector<float> g1 = {1, 1}, g2 = {2, 2}, g3 = {4, 8};
  ASSERT_TRUE(table->Push(0, {11}, g1.data()).ok());
  ASSERT_TRUE(table->Push(1, {11}, g2.data()).ok());
  EXPECT_EQ(table->rows(), 0);
  EXPECT_EQ(PullOne(*table, 11), init) << "filtered pushes are dropped";
  ASSERT_TRUE(table->Push(2, {11}, g3.data()).ok());
  EXPECT_EQ(table->rows(), 1);
  EXPECT_EQ(table->admissions(), 1);
  EXPECT_EQ(PullOne(*table, 11), (std::vector<float>{init[0] - 0.1f * 4, init[1] - 0.1f * 8}));
}

TEST(SparseTableTest, RowsUnpushedForExpireAfterStepsAreDropped) {
  SparseTableConfig config = Table(SparseOptimizerKind::kAdagrad, 2);
  config.expire_after = 5;
  auto table = Make(config);
  const std::vector<float> g = {1, 1};
  const std::vector<float> init1 = PullOne(*table, 1);
  ASSERT_TRUE(table->Push(0, {1}, g.data()).ok());
  ASSERT_TRUE(table->Push(4, {2}, g.data()).ok());
  ASSERT_TRUE(table->Push(10, {3}, g.data()).ok());
  EXPECT_EQ(table->Expire(5), 0) << "row 1 was pushed at step 0, 5 steps ago";
  EXPECT_EQ(table->Expire(6), 1);
  EXPECT_EQ(table->rows(), 2);
  EXPECT_EQ(PullOne(*table, 1), init1) << "an expired key reads as new";
  EXPECT_EQ(table->Expire(12), 1);
  std::set<uint64_t> left;
  table->ForEachRow([&](uint64_t key, absl::Span<const float>) { left.insert(key); });
  EXPECT_EQ(left, (std::set<uint64_t>{3}));
  EXPECT_EQ(table->expiries(), 2);
  SparseTableConfig never = config;
  never.expire_after = 0;
  auto kept = Make(never);
  ASSERT_TRUE(kept->Push(0, {1}, g.data()).ok());
  EXPECT_EQ(kept->Expire(1000000), 0);
}

// Random pushes and expiries against a plain map of the same rows: the index
// finds every row after any sequence of inserts, moves and removals.
TEST(SparseTableTest, RowsMatchAModelThroughRandomPushesAndExpiries) {
  SparseTableConfig config = Table(SparseOptimizerKind::kSgd, 3);
  config.expire_after = 40;
  config.admit_after = 2;
  auto table = Make(config);
  std::map<uint64_t, std::vector<float>> rows;
  std::map<uint64_t, int64_t> last_push, sightings, last_sighting;
  std::mt19937_64 random(7);
  for (int64_t step = 0; step < 400; ++step) {
    std::set<uint64_t> keys_set;
    const int n = static_cast<int>(random() % 40);
    for (int i = 0; i < n; ++i) keys_set.insert(random() % 300);
    const std::vector<uint64_t> keys(keys_set.begin(), keys_set.end());
    std::vector<float> grads(keys.size() * 3);
    for (float& g : grads) g = static_cast<float>(static_cast<int>(random() % 17) - 8) / 8.0f;
    ASSERT_TRUE(table->Push(step, keys, grads.data()).ok());
    for (size_t i = 0; i < keys.size(); ++i) {
      const uint64_t key = keys[i];
      if (rows.count(key) == 0) {
        if (++sightings[key] < 2) {
          last_sighting[key] = step;
          continue;
        }
        sightings.erase(key);
        last_sighting.erase(key);
        rows[key] = PullOne(*Make(config), key);
      }
      for (int j = 0; j < 3; ++j) rows[key][j] -= 0.1f * grads[i * 3 + j];
      last_push[key] = step;
    }
    if (step % 7 == 0) {
      int64_t expected_drops = 0;
      for (auto it = rows.begin(); it != rows.end();) {
        if (last_push[it->first] < step - 40) {
          it = rows.erase(it);
          ++expected_drops;
        } else {
          ++it;
        }
      }
      for (auto it = last_sighting.begin(); it != last_sighting.end();) {
        if (it->second < step - 40) {
          sightings.erase(it->first);
          it = last_sighting.erase(it);
        } else {
          ++it;
        }
      }
      ASSERT_EQ(table->Expire(step), expected_drops) << "step " << step;
    }
  }
  ASSERT_EQ(table->rows(), static_cast<int64_t>(rows.size()));
  std::map<uint64_t, std::vector<float>> stored;
  table->ForEachRow([&](uint64_t key, absl::Span<const float> values) {
    stored[key] = std::vector<float>(values.begin(), values.end());
  });
  EXPECT_EQ(stored, rows);
  for (const auto& [key, values] : rows) EXPECT_EQ(PullOne(*table, key), values) << "key " << key;
}

// A table state as a map: rows by key (step and floats), filter counts by
// key, counters; the same whatever order the bytes list them in.
struct StateContent {
  std::map<uint64_t, std::pair<int64_t, std::vector<float>>> rows;
  std::map<uint64_t, std::pair<int32_t, int64_t>> candidates;
  std::vector<int64_t> counters;
  bool operator==(const StateContent& o) const {
    return rows == o.rows && candidates == o.candidates && counters == o.counters;
  }
};

StateContent ContentOf(const SparseTable& table) {
  std::string bytes;
  table.AppendState(&bytes);
  StateContent content;
  TableStateVisitor visit;
  visit.begin = [&](uint64_t, const TableStateCounters& c) {
    content.counters = {c.pushes, c.admissions, c.expiries};
    return absl::OkStatus();
  };
  visit.row = [&](uint64_t key, int64_t step, absl::Span<const float> floats) {
    content.rows[key] = {step, std::vector<float>(floats.begin(), floats.end())};
    return absl::OkStatus();
  };
  visit.candidate = [&](uint64_t key, int32_t count, int64_t step) {
    content.candidates[key] = {count, step};
    return absl::OkStatus();
  };
  EXPECT_TRUE(ParseTableState(bytes, "emb", static_cast<int32_t>(table.raw_row_bytes() / 4), visit).ok());
  return content;
}

// Checkpoints taken incrementally (each on the one before) compose, at
// every point of a run of random pushes, admissions and expiries, into the
// table's whole state of that moment; they hold only the rows changed.
TEST(SparseTableTest, IncrementalCheckpointsComposeIntoTheWholeStateOfTheirTime) {
  SparseTableConfig config = Table(SparseOptimizerKind::kAdagrad, 3);
  config.expire_after = 30;
  config.admit_after = 2;
  auto table = Make(config);
  std::mt19937_64 random(11);
  std::string whole;  // what the chain composes to so far
  auto restored = Make(config);  // loaded from the first, each later one applied on it
  int64_t checkpoint = 0;
  int incremental = 0;
  for (int64_t step = 0; step < 300; ++step) {
    std::set<uint64_t> keys_set;
    const int n = static_cast<int>(random() % 30);
    for (int i = 0; i < n; ++i) keys_set.insert(random() % 400);
    const std::vector<uint64_t> keys(keys_set.begin(), keys_set.end());
    std::vector<float> grads(keys.size() * 3);
    for (float& g : grads) g = static_cast<float>(static_cast<int>(random() % 17) - 8) / 8.0f;
    ASSERT_TRUE(table->Push(step, keys, grads.data()).ok());
    if (step % 5 == 0) table->Expire(step);
    if (step % 20 != 19) continue;
    ++checkpoint;
    std::string stored;
    const int64_t base = table->AppendCheckpointState(checkpoint, checkpoint - 1, /*base_is_stored_here=*/true, &stored);
    std::string now;
    table->AppendState(&now);
    if (checkpoint == 1) {
      EXPECT_EQ(base, 0) << "no checkpoint before the first";
      EXPECT_EQ(stored, now);
      whole = stored;
      ASSERT_TRUE(restored->LoadState(stored).ok());
      continue;
    }
    ASSERT_TRUE(restored->ApplyChanges(stored).ok()) << "checkpoint " << checkpoint;
    ASSERT_TRUE(ContentOf(*restored) == ContentOf(*table)) << "checkpoint " << checkpoint;
    ASSERT_EQ(base, checkpoint - 1);
    EXPECT_LT(stored.size(), now.size()) << "checkpoint " << checkpoint << " holds only what changed";
    absl::StatusOr<std::string> composed = ComposeTableState(whole, stored, "emb");
    ASSERT_TRUE(composed.ok()) << composed.status();
    ASSERT_EQ(*composed, now) << "checkpoint " << checkpoint;
    whole = *std::move(composed);
    ++incremental;
  }
  EXPECT_EQ(incremental, 14);
  // A reloaded table composes the same and builds on what it was loaded from.
  auto reloaded = Make(config);
  ASSERT_TRUE(reloaded->LoadState(whole).ok());
  std::string again;
  EXPECT_EQ(reloaded->AppendCheckpointState(99, checkpoint, /*base_is_stored_here=*/true, &again), 0)
      << "it holds no mark of that checkpoint until told it was loaded from it";
  reloaded->MarkCheckpoint(checkpoint);
  again.clear();
  EXPECT_EQ(reloaded->AppendCheckpointState(100, checkpoint, /*base_is_stored_here=*/false, &again), 0)
      << "unless the caller says its copy is the stored one";
  again.clear();
  EXPECT_EQ(reloaded->AppendCheckpointState(101, checkpoint, /*base_is_stored_here=*/true, &again), checkpoint);
  absl::StatusOr<std::string> unchanged = ComposeTableState(whole, again, "emb");
  ASSERT_TRUE(unchanged.ok()) << unchanged.status();
  std::string reloaded_state;  // the same rows; its filter counts in its own map's order
  reloaded->AppendState(&reloaded_state);
  EXPECT_EQ(*unchanged, reloaded_state);
  EXPECT_EQ(unchanged->size(), whole.size());
}

// Replicas of a bucket write the same bytes whatever the frequency filter's
// map looks like inside (its order differs between processes, and with the
// order keys came in): its counts are written in key order. They used to be
// written in the map's order, so a backup's copy never matched its
// primary's and a checkpoint listed only the primary as holding it.
TEST(SparseTableTest, TheFilterCountsAreWrittenInKeyOrder) {
  SparseTableConfig config = Table(SparseOptimizerKind::kAdagrad, 2);
  config.admit_after = 3;
  auto ascending = Make(config);
  auto descending = Make(config);
  std::vector<uint64_t> keys(2000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = 1 + i * 7919;
  const std::vector<float> grads(keys.size() * 2, 0.25f);
  ASSERT_TRUE(ascending->Push(1, keys, grads.data()).ok());
  std::reverse(keys.begin(), keys.end());
  ASSERT_TRUE(descending->Push(1, keys, grads.data()).ok());
  std::string a, b;
  ascending->AppendState(&a);
  descending->AppendState(&b);
  EXPECT_EQ(a, b);
  uint64_t last = 0;
  int counted = 0;
  TableStateVisitor visit;
  visit.begin = [](uint64_t, const TableStateCounters&) { return absl::OkStatus(); };
  visit.row = [](uint64_t, int64_t, absl::Span<const float>) { return absl::OkStatus(); };
  visit.candidate = [&](uint64_t key, int32_t count, int64_t) {
    EXPECT_GT(key, last);
    EXPECT_EQ(count, 1);
    last = key;
    ++counted;
    return absl::OkStatus();
  };
  // Rows of 2 floats and Adagrad's 2 accumulators.
  ASSERT_TRUE(ParseTableState(a, "emb", static_cast<int32_t>(ascending->raw_row_bytes() / 4), visit).ok());
  EXPECT_EQ(counted, 2000);
}

// Changes that would take as many bytes as the whole state (every row
// pushed since the base) are stored whole, and the next checkpoint builds on
// that one.
TEST(SparseTableTest, ACheckpointWhoseRowsAllChangedIsStoredWhole) {
  auto table = Make(Table(SparseOptimizerKind::kAdagrad, 4));
  std::vector<uint64_t> keys(100);
  std::iota(keys.begin(), keys.end(), uint64_t{1});
  const std::vector<float> grads(keys.size() * 4, 0.5f);
  ASSERT_TRUE(table->Push(1, keys, grads.data()).ok());
  std::string first;
  ASSERT_EQ(table->AppendCheckpointState(1, 0, true, &first), 0);
  ASSERT_TRUE(table->Push(2, keys, grads.data()).ok());  // every row
  std::string second, whole;
  EXPECT_EQ(table->AppendCheckpointState(2, 1, true, &second), 0) << "every row changed: stored whole";
  table->AppendState(&whole);
  EXPECT_EQ(second, whole);
  const std::vector<uint64_t> most(keys.begin(), keys.begin() + 90);
  ASSERT_TRUE(table->Push(3, most, grads.data()).ok());  // 90 of 100 rows: still fewer bytes as changes
  std::string third;
  EXPECT_EQ(table->AppendCheckpointState(3, 2, true, &third), 2);
  std::string now;
  table->AppendState(&now);
  EXPECT_LT(third.size(), now.size());
  absl::StatusOr<std::string> composed = ComposeTableState(second, third, "emb");
  ASSERT_TRUE(composed.ok()) << composed.status();
  EXPECT_EQ(*composed, now);
}

TEST(SparseTableTest, ChangesThatDoNotFitTheTableAreRefusedLeavingItAsItWas) {
  auto table = Make(Table(SparseOptimizerKind::kSgd, 2));
  const std::vector<float> grads = {1, 1, 1, 1};
  ASSERT_TRUE(table->Push(1, {4, 8}, grads.data()).ok());
  const StateContent before = ContentOf(*table);
  auto changes = [](std::vector<std::pair<uint64_t, bool>> rows) {
    std::string out;
    AppendTableDeltaHeader(3, 2, {}, rows.size(), &out);
    for (const auto& [key, changed] : rows) {
      if (changed) {
        AppendTableDeltaRow(key, 9, std::vector<float>{0.5f, 0.5f}, &out);
      } else {
        AppendTableDeltaSame(key, &out);
      }
    }
    AppendTableStateCandidates(0, &out);
    return out;
  };
  const struct {
    std::string bytes, says;
  } cases[] = {
      {changes({{4, false}, {5, false}}), "key 5"},             // unchanged, but the table has no row of it
      {changes({{4, false}, {4, true}}), "listed twice"},      // a key twice
      {changes({{4, true}}).substr(0, 40), "truncated"},       // cut short
      {changes({{4, true}}) + "z", "unexpected bytes"},        // trailing
  };
  for (const auto& c : cases) {
    const absl::Status status = table->ApplyChanges(c.bytes);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << c.says;
    EXPECT_NE(status.message().find(c.says), std::string::npos) << status;
    EXPECT_TRUE(ContentOf(*table) == before) << c.says << ": nothing applied";
  }
  std::string whole;
  table->AppendState(&whole);
  EXPECT_EQ(table->ApplyChanges(whole).code(), absl::StatusCode::kDataLoss) << "a whole state is no change";
  // Changes that fit: key 8 dropped, key 4 kept, key 6 new.
  ASSERT_TRUE(table->ApplyChanges(changes({{4, false}, {6, true}})).ok());
  EXPECT_EQ(table->rows(), 2);
  EXPECT_EQ(PullOne(*table, 6), (std::vector<float>{0.5f, 0.5f}));
  EXPECT_EQ(PullOne(*table, 4), before.rows.at(4).second);
}

TEST(SparseTableTest, ACheckpointIsWholeUnlessItsBaseIsStoredAsThisTableTookIt) {
  auto table = Make(Table(SparseOptimizerKind::kSgd, 2));
  const std::vector<float> grads = {1, 1, 1, 1};
  ASSERT_TRUE(table->Push(1, {4, 8}, grads.data()).ok());
  std::string out;
  EXPECT_EQ(table->AppendCheckpointState(1, 0, true, &out), 0);
  ASSERT_TRUE(table->Push(2, {4}, grads.data()).ok());
  out.clear();
  EXPECT_EQ(table->AppendCheckpointState(2, 1, /*base_is_stored_here=*/false, &out), 0)
      << "another replica's copy of checkpoint 1 is the stored one";
  out.clear();
  EXPECT_EQ(table->AppendCheckpointState(3, 7, true, &out), 0) << "never took checkpoint 7";
  out.clear();
  EXPECT_EQ(table->AppendCheckpointState(4, 3, true, &out), 3);
  // Only the last kMaxCheckpointMarks are remembered.
  for (int64_t id = 5; id < 5 + static_cast<int64_t>(SparseTable::kMaxCheckpointMarks); ++id) {
    out.clear();
    table->AppendCheckpointState(id, 0, true, &out);
  }
  out.clear();
  EXPECT_EQ(table->AppendCheckpointState(20, 4, true, &out), 0);
  // Cleared or loaded: nothing it captured before is a base any longer.
  table->Clear();
  out.clear();
  EXPECT_EQ(table->AppendCheckpointState(21, 20, true, &out), 0);
}

// The key whose SplitMix64 is `hash` (SplitMix64 is a bijection: each of
// its steps undone in turn).
uint64_t SplitMix64Inverse(uint64_t hash) {
  auto unshift = [](uint64_t y, int shift) {  // undoes y = x ^ (x >> shift)
    uint64_t x = y;
    for (int s = shift; s < 64; s += shift) x ^= y >> s;
    return x;
  };
  auto inverse = [](uint64_t odd) {  // modulo 2^64, by Newton's iteration
    uint64_t inv = odd;
    for (int i = 0; i < 5; ++i) inv *= 2 - odd * inv;
    return inv;
  };
  uint64_t x = unshift(hash, 31);
  x = unshift(x * inverse(0x94d049bb133111ebULL), 27);
  x = unshift(x * inverse(0xbf58476d1ce4e5b9ULL), 30);
  return x - 0x9e3779b97f4a7c15ULL;
}

TEST(SparseTableTest, KeysChosenToCollideDoNotLengthenLookups) {
  // A worker that knows the hash could send keys whose hashes share their
  // low bits, all homed in one index slot: each lookup would pass every
  // key before it. The table's seed of its own scatters them. (The bound
  // is loose: at this load a random seed's longest probe is tens of slots,
  // rarely past 64.)
  std::vector<uint64_t> keys;
  for (uint64_t i = 1; i <= 5000; ++i) keys.push_back(SplitMix64Inverse(i << 32));
  for (size_t i = 0; i < 10; ++i) ASSERT_EQ(SplitMix64(keys[i]), (i + 1) << 32);
  auto table = Make(Table(SparseOptimizerKind::kSgd, 2));
  ASSERT_NE(table, nullptr);
  const std::vector<float> grads(keys.size() * 2, 0.5f);
  ASSERT_TRUE(table->Push(1, keys, grads.data()).ok());
  EXPECT_EQ(table->rows(), 5000);
  EXPECT_LT(table->LongestProbe(), 500) << "crafted keys, 4999 without the seed";
  // And a random key set, for scale.
  std::vector<uint64_t> plain;
  for (uint64_t i = 1; i <= 5000; ++i) plain.push_back(SplitMix64(i ^ 0xfeed));
  auto other = Make(Table(SparseOptimizerKind::kSgd, 2));
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(other->Push(1, plain, grads.data()).ok());
  EXPECT_LT(other->LongestProbe(), 500);
}

TEST(SparseTableTest, BadPushesAreRefusedWholeNamingTheKey) {
  auto table = Make(Table(SparseOptimizerKind::kSgd, 2));
  const std::vector<float> good = {1, 1, 1, 1};
  std::vector<float> nan = good;
  nan[3] = std::nanf("");
  absl::Status status = table->Push(0, {4, 8}, nan.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("key 8 at element 1"), std::string::npos) << status;
  status = table->Push(0, {4, 4}, good.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("key 4 more than once"), std::string::npos) << status;
  EXPECT_EQ(table->rows(), 0) << "nothing of a refused push applied";
}

TEST(SparseTableTest, AFullTableRefusesNewRowsNamingItselfAndKeepsWhatItHas) {
  SparseTableConfig config = Table(SparseOptimizerKind::kAdagrad, 16);
  config.memory_budget = 4 << 20;
  auto table = Make(config);
  std::vector<uint64_t> keys(1000);
  std::vector<float> grads(keys.size() * 16, 0.5f);
  uint64_t next = 0;
  absl::Status status;
  while (status.ok()) {
    for (uint64_t& key : keys) key = next++;
    status = table->Push(1, keys, grads.data());
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("table emb is full"), std::string::npos) << status;
  const int64_t rows = table->rows();
  EXPECT_GT(rows, 10000);
  EXPECT_LE(table->bytes(), config.memory_budget);
  EXPECT_EQ(static_cast<uint64_t>(rows), next - keys.size()) << "the refused push created no row";
  // Rows that exist still take pushes.
  const std::vector<float> before = PullOne(*table, 0);
  ASSERT_TRUE(table->Push(2, {0}, grads.data()).ok());
  EXPECT_NE(PullOne(*table, 0), before);
}

// Memory a row: its values and Adagrad state (16 + 16 floats, 128 bytes)
// plus key, last step and index share stay within 1.3 times those bytes.
TEST(SparseTableTest, MemoryPerRowIsWithinAThirdOfItsValuesAndState) {
  auto table = Make(Table(SparseOptimizerKind::kAdagrad, 16));
  std::vector<uint64_t> keys(4096);
  std::vector<float> grads(keys.size() * 16, 0.25f);
  for (int batch = 0; batch < 50; ++batch) {
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = SplitMix64(batch * keys.size() + i);
    ASSERT_TRUE(table->Push(batch, keys, grads.data()).ok());
  }
  const double per_row = static_cast<double>(table->bytes()) / static_cast<double>(table->rows());
  EXPECT_EQ(table->raw_row_bytes(), 128);
  EXPECT_LE(per_row, 1.3 * 128) << per_row << " bytes a row";
}

// A table of a few rows takes a few rows' bytes (a table of 4096 buckets
// with ten rows each took a 256 KiB block a bucket), and rows keep their
// values as its first block grows and the table passes into whole blocks.
TEST(SparseTableTest, ASmallTableTakesWhatItsRowsTakeAndRowsSurviveItsGrowth) {
  auto table = Make(Table(SparseOptimizerKind::kSgd, 16));
  ASSERT_NE(table, nullptr);
  const std::vector<float> grads(16, 0.5f);
  for (uint64_t key = 0; key < 10; ++key) ASSERT_TRUE(table->Push(1, {key}, grads.data()).ok());
  EXPECT_EQ(table->rows(), 10);
  EXPECT_LE(table->bytes(), 4096) << "ten rows of " << table->raw_row_bytes() << " bytes";
  // Through the first block's doublings into whole blocks (80-byte rows:
  // 2048 a block): every row as a model of the pushes says.
  std::map<uint64_t, std::vector<float>> expected;
  for (uint64_t key = 0; key < 5000; ++key) expected[key] = PullOne(*table, key);
  for (int64_t step = 2; step < 6; ++step) {
    for (uint64_t key = 0; key < 5000; key += static_cast<uint64_t>(step) - 1) {
      std::vector<float> g(16);
      for (int j = 0; j < 16; ++j) g[j] = static_cast<float>((key * 7 + static_cast<uint64_t>(j)) % 13) - 6;
      ASSERT_TRUE(table->Push(step, {key}, g.data()).ok());
      for (int j = 0; j < 16; ++j) expected[key][j] -= 0.1f * g[j];
    }
  }
  EXPECT_EQ(table->rows(), 5000);
  for (const auto& [key, row] : expected) ASSERT_EQ(PullOne(*table, key), row) << "key " << key;
  EXPECT_LE(table->bytes(), 2 * 5000 * (table->raw_row_bytes() + 32));
}

TEST(SparseTableTest, ConfigsTheTableCannotRunAreRefusedNamingTheField) {
  auto refused = [](SparseTableConfig config, const std::string& needle) {
    absl::Status status = ValidateSparseTableConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(status.message().find(needle), std::string::npos) << status;
    EXPECT_NE(status.message().find("table emb"), std::string::npos) << status;
  };
  SparseTableConfig config = Table(SparseOptimizerKind::kAdam);
  config.dim = 0;
  refused(config, "dim 0");
  config = Table(SparseOptimizerKind::kAdam);
  config.optimizer.lr = std::numeric_limits<float>::infinity();
  refused(config, "lr");
  config = Table(SparseOptimizerKind::kAdam);
  config.optimizer.beta2 = 1.0f;
  refused(config, "beta2");
  config = Table(SparseOptimizerKind::kFtrl);
  config.init = InitKind::kUniform;
  refused(config, "FTRL");
  config = Table(SparseOptimizerKind::kSgd);
  config.admit_after = -1;
  refused(config, "admitAfter");
  config = Table(SparseOptimizerKind::kSgd);
  config.expire_after = kMaxSparseStep + 1;
  refused(config, "expireAfter");
  // A zero epsilon divides 0 by 0 on a zero gradient of a fresh row.
  config = Table(SparseOptimizerKind::kAdam);
  config.optimizer.epsilon = 0;
  refused(config, "epsilon must be > 0");
  config = Table(SparseOptimizerKind::kAdagrad);
  config.optimizer.epsilon = 0;
  config.optimizer.initial_accumulator = 0;
  refused(config, "epsilon must be > 0");
  config.optimizer.initial_accumulator = 0.1f;
  EXPECT_TRUE(ValidateSparseTableConfig(config).ok()) << "the accumulator keeps the denominator above 0";
  EXPECT_TRUE(ValidateSparseTableConfig(Table(SparseOptimizerKind::kFtrl)).ok());
}


TEST(SparseTableTest, StateRoundTripsAndDamagedStateIsRefusedLeavingTheTableEmpty) {
  SparseTableConfig config = Table(SparseOptimizerKind::kAdagrad);
  config.admit_after = 2;
  auto table = Make(config);
  std::vector<uint64_t> keys = {1, 2, 3, 1ULL << 60};
  std::vector<float> grads(keys.size() * 4, 0.5f);
  for (int64_t step = 0; step < 2; ++step) ASSERT_TRUE(table->Push(step, keys, grads.data()).ok());
  const uint64_t seen_once = 99;
  ASSERT_TRUE(table->Push(2, {seen_once}, grads.data()).ok());  // a filter count, no row
  std::string state;
  table->AppendState(&state);

  auto copy = Make(config);
  ASSERT_TRUE(copy->LoadState(state).ok());
  EXPECT_EQ(copy->rows(), table->rows());
  EXPECT_EQ(copy->admissions(), table->admissions());
  for (uint64_t key : keys) EXPECT_EQ(PullOne(*copy, key), PullOne(*table, key));
  // Both go on alike: the accumulators and the filter count came along.
  for (SparseTable* t : {table.get(), copy.get()}) ASSERT_TRUE(t->Push(3, {1, seen_once}, grads.data()).ok());
  EXPECT_EQ(PullOne(*copy, 1), PullOne(*table, 1));
  EXPECT_EQ(copy->rows(), 5) << "the second sighting of 99 admitted it";
  EXPECT_EQ(copy->LoadState(state).code(), absl::StatusCode::kFailedPrecondition) << "not empty";

  auto damaged = [&](const std::string& bytes, const std::string& says) {
    SCOPED_TRACE(says);
    auto fresh = Make(config);
    const absl::Status loaded = fresh->LoadState(bytes);
    EXPECT_EQ(loaded.code(), absl::StatusCode::kDataLoss) << loaded;
    EXPECT_NE(loaded.message().find(says), std::string::npos) << loaded;
    EXPECT_EQ(fresh->rows(), 0) << "nothing kept";
    EXPECT_TRUE(fresh->Push(0, keys, grads.data()).ok()) << "still usable";
  };
  damaged(state.substr(0, state.size() - 3), "truncated");
  damaged(state + "x", "unexpected bytes");
  damaged(std::string(), "truncated");
  std::string wide = state;
  wide[0] = 9;  // rows of 9 floats
  damaged(wide, "rows of 9 floats");
  std::string twice = state;
  // Offsets: the row width (4 bytes) and three counters, the row count at
  // 28, the first row at 36: its key, its step, its 8 floats.
  const size_t row_bytes = 16 + 8 * 4;
  std::memcpy(&twice[36 + row_bytes], &twice[36], 8);  // the second row's key := the first's
  damaged(twice, "listed twice");
  std::string step = state;
  const int64_t past = kMaxSparseStep + 2;
  std::memcpy(&step[36 + 8], &past, 8);  // the first row's step
  damaged(step, "row step");
  std::string counter = state;
  const int64_t negative = -1;
  std::memcpy(&counter[4], &negative, 8);  // the pushes
  damaged(counter, "counter");
  std::string many = state;
  many[28 + 7] = 0x7f;  // an enormous row count
  damaged(many, "claims");

  // A row a diverged model made non-finite loads as it was: a copy of the
  // table, or its checkpoint, holds what the table holds.
  std::string diverged = state;
  const float nan = std::nanf("");
  std::memcpy(&diverged[36 + 16], &nan, 4);
  auto holder = Make(config);
  ASSERT_TRUE(holder->LoadState(diverged).ok());
  std::string again;
  holder->AppendState(&again);
  EXPECT_EQ(again, diverged);
}

}  // namespace
}  // namespace fulcrum
