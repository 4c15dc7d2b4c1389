#include "worker/trainer.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace fulcrum {
namespace {

bool IsPermutation(const std::vector<int64_t>& perm, int64_t n) {
  if (static_cast<int64_t>(perm.size()) != n) return false;
  std::vector<bool> seen(n, false);
  for (int64_t v : perm) {
    if (v < 0 || v >= n || seen[v]) return false;
    seen[v] = true;
  }
  return true;
}

TEST(EpochPermutationTest, IsAPermutation) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7}, int64_t{1000},
                    int64_t{60000}}) {
    for (int64_t epoch : {0, 1, 5}) {
      EXPECT_TRUE(IsPermutation(EpochPermutation(123, epoch, n), n))
          << "n " << n << " epoch " << epoch;
    }
  }
}

TEST(EpochPermutationTest, IsDeterministic) {
  EXPECT_EQ(EpochPermutation(42, 3, 5000), EpochPermutation(42, 3, 5000));
  EXPECT_EQ(EpochPermutation(0, 0, 100), EpochPermutation(0, 0, 100));
}

TEST(EpochPermutationTest, ShufflesAtAll) {
  std::vector<int64_t> identity(1000);
  for (int64_t i = 0; i < 1000; ++i) identity[i] = i;
  EXPECT_NE(EpochPermutation(42, 0, 1000), identity);
}

TEST(EpochPermutationTest, DiffersAcrossEpochs) {
  const std::vector<int64_t> e0 = EpochPermutation(42, 0, 1000);
  const std::vector<int64_t> e1 = EpochPermutation(42, 1, 1000);
  const std::vector<int64_t> e2 = EpochPermutation(42, 2, 1000);
  EXPECT_NE(e0, e1);
  EXPECT_NE(e1, e2);
  EXPECT_NE(e0, e2);
}

TEST(EpochPermutationTest, DiffersAcrossSeeds) {
  const std::vector<int64_t> a = EpochPermutation(1, 0, 1000);
  const std::vector<int64_t> b = EpochPermutation(2, 0, 1000);
  const std::vector<int64_t> c = EpochPermutation(18446744073709551615ull, 0, 1000);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(b, c);
}

// The partition documented in trainer.h: with G = B * W, global step s uses
// perm[s*G, (s+1)*G) and rank r takes perm[s*G + r*B, s*G + (r+1)*B).
TEST(DataPartitionTest, RanksCoverTheEpochPrefixExactlyOnce) {
  struct Case {
    int64_t n;
    int64_t batch;
    int64_t workers;
  };
  for (const Case& c : {Case{1000, 64, 2}, Case{1000, 10, 1}, Case{1000, 7, 3},
                        Case{60000, 128, 4}, Case{129, 64, 2}, Case{128, 64, 2}}) {
    const int64_t global = c.batch * c.workers;
    const int64_t steps = c.n / global;
    for (int64_t epoch : {0, 1}) {
      const std::vector<int64_t> perm = EpochPermutation(99, epoch, c.n);
      std::vector<int64_t> taken;
      std::set<int64_t> seen;
      for (int64_t s = 0; s < steps; ++s) {
        for (int64_t r = 0; r < c.workers; ++r) {
          const int64_t first = s * global + r * c.batch;
          ASSERT_LE(first + c.batch, c.n);
          for (int64_t i = first; i < first + c.batch; ++i) {
            EXPECT_TRUE(seen.insert(perm[i]).second)
                << "example " << perm[i] << " seen twice (n " << c.n << ")";
            taken.push_back(perm[i]);
          }
        }
      }
      ASSERT_EQ(static_cast<int64_t>(taken.size()), steps * global);
      std::vector<int64_t> prefix(perm.begin(), perm.begin() + steps * global);
      std::sort(taken.begin(), taken.end());
      std::sort(prefix.begin(), prefix.end());
      EXPECT_EQ(taken, prefix) << "n " << c.n << " B " << c.batch << " W " << c.workers;
    }
  }
}

// A BSP step sees the same examples whatever the number of workers, as long
// as the global batch is the same.
TEST(DataPartitionTest, StepExamplesDependOnlyOnTheGlobalBatch) {
  const int64_t n = 1000;
  const std::vector<int64_t> perm = EpochPermutation(5, 0, n);
  auto step_examples = [&](int64_t batch, int64_t workers, int64_t step) {
    std::vector<int64_t> examples;
    for (int64_t r = 0; r < workers; ++r) {
      const int64_t first = step * batch * workers + r * batch;
      examples.insert(examples.end(), perm.begin() + first, perm.begin() + first + batch);
    }
    return examples;
  };
  for (int64_t step = 0; step < n / 128; ++step) {
    const std::vector<int64_t> one = step_examples(128, 1, step);
    EXPECT_EQ(step_examples(64, 2, step), one);
    EXPECT_EQ(step_examples(32, 4, step), one);
  }
}

}  // namespace
}  // namespace fulcrum
