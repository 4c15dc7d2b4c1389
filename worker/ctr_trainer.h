// A worker's share of a job on the click path (kernels/model_from_spec.h
// TrainsOnClickPath: click models, and graphs over dense data that are not
// MLPs):
// each data partition steps through its batches at its own pace (ASP; SSP:
// at most `staleness` steps ahead of the slowest), and a step pulls the
// dense tensors, pulls the rows of the batch's distinct keys from the sparse
// tables, computes the CTR model on the host (kernels/ctr_model.h), and
// pushes the dense gradients and each distinct key's summed row gradient.
// The partition that evaluates reports the test set's loss, accuracy (at
// probability 0.5) and AUC.
//
// Synthetic click data is made, not loaded: every example is a function of
// (seed, split, index), so a step makes its own batch and only the test set
// is held. An epoch visits the examples in a seeded affine order
// (AffineOrder), which takes no memory whatever the data's size.
#ifndef FULCRUM_WORKER_CTR_TRAINER_H_
#define FULCRUM_WORKER_CTR_TRAINER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fulcrum/v1/cluster.pb.h"
#include "worker/ctr_data.h"
#include "worker/dataset.h"
#include "worker/parameter_transport.h"
#include "worker/trainer.h"

namespace fulcrum {

// A permutation of [0, n) for one epoch: i -> (a * i + b) mod n, with a
// coprime to n, a and b drawn from (seed, epoch).
class AffineOrder {
 public:
  AffineOrder(uint64_t seed, int64_t epoch, int64_t n);
  int64_t operator[](int64_t i) const;

 private:
  int64_t n_;
  uint64_t a_ = 1, b_ = 0;
};

// The job spec's synthetic click data, defaults filled in.
SyntheticCtrSpec SyntheticCtrOf(const v1::JobSpec& spec);

// The files a path names: itself, or what a glob pattern matches, sorted.
// NOT_FOUND when nothing matches; INVALID_ARGUMENT beyond 100000 files.
absl::StatusOr<std::vector<std::string>> ExpandPath(const std::string& pattern);

// Loads a job's click data. Files must lie under `roots` (PERMISSION_DENIED
// otherwise; any path when empty); RESOURCE_EXHAUSTED naming the bytes
// beyond `memory_budget` (0: none); a bad record fails the load with its
// file and line under onBadRecord FAIL, else it is counted and skipped (the
// counts are logged); INVALID_ARGUMENT naming the file and record for a
// negative libsvm value (values weigh the ids' rows). Dense data
// (FASHION_MNIST, SYNTHETIC, under a GRAPH that is not an MLP) is held
// whole as AsDenseFeatures gives it, its test split too.
absl::StatusOr<ClickData> LoadClickData(const v1::JobSpec& spec, const std::vector<std::string>& roots,
                                        int64_t memory_budget);
v1::WorkReport ClickReadyReport(const v1::JobSpec& spec, const ClickData& data);

// A dense dataset as click data: no fields, its features dense ones, its
// class numbers the labels.
SparseDataset AsDenseFeatures(Dataset dataset);

// Trains until the job is through on this worker and then until it ends
// (reporting DONE for its partitions), as Trainer::Train. With `compute`
// (a GPU's backend), the model's layers run on it (kernels::GraphModel on a
// backend; a preset kind as its graph); null: on the host.
absl::Status RunClickJob(const std::string& worker_id, const TrainerHooks& hooks, ParameterTransport* transport,
                         const v1::Assignment& assignment, ClickData data, kernels::Backend* compute = nullptr);

}  // namespace fulcrum

#endif  // FULCRUM_WORKER_CTR_TRAINER_H_
