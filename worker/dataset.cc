#include "worker/dataset.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/counter_rng.h"
#include "common/memory_budget.h"
#include "common/param_init.h"
#include "common/status_macros.h"
#include "worker/data_file.h"

namespace fulcrum {
namespace {

constexpr uint32_t kImageMagic = 0x00000803;
constexpr uint32_t kLabelMagic = 0x00000801;
constexpr int64_t kReadChunk = int64_t{1} << 24;

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzPtr = std::unique_ptr<gzFile_s, GzCloser>;

// An open IDX file positioned just after its header.
struct IdxFile {
  std::string path;
  GzPtr file;
  std::vector<uint32_t> dims;
};

std::string Hex(uint32_t value) {
  return absl::StrCat("0x", absl::Hex(value));
}

absl::StatusOr<GzPtr> OpenGz(const std::string& path) {
  absl::StatusOr<int> fd = OpenDataFile(path, "dataset file");
  if (absl::IsNotFound(fd.status())) {
    return absl::NotFoundError(absl::StrCat(
        "dataset file ", path, ": does not exist; check the path or download "
        "the dataset there"));
  }
  if (!fd.ok()) return fd.status();
  errno = 0;
  GzPtr file(gzdopen(*fd, "rb"));  // owns the descriptor from here
  if (file != nullptr) return file;
  const int err = errno;
  close(*fd);
  return absl::FailedPreconditionError(
      absl::StrCat("dataset file ", path, ": cannot open (",
                   err != 0 ? std::strerror(err) : "out of memory",
                   "); check that it is a readable file"));
}

// Reads up to `bytes` bytes; stops early only at end of file.
absl::StatusOr<std::vector<uint8_t>> ReadUpTo(gzFile_s* file,
                                              const std::string& path,
                                              int64_t bytes) {
  std::vector<uint8_t> data;
  while (static_cast<int64_t>(data.size()) < bytes) {
    const int64_t want =
        std::min(kReadChunk, bytes - static_cast<int64_t>(data.size()));
    const size_t start = data.size();
    data.resize(start + want);  // grows with what is actually present
    const int got =
        gzread(file, data.data() + start, static_cast<unsigned>(want));
    if (got < 0) {
      int code = 0;
      const char* message = gzerror(file, &code);
      const std::string text = absl::StrCat(
          "dataset file ", path, ": read failed (",
          code == Z_ERRNO ? std::strerror(errno) : message, ")");
      if (code == Z_ERRNO) {
        return absl::FailedPreconditionError(
            absl::StrCat(text, "; check that it is a readable regular file"));
      }
      return absl::DataLossError(
          absl::StrCat(text, "; the file is corrupt, download it again"));
    }
    data.resize(start + got);
    if (got < want) break;
  }
  return data;
}

absl::StatusOr<std::vector<uint8_t>> ReadExactly(gzFile_s* file,
                                                 const std::string& path,
                                                 int64_t bytes,
                                                 const std::string& what) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> data, ReadUpTo(file, path, bytes));
  if (static_cast<int64_t>(data.size()) < bytes) {
    return absl::DataLossError(absl::StrCat(
        "dataset file ", path, ": truncated: expected ", bytes, " bytes of ",
        what, ", got ", data.size(), "; download the file again"));
  }
  return data;
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Opens an IDX file, checks its magic and reads its num_dims dimensions.
absl::StatusOr<IdxFile> OpenIdx(const std::string& path, uint32_t magic,
                                int num_dims, const char* kind) {
  ASSIGN_OR_RETURN(GzPtr file, OpenGz(path));
  ASSIGN_OR_RETURN(const std::vector<uint8_t> head,
                   ReadExactly(file.get(), path, 4, "IDX magic number"));
  const uint32_t got_magic = BigEndian32(head.data());
  if (got_magic != magic) {
    // The bytes read are never echoed: the path may name a file that is not
    // a dataset at all, and errors travel to whoever submitted the job.
    const bool other_idx = got_magic == kImageMagic || got_magic == kLabelMagic;
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset file ", path, ": bad magic, expected ", Hex(magic), " (",
        kind, "): ",
        other_idx ? "it is the other IDX file of the pair (images and labels swapped?)"
                  : "it is not an IDX file",
        "; check that the file is the ", kind, " file of the pair"));
  }
  ASSIGN_OR_RETURN(
      const std::vector<uint8_t> dims_bytes,
      ReadExactly(file.get(), path, 4 * num_dims, "IDX dimensions"));
  IdxFile idx{path, std::move(file), {}};
  for (int i = 0; i < num_dims; ++i) {
    idx.dims.push_back(BigEndian32(dims_bytes.data() + 4 * i));
  }
  return idx;
}

absl::Status CheckImageShape(const IdxFile& images) {
  const uint64_t rows = images.dims[1], cols = images.dims[2];
  if (rows == 0 || cols == 0 || rows * cols > uint64_t{INT_MAX}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset file ", images.path, ": image shape ", rows, "x", cols,
        " is invalid; rows and cols must be positive with rows*cols <= ",
        INT_MAX));
  }
  return absl::OkStatus();
}

absl::Status CheckCounts(const IdxFile& images, const IdxFile& labels) {
  if (images.dims[0] == labels.dims[0]) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "dataset files ", images.path, " and ", labels.path,
      ": image count ", images.dims[0], " != label count ", labels.dims[0],
      "; make sure both files belong to the same split"));
}

absl::Status ConvertLabels(const std::string& path,
                           const std::vector<uint8_t>& bytes, int num_classes,
                           std::vector<int32_t>* labels) {
  labels->resize(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] >= num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dataset file ", path, ": label[", i, "] = ", int{bytes[i]},
          " is >= num_classes = ", num_classes,
          "; pass the right num_classes or check the file"));
    }
    (*labels)[i] = bytes[i];
  }
  return absl::OkStatus();
}

// Returns dir/name.gz if it exists, else dir/name if that exists.
absl::StatusOr<std::string> ResolveDataFile(const std::string& dir,
                                            const std::string& name) {
  const std::filesystem::path base = std::filesystem::path(dir) / name;
  const std::string gz = base.string() + ".gz";
  std::error_code error;
  if (std::filesystem::exists(gz, error)) return gz;
  if (std::filesystem::exists(base, error)) return base.string();
  return absl::NotFoundError(absl::StrCat(
      "dataset file ", gz, ": does not exist (nor does ", base.string(),
      "); download Fashion-MNIST into ", dir));
}

std::vector<double> SyntheticMeans(uint64_t seed, int num_features,
                                   int num_classes) {
  // Pairwise distance between two means ~ std * sqrt(2 * num_features) = 6.
  const double std_dev = 6.0 / std::sqrt(2.0 * num_features);
  CounterRng rng(SplitMix64(SplitMix64(seed) ^ 0x6d65616e73ULL));  // "means"
  std::vector<double> means(static_cast<size_t>(num_features) * num_classes);
  for (double& value : means) value = std_dev * rng.Normal();
  return means;
}

}  // namespace

int64_t DatasetBytes(int64_t examples, int64_t features) {
  return examples * (features * static_cast<int64_t>(sizeof(float)) +
                     static_cast<int64_t>(sizeof(int32_t)));
}

absl::StatusOr<Dataset> LoadIdx(const std::string& images_path,
                                const std::string& labels_path,
                                int num_classes, int64_t max_bytes) {
  if (num_classes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LoadIdx: num_classes = ", num_classes, " must be positive"));
  }
  ASSIGN_OR_RETURN(IdxFile images,
                   OpenIdx(images_path, kImageMagic, 3, "IDX uint8 images"));
  RETURN_IF_ERROR(CheckImageShape(images));
  ASSIGN_OR_RETURN(IdxFile labels,
                   OpenIdx(labels_path, kLabelMagic, 1, "IDX uint8 labels"));
  RETURN_IF_ERROR(CheckCounts(images, labels));

  Dataset dataset;
  dataset.num_examples = images.dims[0];
  dataset.num_features = static_cast<int>(images.dims[1] * images.dims[2]);
  // The pixels are read as bytes, then widened: both are held for a moment.
  const int64_t needed = DatasetBytes(dataset.num_examples, dataset.num_features) +
                         dataset.num_examples * int64_t{dataset.num_features};
  if (max_bytes > 0 && needed > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "dataset file ", images_path, ": ", dataset.num_examples, " images of ",
        dataset.num_features, " pixels need ", needed,
        " bytes to load; this worker's memory budget leaves ", max_bytes,
        " (fulcrum-worker --memory-budget)"));
  }
  dataset.num_classes = num_classes;
  ASSIGN_OR_RETURN(
      const std::vector<uint8_t> pixels,
      ReadExactly(images.file.get(), images_path,
                  dataset.num_examples * dataset.num_features,
                  "pixel data after the header"));
  ASSIGN_OR_RETURN(
      const std::vector<uint8_t> label_bytes,
      ReadExactly(labels.file.get(), labels_path, dataset.num_examples,
                  "labels after the header"));
  RETURN_IF_ERROR(
      ConvertLabels(labels_path, label_bytes, num_classes, &dataset.labels));
  dataset.features.resize(pixels.size());
  std::transform(pixels.begin(), pixels.end(), dataset.features.begin(),
                 [](uint8_t p) { return p / 255.0f; });
  return dataset;
}

absl::Status CheckUnderRoots(const std::string& path,
                             const std::vector<std::string>& roots) {
  if (roots.empty()) return absl::OkStatus();
  // Symlinks resolved (as far as the path exists) and "." / ".." folded, so
  // that neither a link nor "/data/../etc" leads out of a root.
  std::error_code error;
  const std::filesystem::path real =
      std::filesystem::weakly_canonical(path, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset path ", path, ": cannot resolve it (", error.message(), ")"));
  }
  for (const std::string& root : roots) {
    std::error_code root_error;
    const std::filesystem::path base =
        std::filesystem::weakly_canonical(root, root_error);
    if (root_error) continue;
    auto [end, _] = std::mismatch(base.begin(), base.end(), real.begin(),
                                  real.end());
    if (end == base.end()) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "dataset path ", path, " is outside the folders this worker may read (",
      absl::StrJoin(roots, ", "),
      "); the operator sets them with fulcrum-worker --data-root"));
}

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train,
                                         const std::vector<std::string>& roots,
                                         int64_t max_bytes) {
  RETURN_IF_ERROR(CheckUnderRoots(dir, roots));
  const std::string prefix = train ? "train" : "t10k";
  ASSIGN_OR_RETURN(const std::string images,
                   ResolveDataFile(dir, prefix + "-images-idx3-ubyte"));
  ASSIGN_OR_RETURN(const std::string labels,
                   ResolveDataFile(dir, prefix + "-labels-idx1-ubyte"));
  // The files themselves may be links out of the folder.
  RETURN_IF_ERROR(CheckUnderRoots(images, roots));
  RETURN_IF_ERROR(CheckUnderRoots(labels, roots));
  return LoadIdx(images, labels, 10, max_bytes);
}

Dataset MakeSynthetic(uint64_t seed, int64_t num_examples, int num_features,
                      int num_classes, int split) {
  Dataset dataset;
  if (num_examples <= 0 || num_features <= 0 || num_classes <= 0) {
    return dataset;
  }
  dataset.num_examples = num_examples;
  dataset.num_features = num_features;
  dataset.num_classes = num_classes;
  const std::vector<double> means =
      SyntheticMeans(seed, num_features, num_classes);
  CounterRng rng(SplitMix64(SplitMix64(seed) + 1 + static_cast<uint32_t>(split)));
  dataset.labels.resize(num_examples);
  dataset.features.resize(num_examples * num_features);
  for (int64_t i = 0; i < num_examples; ++i) {
    const int32_t label = static_cast<int32_t>(rng.NextBits() % num_classes);
    dataset.labels[i] = label;
    const double* mean = means.data() + int64_t{label} * num_features;
    float* row = dataset.features.data() + i * num_features;
    for (int j = 0; j < num_features; ++j) {
      row[j] = static_cast<float>(mean[j] + rng.Normal());
    }
  }
  return dataset;
}

absl::StatusOr<Dataset> LoadDenseSplit(const v1::DataSpec& data, uint64_t seed, bool train,
                                       const std::vector<std::string>& roots, int64_t budget) {
  try {  // an allocation that fails fails the job, not the process
    if (data.dataset() == v1::DataSpec::FASHION_MNIST) return LoadFashionMnist(data.path(), train, roots, budget);
    const int64_t n = train ? data.synthetic_examples() : std::max<int64_t>(1, data.synthetic_examples() / 5);
    const int64_t bytes = DatasetBytes(n, data.synthetic_features());
    if (budget > 0 && bytes > budget) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the synthetic ", train ? "training" : "test", " set (", n, " examples x ", data.synthetic_features(),
          " features) needs ", FormatBytes(bytes), "; this worker has ", FormatBytes(budget),
          " left of its memory budget (fulcrum-worker --memory-budget)"));
    }
    return MakeSynthetic(seed, n, data.synthetic_features(), data.synthetic_classes(), train ? 0 : 1);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory loading the ", train ? "training" : "test",
                                                     " set: this worker cannot hold it"));
  }
}

}  // namespace fulcrum
