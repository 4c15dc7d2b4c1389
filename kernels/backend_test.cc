// Conformance suite for kernels::Backend implementations. Every backend in
// AllBackendFactories() runs every test; add a device backend's factory there
// (e.g. {"cuda", MakeCudaBackend}) once it exists.

#include "kernels/backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"

namespace fulcrum {
namespace kernels {
namespace {

struct BackendFactory {
  std::string name;
  std::function<std::unique_ptr<Backend>()> make;
};

void PrintTo(const BackendFactory& factory, std::ostream* os) {
  *os << factory.name;
}

std::vector<BackendFactory> AllBackendFactories() {
  return {{"cpu", MakeCpuBackend}};
}

constexpr double kRelTol = 1e-5;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> RandomVector(int64_t n, uint32_t seed, float lo = -1.0f,
                                float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<float> Poisoned(int64_t n) { return std::vector<float>(n, kNaN); }

// Checks |actual - expected| <= kRelTol * max(1, scale) element-wise, where
// scale bounds the magnitude of the terms that produced the value. A NaN left
// by poisoning (an unwritten element) always fails.
void ExpectAllClose(const std::vector<float>& actual,
                    const std::vector<double>& expected,
                    const std::vector<double>& scale) {
  ASSERT_EQ(actual.size(), expected.size());
  int failures = 0;
  for (size_t i = 0; i < actual.size() && failures < 5; ++i) {
    const double tol = kRelTol * std::max(1.0, scale[i]);
    const bool ok = std::isfinite(actual[i]) &&
                    std::fabs(actual[i] - expected[i]) <= tol;
    if (!ok) ++failures;
    EXPECT_TRUE(ok) << "element " << i << ": got " << actual[i]
                    << ", expected " << expected[i] << " (tol " << tol << ")";
  }
}

void ExpectAllClose(const std::vector<float>& actual,
                    const std::vector<double>& expected) {
  std::vector<double> scale(expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    scale[i] = std::fabs(expected[i]);
  }
  ExpectAllClose(actual, expected, scale);
}

double ReferenceActivate(Activation act, double z) {
  switch (act) {
    case Activation::kRelu:
      return z > 0 ? z : 0;
    case Activation::kTanh:
      return std::tanh(z);
    case Activation::kSigmoid:
      return 1 / (1 + std::exp(-z));
    case Activation::kNone:
      break;
  }
  return z;
}

double ReferenceGrad(Activation act, double y) {
  switch (act) {
    case Activation::kRelu:
      return y > 0 ? 1 : 0;
    case Activation::kTanh:
      return 1 - y * y;
    case Activation::kSigmoid:
      return y * (1 - y);
    case Activation::kNone:
      break;
  }
  return 1;
}

constexpr Activation kAllActivations[] = {
    Activation::kNone, Activation::kRelu, Activation::kTanh,
    Activation::kSigmoid};

class BackendTest : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override {
    backend_ = GetParam().make();
    ASSERT_NE(backend_, nullptr);
  }

  std::unique_ptr<Backend> backend_;
};

TEST_P(BackendTest, HasName) {
  EXPECT_STREQ(backend_->Name(), GetParam().name.c_str());
}

struct GemmCase {
  bool trans_a, trans_b;
  int m, n, k;
  float alpha, beta;
};

// Runs one Gemm case against a double-precision reference loop.
void CheckGemm(Backend* backend, const GemmCase& c) {
  SCOPED_TRACE(::testing::Message()
               << "trans_a=" << c.trans_a << " trans_b=" << c.trans_b
               << " m=" << c.m << " n=" << c.n << " k=" << c.k
               << " alpha=" << c.alpha << " beta=" << c.beta);
  const std::vector<float> a = RandomVector(int64_t{c.m} * c.k, 1);
  const std::vector<float> b = RandomVector(int64_t{c.k} * c.n, 2);
  const std::vector<float> c0 = RandomVector(int64_t{c.m} * c.n, 3);
  std::vector<float> out = c.beta == 0.0f ? Poisoned(c0.size()) : c0;
  ASSERT_TRUE(backend->Gemm(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha,
                            a.data(), b.data(), c.beta, out.data())
                  .ok());
  std::vector<double> expected(out.size()), scale(out.size());
  for (int i = 0; i < c.m; ++i) {
    for (int j = 0; j < c.n; ++j) {
      double sum = 0, abs_sum = 0;
      for (int p = 0; p < c.k; ++p) {
        const double av = c.trans_a ? a[p * c.m + i] : a[i * c.k + p];
        const double bv = c.trans_b ? b[j * c.k + p] : b[p * c.n + j];
        sum += av * bv;
        abs_sum += std::fabs(av * bv);
      }
      const double base = c.beta == 0.0f ? 0.0 : c.beta * c0[i * c.n + j];
      expected[i * c.n + j] = c.alpha * sum + base;
      scale[i * c.n + j] = std::fabs(c.alpha) * abs_sum + std::fabs(base);
    }
  }
  ExpectAllClose(out, expected, scale);
}

TEST_P(BackendTest, GemmAllTransposeCombosNonSquare) {
  const int shapes[][3] = {{5, 7, 3}, {17, 4, 33}, {1, 9, 1}, {64, 65, 31}};
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      for (const auto& s : shapes) {
        CheckGemm(backend_.get(), {trans_a, trans_b, s[0], s[1], s[2], 1.0f,
                                   0.0f});
        CheckGemm(backend_.get(), {trans_a, trans_b, s[0], s[1], s[2], -0.75f,
                                   0.5f});
      }
    }
  }
}

TEST_P(BackendTest, GemmZeroInnerDimensionScalesC) {
  CheckGemm(backend_.get(), {false, false, 3, 4, 0, 1.0f, 0.0f});
  CheckGemm(backend_.get(), {true, true, 3, 4, 0, 1.0f, 2.0f});
}

TEST_P(BackendTest, GemmEmptyOutputIsOk) {
  EXPECT_TRUE(backend_
                  ->Gemm(false, false, 0, 0, 5, 1.0f, nullptr, nullptr, 0.0f,
                         nullptr)
                  .ok());
}

TEST_P(BackendTest, GemmRejectsNegativeDimsAndNullPointers) {
  std::vector<float> buf(16, 0.0f);
  const absl::Status negative = backend_->Gemm(
      false, false, -1, 2, 2, 1.0f, buf.data(), buf.data(), 0.0f, buf.data());
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(negative.message().find("m = -1"), std::string::npos)
      << negative.message();
  EXPECT_EQ(backend_
                ->Gemm(false, false, 2, 2, 2, 1.0f, nullptr, buf.data(), 0.0f,
                       buf.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendTest, BiasActivationForwardMatchesReference) {
  const int rows = 6, cols = 9;
  const std::vector<float> bias = RandomVector(cols, 4);
  for (Activation act : kAllActivations) {
    SCOPED_TRACE(ActivationName(act));
    std::vector<float> x = RandomVector(rows * cols, 5, -3.0f, 3.0f);
    std::vector<double> expected(x.size());
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) {
        expected[i * cols + j] = ReferenceActivate(
            act, double{x[i * cols + j]} + double{bias[j]});
      }
    }
    ASSERT_TRUE(
        backend_->BiasActivationForward(act, rows, cols, bias.data(), x.data())
            .ok());
    ExpectAllClose(x, expected);
  }
}

TEST_P(BackendTest, BiasActivationForwardRejectsNegativeDims) {
  float x = 0, bias = 0;
  EXPECT_EQ(
      backend_->BiasActivationForward(Activation::kRelu, 1, -2, &bias, &x)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendTest, ActivationBackwardMatchesReference) {
  const int64_t n = 97;
  for (Activation act : kAllActivations) {
    SCOPED_TRACE(ActivationName(act));
    std::vector<float> y = RandomVector(n, 6, -3.0f, 3.0f);
    for (float& v : y) v = static_cast<float>(ReferenceActivate(act, v));
    y[0] = 0.0f;  // relu boundary: gradient must be exactly zero there
    std::vector<float> dy = RandomVector(n, 7);
    std::vector<double> expected(n);
    for (int64_t i = 0; i < n; ++i) {
      expected[i] = dy[i] * ReferenceGrad(act, y[i]);
    }
    ASSERT_TRUE(backend_->ActivationBackward(act, n, y.data(), dy.data()).ok());
    ExpectAllClose(dy, expected);
  }
}

TEST_P(BackendTest, ActivationBackwardRejectsNegativeSize) {
  EXPECT_EQ(backend_->ActivationBackward(Activation::kTanh, -1, nullptr,
                                         nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendTest, ColumnSumMatchesReference) {
  const int rows = 13, cols = 7;
  const std::vector<float> x = RandomVector(rows * cols, 8);
  std::vector<float> out = Poisoned(cols);
  ASSERT_TRUE(backend_->ColumnSum(rows, cols, x.data(), out.data()).ok());
  std::vector<double> expected(cols, 0.0), scale(cols, 0.0);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      expected[j] += x[i * cols + j];
      scale[j] += std::fabs(x[i * cols + j]);
    }
  }
  ExpectAllClose(out, expected, scale);
}

TEST_P(BackendTest, ColumnSumOfNoRowsIsZero) {
  std::vector<float> out = Poisoned(4);
  ASSERT_TRUE(backend_->ColumnSum(0, 4, nullptr, out.data()).ok());
  ExpectAllClose(out, std::vector<double>(4, 0.0));
}

TEST_P(BackendTest, ColumnSumRejectsNegativeDims) {
  float x = 0, out = 0;
  EXPECT_EQ(backend_->ColumnSum(-1, 1, &x, &out).code(),
            absl::StatusCode::kInvalidArgument);
}

struct SoftmaxReference {
  std::vector<double> dlogits;
  double loss_sum = 0;
  int64_t correct = 0;
};

SoftmaxReference ReferenceSoftmax(int rows, int classes,
                                  const std::vector<float>& logits,
                                  const std::vector<int32_t>& labels,
                                  double grad_scale) {
  SoftmaxReference ref;
  ref.dlogits.resize(logits.size());
  for (int i = 0; i < rows; ++i) {
    const float* row = logits.data() + i * classes;
    int argmax = 0;
    for (int j = 1; j < classes; ++j) {
      if (row[j] > row[argmax]) argmax = j;
    }
    double sum = 0;
    for (int j = 0; j < classes; ++j) {
      sum += std::exp(double{row[j]} - row[argmax]);
    }
    ref.loss_sum += std::log(sum) + row[argmax] - row[labels[i]];
    ref.correct += argmax == labels[i] ? 1 : 0;
    for (int j = 0; j < classes; ++j) {
      const double p = std::exp(double{row[j]} - row[argmax]) / sum;
      ref.dlogits[i * classes + j] = (p - (j == labels[i])) * grad_scale;
    }
  }
  return ref;
}

void CheckSoftmax(Backend* backend, int rows, int classes,
                  const std::vector<float>& logits,
                  const std::vector<int32_t>& labels) {
  const float grad_scale = 1.0f / rows;
  std::vector<float> dlogits = Poisoned(logits.size());
  double loss_sum = 1.5;  // must be added to, not overwritten
  int64_t correct = 3;
  ASSERT_TRUE(backend
                  ->SoftmaxCrossEntropy(rows, classes, logits.data(),
                                        labels.data(), grad_scale,
                                        dlogits.data(), &loss_sum, &correct)
                  .ok());
  const SoftmaxReference ref =
      ReferenceSoftmax(rows, classes, logits, labels, grad_scale);
  EXPECT_NEAR(loss_sum - 1.5, ref.loss_sum,
              kRelTol * std::max(1.0, ref.loss_sum));
  EXPECT_EQ(correct - 3, ref.correct);
  ExpectAllClose(dlogits, ref.dlogits);
}

TEST_P(BackendTest, SoftmaxCrossEntropyMatchesReference) {
  const int rows = 8, classes = 10;
  const std::vector<float> logits = RandomVector(rows * classes, 9, -5, 5);
  std::vector<int32_t> labels(rows);
  for (int i = 0; i < rows; ++i) labels[i] = (i * 7) % classes;
  // Make a few rows correct so the argmax count is exercised.
  std::vector<float> adjusted = logits;
  for (int i = 0; i < rows; i += 2) adjusted[i * classes + labels[i]] = 6.0f;
  CheckSoftmax(backend_.get(), rows, classes, adjusted, labels);
}

TEST_P(BackendTest, SoftmaxCrossEntropyIsStableForLargeLogits) {
  const int rows = 4, classes = 3;
  const std::vector<float> logits = {1000, 999, -1000,   //
                                     -1e4, -1e4, -1e4,   //
                                     88, 89, 90,         //
                                     -500, 3e4, 0};
  const std::vector<int32_t> labels = {1, 2, 0, 1};
  CheckSoftmax(backend_.get(), rows, classes, logits, labels);
  double loss_sum = 0;
  ASSERT_TRUE(backend_
                  ->SoftmaxCrossEntropy(rows, classes, logits.data(),
                                        labels.data(), 1.0f, nullptr, &loss_sum,
                                        nullptr)
                  .ok());
  // Rows: log(1+e+e^-1999), log 3, 90 - 88 + log(1+e^-1+e^-2), ~0.
  const double expected = std::log(1 + std::exp(1.0)) + std::log(3.0) + 2 +
                          std::log(1 + std::exp(-1.0) + std::exp(-2.0));
  EXPECT_NEAR(loss_sum, expected, 1e-4);
}

TEST_P(BackendTest, SoftmaxCrossEntropyRejectsLabelOutOfRange) {
  const int rows = 2, classes = 10;
  const std::vector<float> logits = RandomVector(rows * classes, 10);
  for (int32_t bad : {10, -1}) {
    const std::vector<int32_t> labels = {0, bad};
    std::vector<float> dlogits = Poisoned(logits.size());
    double loss_sum = 0;
    int64_t correct = 0;
    const absl::Status status = backend_->SoftmaxCrossEntropy(
        rows, classes, logits.data(), labels.data(), 1.0f, dlogits.data(),
        &loss_sum, &correct);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("labels[1]"), std::string::npos)
        << status.message();
    EXPECT_EQ(loss_sum, 0.0);
    EXPECT_EQ(correct, 0);
    EXPECT_TRUE(std::isnan(dlogits[0])) << "outputs must be untouched";
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllBackends, BackendTest, ::testing::ValuesIn(AllBackendFactories()),
    [](const ::testing::TestParamInfo<BackendFactory>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace kernels
}  // namespace fulcrum
