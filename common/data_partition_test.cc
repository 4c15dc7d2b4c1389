#include "common/data_partition.h"

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

// With G = B * P, global step s uses perm[s*G, (s+1)*G) and partition p
// takes perm[s*G + p*B, s*G + (p+1)*B): over an epoch the partitions cover
// the permutation's full global batches exactly once.
TEST(DataPartitioningTest, PartitionsCoverTheEpochPrefixExactlyOnce) {
  struct Case {
    int64_t n;
    int64_t batch;
    int64_t partitions;
  };
  for (const Case& c : {Case{1000, 64, 2}, Case{1000, 10, 1}, Case{1000, 7, 3},
                        Case{60000, 128, 4}, Case{129, 64, 2}, Case{128, 64, 2}}) {
    const DataPartitioning partitioning(c.n, c.batch, c.partitions);
    const int64_t steps = partitioning.steps_per_epoch();
    ASSERT_EQ(steps, c.n / (c.batch * c.partitions));
    for (int64_t epoch : {0, 1}) {
      const std::vector<int64_t> perm = EpochPermutation(99, epoch, c.n);
      std::vector<int64_t> taken;
      std::set<int64_t> seen;
      for (int64_t s = epoch * steps; s < (epoch + 1) * steps; ++s) {
        ASSERT_EQ(partitioning.EpochOf(s), epoch);
        for (int32_t p = 0; p < c.partitions; ++p) {
          const int64_t first = partitioning.FirstRow(s, p);
          ASSERT_LE(first + c.batch, c.n);
          for (int64_t i = first; i < first + c.batch; ++i) {
            EXPECT_TRUE(seen.insert(perm[i]).second)
                << "example " << perm[i] << " seen twice (n " << c.n << ")";
            taken.push_back(perm[i]);
          }
        }
      }
      ASSERT_EQ(static_cast<int64_t>(taken.size()), steps * partitioning.global_batch());
      std::vector<int64_t> prefix(perm.begin(), perm.begin() + steps * partitioning.global_batch());
      std::sort(taken.begin(), taken.end());
      std::sort(prefix.begin(), prefix.end());
      EXPECT_EQ(taken, prefix) << "n " << c.n << " B " << c.batch << " P " << c.partitions;
    }
  }
}

// A BSP step sees the same examples whatever the number of partitions, as
// long as the global batch is the same.
TEST(DataPartitioningTest, StepExamplesDependOnlyOnTheGlobalBatch) {
  const int64_t n = 1000;
  const std::vector<int64_t> perm = EpochPermutation(5, 0, n);
  auto step_examples = [&](int64_t batch, int64_t partitions, int64_t step) {
    const DataPartitioning partitioning(n, batch, partitions);
    std::vector<int64_t> examples;
    for (int32_t p = 0; p < partitions; ++p) {
      const int64_t first = partitioning.FirstRow(step, p);
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

// What the workers' pushes carry (StepAudit of each partition step) adds up
// to what the audit expects of whole epochs, and a step counted twice or
// left out shows.
TEST(DataPartitioningTest, StepAuditsAddUpToTheExpectedAudit) {
  const DataPartitioning partitioning(1000, 16, 3);
  const int64_t epochs = 2;
  ExampleAudit sum;
  for (int64_t step = 0; step < partitioning.TotalSteps(epochs, 0); ++step) {
    const std::vector<int64_t> perm = EpochPermutation(11, partitioning.EpochOf(step), 1000);
    for (int32_t p = 0; p < 3; ++p) {
      const ExampleAudit step_audit = partitioning.StepAudit(perm, step, p);
      EXPECT_EQ(step_audit.examples, 16);
      sum.examples += step_audit.examples;
      sum.digest += step_audit.digest;
    }
  }
  const ExampleAudit expected = partitioning.ExpectedAudit(11, epochs);
  EXPECT_EQ(sum.examples, expected.examples);
  EXPECT_EQ(sum.digest, expected.digest);
  const ExampleAudit once_more = partitioning.StepAudit(EpochPermutation(11, 0, 1000), 0, 0);
  EXPECT_NE(sum.digest + once_more.digest, expected.digest);
}

TEST(DataPartitioningTest, CountsStepsAndConvertsThemBetweenGlobalBatches) {
  const DataPartitioning partitioning(1000, 16, 4);  // G = 64: 15 steps an epoch, 40 rows left out
  EXPECT_EQ(partitioning.global_batch(), 64);
  EXPECT_EQ(partitioning.steps_per_epoch(), 15);
  EXPECT_EQ(partitioning.TotalSteps(3, 0), 45);
  EXPECT_EQ(partitioning.TotalSteps(3, 20), 20);
  EXPECT_EQ(partitioning.TotalSteps(3, 100), 45);
  EXPECT_EQ(DataPartitioning(10, 16, 4).steps_per_epoch(), 0);
  // 10 steps of a global batch of 128 are 20 of 64: the same examples done.
  EXPECT_EQ(partitioning.StepFrom(10, 128), 20);
  v1::JobSpec spec;
  spec.mutable_data()->set_batch_size(16);
  spec.set_num_workers(2);
  EXPECT_EQ(DataPartitioning::For(spec, 1000).num_partitions(), 2);
  spec.set_max_workers(4);
  EXPECT_EQ(DataPartitioning::For(spec, 1000).num_partitions(), 4);
}

}  // namespace
}  // namespace fulcrum
