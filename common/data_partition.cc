#include "common/data_partition.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/param_init.h"

namespace fulcrum {

std::vector<int64_t> EpochPermutation(uint64_t seed, int64_t epoch, int64_t n) {
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  uint64_t stream = SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(epoch) + 0x9e3779b97f4a7c15ull));
  for (int64_t i = n - 1; i > 0; --i) {
    uint64_t j = SplitMix64(stream + static_cast<uint64_t>(i)) % static_cast<uint64_t>(i + 1);
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

uint64_t ExampleDigest(int64_t epoch, int64_t example) {
  return SplitMix64(SplitMix64(static_cast<uint64_t>(epoch) ^ 0x5851f42d4c957f2dull) + static_cast<uint64_t>(example));
}

DataPartitioning DataPartitioning::For(const v1::JobSpec& spec, int64_t num_examples) {
  const int64_t partitions = spec.max_workers() > 0 ? spec.max_workers() : spec.num_workers();
  return DataPartitioning(num_examples, StepBatchSize(spec), partitions);
}

int64_t DataPartitioning::steps_per_epoch() const {
  return global_batch() > 0 ? num_examples_ / global_batch() : 0;
}

int64_t DataPartitioning::TotalSteps(int64_t epochs, int64_t max_steps) const {
  const int64_t steps = steps_per_epoch() * epochs;
  return max_steps > 0 ? std::min(steps, max_steps) : steps;
}

int64_t DataPartitioning::FirstRow(int64_t step, int32_t partition) const {
  return (step % steps_per_epoch()) * global_batch() + int64_t{partition} * batch_size_;
}

ExampleAudit DataPartitioning::StepAudit(const std::vector<int64_t>& permutation, int64_t step,
                                         int32_t partition) const {
  const int64_t epoch = EpochOf(step);
  const int64_t first = FirstRow(step, partition);
  ExampleAudit audit;
  for (int64_t i = first; i < first + batch_size_; ++i) {
    audit.digest += ExampleDigest(epoch, permutation[i]);
    ++audit.examples;
  }
  return audit;
}

ExampleAudit DataPartitioning::ExpectedAudit(uint64_t shuffle_seed, int64_t epochs) const {
  ExampleAudit audit;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    const std::vector<int64_t> perm = EpochPermutation(shuffle_seed, epoch, num_examples_);
    for (int64_t i = 0; i < steps_per_epoch() * global_batch(); ++i) {
      audit.digest += ExampleDigest(epoch, perm[i]);
      ++audit.examples;
    }
  }
  return audit;
}

int64_t DataPartitioning::StepFrom(int64_t step, int64_t from_global_batch) const {
  return global_batch() > 0 ? step * from_global_batch / global_batch() : step;
}

absl::Status DataPartitioning::CheckStepsPerEpoch(int64_t counted) const {
  if (steps_per_epoch() == counted && counted > 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("the training data read here (", num_examples_,
                                                    " examples) makes ", steps_per_epoch(),
                                                    " steps an epoch, the scheduler counts ", counted,
                                                    ": the workers read different data (files that differ "
                                                    "between the workers' machines, or changed since the "
                                                    "job started)"));
}

}  // namespace fulcrum
