// Conformance suite for kernels::Backend implementations. Every backend in
// AllBackendFactories() (backend_test_util.h) runs every test: the CPU
// backend here, the CUDA backend too where a GPU and the plugin are present
// (elsewhere its instances skip with the reason).
//
// Backend memory may be device memory, so inputs go in with CopyFromHost,
// results come out with CopyToHost, and outputs are poisoned with NaN through
// CopyFromHost before an op so that an element the op failed to write shows.

#include "kernels/backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/half.h"
#include "common/test_util.h"
#include "gtest/gtest.h"
#include "kernels/backend_test_util.h"
#include "kernels/cpu/cpu_backend.h"

namespace fulcrum {
namespace kernels {
namespace {

constexpr double kRelTol = 1e-5;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> RandomVector(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
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
void ExpectAllClose(const std::vector<float>& actual, const std::vector<double>& expected,
                    const std::vector<double>& scale) {
  ASSERT_EQ(actual.size(), expected.size());
  int failures = 0;
  for (size_t i = 0; i < actual.size() && failures < 5; ++i) {
    const double tol = kRelTol * std::max(1.0, scale[i]);
    const bool ok = std::isfinite(actual[i]) && std::fabs(actual[i] - expected[i]) <= tol;
    if (!ok) ++failures;
    EXPECT_TRUE(ok) << "element " << i << ": got " << actual[i] << ", expected " << expected[i] << " (tol "
                    << tol << ")";
  }
}

void ExpectAllClose(const std::vector<float>& actual, const std::vector<double>& expected) {
  std::vector<double> scale(expected.size());
  for (size_t i = 0; i < expected.size(); ++i) scale[i] = std::fabs(expected[i]);
  ExpectAllClose(actual, expected, scale);
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

constexpr Activation kAllActivations[] = {Activation::kNone, Activation::kRelu, Activation::kTanh,
                                          Activation::kSigmoid};

class BackendTest : public BackendFixture {
 protected:
  Backend* backend() { return backend_.get(); }

  template <typename T>
  Buffer In(const std::vector<T>& host) {
    return ToBackend(backend(), host);
  }
  template <typename T>
  std::vector<T> Out(const Buffer& buffer, size_t n) {
    return FromBackend<T>(backend(), buffer, n);
  }
};

// --- Identity and memory -------------------------------------------------------

TEST_P(BackendTest, HasName) {
  const std::string name = backend()->Name();
  EXPECT_EQ(name.rfind(GetParam().name_prefix, 0), 0u) << name;
}

TEST_P(BackendTest, HostMemoryOnlyForTheCpu) { EXPECT_EQ(backend()->HostMemory(), GetParam().name == "cpu"); }

TEST_P(BackendTest, AllocateIsAlignedAndReusesFreedBuffers) {
  absl::StatusOr<void*> first = backend()->Allocate(1000);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*first) % 256, 0u);
  absl::StatusOr<void*> second = backend()->Allocate(1000);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(*first, *second) << "two live buffers must not overlap";
  backend()->Free(*first);
  absl::StatusOr<void*> again = backend()->Allocate(1000);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *first) << "a freed buffer of the same size class comes back from the pool";
  backend()->Free(*again);
  backend()->Free(*second);
  backend()->Free(nullptr);
  EXPECT_TRUE(backend()->Synchronize().ok());
}

TEST_P(BackendTest, BufferReturnsItsMemoryToThePool) {
  void* data = nullptr;
  {
    absl::StatusOr<Buffer> buffer = Buffer::Make(backend(), 4096);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    data = buffer->get<void>();
    Buffer moved = std::move(*buffer);
    EXPECT_EQ(moved.get<void>(), data);
    EXPECT_EQ(moved.bytes(), 4096u);
    EXPECT_EQ(buffer->get<void>(), nullptr);
  }
  absl::StatusOr<Buffer> next = Buffer::Make(backend(), 4096);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->get<void>(), data);
}

TEST_P(BackendTest, FreeOfAForeignPointerIsReportedBySynchronize) {
  int not_backend_memory = 0;
  backend()->Free(&not_backend_memory);
  const absl::Status status = backend()->Synchronize();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("not allocated by this backend"), std::string::npos) << status;
  EXPECT_TRUE(backend()->Synchronize().ok()) << "reported once";
}

TEST_P(BackendTest, CopiesRoundTripLargeAndOffsetBuffers) {
  // Larger than two staging chunks and not a multiple of anything round.
  const int64_t n = (int64_t{9} << 20) / 4 + 12345;
  const std::vector<float> host = RandomVector(n, 21);
  Buffer buffer = In(host);
  EXPECT_EQ(Out<float>(buffer, n), host);
  // A copy into the middle of a buffer leaves the rest alone.
  const std::vector<float> patch = {1.0f, 2.0f, 3.0f};
  ASSERT_TRUE(backend()->CopyFromHost(buffer.get() + 1000, patch.data(), sizeof(float) * patch.size()).ok());
  const std::vector<float> round_trip = Out<float>(buffer, n);
  EXPECT_EQ(round_trip[999], host[999]);
  EXPECT_EQ(round_trip[1000], 1.0f);
  EXPECT_EQ(round_trip[1002], 3.0f);
  EXPECT_EQ(round_trip[1003], host[1003]);
  EXPECT_EQ(FromBackend(backend(), buffer.get() + 1001, 1), std::vector<float>{2.0f});
}

TEST_P(BackendTest, CopiesAreOrderedWithOps) {
  const int64_t n = 100000;
  Buffer buffer = In(Poisoned(n));
  // op, then a copy over its output, then an op over the copy.
  ASSERT_TRUE(backend()->Fill(n, 3.0f, buffer.get()).ok());
  ASSERT_TRUE(
      backend()->CopyFromHost(buffer.get(), std::vector<float>(n, 5.0f).data(), n * sizeof(float)).ok());
  EXPECT_EQ(Out<float>(buffer, n), std::vector<float>(n, 5.0f));
  ASSERT_TRUE(backend()->Fill(n / 2, 7.0f, buffer.get()).ok());
  std::vector<float> expected(n, 5.0f);
  std::fill(expected.begin(), expected.begin() + n / 2, 7.0f);
  EXPECT_EQ(Out<float>(buffer, n), expected);
  // Many small copies in flight, each read by the op queued after it.
  Buffer sums = In(Poisoned(1));
  for (int i = 0; i < 64; ++i) {
    const std::vector<float> column(8, static_cast<float>(i));
    ASSERT_TRUE(backend()->CopyFromHost(buffer.get(), column.data(), sizeof(float) * column.size()).ok());
    ASSERT_TRUE(backend()->ColumnSum(8, 1, buffer.get(), sums.get(), false).ok());
    ASSERT_EQ(Out<float>(sums, 1)[0], 8.0f * i);
  }
  EXPECT_TRUE(backend()->Synchronize().ok());
}

TEST_P(BackendTest, CopiesRejectNullPointers) {
  float host = 0;
  EXPECT_EQ(backend()->CopyFromHost(nullptr, &host, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend()->CopyToHost(nullptr, &host, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend()->CopyToHost(nullptr, nullptr, 0).ok());
}

// Each copy carries what the ops queued before it wrote (the contract forbids
// writing a buffer whose copy is in flight, so "not after" is not testable).
TEST_P(BackendTest, AsyncCopiesSeeTheOpsQueuedBeforeThem) {
  const int64_t n = (int64_t{3} << 20) / 4 + 7;  // several MiB: long enough to overlap
  Buffer first = In(Poisoned(n));
  Buffer second = In(Poisoned(n));
  ASSERT_TRUE(backend()->Fill(n, 1.0f, first.get()).ok());
  std::vector<float> first_host(n, kNaN);
  const absl::StatusOr<int64_t> first_ticket =
      backend()->CopyToHostAsync(first_host.data(), first.get(), n * sizeof(float));
  ASSERT_TRUE(first_ticket.ok()) << first_ticket.status();
  // Queued after the first copy (it may run while that one travels), before the second.
  ASSERT_TRUE(backend()->Fill(n, 2.0f, second.get()).ok());
  std::vector<float> second_host(n, kNaN);
  const absl::StatusOr<int64_t> second_ticket =
      backend()->CopyToHostAsync(second_host.data(), second.get(), n * sizeof(float));
  ASSERT_TRUE(second_ticket.ok()) << second_ticket.status();
  // ...and writing a buffer after its copy was queued is allowed once waited.
  ASSERT_TRUE(backend()->WaitCopy(*second_ticket).ok()) << "waiting for the later ticket waits for both";
  EXPECT_EQ(first_host, std::vector<float>(n, 1.0f));
  EXPECT_EQ(second_host, std::vector<float>(n, 2.0f));
  ASSERT_TRUE(backend()->Fill(n, 3.0f, first.get()).ok());
  EXPECT_TRUE(backend()->WaitCopy(*first_ticket).ok()) << "a ticket already waited for passes";
  EXPECT_EQ(first_host, std::vector<float>(n, 1.0f)) << "a finished copy is not written again";
  EXPECT_EQ(Out<float>(first, n), std::vector<float>(n, 3.0f));
  EXPECT_TRUE(backend()->Synchronize().ok());
}

TEST_P(BackendTest, AsyncCopiesOfManyLayersArriveWhole) {
  // The trainer's pattern: one copy per gradient tensor, each queued right
  // after the op that writes it, all waited for at the end.
  std::vector<Buffer> tensors;
  std::vector<std::vector<float>> hosts;
  std::vector<int64_t> tickets;
  for (int t = 0; t < 12; ++t) {
    const int64_t n = 1 + t * 997;
    tensors.push_back(In(Poisoned(n)));
    hosts.emplace_back(n, kNaN);
    ASSERT_TRUE(backend()->Fill(n, static_cast<float>(t), tensors.back().get()).ok());
    const absl::StatusOr<int64_t> ticket =
        backend()->CopyToHostAsync(hosts.back().data(), tensors.back().get(), n * sizeof(float));
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    if (!tickets.empty()) {
      EXPECT_GE(*ticket, tickets.back()) << "tickets are ordered";
    }
    tickets.push_back(*ticket);
  }
  for (int t = 0; t < 12; ++t) {
    ASSERT_TRUE(backend()->WaitCopy(tickets[t]).ok());
    EXPECT_EQ(hosts[t], std::vector<float>(hosts[t].size(), static_cast<float>(t))) << "tensor " << t;
  }
}

TEST_P(BackendTest, AsyncCopyOfNothingIsDoneAndNullIsRefused) {
  const absl::StatusOr<int64_t> empty = backend()->CopyToHostAsync(nullptr, nullptr, 0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(backend()->WaitCopy(*empty).ok());
  float host = 0;
  Buffer one = In(std::vector<float>{4.0f});
  EXPECT_EQ(backend()->CopyToHostAsync(nullptr, one.get(), 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend()->CopyToHostAsync(&host, nullptr, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(host, 0.0f);
  EXPECT_TRUE(backend()->Synchronize().ok());
}

// --- Fill ---------------------------------------------------------------------

TEST_P(BackendTest, FillWritesEveryElement) {
  const int64_t n = 1003;
  Buffer x = In(Poisoned(n));
  ASSERT_TRUE(backend()->Fill(n, -2.5f, x.get()).ok());
  EXPECT_EQ(Out<float>(x, n), std::vector<float>(n, -2.5f));
  EXPECT_TRUE(backend()->Fill(0, 1.0f, nullptr).ok());
  EXPECT_EQ(backend()->Fill(-1, 1.0f, x.get()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend()->Fill(4, 1.0f, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// Axpy rounds the product and the sum each once, in float32, on every
// backend (what local SGD's steps and deltas are made of): bit-exact.
TEST_P(BackendTest, AxpyAddsTheScaledVectorRoundingLikeTheHost) {
  const int64_t n = 1003;
  const std::vector<float> x = RandomVector(n, 31), y = RandomVector(n, 32);
  Buffer x_dev = In(x), y_dev = In(y);
  ASSERT_TRUE(backend()->Axpy(n, -0.37f, x_dev.get(), y_dev.get()).ok());
  std::vector<float> expected(y);
  for (int64_t i = 0; i < n; ++i) {
    const volatile float product = -0.37f * x[i];  // rounded on its own, as a float
    expected[i] = y[i] + product;
  }
  EXPECT_EQ(Out<float>(y_dev, n), expected);
  EXPECT_TRUE(backend()->Axpy(0, 1.0f, nullptr, nullptr).ok());
  EXPECT_EQ(backend()->Axpy(-1, 1.0f, x_dev.get(), y_dev.get()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend()->Axpy(4, 1.0f, nullptr, y_dev.get()).code(), absl::StatusCode::kInvalidArgument);
}

// --- Gemm ----------------------------------------------------------------------

struct GemmCase {
  bool trans_a, trans_b;
  int m, n, k;
  float alpha, beta;
};

// Runs one Gemm case against a double-precision reference loop.
void CheckGemm(Backend* backend, const GemmCase& c) {
  SCOPED_TRACE(::testing::Message() << "trans_a=" << c.trans_a << " trans_b=" << c.trans_b << " m=" << c.m
                                    << " n=" << c.n << " k=" << c.k << " alpha=" << c.alpha
                                    << " beta=" << c.beta);
  const std::vector<float> a = RandomVector(int64_t{c.m} * c.k, 1);
  const std::vector<float> b = RandomVector(int64_t{c.k} * c.n, 2);
  const std::vector<float> c0 = RandomVector(int64_t{c.m} * c.n, 3);
  Buffer a_dev = ToBackend(backend, a), b_dev = ToBackend(backend, b);
  Buffer c_dev = ToBackend(backend, c.beta == 0.0f ? Poisoned(c0.size()) : c0);
  ASSERT_TRUE(
      backend
          ->Gemm(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, a_dev.get(), b_dev.get(), c.beta, c_dev.get())
          .ok());
  const std::vector<float> out = FromBackend<float>(backend, c_dev, c0.size());
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
        CheckGemm(backend(), {trans_a, trans_b, s[0], s[1], s[2], 1.0f, 0.0f});
        CheckGemm(backend(), {trans_a, trans_b, s[0], s[1], s[2], -0.75f, 0.5f});
      }
    }
  }
}

TEST_P(BackendTest, GemmZeroInnerDimensionScalesC) {
  CheckGemm(backend(), {false, false, 3, 4, 0, 1.0f, 0.0f});
  CheckGemm(backend(), {true, true, 3, 4, 0, 1.0f, 2.0f});
}

TEST_P(BackendTest, GemmEmptyOutputIsOk) {
  EXPECT_TRUE(backend()->Gemm(false, false, 0, 0, 5, 1.0f, nullptr, nullptr, 0.0f, nullptr).ok());
}

TEST_P(BackendTest, GemmRejectsNegativeDimsAndNullPointers) {
  Buffer buf = In(std::vector<float>(16, 0.0f));
  const absl::Status negative =
      backend()->Gemm(false, false, -1, 2, 2, 1.0f, buf.get(), buf.get(), 0.0f, buf.get());
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(negative.message().find("m = -1"), std::string::npos) << negative.message();
  EXPECT_EQ(backend()->Gemm(false, false, 2, 2, 2, 1.0f, nullptr, buf.get(), 0.0f, buf.get()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendTest, SetPrecisionRejectsUnknownValues) {
  EXPECT_TRUE(backend()->SetPrecision(Precision::kTf32).ok());
  EXPECT_EQ(backend()->SetPrecision(static_cast<Precision>(7)).code(), absl::StatusCode::kInvalidArgument);
}

// max |C - C_ref| / max |C_ref| for C = A[m, K] * B[K, n] at `precision`,
// against the CPU backend's fp32 product. Inputs uniform in [-1, 1].
struct PrecisionResult {
  double relative_error;
  bool bit_identical;
};

PrecisionResult GemmAgainstCpuFp32(Backend* backend, Precision precision, bool trans_a, bool trans_b) {
  constexpr int m = 96, n = 80, k = 256;
  const std::vector<float> a = RandomVector(int64_t{m} * k, 31), b = RandomVector(int64_t{k} * n, 32);
  std::vector<float> reference(int64_t{m} * n);
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  EXPECT_TRUE(cpu->Gemm(trans_a, trans_b, m, n, k, 1.0f, a.data(), b.data(), 0.0f, reference.data()).ok());
  EXPECT_TRUE(backend->SetPrecision(precision).ok());
  Buffer a_dev = ToBackend(backend, a), b_dev = ToBackend(backend, b),
         c_dev = ToBackend(backend, Poisoned(m * n));
  const absl::Status status =
      backend->Gemm(trans_a, trans_b, m, n, k, 1.0f, a_dev.get(), b_dev.get(), 0.0f, c_dev.get());
  EXPECT_TRUE(status.ok()) << status;
  const std::vector<float> c = FromBackend<float>(backend, c_dev, m * n);
  double max_error = 0, max_reference = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    const double error = std::fabs(double{c[i]} - reference[i]);
    max_error = std::isnan(error) ? kInf : std::max(max_error, error);
    max_reference = std::max(max_reference, std::fabs(double{reference[i]}));
  }
  return {max_error / max_reference, c == reference};
}

// The tolerances documented beside kernels::Precision (backend.h): for K = 256
// and inputs in [-1, 1], max |C - C_fp32| <= tol * max |C_fp32| with tol 1e-5
// for fp32, 5e-3 for TF32 and 2e-2 for bf16. The CPU computes fp32 for all.
TEST_P(BackendTest, GemmPrecisionsStayWithinTheirTolerances) {
  struct Case {
    Precision precision;
    const char* name;
    double tolerance;
  };
  const Case cases[] = {{Precision::kFp32, "fp32", 1e-5},
                        {Precision::kTf32, "tf32", 5e-3},
                        {Precision::kBf16, "bf16", 2e-2},
                        {Precision::kFp32, "fp32 again", 1e-5}};
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(::testing::Message() << c.name << " trans_a=" << trans_a << " trans_b=" << trans_b);
        const PrecisionResult result = GemmAgainstCpuFp32(backend(), c.precision, trans_a, trans_b);
        if (backend()->HostMemory()) {
          EXPECT_TRUE(result.bit_identical) << "the CPU backend computes fp32 at every precision";
        }
        EXPECT_LE(result.relative_error, c.tolerance);
        if (c.precision == Precision::kBf16 && !backend()->HostMemory()) {
          EXPECT_GT(result.relative_error, 0.0) << "bf16 inputs should round";
        }
      }
    }
  }
}

// --- Bias, activations, column sums ------------------------------------------

TEST_P(BackendTest, BiasActivationForwardMatchesReference) {
  const int rows = 6, cols = 9;
  const std::vector<float> bias = RandomVector(cols, 4);
  Buffer bias_dev = In(bias);
  for (Activation act : kAllActivations) {
    SCOPED_TRACE(ActivationName(act));
    const std::vector<float> x = RandomVector(rows * cols, 5, -3.0f, 3.0f);
    std::vector<double> expected(x.size());
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) {
        expected[i * cols + j] = ReferenceActivate(act, double{x[i * cols + j]} + double{bias[j]});
      }
    }
    Buffer x_dev = In(x);
    ASSERT_TRUE(backend()->BiasActivationForward(act, rows, cols, bias_dev.get(), x_dev.get()).ok());
    ExpectAllClose(Out<float>(x_dev, x.size()), expected);
  }
}

TEST_P(BackendTest, BiasActivationForwardRejectsNegativeDims) {
  Buffer x = In(std::vector<float>(1)), bias = In(std::vector<float>(1));
  EXPECT_EQ(backend()->BiasActivationForward(Activation::kRelu, 1, -2, bias.get(), x.get()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendTest, ActivationBackwardMatchesReference) {
  const int64_t n = 97;
  for (Activation act : kAllActivations) {
    SCOPED_TRACE(ActivationName(act));
    std::vector<float> y = RandomVector(n, 6, -3.0f, 3.0f);
    for (float& v : y) v = static_cast<float>(ReferenceActivate(act, v));
    y[0] = 0.0f;  // relu boundary: gradient must be exactly zero there
    const std::vector<float> dy = RandomVector(n, 7);
    std::vector<double> expected(n);
    for (int64_t i = 0; i < n; ++i) expected[i] = dy[i] * ReferenceGrad(act, y[i]);
    Buffer y_dev = In(y), dy_dev = In(dy);
    ASSERT_TRUE(backend()->ActivationBackward(act, n, y_dev.get(), dy_dev.get()).ok());
    ExpectAllClose(Out<float>(dy_dev, n), expected);
  }
}

TEST_P(BackendTest, ActivationBackwardRejectsNegativeSize) {
  EXPECT_EQ(backend()->ActivationBackward(Activation::kTanh, -1, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendTest, ColumnSumMatchesReference) {
  for (const auto& shape : {std::pair<int, int>{13, 7}, {1000, 45}}) {
    const int rows = shape.first, cols = shape.second;
    SCOPED_TRACE(::testing::Message() << rows << "x" << cols);
    const std::vector<float> x = RandomVector(rows * cols, 8);
    Buffer x_dev = In(x), out = In(Poisoned(cols));
    ASSERT_TRUE(backend()->ColumnSum(rows, cols, x_dev.get(), out.get(), false).ok());
    std::vector<double> expected(cols, 0.0), scale(cols, 0.0);
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) {
        expected[j] += x[i * cols + j];
        scale[j] += std::fabs(x[i * cols + j]);
      }
    }
    ExpectAllClose(Out<float>(out, cols), expected, scale);
  }
}

TEST_P(BackendTest, ColumnSumAccumulatingAddsToWhatOutHolds) {
  const int rows = 37, cols = 45;
  const std::vector<float> x = RandomVector(rows * cols, 9);
  const std::vector<float> before = RandomVector(cols, 10);
  Buffer x_dev = In(x), out = In(before);
  ASSERT_TRUE(backend()->ColumnSum(rows, cols, x_dev.get(), out.get(), true).ok());
  std::vector<double> expected(before.begin(), before.end()), scale(cols, 0.0);
  for (int j = 0; j < cols; ++j) scale[j] = std::fabs(before[j]);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      expected[j] += x[i * cols + j];
      scale[j] += std::fabs(x[i * cols + j]);
    }
  }
  ExpectAllClose(Out<float>(out, cols), expected, scale);
  // No rows: what out holds stays.
  ASSERT_TRUE(backend()->ColumnSum(0, cols, nullptr, out.get(), true).ok());
  ExpectAllClose(Out<float>(out, cols), expected, scale);
}

TEST_P(BackendTest, ColumnSumOfNoRowsIsZero) {
  Buffer out = In(Poisoned(4));
  ASSERT_TRUE(backend()->ColumnSum(0, 4, nullptr, out.get(), false).ok());
  ExpectAllClose(Out<float>(out, 4), std::vector<double>(4, 0.0));
}

TEST_P(BackendTest, ColumnSumRejectsNegativeDims) {
  Buffer x = In(std::vector<float>(1)), out = In(std::vector<float>(1));
  EXPECT_EQ(backend()->ColumnSum(-1, 1, x.get(), out.get(), false).code(), absl::StatusCode::kInvalidArgument);
}

// --- Softmax cross-entropy -------------------------------------------------------

struct SoftmaxReference {
  std::vector<double> dlogits;
  double loss_sum = 0;
  int64_t correct = 0;
};

SoftmaxReference ReferenceSoftmax(int rows, int classes, const std::vector<float>& logits,
                                  const std::vector<int32_t>& labels, double grad_scale) {
  SoftmaxReference ref;
  ref.dlogits.resize(logits.size());
  for (int i = 0; i < rows; ++i) {
    const float* row = logits.data() + i * classes;
    int argmax = 0;
    for (int j = 1; j < classes; ++j) {
      if (row[j] > row[argmax]) argmax = j;
    }
    double sum = 0;
    for (int j = 0; j < classes; ++j) sum += std::exp(double{row[j]} - row[argmax]);
    ref.loss_sum += std::log(sum) + row[argmax] - row[labels[i]];
    ref.correct += argmax == labels[i] ? 1 : 0;
    for (int j = 0; j < classes; ++j) {
      const double p = std::exp(double{row[j]} - row[argmax]) / sum;
      ref.dlogits[i * classes + j] = (p - (j == labels[i])) * grad_scale;
    }
  }
  return ref;
}

void CheckSoftmax(Backend* backend, int rows, int classes, const std::vector<float>& logits,
                  const std::vector<int32_t>& labels) {
  const float grad_scale = 1.0f / rows;
  Buffer logits_dev = ToBackend(backend, logits), labels_dev = ToBackend(backend, labels);
  Buffer dlogits = ToBackend(backend, Poisoned(logits.size()));
  double loss_sum = 1.5;  // must be added to, not overwritten
  int64_t correct = 3;
  ASSERT_TRUE(backend
                  ->SoftmaxCrossEntropy(rows, classes, logits_dev.get(), labels_dev.get<int32_t>(),
                                        grad_scale, dlogits.get(), &loss_sum, &correct)
                  .ok());
  const SoftmaxReference ref = ReferenceSoftmax(rows, classes, logits, labels, grad_scale);
  EXPECT_NEAR(loss_sum - 1.5, ref.loss_sum, kRelTol * std::max(1.0, ref.loss_sum));
  EXPECT_EQ(correct - 3, ref.correct);
  ExpectAllClose(FromBackend<float>(backend, dlogits, logits.size()), ref.dlogits);
}

TEST_P(BackendTest, SoftmaxCrossEntropyMatchesReference) {
  const int rows = 8, classes = 10;
  const std::vector<float> logits = RandomVector(rows * classes, 9, -5, 5);
  std::vector<int32_t> labels(rows);
  for (int i = 0; i < rows; ++i) labels[i] = (i * 7) % classes;
  // Make a few rows correct so the argmax count is exercised.
  std::vector<float> adjusted = logits;
  for (int i = 0; i < rows; i += 2) adjusted[i * classes + labels[i]] = 6.0f;
  CheckSoftmax(backend(), rows, classes, adjusted, labels);
}

TEST_P(BackendTest, SoftmaxCrossEntropyManyRowsAndWideRows) {
  // More rows than one block of warps, and rows wider than a warp.
  const int shapes[][2] = {{1000, 10}, {37, 1000}};
  for (const auto& shape : shapes) {
    const int rows = shape[0], classes = shape[1];
    SCOPED_TRACE(::testing::Message() << rows << "x" << classes);
    std::vector<float> logits = RandomVector(int64_t{rows} * classes, 19, -4, 4);
    std::vector<int32_t> labels(rows);
    for (int i = 0; i < rows; ++i) labels[i] = (i * 13) % classes;
    for (int i = 0; i < rows; i += 3) logits[int64_t{i} * classes + labels[i]] = 9.0f;
    CheckSoftmax(backend(), rows, classes, logits, labels);
  }
}

TEST_P(BackendTest, SoftmaxCrossEntropyCountsTheFirstMaximum) {
  // Ties: the first maximum is the prediction.
  const std::vector<float> logits = {2, 2, 1,  //
                                     1, 3, 3};
  const std::vector<int32_t> labels = {1, 1};
  Buffer logits_dev = In(logits), labels_dev = In(labels);
  double loss_sum = 0;
  int64_t correct = 0;
  ASSERT_TRUE(backend()
                  ->SoftmaxCrossEntropy(2, 3, logits_dev.get(), labels_dev.get<int32_t>(), 1.0f, nullptr,
                                        &loss_sum, &correct)
                  .ok());
  EXPECT_EQ(correct, 1);
}

TEST_P(BackendTest, SoftmaxCrossEntropyIsStableForLargeLogits) {
  const int rows = 4, classes = 3;
  const std::vector<float> logits = {1000, 999,  -1000,  //
                                     -1e4, -1e4, -1e4,   //
                                     88,   89,   90,     //
                                     -500, 3e4,  0};
  const std::vector<int32_t> labels = {1, 2, 0, 1};
  CheckSoftmax(backend(), rows, classes, logits, labels);
  Buffer logits_dev = In(logits), labels_dev = In(labels);
  double loss_sum = 0;
  ASSERT_TRUE(backend()
                  ->SoftmaxCrossEntropy(rows, classes, logits_dev.get(), labels_dev.get<int32_t>(), 1.0f,
                                        nullptr, &loss_sum, nullptr)
                  .ok());
  // Rows: log(1+e+e^-1999), log 3, 90 - 88 + log(1+e^-1+e^-2), ~0.
  const double expected =
      std::log(1 + std::exp(1.0)) + std::log(3.0) + 2 + std::log(1 + std::exp(-1.0) + std::exp(-2.0));
  EXPECT_NEAR(loss_sum, expected, 1e-4);
}

TEST_P(BackendTest, SoftmaxCrossEntropyRejectsLabelOutOfRange) {
  const int rows = 2, classes = 10;
  Buffer logits = In(RandomVector(rows * classes, 10));
  for (int32_t bad : {10, -1}) {
    Buffer labels = In(std::vector<int32_t>{0, bad});
    Buffer dlogits = In(Poisoned(rows * classes));
    double loss_sum = 0;
    int64_t correct = 0;
    const absl::Status status = backend()->SoftmaxCrossEntropy(
        rows, classes, logits.get(), labels.get<int32_t>(), 1.0f, dlogits.get(), &loss_sum, &correct);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("labels[1] = " + std::to_string(bad)), std::string::npos)
        << status.message();
    EXPECT_EQ(loss_sum, 0.0);
    EXPECT_EQ(correct, 0);
    EXPECT_TRUE(std::isnan(Out<float>(dlogits, 1)[0])) << "outputs must be untouched";
  }
}

TEST_P(BackendTest, SoftmaxCrossEntropyBadLabelWithoutScalarsSurfacesOnSynchronize) {
  const int rows = 3, classes = 4;
  Buffer logits = In(RandomVector(rows * classes, 11));
  Buffer labels = In(std::vector<int32_t>{0, 1, 4});
  Buffer dlogits = In(Poisoned(rows * classes));
  const absl::Status status =
      Settled(backend(), backend()->SoftmaxCrossEntropy(rows, classes, logits.get(), labels.get<int32_t>(),
                                                        1.0f, dlogits.get(), nullptr, nullptr));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("labels[2] = 4"), std::string::npos) << status.message();
  for (float v : Out<float>(dlogits, rows * classes))
    EXPECT_TRUE(std::isnan(v)) << "outputs must be untouched";
  EXPECT_TRUE(backend()->Synchronize().ok()) << "reported once";
}

// --- 16-bit formats -----------------------------------------------------------------

// Packs `values` to `type` and returns the bits.
std::vector<uint16_t> Pack(Backend* backend, HalfType type, const std::vector<float>& values) {
  Buffer src = ToBackend(backend, values);
  Buffer dst = ToBackend(backend, std::vector<uint16_t>(values.size(), 0xDEAD));
  const absl::Status status = backend->PackHalf(type, values.size(), src.get(), dst.get<uint16_t>());
  EXPECT_TRUE(status.ok()) << status;
  return FromBackend<uint16_t>(backend, dst, values.size());
}

std::vector<float> Unpack(Backend* backend, HalfType type, const std::vector<uint16_t>& bits) {
  Buffer src = ToBackend(backend, bits);
  Buffer dst = ToBackend(backend, Poisoned(bits.size()));
  const absl::Status status = backend->UnpackHalf(type, bits.size(), src.get<uint16_t>(), dst.get());
  EXPECT_TRUE(status.ok()) << status;
  return FromBackend<float>(backend, dst, bits.size());
}

bool IsHalfNaN(HalfType type, uint16_t bits) {
  if (type == HalfType::kFp16) return (bits & 0x7C00) == 0x7C00 && (bits & 0x03FF) != 0;
  return (bits & 0x7F80) == 0x7F80 && (bits & 0x007F) != 0;
}

// Every 16-bit pattern unpacks to the value it encodes and packs back to
// itself (NaNs stay NaNs).
void CheckAllPatternsRoundTrip(Backend* backend, HalfType type) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  const std::vector<float> values = Unpack(backend, type, all);
  const std::vector<uint16_t> again = Pack(backend, type, values);
  int failures = 0;
  for (size_t i = 0; i < all.size() && failures < 5; ++i) {
    const bool ok =
        IsHalfNaN(type, all[i]) ? std::isnan(values[i]) && IsHalfNaN(type, again[i]) : again[i] == all[i];
    if (!ok) {
      ++failures;
      ADD_FAILURE() << "pattern 0x" << std::hex << all[i] << " unpacked to " << values[i] << " packed to 0x"
                    << again[i];
    }
  }
}

TEST_P(BackendTest, Fp16EveryPatternRoundTripsExactly) {
  CheckAllPatternsRoundTrip(backend(), HalfType::kFp16);
}

TEST_P(BackendTest, Bf16EveryPatternRoundTripsExactly) {
  CheckAllPatternsRoundTrip(backend(), HalfType::kBf16);
}

TEST_P(BackendTest, UnpackHalfGivesTheEncodedValues) {
  const std::vector<float> fp16 = Unpack(
      backend(), HalfType::kFp16, {0x3C00, 0xC000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00, 0x8000});
  const std::vector<float> fp16_expected = {1.0f,
                                            -2.0f,
                                            std::ldexp(1.0f, -24),
                                            1023 * std::ldexp(1.0f, -24),
                                            std::ldexp(1.0f, -14),
                                            65504.0f,
                                            kInf,
                                            -kInf,
                                            -0.0f};
  EXPECT_EQ(fp16, fp16_expected);
  EXPECT_TRUE(std::signbit(fp16[8]));
  const std::vector<float> bf16 =
      Unpack(backend(), HalfType::kBf16, {0x3F80, 0xC040, 0x0001, 0x7F7F, 0xFF80});
  const std::vector<float> bf16_expected = {1.0f, -3.0f, BitsFloat(0x00010000), BitsFloat(0x7F7F0000), -kInf};
  EXPECT_EQ(bf16, bf16_expected);
}

TEST_P(BackendTest, PackFp16RoundsToNearestEven) {
  const float one = 1.0f, ulp = std::ldexp(1.0f, -10), tiny = std::ldexp(1.0f, -24);
  const std::vector<float> values = {
      one + ulp / 2,                          // tie, 1.0 is even
      one + 3 * ulp / 2,                      // tie, 1 + 2 ulp is even
      one + ulp / 2 + std::ldexp(1.0f, -20),  // just above the tie
      65504.0f + 15.99f,                      // below 65520: largest finite
      65520.0f,                               // tie with 65536: inf is even
      1e6f,
      -1e6f,
      kInf,
      -0.0f,
      tiny / 2,                          // tie between 0 and the smallest subnormal
      3 * tiny / 2,                      // tie, 2 * tiny is even
      tiny / 2 + std::ldexp(1.0f, -35),  // above the tie
      std::ldexp(1.0f, -14) - tiny / 2,  // tie between the largest subnormal and 2^-14
      std::ldexp(1.0f, -30),             // underflows to zero
      -3 * tiny / 2,
  };
  const std::vector<uint16_t> expected = {0x3C00, 0x3C02, 0x3C01, 0x7BFF, 0x7C00, 0x7C00, 0xFC00, 0x7C00,
                                          0x8000, 0x0000, 0x0002, 0x0001, 0x0400, 0x0000, 0x8002};
  const std::vector<uint16_t> bits = Pack(backend(), HalfType::kFp16, values);
  ASSERT_EQ(bits.size(), expected.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    EXPECT_EQ(bits[i], expected[i]) << "value " << i << " = " << values[i];
  }
  EXPECT_TRUE(IsHalfNaN(HalfType::kFp16, Pack(backend(), HalfType::kFp16, {kNaN})[0]));
}

TEST_P(BackendTest, PackBf16RoundsToNearestEven) {
  const std::vector<float> values = {
      BitsFloat(0x3F808000),  // 1 + 2^-8: tie, 1.0 is even
      BitsFloat(0x3F818000),  // tie, 0x3F82 is even
      BitsFloat(0x3F808001),  // just above the tie
      BitsFloat(0x3F807FFF),  // just below
      BitsFloat(0x7F7FFFFF),  // float max rounds up to inf
      BitsFloat(0x00018000),  // float subnormal tie: 0x0002 is even
      BitsFloat(0x00008000),  // tie with zero
      -kInf,
      -0.0f,
  };
  const std::vector<uint16_t> expected = {0x3F80, 0x3F82, 0x3F81, 0x3F80, 0x7F80,
                                          0x0002, 0x0000, 0xFF80, 0x8000};
  const std::vector<uint16_t> bits = Pack(backend(), HalfType::kBf16, values);
  ASSERT_EQ(bits.size(), expected.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    EXPECT_EQ(bits[i], expected[i]) << "value " << i << " = 0x" << std::hex << FloatBits(values[i]);
  }
  EXPECT_TRUE(IsHalfNaN(HalfType::kBf16, Pack(backend(), HalfType::kBf16, {kNaN, -kNaN})[0]));
}

TEST_P(BackendTest, PackHalfRejectsBadArguments) {
  Buffer src = In(std::vector<float>(4)), dst = In(std::vector<uint16_t>(4));
  EXPECT_EQ(backend()->PackHalf(HalfType::kFp16, -1, src.get(), dst.get<uint16_t>()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend()->PackHalf(static_cast<HalfType>(9), 4, src.get(), dst.get<uint16_t>()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend()->UnpackHalf(HalfType::kBf16, 4, nullptr, src.get()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend()->PackHalf(HalfType::kBf16, 0, nullptr, nullptr).ok());
}

// --- Embedding bag ---------------------------------------------------------------------

struct Bags {
  int bags;
  std::vector<int32_t> offsets, ids;
};

// Bag sizes 3, 0, 4, 1, 0, 5 (two empty bags, repeated ids).
Bags SampleBags() {
  Bags b;
  b.bags = 6;
  b.offsets = {0, 3, 3, 7, 8, 8, 13};
  b.ids = {4, 0, 19, 7, 7, 2, 11, 5, 0, 4, 4, 18, 9};
  return b;
}

// Without scales (a plain sum) and with them (a weighted sum).
TEST_P(BackendTest, EmbeddingBagForwardMatchesNaiveWeightedSum) {
  const int dim = 7, table_rows = 20;
  const Bags b = SampleBags();
  const std::vector<float> table = RandomVector(table_rows * dim, 41);
  const std::vector<float> weights = RandomVector(static_cast<int64_t>(b.ids.size()), 50, 0.0f, 2.0f);
  for (bool weighted : {false, true}) {
    SCOPED_TRACE(weighted ? "scales" : "no scales");
    Buffer offsets = In(b.offsets), ids = In(b.ids), table_dev = In(table), out = In(Poisoned(b.bags * dim));
    Buffer scales = In(weights);
    ASSERT_TRUE(backend()
                    ->EmbeddingBagForward(b.bags, dim, offsets.get<int32_t>(), ids.get<int32_t>(),
                                          weighted ? scales.get() : nullptr, table_rows, table_dev.get(),
                                          out.get())
                    .ok());
    std::vector<double> expected(b.bags * dim, 0.0), scale(b.bags * dim, 0.0);
    for (int bag = 0; bag < b.bags; ++bag) {
      for (int j = b.offsets[bag]; j < b.offsets[bag + 1]; ++j) {
        const double w = weighted ? weights[j] : 1.0;
        for (int d = 0; d < dim; ++d) {
          expected[bag * dim + d] += w * table[b.ids[j] * dim + d];
          scale[bag * dim + d] += std::fabs(w * table[b.ids[j] * dim + d]);
        }
      }
    }
    ExpectAllClose(Out<float>(out, b.bags * dim), expected, scale);
  }
}

TEST_P(BackendTest, EmbeddingBagBackwardMatchesNaiveWeightedScatterAdd) {
  // dim wider than a block's threads, so threads loop over it.
  const int dim = 300, table_rows = 20;
  const Bags b = SampleBags();
  const std::vector<float> dout = RandomVector(b.bags * dim, 42);
  const std::vector<float> dtable0 = RandomVector(table_rows * dim, 43);
  const std::vector<float> weights = RandomVector(static_cast<int64_t>(b.ids.size()), 51, 0.0f, 2.0f);
  for (bool weighted : {false, true}) {
    SCOPED_TRACE(weighted ? "scales" : "no scales");
    Buffer offsets = In(b.offsets), ids = In(b.ids), dout_dev = In(dout), dtable = In(dtable0);
    Buffer scales = In(weights);
    ASSERT_TRUE(backend()
                    ->EmbeddingBagBackward(b.bags, dim, offsets.get<int32_t>(), ids.get<int32_t>(),
                                           weighted ? scales.get() : nullptr, table_rows, dout_dev.get(),
                                           dtable.get())
                    .ok());
    std::vector<double> expected(dtable0.begin(), dtable0.end()), scale(dtable0.size());
    for (size_t i = 0; i < scale.size(); ++i) scale[i] = std::fabs(dtable0[i]);
    for (int bag = 0; bag < b.bags; ++bag) {
      for (int j = b.offsets[bag]; j < b.offsets[bag + 1]; ++j) {
        const double w = weighted ? weights[j] : 1.0;
        for (int d = 0; d < dim; ++d) {
          expected[b.ids[j] * dim + d] += w * dout[bag * dim + d];
          scale[b.ids[j] * dim + d] += std::fabs(w * dout[bag * dim + d]);
        }
      }
    }
    ExpectAllClose(Out<float>(dtable, dtable0.size()), expected, scale);
  }
}

TEST_P(BackendTest, EmbeddingBagAllEmptyBagsGiveZerosAndNeedNoIds) {
  const int bags = 3, dim = 4, table_rows = 5;
  Buffer offsets = In(std::vector<int32_t>(bags + 1, 0));
  Buffer table = In(RandomVector(table_rows * dim, 44)), out = In(Poisoned(bags * dim));
  ASSERT_TRUE(Settled(backend(), backend()->EmbeddingBagForward(bags, dim, offsets.get<int32_t>(), nullptr,
                                                                nullptr, table_rows, table.get(), out.get()))
                  .ok());
  EXPECT_EQ(Out<float>(out, bags * dim), std::vector<float>(bags * dim, 0.0f));
  const std::vector<float> dtable0 = RandomVector(table_rows * dim, 45);
  Buffer dtable = In(dtable0), dout = In(RandomVector(bags * dim, 46));
  ASSERT_TRUE(
      Settled(backend(), backend()->EmbeddingBagBackward(bags, dim, offsets.get<int32_t>(), nullptr, nullptr,
                                                         table_rows, dout.get(), dtable.get()))
          .ok());
  EXPECT_EQ(Out<float>(dtable, dtable0.size()), dtable0);
  EXPECT_TRUE(backend()
                  ->EmbeddingBagForward(0, dim, nullptr, nullptr, nullptr, table_rows, table.get(), nullptr)
                  .ok());
}

TEST_P(BackendTest, EmbeddingBagRejectsBadOffsetsAndIds) {
  const int dim = 3, table_rows = 10;
  struct Case {
    const char* what;
    std::vector<int32_t> offsets, ids;
    bool null_ids;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"offsets[0] != 0", {1, 2, 4}, {1, 2, 3, 4}, false, "offsets[0] = 1 must be 0"},
      {"decreasing offsets", {0, 3, 2}, {1, 2, 3, 4}, false, "offsets[2] = 2 is less than offsets[1]"},
      {"offset before a bad id", {0, 3, 1}, {1, 2, 99, 4}, false, "offsets[2] = 1"},
      {"id too large", {0, 2, 4}, {1, 2, 3, 10}, false, "ids[3] = 10 is out of range [0, 10)"},
      {"negative id", {0, 2, 4}, {1, -5, 3, -1}, false, "ids[1] = -5"},
      {"null ids", {0, 2, 4}, {}, true, "ids is null"},
  };
  const std::vector<float> dtable0 = RandomVector(table_rows * dim, 47);
  Buffer table = In(RandomVector(table_rows * dim, 48)), dout = In(RandomVector(2 * dim, 49));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Buffer offsets = In(c.offsets), ids = In(c.ids);
    const int32_t* ids_ptr = c.null_ids ? nullptr : ids.get<int32_t>();
    Buffer out = In(Poisoned(2 * dim));
    absl::Status status =
        Settled(backend(), backend()->EmbeddingBagForward(2, dim, offsets.get<int32_t>(), ids_ptr, nullptr,
                                                          table_rows, table.get(), out.get()));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("EmbeddingBagForward: " + c.message), std::string::npos)
        << status.message();
    for (float v : Out<float>(out, 2 * dim)) EXPECT_TRUE(std::isnan(v)) << "outputs must be untouched";

    Buffer dtable = In(dtable0);
    status =
        Settled(backend(), backend()->EmbeddingBagBackward(2, dim, offsets.get<int32_t>(), ids_ptr, nullptr,
                                                           table_rows, dout.get(), dtable.get()));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("EmbeddingBagBackward: " + c.message), std::string::npos)
        << status.message();
    EXPECT_EQ(Out<float>(dtable, dtable0.size()), dtable0) << "dtable must be untouched";
  }
}

TEST_P(BackendTest, EmbeddingBagRejectsNegativeDimsAndNullBuffers) {
  Buffer offsets = In(std::vector<int32_t>{0, 1}), ids = In(std::vector<int32_t>{0});
  Buffer table = In(std::vector<float>(4)), out = In(std::vector<float>(4));
  EXPECT_EQ(backend()
                ->EmbeddingBagForward(-1, 4, offsets.get<int32_t>(), ids.get<int32_t>(), nullptr, 1,
                                      table.get(), out.get())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend()
                ->EmbeddingBagForward(1, 4, offsets.get<int32_t>(), ids.get<int32_t>(), nullptr, -1,
                                      table.get(), out.get())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend()
                ->EmbeddingBagForward(1, 4, nullptr, ids.get<int32_t>(), nullptr, 1, table.get(), out.get())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend()
                ->EmbeddingBagBackward(1, 4, offsets.get<int32_t>(), ids.get<int32_t>(), nullptr, 1,
                                       out.get(), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// --- Graph ops: strided copies, interactions, pointwise losses -------------------------

TEST_P(BackendTest, CopyColumnsCopiesAndAddsBetweenStrides) {
  const int rows = 5, cols = 3, src_ld = 7, dst_ld = 4;
  const std::vector<float> src = RandomVector(rows * src_ld, 60);
  const std::vector<float> dst0 = RandomVector(rows * dst_ld, 61);
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "copy");
    Buffer src_dev = In(src), dst = In(dst0);
    ASSERT_TRUE(backend()
                    ->CopyColumns(rows, cols, src_dev.get() + 2, src_ld, dst.get() + 1, dst_ld, accumulate)
                    .ok());
    std::vector<float> expected = dst0;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const float from = src[r * src_ld + 2 + c];
        expected[r * dst_ld + 1 + c] = accumulate ? expected[r * dst_ld + 1 + c] + from : from;
      }
    }
    EXPECT_EQ(Out<float>(dst, dst0.size()), expected) << "columns outside the copy must be untouched";
  }
  Buffer src_dev = In(src), dst = In(dst0);
  EXPECT_EQ(backend()->CopyColumns(rows, cols, src_dev.get(), 2, dst.get(), dst_ld, false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend()->CopyColumns(-1, cols, src_dev.get(), src_ld, dst.get(), dst_ld, false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend()->CopyColumns(rows, cols, nullptr, src_ld, dst.get(), dst_ld, false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend()->CopyColumns(0, cols, nullptr, src_ld, nullptr, dst_ld, false).ok());
}

// x[rows, vectors, dim] from a seed.
struct Interaction {
  int rows = 6, vectors = 5, dim;
  std::vector<float> x;
  Interaction(uint32_t seed, int d) : dim(d), x(RandomVector(int64_t{6} * 5 * d, seed)) {}
  double at(int r, int i, int d) const { return x[(static_cast<size_t>(r) * vectors + i) * dim + d]; }
};

// Dims of one warp or less, several warps, and more than a block's threads.
constexpr int kInteractionDims[] = {9, 40, 300};

TEST_P(BackendTest, FmForwardAndBackwardMatchTheFormula) {
  for (int dim : kInteractionDims) {
    SCOPED_TRACE(dim);
    const Interaction in(62, dim);
    const int n = in.rows * in.vectors * in.dim;
    const std::vector<float> dout = RandomVector(in.rows, 63);
    const std::vector<float> dx0 = RandomVector(n, 64);
    Buffer x = In(in.x), out = In(Poisoned(in.rows)), dout_dev = In(dout), dx = In(dx0);
    ASSERT_TRUE(backend()->FmForward(in.rows, in.vectors, in.dim, x.get(), out.get()).ok());
    ASSERT_TRUE(backend()->FmBackward(in.rows, in.vectors, in.dim, x.get(), dout_dev.get(), dx.get()).ok());
    std::vector<double> expected(in.rows), scale(in.rows);
    std::vector<double> expected_dx(dx0.begin(), dx0.end()), scale_dx(n, 1.0);
    for (int r = 0; r < in.rows; ++r) {
      for (int d = 0; d < in.dim; ++d) {
        double sum = 0, squares = 0;
        for (int i = 0; i < in.vectors; ++i) {
          sum += in.at(r, i, d);
          squares += in.at(r, i, d) * in.at(r, i, d);
        }
        expected[r] += 0.5 * (sum * sum - squares);
        scale[r] += sum * sum + squares;
        for (int i = 0; i < in.vectors; ++i) {
          expected_dx[(static_cast<size_t>(r) * in.vectors + i) * in.dim + d] +=
              dout[r] * (sum - in.at(r, i, d));
        }
      }
    }
    ExpectAllClose(Out<float>(out, in.rows), expected, scale);
    ExpectAllClose(Out<float>(dx, n), expected_dx, scale_dx);
    EXPECT_EQ(backend()->FmForward(in.rows, -1, in.dim, x.get(), out.get()).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(backend()->FmBackward(in.rows, in.vectors, in.dim, x.get(), nullptr, dx.get()).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST_P(BackendTest, PairwiseDotForwardAndBackwardMatchTheFormula) {
  for (int dim : kInteractionDims) {
    SCOPED_TRACE(dim);
    const Interaction in(65, dim);
    const int n = in.rows * in.vectors * in.dim, pairs = in.vectors * (in.vectors - 1) / 2;
    const std::vector<float> dout = RandomVector(in.rows * pairs, 66);
    const std::vector<float> dx0 = RandomVector(n, 67);
    Buffer x = In(in.x), out = In(Poisoned(in.rows * pairs)), dout_dev = In(dout), dx = In(dx0);
    ASSERT_TRUE(backend()->PairwiseDotForward(in.rows, in.vectors, in.dim, x.get(), out.get()).ok());
    ASSERT_TRUE(
        backend()->PairwiseDotBackward(in.rows, in.vectors, in.dim, x.get(), dout_dev.get(), dx.get()).ok());
    std::vector<double> expected(in.rows * pairs), scale(in.rows * pairs);
    std::vector<double> expected_dx(dx0.begin(), dx0.end()), scale_dx(n, 1.0);
    for (int r = 0; r < in.rows; ++r) {
      int p = 0;
      for (int i = 0; i < in.vectors; ++i) {
        for (int j = i + 1; j < in.vectors; ++j, ++p) {
          for (int d = 0; d < in.dim; ++d) {
            expected[r * pairs + p] += in.at(r, i, d) * in.at(r, j, d);
            scale[r * pairs + p] += std::fabs(in.at(r, i, d) * in.at(r, j, d));
            const double g = dout[r * pairs + p];
            expected_dx[(static_cast<size_t>(r) * in.vectors + i) * in.dim + d] += g * in.at(r, j, d);
            expected_dx[(static_cast<size_t>(r) * in.vectors + j) * in.dim + d] += g * in.at(r, i, d);
          }
        }
      }
    }
    ExpectAllClose(Out<float>(out, in.rows * pairs), expected, scale);
    ExpectAllClose(Out<float>(dx, n), expected_dx, scale_dx);
    // One vector has no pairs: nothing to write, nothing to read.
    EXPECT_TRUE(backend()->PairwiseDotForward(in.rows, 1, in.dim, x.get(), nullptr).ok());
    EXPECT_EQ(backend()->PairwiseDotForward(in.rows, in.vectors, in.dim, nullptr, out.get()).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// 40 rows (one block) and 10,000 (many blocks adding their sums).
TEST_P(BackendTest, PointwiseLossesMatchTheirFormulas) {
  for (int rows : {40, 10000}) {
    SCOPED_TRACE(rows);
    std::vector<float> z = RandomVector(rows, 68, -30.0f, 30.0f);
    z[0] = 90.0f;  // beyond exp's float range both ways: the loss stays finite
    z[1] = -90.0f;
    const std::vector<float> soft = RandomVector(rows, 69, 0.0f, 1.0f);
    const std::vector<float> values = RandomVector(rows, 70, -5.0f, 5.0f);
    const float grad_scale = 0.25f;
    for (Backend::PointLoss loss :
         {Backend::PointLoss::kSigmoidCrossEntropy, Backend::PointLoss::kSquaredError}) {
      const bool sigmoid = loss == Backend::PointLoss::kSigmoidCrossEntropy;
      SCOPED_TRACE(sigmoid ? "sigmoid cross-entropy" : "squared error");
      const std::vector<float>& labels = sigmoid ? soft : values;
      double expected_sum = 1.0, scale_sum = 1.0;
      std::vector<double> expected(rows);
      for (int r = 0; r < rows; ++r) {
        const double zr = z[r], y = labels[r];
        if (sigmoid) {
          expected_sum += std::max(zr, 0.0) - zr * y + std::log1p(std::exp(-std::fabs(zr)));
          expected[r] = (1 / (1 + std::exp(-zr)) - y) * grad_scale;
        } else {
          expected_sum += (zr - y) * (zr - y);
          expected[r] = 2 * (zr - y) * grad_scale;
        }
        scale_sum += std::fabs(zr) + std::fabs(zr - y) * std::fabs(zr - y);
      }
      Buffer z_dev = In(z), labels_dev = In(labels);
      // The sum and the gradient together, then each alone.
      Buffer dz = In(Poisoned(rows));
      double loss_sum = 1.0;  // added to
      ASSERT_TRUE(
          backend()
              ->PointwiseLoss(loss, rows, z_dev.get(), labels_dev.get(), grad_scale, dz.get(), &loss_sum)
              .ok());
      EXPECT_NEAR(loss_sum, expected_sum, 1e-5 * scale_sum);
      ExpectAllClose(Out<float>(dz, rows), expected, std::vector<double>(rows, 10.0));
      Buffer dz_alone = In(Poisoned(rows));
      ASSERT_TRUE(Settled(backend(), backend()->PointwiseLoss(loss, rows, z_dev.get(), labels_dev.get(),
                                                              grad_scale, dz_alone.get(), nullptr))
                      .ok());
      ExpectAllClose(Out<float>(dz_alone, rows), expected, std::vector<double>(rows, 10.0));
      double sum_alone = 1.0;
      ASSERT_TRUE(
          backend()
              ->PointwiseLoss(loss, rows, z_dev.get(), labels_dev.get(), grad_scale, nullptr, &sum_alone)
              .ok());
      EXPECT_NEAR(sum_alone, expected_sum, 1e-5 * scale_sum);
    }
  }
}

TEST_P(BackendTest, PointwiseLossRejectsLabelsItsLossDoesNotTake) {
  const int rows = 4;
  Buffer z = In(RandomVector(rows, 71));
  struct Case {
    Backend::PointLoss loss;
    std::vector<float> labels;
    std::string message;
  };
  const std::vector<Case> cases = {
      {Backend::PointLoss::kSigmoidCrossEntropy, {0, 1, 1.5f, -1}, "labels[2] = 1.5 is outside [0, 1]"},
      {Backend::PointLoss::kSigmoidCrossEntropy, {0, kNaN, 1, 0}, "labels[1] = nan is outside [0, 1]"},
      {Backend::PointLoss::kSquaredError, {3, -7, 0, kInf}, "labels[3] = inf is not finite"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    Buffer labels = In(c.labels), dz = In(Poisoned(rows));
    double loss_sum = 0;
    const absl::Status status = Settled(
        backend(), backend()->PointwiseLoss(c.loss, rows, z.get(), labels.get(), 1.0f, dz.get(), &loss_sum));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("PointwiseLoss: " + c.message), std::string::npos) << status.message();
    EXPECT_EQ(loss_sum, 0.0);
    for (float v : Out<float>(dz, rows)) EXPECT_TRUE(std::isnan(v)) << "dz must be untouched";
  }
  EXPECT_EQ(
      backend()
          ->PointwiseLoss(static_cast<Backend::PointLoss>(7), rows, z.get(), z.get(), 1.0f, nullptr, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, BackendTest, ::testing::ValuesIn(AllBackendFactories()),
                         BackendTestName);

}  // namespace
}  // namespace kernels
}  // namespace fulcrum
