// In-memory classification datasets: IDX (MNIST / Fashion-MNIST format)
// loading and a seeded synthetic generator.

#ifndef FULCRUM_WORKER_DATASET_H_
#define FULCRUM_WORKER_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fulcrum/v1/job.pb.h"

namespace fulcrum {

struct Dataset {
  int64_t num_examples = 0;
  int num_features = 0;
  int num_classes = 0;
  std::vector<float> features;  // [num_examples, num_features], row-major
  std::vector<int32_t> labels;  // [num_examples], each in [0, num_classes)
};

// Loads an IDX image file (magic 0x00000803: uint8 pixels, dims
// [count, rows, cols]) and an IDX label file (magic 0x00000801: uint8 labels,
// dims [count]). Both may be gzip-compressed or raw. Pixels are scaled to
// [0, 1] by dividing by 255; num_features = rows * cols. Bytes after the
// declared payload are ignored.
// Errors (each message names the file and the fix):
//   NotFound          a file does not exist
//   InvalidArgument   bad magic (got vs expected), zero rows/cols, image and
//                     label counts differ, a label >= num_classes, or
//                     num_classes <= 0
//   DataLoss          a file is shorter than its header declares (expected vs
//                     got bytes) or cannot be decompressed
//   FailedPrecondition  a file exists but cannot be opened or read
//   ResourceExhausted  the data would take more than `max_bytes` (0: no
//                      limit), checked from the headers before reading on
absl::StatusOr<Dataset> LoadIdx(const std::string& images_path,
                                const std::string& labels_path,
                                int num_classes = 10, int64_t max_bytes = 0);

// The memory a dataset of `examples` x `features` takes (float features,
// int32 labels).
int64_t DatasetBytes(int64_t examples, int64_t features);
inline int64_t DatasetBytes(const Dataset& dataset) {
  return DatasetBytes(dataset.num_examples, dataset.num_features);
}

// The folders a worker may read datasets from (fulcrum-worker --data-root).
constexpr char kDefaultDataRoots[] = "/usr/share/datasets,/data";

// OK when `path`, with symlinks and ".." resolved, lies under one of
// `roots` (any path when `roots` is empty); PERMISSION_DENIED naming the
// roots otherwise.
absl::Status CheckUnderRoots(const std::string& path,
                             const std::vector<std::string>& roots);

// Loads Fashion-MNIST from `dir`: train-{images-idx3,labels-idx1}-ubyte.gz
// when `train`, else t10k-*. Each file falls back to the same name without
// ".gz" when the .gz is absent; NotFound names both candidates when neither
// exists. Yields 60000 (train) or 10000 (test) examples of 784 features and
// 10 classes. `dir` and the files must lie under `roots` (CheckUnderRoots),
// checked before anything is opened.
absl::StatusOr<Dataset> LoadFashionMnist(
    const std::string& dir, bool train,
    const std::vector<std::string>& roots = {}, int64_t max_bytes = 0);

// Seeded synthetic classification data: num_classes Gaussian blobs in
// num_features dimensions. The class means depend only on `seed` (so every
// split shares them) and are drawn so that pairwise mean distances are about
// 6 noise standard deviations, which a softmax regression separates with high
// accuracy once num_features is moderately large (>= ~8). Labels are uniform
// and features are mean + N(0, 1). `split` selects an independent stream of
// examples (e.g. 0 = train, 1 = test). Fully deterministic for given
// arguments, independent of platform. Non-positive sizes yield a dataset with
// no examples.
Dataset MakeSynthetic(uint64_t seed, int64_t num_examples, int num_features,
                      int num_classes, int split);

// One split of a job's dense data: FASHION_MNIST from data.path (under
// `roots`), or SYNTHETIC from `seed` (the test split a fifth of
// data.syntheticExamples, at least one), within `budget` bytes (0: no
// limit; RESOURCE_EXHAUSTED naming the split beyond it, or when an
// allocation fails).
absl::StatusOr<Dataset> LoadDenseSplit(const v1::DataSpec& data, uint64_t seed, bool train,
                                       const std::vector<std::string>& roots, int64_t budget);

}  // namespace fulcrum

#endif  // FULCRUM_WORKER_DATASET_H_
