#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fulcrum {
namespace kernels {
namespace {

absl::Status CheckDim(const char* op, const char* name, int64_t value) {
  if (value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " = ", value,
                   " is negative; dimensions must be >= 0"));
}

absl::Status CheckPtr(const char* op, const char* name, const void* ptr,
                      int64_t elements) {
  if (ptr != nullptr || elements == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " is null but must hold ", elements,
                   " elements"));
}

absl::Status CheckActivation(const char* op, Activation act) {
  switch (act) {
    case Activation::kNone:
    case Activation::kRelu:
    case Activation::kTanh:
    case Activation::kSigmoid:
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": unknown activation value ", static_cast<int>(act),
                   "; use one of kNone, kRelu, kTanh, kSigmoid"));
}

// Combines statuses, returning the first error.
absl::Status FirstError(std::initializer_list<absl::Status> statuses) {
  for (const absl::Status& status : statuses) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

float Activate(Activation act, float z) {
  switch (act) {
    case Activation::kRelu:
      return z > 0.0f ? z : 0.0f;
    case Activation::kTanh:
      return std::tanh(z);
    case Activation::kSigmoid:
      return 1.0f / (1.0f + std::exp(-z));
    case Activation::kNone:
      break;
  }
  return z;
}

// Derivative of the activation expressed through its output y.
float ActivationGrad(Activation act, float y) {
  switch (act) {
    case Activation::kRelu:
      return y > 0.0f ? 1.0f : 0.0f;
    case Activation::kTanh:
      return 1.0f - y * y;
    case Activation::kSigmoid:
      return y * (1.0f - y);
    case Activation::kNone:
      break;
  }
  return 1.0f;
}

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
    if (labels[i] < 0 || labels[i] >= classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SoftmaxCrossEntropy: labels[", i, "] = ", labels[i],
          " is out of range [0, ", classes,
          "); check the dataset's num_classes against the model's"));
    }
  }
  return absl::OkStatus();
}

struct RowResult {
  double loss = 0.0;
  bool correct = false;
};

// Softmax cross-entropy for one row; writes drow when non-null.
RowResult SoftmaxRow(int classes, const float* row, int32_t label,
                     float grad_scale, float* drow) {
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

  absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                    float alpha, const float* a, const float* b, float beta,
                    float* c) override {
    const int64_t mk = int64_t{m} * k, kn = int64_t{k} * n,
                  mn = int64_t{m} * n;
    absl::Status status = FirstError(
        {CheckDim("Gemm", "m", m), CheckDim("Gemm", "n", n),
         CheckDim("Gemm", "k", k), CheckPtr("Gemm", "a", a, mk),
         CheckPtr("Gemm", "b", b, kn), CheckPtr("Gemm", "c", c, mn)});
    if (!status.ok()) return status;
    if (mn == 0) return absl::OkStatus();
    if (k == 0) {
      ScaleMatrix(mn, beta, c);
      return absl::OkStatus();
    }
    const int lda = std::max(1, trans_a ? m : k);
    const int ldb = std::max(1, trans_b ? k : n);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b,
                ldb, beta, c, std::max(1, n));
    return absl::OkStatus();
  }

  absl::Status BiasActivationForward(Activation act, int rows, int cols,
                                     const float* bias, float* x) override {
    const char* op = "BiasActivationForward";
    absl::Status status = FirstError(
        {CheckActivation(op, act), CheckDim(op, "rows", rows),
         CheckDim(op, "cols", cols),
         CheckPtr(op, "bias", bias, rows == 0 ? 0 : cols),
         CheckPtr(op, "x", x, int64_t{rows} * cols)});
    if (!status.ok()) return status;
    for (int i = 0; i < rows; ++i) {
      float* row = x + int64_t{i} * cols;
      for (int j = 0; j < cols; ++j) row[j] = Activate(act, row[j] + bias[j]);
    }
    return absl::OkStatus();
  }

  absl::Status ActivationBackward(Activation act, int64_t n, const float* y,
                                  float* dy) override {
    const char* op = "ActivationBackward";
    absl::Status status =
        FirstError({CheckActivation(op, act), CheckDim(op, "n", n),
                    CheckPtr(op, "y", y, n), CheckPtr(op, "dy", dy, n)});
    if (!status.ok()) return status;
    if (act == Activation::kRelu) {
      // Select rather than multiply so a masked-out dy never leaks NaN/inf.
      for (int64_t i = 0; i < n; ++i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
    } else if (act != Activation::kNone) {
      for (int64_t i = 0; i < n; ++i) dy[i] *= ActivationGrad(act, y[i]);
    }
    return absl::OkStatus();
  }

  absl::Status ColumnSum(int rows, int cols, const float* x,
                         float* out) override {
    const char* op = "ColumnSum";
    absl::Status status = FirstError(
        {CheckDim(op, "rows", rows), CheckDim(op, "cols", cols),
         CheckPtr(op, "x", x, int64_t{rows} * cols),
         CheckPtr(op, "out", out, cols)});
    if (!status.ok()) return status;
    std::fill(out, out + cols, 0.0f);
    for (int i = 0; i < rows; ++i) {
      const float* row = x + int64_t{i} * cols;
      for (int j = 0; j < cols; ++j) out[j] += row[j];
    }
    return absl::OkStatus();
  }

  absl::Status SoftmaxCrossEntropy(int rows, int classes, const float* logits,
                                   const int32_t* labels, float grad_scale,
                                   float* dlogits, double* loss_sum,
                                   int64_t* correct) override {
    const char* op = "SoftmaxCrossEntropy";
    absl::Status status = FirstError(
        {CheckDim(op, "rows", rows), CheckDim(op, "classes", classes),
         CheckPtr(op, "logits", logits, int64_t{rows} * classes),
         CheckPtr(op, "labels", labels, rows)});
    if (!status.ok()) return status;
    status = CheckLabels(rows, classes, labels);
    if (!status.ok()) return status;
    double total_loss = 0.0;
    int64_t total_correct = 0;
    for (int i = 0; i < rows; ++i) {
      const int64_t offset = int64_t{i} * classes;
      const RowResult row =
          SoftmaxRow(classes, logits + offset, labels[i], grad_scale,
                     dlogits == nullptr ? nullptr : dlogits + offset);
      total_loss += row.loss;
      total_correct += row.correct ? 1 : 0;
    }
    if (loss_sum != nullptr) *loss_sum += total_loss;
    if (correct != nullptr) *correct += total_correct;
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace kernels
}  // namespace fulcrum
