// Test helpers shared by the kernels tests: the backends every suite runs
// against and the moves of test data in and out of backend memory (which is
// device memory on a GPU backend).

#ifndef FULCRUM_KERNELS_BACKEND_TEST_UTIL_H_
#define FULCRUM_KERNELS_BACKEND_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/backend_loader.h"
#include "kernels/cpu/cpu_backend.h"

namespace fulcrum {
namespace kernels {

// An activation in double precision, the reference the float kernels are
// checked against.
inline double ReferenceActivate(Activation act, double z) {
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

struct BackendFactory {
  std::string name;         // test-name suffix
  std::string name_prefix;  // what Backend::Name() starts with
  bool optional;            // skip (not fail) when the backend is unavailable
  std::function<absl::StatusOr<std::unique_ptr<Backend>>()> make;
};

inline void PrintTo(const BackendFactory& factory, std::ostream* os) { *os << factory.name; }

// The CPU backend and the CUDA backend on GPU 0 (through the plugin, which
// the loader looks for beside the test binary, in ../lib or at
// $FULCRUM_CUDA_PLUGIN).
inline std::vector<BackendFactory> AllBackendFactories() {
  return {
      {"cpu", "cpu", false, []() -> absl::StatusOr<std::unique_ptr<Backend>> { return MakeCpuBackend(); }},
      {"cuda", "cuda:0", true, [] { return LoadCudaBackend(0); }},
  };
}

inline std::string BackendTestName(const ::testing::TestParamInfo<BackendFactory>& info) {
  return info.param.name;
}

// A fixture base that makes GetParam()'s backend, or skips the test when an
// optional backend (a GPU) is not available here.
class BackendFixture : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> backend = GetParam().make();
    if (!backend.ok() && GetParam().optional) {
      GTEST_SKIP() << "no GPU: " << backend.status().message();
    }
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
  }

  std::unique_ptr<Backend> backend_;
};

// Backend memory holding a copy of `host` (at least one byte, so the pointer
// is never null). Failures are test failures.
template <typename T>
Buffer ToBackend(Backend* backend, const std::vector<T>& host) {
  const size_t bytes = host.size() * sizeof(T);
  absl::StatusOr<Buffer> buffer = Buffer::Make(backend, std::max<size_t>(bytes, 1));
  if (!buffer.ok()) {
    ADD_FAILURE() << "Allocate(" << bytes << "): " << buffer.status();
    return Buffer();
  }
  const absl::Status copied = backend->CopyFromHost(buffer->get<void>(), host.data(), bytes);
  EXPECT_TRUE(copied.ok()) << copied;
  return std::move(*buffer);
}

// `n` elements of backend memory at `src`, copied to the host.
template <typename T>
std::vector<T> FromBackend(Backend* backend, const T* src, size_t n) {
  std::vector<T> host(n);
  const absl::Status copied = backend->CopyToHost(host.data(), src, n * sizeof(T));
  EXPECT_TRUE(copied.ok()) << copied;
  return host;
}

template <typename T>
std::vector<T> FromBackend(Backend* backend, const Buffer& buffer, size_t n) {
  return FromBackend(backend, buffer.get<T>(), n);
}

// An op's final status: its own error, or else what the next wait reports
// (a device backend checks data on the device and reports after the fact).
inline absl::Status Settled(Backend* backend, absl::Status op_status) {
  if (!op_status.ok()) return op_status;
  return backend->Synchronize();
}

}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_BACKEND_TEST_UTIL_H_
