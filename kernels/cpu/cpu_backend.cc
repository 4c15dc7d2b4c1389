#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "common/status_macros.h"
#include "kernels/backend_checks.h"
#include "kernels/caching_pool.h"
#include "kernels/cpu/activation.h"

namespace fulcrum {
namespace kernels {
namespace {

// C = beta * C for an [m, n] matrix; beta == 0 overwrites (ignores NaN).
void ScaleMatrix(int64_t elements, float beta, float* c) {
  if (beta == 0.0f) {
    std::fill(c, c + elements, 0.0f);
  } else if (beta != 1.0f) {
    for (int64_t i = 0; i < elements; ++i) c[i] *= beta;
  }
}

absl::Status CheckLabels(int rows, int classes, const int32_t* labels) {
  for (int i = 0; i < rows; ++i) {
    if (labels[i] < 0 || labels[i] >= classes) return checks::LabelOutOfRange(i, labels[i], classes);
  }
  return absl::OkStatus();
}

// Offsets start at 0 and never decrease; then every id is a row of the table.
// Offsets are checked first (all of them), then ids, so the CUDA backend,
// which checks in parallel, reports the same first error.
absl::Status CheckBags(const char* op, int bags, const int32_t* offsets, const int32_t* ids,
                       int64_t table_rows) {
  if (bags == 0) return absl::OkStatus();
  if (offsets[0] != 0) return checks::BadOffset(op, 0, offsets[0]);
  for (int b = 0; b < bags; ++b) {
    if (offsets[b + 1] < offsets[b]) return checks::BadOffset(op, b + 1, offsets[b + 1]);
  }
  const int32_t total = offsets[bags];
  if (total > 0 && ids == nullptr) return checks::NullIds(op);
  for (int32_t j = 0; j < total; ++j) {
    if (ids[j] < 0 || ids[j] >= table_rows) return checks::IdOutOfRange(op, j, ids[j], table_rows);
  }
  return absl::OkStatus();
}

// 1 / (1 + e^-z) without overflow for large |z|.
float StableSigmoid(float z) {
  if (z >= 0.0f) return 1.0f / (1.0f + std::exp(-z));
  const float e = std::exp(z);
  return e / (1.0f + e);
}

// Host memory for the pool: 256-byte aligned.
struct HostAllocator {
  absl::StatusOr<void*> Allocate(size_t bytes) {
    void* block = std::aligned_alloc(256, bytes);  // bytes is a multiple of 256
    if (block == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("Allocate: out of host memory for ", bytes, " bytes"));
    }
    return block;
  }
  void Free(void* block) { std::free(block); }
};

// Freed host blocks kept for reuse at most; beyond that they go back to libc.
constexpr size_t kMaxCachedHostBytes = size_t{1} << 30;

struct RowResult {
  double loss = 0.0;
  bool correct = false;
};

// Softmax cross-entropy for one row; writes drow when non-null.
RowResult SoftmaxRow(int classes, const float* row, int32_t label, float grad_scale, float* drow) {
  int argmax = 0;
  for (int j = 1; j < classes; ++j) {
    if (row[j] > row[argmax]) argmax = j;
  }
  const float max_logit = row[argmax];
  double sum = 0.0;
  for (int j = 0; j < classes; ++j) sum += std::exp(double{row[j]} - max_logit);
  RowResult result;
  result.loss = max_logit + std::log(sum) - row[label];
  result.correct = argmax == label;
  if (drow != nullptr) {
    for (int j = 0; j < classes; ++j) {
      const double p = std::exp(double{row[j]} - max_logit) / sum;
      drow[j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) * grad_scale);
    }
  }
  return result;
}

class CpuBackend : public Backend {
 public:
  const char* Name() const override { return "cpu"; }

  bool HostMemory() const override { return true; }

  absl::StatusOr<void*> Allocate(size_t bytes) override { return pool_.Allocate(bytes); }

  void Free(void* buffer) override {
    if (!pool_.Free(buffer) && deferred_error_.ok()) {
      deferred_error_ = checks::UnknownBuffer(buffer);
    }
  }

  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override {
    RETURN_IF_ERROR(checks::FirstError({checks::Bytes("CopyFromHost", "dst", dst, bytes),
                                        checks::Bytes("CopyFromHost", "host_src", host_src, bytes)}));
    if (bytes > 0) std::memmove(dst, host_src, bytes);
    return absl::OkStatus();
  }

  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    RETURN_IF_ERROR(checks::FirstError({checks::Bytes("CopyToHost", "host_dst", host_dst, bytes),
                                        checks::Bytes("CopyToHost", "src", src, bytes)}));
    if (bytes > 0) std::memmove(host_dst, src, bytes);
    return absl::OkStatus();
  }

  // Nothing runs asynchronously; reports a bad Free() since the last call.
  absl::Status Synchronize() override { return std::exchange(deferred_error_, absl::OkStatus()); }

  absl::Status SetPrecision(Precision precision) override { return checks::PrecisionValue(precision); }

  absl::Status Fill(int64_t n, float value, float* x) override {
    RETURN_IF_ERROR(checks::FirstError({checks::Dim("Fill", "n", n), checks::Ptr("Fill", "x", x, n)}));
    std::fill(x, x + n, value);
    return absl::OkStatus();
  }

  absl::Status Axpy(int64_t n, float alpha, const float* x, float* y) override {
    RETURN_IF_ERROR(checks::FirstError(
        {checks::Dim("Axpy", "n", n), checks::Ptr("Axpy", "x", x, n), checks::Ptr("Axpy", "y", y, n)}));
    for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
    return absl::OkStatus();
  }

  absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    const float* b, float beta, float* c) override {
    const int64_t mk = int64_t{m} * k, kn = int64_t{k} * n, mn = int64_t{m} * n;
    absl::Status status = checks::FirstError(
        {checks::Dim("Gemm", "m", m), checks::Dim("Gemm", "n", n), checks::Dim("Gemm", "k", k),
         checks::Ptr("Gemm", "a", a, mk), checks::Ptr("Gemm", "b", b, kn), checks::Ptr("Gemm", "c", c, mn)});
    if (!status.ok()) return status;
    if (mn == 0) return absl::OkStatus();
    if (k == 0) {
      ScaleMatrix(mn, beta, c);
      return absl::OkStatus();
    }
    const int lda = std::max(1, trans_a ? m : k);
    const int ldb = std::max(1, trans_b ? k : n);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, a, lda, b, ldb, beta, c, std::max(1, n));
    return absl::OkStatus();
  }

  absl::Status BiasActivationForward(Activation act, int rows, int cols, const float* bias,
                                     float* x) override {
    const char* op = "BiasActivationForward";
    absl::Status status = checks::FirstError(
        {checks::ActivationValue(op, act), checks::Dim(op, "rows", rows), checks::Dim(op, "cols", cols),
         checks::Ptr(op, "bias", bias, rows == 0 ? 0 : cols), checks::Ptr(op, "x", x, int64_t{rows} * cols)});
    if (!status.ok()) return status;
    for (int i = 0; i < rows; ++i) {
      float* row = x + int64_t{i} * cols;
      for (int j = 0; j < cols; ++j) row[j] = Activate(act, row[j] + bias[j]);
    }
    return absl::OkStatus();
  }

  absl::Status ActivationBackward(Activation act, int64_t n, const float* y, float* dy) override {
    const char* op = "ActivationBackward";
    absl::Status status = checks::FirstError({checks::ActivationValue(op, act), checks::Dim(op, "n", n),
                                              checks::Ptr(op, "y", y, n), checks::Ptr(op, "dy", dy, n)});
    if (!status.ok()) return status;
    if (act == Activation::kRelu) {
      // Select rather than multiply so a masked-out dy never leaks NaN/inf.
      for (int64_t i = 0; i < n; ++i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
    } else if (act != Activation::kNone) {
      for (int64_t i = 0; i < n; ++i) dy[i] *= ActivationGrad(act, y[i]);
    }
    return absl::OkStatus();
  }

  absl::Status ColumnSum(int rows, int cols, const float* x, float* out, bool accumulate) override {
    const char* op = "ColumnSum";
    absl::Status status = checks::FirstError({checks::Dim(op, "rows", rows), checks::Dim(op, "cols", cols),
                                              checks::Ptr(op, "x", x, int64_t{rows} * cols),
                                              checks::Ptr(op, "out", out, cols)});
    if (!status.ok()) return status;
    if (!accumulate) std::fill(out, out + cols, 0.0f);
    for (int i = 0; i < rows; ++i) {
      const float* row = x + int64_t{i} * cols;
      for (int j = 0; j < cols; ++j) out[j] += row[j];
    }
    return absl::OkStatus();
  }

  absl::Status SoftmaxCrossEntropy(int rows, int classes, const float* logits, const int32_t* labels,
                                   float grad_scale, float* dlogits, double* loss_sum,
                                   int64_t* correct) override {
    const char* op = "SoftmaxCrossEntropy";
    absl::Status status =
        checks::FirstError({checks::Dim(op, "rows", rows), checks::Dim(op, "classes", classes),
                            checks::Ptr(op, "logits", logits, int64_t{rows} * classes),
                            checks::Ptr(op, "labels", labels, rows)});
    if (!status.ok()) return status;
    status = CheckLabels(rows, classes, labels);
    if (!status.ok()) return status;
    double total_loss = 0.0;
    int64_t total_correct = 0;
    for (int i = 0; i < rows; ++i) {
      const int64_t offset = int64_t{i} * classes;
      const RowResult row = SoftmaxRow(classes, logits + offset, labels[i], grad_scale,
                                       dlogits == nullptr ? nullptr : dlogits + offset);
      total_loss += row.loss;
      total_correct += row.correct ? 1 : 0;
    }
    if (loss_sum != nullptr) *loss_sum += total_loss;
    if (correct != nullptr) *correct += total_correct;
    return absl::OkStatus();
  }

  absl::Status PackHalf(HalfType type, int64_t n, const float* src, uint16_t* dst) override {
    const char* op = "PackHalf";
    RETURN_IF_ERROR(checks::FirstError({checks::HalfTypeValue(op, type), checks::Dim(op, "n", n),
                                        checks::Ptr(op, "src", src, n), checks::Ptr(op, "dst", dst, n)}));
    if (type == HalfType::kFp16) {
      FloatsToFp16(src, n, dst);
    } else {
      FloatsToBf16(src, n, dst);
    }
    return absl::OkStatus();
  }

  absl::Status UnpackHalf(HalfType type, int64_t n, const uint16_t* src, float* dst) override {
    const char* op = "UnpackHalf";
    RETURN_IF_ERROR(checks::FirstError({checks::HalfTypeValue(op, type), checks::Dim(op, "n", n),
                                        checks::Ptr(op, "src", src, n), checks::Ptr(op, "dst", dst, n)}));
    if (type == HalfType::kFp16) {
      Fp16sToFloats(src, n, dst);
    } else {
      Bf16sToFloats(src, n, dst);
    }
    return absl::OkStatus();
  }

  absl::Status EmbeddingBagForward(int bags, int dim, const int32_t* offsets, const int32_t* ids,
                                   const float* scales, int64_t table_rows, const float* table,
                                   float* out) override {
    const char* op = "EmbeddingBagForward";
    RETURN_IF_ERROR(checks::BagArgs(op, bags, dim, offsets, table_rows, table, "table", out, "out"));
    RETURN_IF_ERROR(CheckBags(op, bags, offsets, ids, table_rows));
    for (int b = 0; b < bags; ++b) {
      float* row = out + int64_t{b} * dim;
      std::fill(row, row + dim, 0.0f);
      for (int32_t j = offsets[b]; j < offsets[b + 1]; ++j) {
        const float* source = table + int64_t{ids[j]} * dim;
        const float scale = scales == nullptr ? 1.0f : scales[j];
        for (int d = 0; d < dim; ++d) row[d] += scale * source[d];
      }
    }
    return absl::OkStatus();
  }

  absl::Status EmbeddingBagBackward(int bags, int dim, const int32_t* offsets, const int32_t* ids,
                                    const float* scales, int64_t table_rows, const float* dout,
                                    float* dtable) override {
    const char* op = "EmbeddingBagBackward";
    RETURN_IF_ERROR(checks::BagArgs(op, bags, dim, offsets, table_rows, dtable, "dtable", dout, "dout"));
    RETURN_IF_ERROR(CheckBags(op, bags, offsets, ids, table_rows));
    for (int b = 0; b < bags; ++b) {
      const float* grad = dout + int64_t{b} * dim;
      for (int32_t j = offsets[b]; j < offsets[b + 1]; ++j) {
        float* target = dtable + int64_t{ids[j]} * dim;
        const float scale = scales == nullptr ? 1.0f : scales[j];
        for (int d = 0; d < dim; ++d) target[d] += scale * grad[d];
      }
    }
    return absl::OkStatus();
  }

  absl::Status CopyColumns(int rows, int cols, const float* src, int src_ld, float* dst, int dst_ld,
                           bool accumulate) override {
    RETURN_IF_ERROR(checks::CopyColumnsArgs("CopyColumns", rows, cols, src, src_ld, dst, dst_ld));
    for (int r = 0; r < rows; ++r) {
      const float* from = src + int64_t{r} * src_ld;
      float* to = dst + int64_t{r} * dst_ld;
      if (accumulate) {
        for (int c = 0; c < cols; ++c) to[c] += from[c];
      } else {
        std::copy_n(from, cols, to);
      }
    }
    return absl::OkStatus();
  }

  absl::Status FmForward(int rows, int vectors, int dim, const float* x, float* out) override {
    RETURN_IF_ERROR(checks::InteractionArgs("FmForward", rows, vectors, dim, x, "out", out, rows));
    sums_.resize(static_cast<size_t>(dim));
    for (int r = 0; r < rows; ++r) {
      const float* v = x + int64_t{r} * vectors * dim;
      std::fill(sums_.begin(), sums_.end(), 0.0f);
      float squares = 0.0f;
      for (int i = 0; i < vectors; ++i) {
        for (int d = 0; d < dim; ++d) {
          const float value = v[int64_t{i} * dim + d];
          sums_[static_cast<size_t>(d)] += value;
          squares += value * value;
        }
      }
      float sum_squared = 0.0f;
      for (float s : sums_) sum_squared += s * s;
      out[r] = 0.5f * (sum_squared - squares);
    }
    return absl::OkStatus();
  }

  absl::Status FmBackward(int rows, int vectors, int dim, const float* x, const float* dout,
                          float* dx) override {
    const char* op = "FmBackward";
    RETURN_IF_ERROR(
        checks::InteractionArgs(op, rows, vectors, dim, x, "dx", dx, int64_t{rows} * vectors * dim));
    RETURN_IF_ERROR(checks::Ptr(op, "dout", dout, rows));
    sums_.resize(static_cast<size_t>(dim));
    for (int r = 0; r < rows; ++r) {
      const int64_t base = int64_t{r} * vectors * dim;
      std::fill(sums_.begin(), sums_.end(), 0.0f);
      for (int i = 0; i < vectors; ++i) {
        for (int d = 0; d < dim; ++d) sums_[static_cast<size_t>(d)] += x[base + int64_t{i} * dim + d];
      }
      for (int i = 0; i < vectors; ++i) {
        for (int d = 0; d < dim; ++d) {
          const int64_t at = base + int64_t{i} * dim + d;
          dx[at] += dout[r] * (sums_[static_cast<size_t>(d)] - x[at]);
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status PairwiseDotForward(int rows, int vectors, int dim, const float* x, float* out) override {
    const int64_t pairs = int64_t{vectors} * (vectors - 1) / 2;
    RETURN_IF_ERROR(
        checks::InteractionArgs("PairwiseDotForward", rows, vectors, dim, x, "out", out, rows * pairs));
    for (int r = 0; r < rows; ++r) {
      const float* v = x + int64_t{r} * vectors * dim;
      float* row = out + r * pairs;
      int64_t p = 0;
      for (int i = 0; i < vectors; ++i) {
        for (int j = i + 1; j < vectors; ++j) {
          float dot = 0.0f;
          for (int d = 0; d < dim; ++d) dot += v[int64_t{i} * dim + d] * v[int64_t{j} * dim + d];
          row[p++] = dot;
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status PairwiseDotBackward(int rows, int vectors, int dim, const float* x, const float* dout,
                                   float* dx) override {
    const char* op = "PairwiseDotBackward";
    const int64_t pairs = int64_t{vectors} * (vectors - 1) / 2;
    RETURN_IF_ERROR(
        checks::InteractionArgs(op, rows, vectors, dim, x, "dx", dx, int64_t{rows} * vectors * dim));
    RETURN_IF_ERROR(checks::Ptr(op, "dout", dout, rows * pairs));
    for (int r = 0; r < rows; ++r) {
      const float* v = x + int64_t{r} * vectors * dim;
      float* dv = dx + int64_t{r} * vectors * dim;
      const float* g = dout + r * pairs;
      int64_t p = 0;
      for (int i = 0; i < vectors; ++i) {
        for (int j = i + 1; j < vectors; ++j) {
          const float gij = g[p++];
          for (int d = 0; d < dim; ++d) {
            dv[int64_t{i} * dim + d] += gij * v[int64_t{j} * dim + d];
            dv[int64_t{j} * dim + d] += gij * v[int64_t{i} * dim + d];
          }
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status PointwiseLoss(PointLoss loss, int rows, const float* z, const float* labels, float grad_scale,
                             float* dz, double* loss_sum) override {
    const char* op = "PointwiseLoss";
    RETURN_IF_ERROR(
        checks::FirstError({checks::PointLossValue(op, loss), checks::Dim(op, "rows", rows),
                            checks::Ptr(op, "z", z, rows), checks::Ptr(op, "labels", labels, rows)}));
    for (int r = 0; r < rows; ++r) {
      if (!checks::PointLabelOk(loss, labels[r])) return checks::BadPointLabel(r, labels[r], loss);
    }
    double total = 0;
    for (int r = 0; r < rows; ++r) {
      const float y = labels[r];
      float gradient;
      if (loss == PointLoss::kSigmoidCrossEntropy) {
        total += std::max(z[r], 0.0f) - z[r] * y + std::log1p(std::exp(-std::fabs(z[r])));
        gradient = StableSigmoid(z[r]) - y;
      } else {
        total += (z[r] - y) * (z[r] - y);
        gradient = 2.0f * (z[r] - y);
      }
      if (dz != nullptr) dz[r] = gradient * grad_scale;
    }
    if (loss_sum != nullptr) *loss_sum += total;
    return absl::OkStatus();
  }

 private:
  CachingPool<HostAllocator> pool_{HostAllocator(), kMaxCachedHostBytes};
  absl::Status deferred_error_;  // first bad Free() since the last Synchronize()
  std::vector<float> sums_;      // FM's per-dimension sums of one row
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace kernels
}  // namespace fulcrum
