// libFuzzer: the IDX dataset loader (gzip or raw, images and labels), as a
// worker runs it on whatever file data.path names. The input is split into
// an image file and a label file (first byte: where); a 1 MiB memory budget
// bounds what the loader may take. Properties: no crash, a clear error code,
// and a loaded dataset is consistent (sizes, labels in range).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/dataset.h"

namespace {

// A file in memory, named /proc/self/fd/N.
std::string MemoryFile(const char* name, const uint8_t* data, size_t size, int* fd) {
  *fd = memfd_create(name, 0);
  if (*fd < 0) std::abort();
  if (size > 0 && write(*fd, data, size) != static_cast<ssize_t>(size)) std::abort();
  return absl::StrCat("/proc/self/fd/", *fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t split = std::min<size_t>(size - 1, data[0] * 4);
  int images_fd = -1, labels_fd = -1;
  const std::string images = MemoryFile("images", data + 1, split, &images_fd);
  const std::string labels = MemoryFile("labels", data + 1 + split, size - 1 - split, &labels_fd);
  absl::StatusOr<fulcrum::Dataset> dataset = fulcrum::LoadIdx(images, labels, 10, /*max_bytes=*/1 << 20);
  close(images_fd);
  close(labels_fd);
  if (!dataset.ok()) {
    switch (dataset.status().code()) {
      case absl::StatusCode::kInvalidArgument:
      case absl::StatusCode::kDataLoss:
      case absl::StatusCode::kResourceExhausted:
      case absl::StatusCode::kFailedPrecondition:
        return 0;
      default:
        std::abort();
    }
  }
  if (static_cast<int64_t>(dataset->labels.size()) != dataset->num_examples ||
      static_cast<int64_t>(dataset->features.size()) != dataset->num_examples * dataset->num_features) {
    std::abort();
  }
  for (int32_t label : dataset->labels) {
    if (label < 0 || label >= 10) std::abort();
  }
  return 0;
}
