// Argument checks and error messages shared by the backends, so that the CPU
// and CUDA backends reject the same calls with the same words. Header-only:
// the CUDA plugin includes it without linking the CPU backend.

#ifndef FULCRUM_KERNELS_BACKEND_CHECKS_H_
#define FULCRUM_KERNELS_BACKEND_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend.h"

namespace fulcrum {
namespace kernels {
namespace checks {

inline absl::Status Dim(const char* op, const char* name, int64_t value) {
  if (value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " = ", value, " is negative; dimensions must be >= 0"));
}

// `ptr` must be non-null when it has to hold `elements` > 0 elements.
inline absl::Status Ptr(const char* op, const char* name, const void* ptr, int64_t elements) {
  if (ptr != nullptr || elements == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " is null but must hold ", elements, " elements"));
}

inline absl::Status Bytes(const char* op, const char* name, const void* ptr, size_t bytes) {
  if (ptr != nullptr || bytes == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is null but must hold ", bytes, " bytes"));
}

inline absl::Status ActivationValue(const char* op, Activation act) {
  switch (act) {
    case Activation::kNone:
    case Activation::kRelu:
    case Activation::kTanh:
    case Activation::kSigmoid:
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(op, ": unknown activation value ", static_cast<int>(act),
                                                 "; use one of kNone, kRelu, kTanh, kSigmoid"));
}

inline absl::Status PrecisionValue(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
    case Precision::kTf32:
    case Precision::kBf16:
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("SetPrecision: unknown precision value ",
                                                 static_cast<int>(precision), "; use kFp32, kTf32 or kBf16"));
}

inline absl::Status HalfTypeValue(const char* op, HalfType type) {
  if (type == HalfType::kFp16 || type == HalfType::kBf16) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": unknown half type value ", static_cast<int>(type), "; use kFp16 or kBf16"));
}

// The first error of `statuses`, or OK.
inline absl::Status FirstError(std::initializer_list<absl::Status> statuses) {
  for (const absl::Status& status : statuses) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

// The shape and pointer checks of EmbeddingBagForward (table = "table",
// bag_rows = "out") and EmbeddingBagBackward ("dtable", "dout"). ids are
// checked with the data, since how many there are is offsets[bags].
inline absl::Status BagArgs(const char* op, int bags, int dim, const int32_t* offsets, int64_t table_rows,
                            const void* table, const char* table_name, const void* bag_rows,
                            const char* bag_rows_name) {
  return FirstError({Dim(op, "bags", bags), Dim(op, "dim", dim), Dim(op, "table_rows", table_rows),
                     Ptr(op, "offsets", offsets, bags == 0 ? 0 : int64_t{bags} + 1),
                     Ptr(op, table_name, table, table_rows * dim),
                     Ptr(op, bag_rows_name, bag_rows, int64_t{bags} * dim)});
}

// CopyColumns' shape: rows and cols >= 0, each ld >= cols, the pointers
// non-null when there is anything to copy.
inline absl::Status CopyColumnsArgs(const char* op, int rows, int cols, const void* src, int src_ld,
                                    const void* dst, int dst_ld) {
  absl::Status dims = FirstError({Dim(op, "rows", rows), Dim(op, "cols", cols)});
  if (!dims.ok()) return dims;
  if (src_ld < cols || dst_ld < cols) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": src_ld = ", src_ld, " and dst_ld = ", dst_ld, " must both be >= cols = ", cols));
  }
  const int64_t elements = int64_t{rows} * cols;
  return FirstError({Ptr(op, "src", src, elements), Ptr(op, "dst", dst, elements)});
}

// The shape of FmForward/FmBackward and PairwiseDotForward/Backward: x
// [rows, vectors, dim] and `out_name` with `out_elements` elements.
inline absl::Status InteractionArgs(const char* op, int rows, int vectors, int dim, const void* x,
                                    const char* out_name, const void* out, int64_t out_elements) {
  return FirstError({Dim(op, "rows", rows), Dim(op, "vectors", vectors), Dim(op, "dim", dim),
                     Ptr(op, "x", x, int64_t{rows} * vectors * dim), Ptr(op, out_name, out, out_elements)});
}

inline absl::Status PointLossValue(const char* op, Backend::PointLoss loss) {
  if (loss == Backend::PointLoss::kSigmoidCrossEntropy || loss == Backend::PointLoss::kSquaredError) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(op, ": unknown loss value ", static_cast<int>(loss),
                                                 "; use kSigmoidCrossEntropy or kSquaredError"));
}

// Whether `label` is one `loss` takes: [0, 1] for sigmoid cross-entropy,
// finite for the squared error.
inline bool PointLabelOk(Backend::PointLoss loss, float label) {
  if (loss == Backend::PointLoss::kSigmoidCrossEntropy) return label >= 0.0f && label <= 1.0f;
  return label - label == 0.0f;  // finite
}

// --- Data errors (found on the host by the CPU backend, on the device by the
// CUDA backend; both report the first offending index) -----------------------

inline absl::Status LabelOutOfRange(int64_t index, int64_t label, int64_t classes) {
  return absl::InvalidArgumentError(absl::StrCat("SoftmaxCrossEntropy: labels[", index, "] = ", label,
                                                 " is out of range [0, ", classes,
                                                 "); check the dataset's num_classes against the model's"));
}

inline absl::Status BadOffset(const char* op, int64_t index, int64_t value) {
  if (index == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": offsets[0] = ", value, " must be 0 (offsets has bags + 1 entries)"));
  }
  return absl::InvalidArgumentError(absl::StrCat(op, ": offsets[", index, "] = ", value,
                                                 " is less than offsets[", index - 1,
                                                 "]; offsets must be non-decreasing"));
}

inline absl::Status IdOutOfRange(const char* op, int64_t index, int64_t id, int64_t table_rows) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ids[", index, "] = ", id, " is out of range [0, ",
                                                 table_rows, ") of the table's rows"));
}

inline absl::Status BadPointLabel(int64_t index, float label, Backend::PointLoss loss) {
  return absl::InvalidArgumentError(absl::StrCat("PointwiseLoss: labels[", index, "] = ", label,
                                                 loss == Backend::PointLoss::kSigmoidCrossEntropy
                                                     ? " is outside [0, 1], which sigmoid cross-entropy takes"
                                                     : " is not finite"));
}

inline absl::Status UnknownBuffer(const void* buffer) {
  return absl::InvalidArgumentError(absl::StrCat("Free: 0x", absl::Hex(reinterpret_cast<uintptr_t>(buffer)),
                                                 " was not allocated by this backend (or was freed twice)"));
}

inline absl::Status NullIds(const char* op) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ids is null but the bags are not all empty (offsets[bags] > 0)"));
}

}  // namespace checks
}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_BACKEND_CHECKS_H_
