// How a job's training examples are cut into steps and data partitions: one
// home for what the workers compute, what the scheduler counts and what the
// example audit expects.
//
// Each epoch has a seeded permutation of the training set (EpochPermutation).
// Step s of the epoch takes the permutation's slice [s*G, (s+1)*G) with
// G = B * P (B = StepBatchSize: batchSize times data.gradientAccumulation
// or localSgd.steps; P data partitions = maxWorkers), and partition p takes
// the p-th B rows of it; the rows past the last full global batch are
// left out of that epoch. Workers compute the partitions the scheduler gives
// them, so every example is used once per epoch and a BSP step's average
// does not depend on how many workers are live or which one computes which
// partition.
#ifndef FULCRUM_COMMON_DATA_PARTITION_H_
#define FULCRUM_COMMON_DATA_PARTITION_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "fulcrum/v1/job.pb.h"

namespace fulcrum {

// Per-epoch permutation of [0, n) (Fisher-Yates over a counter-based stream,
// identical on every platform).
std::vector<int64_t> EpochPermutation(uint64_t seed, int64_t epoch, int64_t n);

// A pseudo-random 64-bit tag of (epoch, example index). Pushes carry the sum
// of the tags of their batch; a server's running sum then equals the sum over
// every example of every epoch exactly when each was used once (with
// overwhelming probability), which the fault-tolerance tests check.
uint64_t ExampleDigest(int64_t epoch, int64_t example);

// The examples behind gradients, as servers sum them per chunk.
struct ExampleAudit {
  int64_t examples = 0;
  uint64_t digest = 0;
};

// The most examples one data partition's step may take.
inline constexpr int64_t kMaxStepExamples = int64_t{1} << 20;

// The highest step a server takes or keeps (a push's, a pull's, a restored
// or copied position): 2^40, beyond any job's steps, so that a step and a
// period add without overflow. A server also refuses steps past its job's
// total.
inline constexpr int64_t kMaxJobStep = int64_t{1} << 40;

// Whether `step` can be a kept position: a capture's or a copy's version,
// or a partition's next step (the step after its last), [0, kMaxJobStep + 1].
// One past that is a corrupt record, whose later pushes would all be
// skipped as duplicates.
inline bool IsStepPosition(int64_t step) { return step >= 0 && step <= kMaxJobStep + 1; }

// The batches of data.batch_size examples one data partition's step
// computes: data.gradient_accumulation micro-batches, or local_sgd.steps
// local steps, or 1.
inline int64_t BatchesPerStep(const v1::JobSpec& spec) {
  return std::max({1, spec.data().gradient_accumulation(), spec.local_sgd().steps()});
}

// The examples one data partition's step takes.
inline int64_t StepBatchSize(const v1::JobSpec& spec) { return spec.data().batch_size() * BatchesPerStep(spec); }

class DataPartitioning {
 public:
  DataPartitioning(int64_t num_examples, int64_t batch_size, int64_t num_partitions)
      : num_examples_(num_examples), batch_size_(batch_size), num_partitions_(num_partitions) {}
  // `spec` after ApplyJobSpecDefaults: P = maxWorkers (numWorkers if unset).
  static DataPartitioning For(const v1::JobSpec& spec, int64_t num_examples);

  int64_t batch_size() const { return batch_size_; }
  int64_t num_partitions() const { return num_partitions_; }
  int64_t global_batch() const { return batch_size_ * num_partitions_; }
  // Full global batches in an epoch; 0 when the training set is smaller
  // than one.
  int64_t steps_per_epoch() const;
  // The steps of `epochs` epochs, at most `max_steps` (0: no cap).
  int64_t TotalSteps(int64_t epochs, int64_t max_steps) const;
  int64_t EpochOf(int64_t step) const { return step / steps_per_epoch(); }
  // Where partition `partition`'s rows of global step `step` start in the
  // permutation of EpochOf(step) (batch_size() of them from there).
  int64_t FirstRow(int64_t step, int32_t partition) const;
  // The audit of one partition step's rows (`permutation`: its epoch's).
  ExampleAudit StepAudit(const std::vector<int64_t>& permutation, int64_t step, int32_t partition) const;
  // The audit of every example of `epochs` full epochs used exactly once.
  ExampleAudit ExpectedAudit(uint64_t shuffle_seed, int64_t epochs) const;
  // `step` steps of global batch `from_global_batch` as steps of this
  // partitioning: the same examples done (a checkpoint restored with another
  // number of partitions).
  int64_t StepFrom(int64_t step, int64_t from_global_batch) const;
  // FAILED_PRECONDITION unless this worker's examples make the scheduler's
  // `counted` steps an epoch (> 0): steps are cut from the examples by
  // number, so every worker must read the same ones.
  absl::Status CheckStepsPerEpoch(int64_t counted) const;

 private:
  int64_t num_examples_;
  int64_t batch_size_;
  int64_t num_partitions_;
};

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_DATA_PARTITION_H_
