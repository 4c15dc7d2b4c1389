// fulcrum-gpu-bench: one worker training step on a GPU (forward + backward +
// packing the gradients to bf16 for transfer), the work PyTorch does in
// bench/torch_step_bench.py, timed the same way: warm-up, then the median of
// many steps, each closed by a device synchronize.
//
// Prints, per model and precision: samples/s, achieved TFLOP/s (6 * batch *
// sum(in*out) per step) and that as a fraction of the cuBLAS ceilings
// measured in ../shared/GPU.md (51 TFLOP/s fp32, 412 TFLOP/s tf32 and bf16
// dense), one line per case as
//   fulcrum <model> <precision> <samples/s> <TFLOP/s>
// which scripts/gpu-check.sh joins with the PyTorch figures.
//
//   fulcrum-gpu-bench [--device cuda:0] [--steps 50]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/param_init.h"
#include "common/status_macros.h"
#include "kernels/backend_loader.h"
#include "kernels/mlp.h"

namespace fulcrum {
namespace {

struct Case {
  std::string name;
  kernels::ModelConfig config;
  int batch;
};

struct Result {
  double samples_per_second = 0;
  double tflops = 0;
};

double FlopsPerStep(const Case& c) {
  std::vector<int> dims = {c.config.input_dim};
  dims.insert(dims.end(), c.config.hidden.begin(), c.config.hidden.end());
  dims.push_back(c.config.num_classes);
  double macs = 0;
  for (size_t i = 0; i + 1 < dims.size(); ++i) macs += static_cast<double>(dims[i]) * dims[i + 1];
  return 6.0 * c.batch * macs;  // forward 2, backward 4 (dW and dX)
}

absl::StatusOr<Result> RunCase(kernels::Backend* backend, const Case& c, kernels::Precision precision,
                               int steps) {
  RETURN_IF_ERROR(backend->SetPrecision(precision));
  auto tensors = kernels::MlpTensors(c.config);
  std::vector<kernels::Buffer> params, grads;
  std::vector<const float*> param_ptrs;
  std::vector<float*> grad_ptrs;
  int64_t total = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    std::vector<float> host(tensors[t].size);
    FillInit(tensors[t].init, tensors[t].init_scale, 1, static_cast<uint32_t>(t), 0, tensors[t].size, host.data());
    ASSIGN_OR_RETURN(kernels::Buffer p, kernels::Buffer::Make(backend, host.size() * 4));
    ASSIGN_OR_RETURN(kernels::Buffer g, kernels::Buffer::Make(backend, host.size() * 4));
    RETURN_IF_ERROR(backend->CopyFromHost(p.get(), host.data(), host.size() * 4));
    param_ptrs.push_back(p.get());
    grad_ptrs.push_back(g.get());
    params.push_back(std::move(p));
    grads.push_back(std::move(g));
    total += tensors[t].size;
  }
  std::vector<float> x(static_cast<size_t>(c.batch) * c.config.input_dim);
  std::vector<int32_t> y(c.batch);
  FillInit(InitKind::kUniform, 1.0f, 7, 0, 0, static_cast<int64_t>(x.size()), x.data());
  for (int i = 0; i < c.batch; ++i) y[i] = i % c.config.num_classes;
  ASSIGN_OR_RETURN(kernels::Buffer xb, kernels::Buffer::Make(backend, x.size() * 4));
  ASSIGN_OR_RETURN(kernels::Buffer yb, kernels::Buffer::Make(backend, y.size() * 4));
  ASSIGN_OR_RETURN(kernels::Buffer packed, kernels::Buffer::Make(backend, total * 2));
  RETURN_IF_ERROR(backend->CopyFromHost(xb.get(), x.data(), x.size() * 4));
  RETURN_IF_ERROR(backend->CopyFromHost(yb.get(), y.data(), y.size() * 4));
  kernels::Mlp model(c.config, backend);
  auto step = [&]() -> absl::Status {
    RETURN_IF_ERROR(model.ForwardBackward(param_ptrs, xb.get(), yb.get<int32_t>(), c.batch, grad_ptrs, nullptr));
    int64_t offset = 0;
    for (size_t t = 0; t < tensors.size(); ++t) {
      RETURN_IF_ERROR(backend->PackHalf(kernels::HalfType::kBf16, tensors[t].size, grad_ptrs[t],
                                        packed.get<uint16_t>() + offset));
      offset += tensors[t].size;
    }
    return backend->Synchronize();
  };
  for (int i = 0; i < 10; ++i) RETURN_IF_ERROR(step());  // warm-up: pools, cuBLAS heuristics
  std::vector<double> seconds;
  for (int i = 0; i < steps; ++i) {
    absl::Time start = absl::Now();
    RETURN_IF_ERROR(step());
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::sort(seconds.begin(), seconds.end());
  double median = seconds[seconds.size() / 2];
  return Result{c.batch / median, FlopsPerStep(c) / median / 1e12};
}

const char* PrecisionName(kernels::Precision p) {
  switch (p) {
    case kernels::Precision::kTf32: return "tf32";
    case kernels::Precision::kBf16: return "bf16";
    default: return "fp32";
  }
}

int Main(int argc, char** argv) {
  std::string device = "cuda:0";
  int steps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--device") == 0) device = argv[i + 1];
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::max(1, std::atoi(argv[i + 1]));
  }
  auto choice = kernels::MakeBackend(device);
  if (!choice.ok()) {
    fprintf(stderr, "fulcrum-gpu-bench: %s\n", std::string(choice.status().message()).c_str());
    return 1;
  }
  kernels::Backend* backend = choice->backend.get();
  fprintf(stderr, "backend: %s\n", backend->Name());
  std::vector<Case> cases = {
      {"mlp-784-1024-1024-10/b4096", {784, {1024, 1024}, kernels::Activation::kRelu, 10}, 4096},
      {"mlp-4096x4/b8192", {4096, {4096, 4096}, kernels::Activation::kRelu, 4096}, 8192},
  };
  const double ceilings[] = {51, 412, 412};  // TFLOP/s: GPU.md, cuBLAS on the H200
  int rc = 0;
  for (const Case& c : cases) {
    int index = 0;
    for (auto precision : {kernels::Precision::kFp32, kernels::Precision::kTf32, kernels::Precision::kBf16}) {
      auto result = RunCase(backend, c, precision, steps);
      if (!result.ok()) {
        fprintf(stderr, "%s %s: %s\n", c.name.c_str(), PrecisionName(precision),
                std::string(result.status().message()).c_str());
        rc = 1;
        ++index;
        continue;
      }
      printf("fulcrum %s %s %.1f %.2f %.3f\n", c.name.c_str(), PrecisionName(precision), result->samples_per_second,
             result->tflops, result->tflops / ceilings[index]);
      fflush(stdout);
      ++index;
    }
  }
  return rc;
}

}  // namespace
}  // namespace fulcrum

int main(int argc, char** argv) { return fulcrum::Main(argc, argv); }
