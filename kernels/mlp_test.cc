#include "kernels/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/param_init.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "worker/dataset.h"

namespace fulcrum {
namespace kernels {
namespace {

// Parameter storage for a model, one vector per tensor in MlpTensors order.
struct Params {
  std::vector<std::vector<float>> values;
  std::vector<std::vector<float>> grads;

  std::vector<const float*> ValuePtrs() const {
    std::vector<const float*> ptrs;
    for (const auto& v : values) ptrs.push_back(v.data());
    return ptrs;
  }
  std::vector<float*> GradPtrs() {
    std::vector<float*> ptrs;
    for (auto& g : grads) ptrs.push_back(g.data());
    return ptrs;
  }
};

// Initializes per MlpTensors; scale_override > 0 replaces every tensor's init
// with uniform [-scale_override, scale_override] (non-zero biases).
Params MakeParams(const ModelConfig& config, uint64_t seed,
                  float scale_override = 0.0f) {
  Params params;
  const std::vector<TensorInfo> tensors = MlpTensors(config);
  for (size_t t = 0; t < tensors.size(); ++t) {
    const TensorInfo& info = tensors[t];
    std::vector<float> v(info.size);
    if (scale_override > 0) {
      FillInit(InitKind::kUniform, scale_override, seed,
               static_cast<uint32_t>(t), 0, info.size, v.data());
    } else {
      FillInit(info.init, info.init_scale, seed, static_cast<uint32_t>(t), 0,
               info.size, v.data());
    }
    params.values.push_back(v);
    params.grads.emplace_back(info.size, 0.0f);
  }
  return params;
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

// Mean softmax cross-entropy of the MLP, computed in double precision.
double ReferenceLoss(const ModelConfig& config,
                     const std::vector<std::vector<double>>& params,
                     const std::vector<float>& x,
                     const std::vector<int32_t>& labels) {
  const int batch = static_cast<int>(labels.size());
  std::vector<double> h(x.begin(), x.end());
  int in = config.input_dim;
  const int num_layers = static_cast<int>(params.size() / 2);
  for (int l = 0; l < num_layers; ++l) {
    const std::vector<double>& w = params[2 * l];
    const std::vector<double>& b = params[2 * l + 1];
    const int out = static_cast<int>(b.size());
    std::vector<double> z(static_cast<size_t>(batch) * out);
    for (int i = 0; i < batch; ++i) {
      for (int j = 0; j < out; ++j) {
        double sum = b[j];
        for (int p = 0; p < in; ++p) sum += h[i * in + p] * w[p * out + j];
        z[i * out + j] = l + 1 < num_layers
                             ? ReferenceActivate(config.activation, sum)
                             : sum;
      }
    }
    h.swap(z);
    in = out;
  }
  double loss = 0;
  for (int i = 0; i < batch; ++i) {
    const double* row = h.data() + i * in;
    double max = row[0], sum = 0;
    for (int j = 1; j < in; ++j) max = std::max(max, row[j]);
    for (int j = 0; j < in; ++j) sum += std::exp(row[j] - max);
    loss += max + std::log(sum) - row[labels[i]];
  }
  return loss / batch;
}

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> labels;
};

Batch RandomBatch(const ModelConfig& config, int batch, uint64_t seed) {
  Batch b;
  b.x.resize(static_cast<size_t>(batch) * config.input_dim);
  FillInit(InitKind::kUniform, 1.0f, seed, 99, 0, b.x.size(), b.x.data());
  for (int i = 0; i < batch; ++i) b.labels.push_back(i % config.num_classes);
  return b;
}

// Compares ForwardBackward's gradients with double-precision central
// differences of ReferenceLoss at the same (float) parameter values.
void CheckGradients(const ModelConfig& config) {
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  Mlp mlp(config, backend.get());
  Params params = MakeParams(config, 17, 0.8f);
  const Batch batch = RandomBatch(config, 6, 5);
  BatchStats stats;
  ASSERT_TRUE(mlp.ForwardBackward(params.ValuePtrs(), batch.x.data(),
                                  batch.labels.data(), 6, params.GradPtrs(),
                                  &stats)
                  .ok());
  std::vector<std::vector<double>> ref_params;
  for (const auto& v : params.values) {
    ref_params.emplace_back(v.begin(), v.end());
  }
  const double loss = ReferenceLoss(config, ref_params, batch.x, batch.labels);
  EXPECT_NEAR(stats.loss_sum / 6, loss, 1e-5 * loss);
  EXPECT_EQ(stats.count, 6);

  constexpr double kStep = 1e-5;
  for (size_t t = 0; t < ref_params.size(); ++t) {
    for (size_t e = 0; e < ref_params[t].size(); ++e) {
      const double saved = ref_params[t][e];
      ref_params[t][e] = saved + kStep;
      const double plus =
          ReferenceLoss(config, ref_params, batch.x, batch.labels);
      ref_params[t][e] = saved - kStep;
      const double minus =
          ReferenceLoss(config, ref_params, batch.x, batch.labels);
      ref_params[t][e] = saved;
      const double numeric = (plus - minus) / (2 * kStep);
      const double analytic = params.grads[t][e];
      EXPECT_NEAR(analytic, numeric,
                  2e-3 * std::max(std::fabs(numeric), std::fabs(analytic)) +
                      2e-5)
          << "tensor " << MlpTensors(config)[t].name << " element " << e;
    }
  }
}

TEST(MlpTest, GradientsMatchFiniteDifferencesTanh) {
  CheckGradients({5, {4, 3}, Activation::kTanh, 3});
}

TEST(MlpTest, GradientsMatchFiniteDifferencesRelu) {
  CheckGradients({5, {6, 4}, Activation::kRelu, 3});
}

TEST(MlpTest, GradientsMatchFiniteDifferencesSigmoid) {
  CheckGradients({4, {5}, Activation::kSigmoid, 4});
}

TEST(MlpTest, GradientsMatchFiniteDifferencesSoftmaxRegression) {
  CheckGradients({7, {}, Activation::kNone, 4});
}

TEST(MlpTest, TensorsHaveFixedOrderShapesAndInit) {
  const std::vector<TensorInfo> t =
      MlpTensors({784, {128, 64}, Activation::kRelu, 10});
  ASSERT_EQ(t.size(), 6u);
  const std::vector<std::string> names = {"layer0.weight", "layer0.bias",
                                          "layer1.weight", "layer1.bias",
                                          "layer2.weight", "layer2.bias"};
  const std::vector<std::vector<int64_t>> shapes = {
      {784, 128}, {128}, {128, 64}, {64}, {64, 10}, {10}};
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].name, names[i]);
    EXPECT_EQ(t[i].shape, shapes[i]);
    int64_t size = 1;
    for (int64_t d : shapes[i]) size *= d;
    EXPECT_EQ(t[i].size, size);
    if (i % 2 == 0) {
      EXPECT_EQ(t[i].init, InitKind::kUniform);
      EXPECT_FLOAT_EQ(t[i].init_scale,
                      std::sqrt(6.0f / (shapes[i][0] + shapes[i][1])));
    } else {
      EXPECT_EQ(t[i].init, InitKind::kZeros);
    }
  }
}

TEST(MlpTest, NoHiddenLayersIsSoftmaxRegression) {
  const std::vector<TensorInfo> t =
      MlpTensors({784, {}, Activation::kNone, 10});
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].name, "layer0.weight");
  EXPECT_EQ(t[0].shape, (std::vector<int64_t>{784, 10}));
  EXPECT_EQ(t[1].name, "layer0.bias");
  EXPECT_EQ(t[1].shape, (std::vector<int64_t>{10}));
}

TEST(MlpTest, RejectsWrongArguments) {
  const ModelConfig config{4, {3}, Activation::kTanh, 2};
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  Mlp mlp(config, backend.get());
  Params params = MakeParams(config, 1);
  const Batch batch = RandomBatch(config, 2, 1);
  std::vector<const float*> too_few = params.ValuePtrs();
  too_few.pop_back();
  BatchStats stats;
  absl::Status status = mlp.ForwardBackward(
      too_few, batch.x.data(), batch.labels.data(), 2, params.GradPtrs(),
      &stats);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("expected 4"), std::string::npos)
      << status.message();
  std::vector<float*> grads = params.GradPtrs();
  grads.push_back(grads[0]);
  EXPECT_EQ(mlp.ForwardBackward(params.ValuePtrs(), batch.x.data(),
                                batch.labels.data(), 2, grads, &stats)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mlp.Evaluate(too_few, batch.x.data(), batch.labels.data(), 2,
                         &stats)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mlp.Evaluate(params.ValuePtrs(), batch.x.data(),
                         batch.labels.data(), 0, &stats)
                .code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad_labels = {0, 2};
  EXPECT_EQ(mlp.Evaluate(params.ValuePtrs(), batch.x.data(), bad_labels.data(),
                         2, &stats)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(stats.count, 0) << "stats must be untouched on error";
}

TEST(MlpTest, RejectsInvalidConfig) {
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  Mlp mlp({4, {0}, Activation::kTanh, 2}, backend.get());
  const std::vector<float> x(8, 0.0f), w(64, 0.0f);
  const std::vector<int32_t> labels = {0, 1};
  const absl::Status status =
      mlp.Evaluate({w.data(), w.data(), w.data(), w.data()}, x.data(),
                   labels.data(), 2, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("hidden[0]"), std::string::npos)
      << status.message();
}

TEST(MlpTest, ScratchReuseAcrossBatchSizesGivesSameResults) {
  const ModelConfig config{6, {5}, Activation::kRelu, 3};
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  Mlp reused(config, backend.get());
  Params params = MakeParams(config, 3, 0.5f);
  const Batch big = RandomBatch(config, 16, 2);
  const Batch small = RandomBatch(config, 4, 3);
  ASSERT_TRUE(reused.ForwardBackward(params.ValuePtrs(), big.x.data(),
                                     big.labels.data(), 16, params.GradPtrs(),
                                     nullptr)
                  .ok());
  ASSERT_TRUE(reused.ForwardBackward(params.ValuePtrs(), small.x.data(),
                                     small.labels.data(), 4,
                                     params.GradPtrs(), nullptr)
                  .ok());
  const std::vector<std::vector<float>> reused_grads = params.grads;
  Mlp fresh(config, backend.get());
  ASSERT_TRUE(fresh.ForwardBackward(params.ValuePtrs(), small.x.data(),
                                    small.labels.data(), 4, params.GradPtrs(),
                                    nullptr)
                  .ok());
  EXPECT_EQ(reused_grads, params.grads);
}

BatchStats EvaluateAll(Mlp& mlp, const Params& params, const Dataset& data) {
  BatchStats stats;
  EXPECT_TRUE(mlp.Evaluate(params.ValuePtrs(), data.features.data(),
                           data.labels.data(),
                           static_cast<int>(data.num_examples), &stats)
                  .ok());
  return stats;
}

TEST(MlpTest, SgdTrainingOnSyntheticDataReducesLoss) {
  const Dataset train = MakeSynthetic(7, 1024, 16, 4, /*split=*/0);
  const Dataset test = MakeSynthetic(7, 512, 16, 4, /*split=*/1);
  const ModelConfig config{16, {32}, Activation::kTanh, 4};
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  Mlp mlp(config, backend.get());
  Params params = MakeParams(config, 11);
  const BatchStats before = EvaluateAll(mlp, params, test);

  constexpr int kBatch = 32;
  constexpr float kLearningRate = 0.1f;
  for (int epoch = 0; epoch < 5; ++epoch) {
    for (int64_t start = 0; start < train.num_examples; start += kBatch) {
      ASSERT_TRUE(mlp.ForwardBackward(
                         params.ValuePtrs(),
                         train.features.data() + start * train.num_features,
                         train.labels.data() + start, kBatch,
                         params.GradPtrs(), nullptr)
                      .ok());
      for (size_t t = 0; t < params.values.size(); ++t) {
        for (size_t e = 0; e < params.values[t].size(); ++e) {
          params.values[t][e] -= kLearningRate * params.grads[t][e];
        }
      }
    }
  }
  const BatchStats after = EvaluateAll(mlp, params, test);
  const double loss_before = before.loss_sum / before.count;
  const double loss_after = after.loss_sum / after.count;
  EXPECT_LT(loss_after, 0.5 * loss_before)
      << "before " << loss_before << " after " << loss_after;
  EXPECT_GT(static_cast<double>(after.correct) / after.count, 0.9);
}

}  // namespace
}  // namespace kernels
}  // namespace fulcrum
