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
#include "kernels/backend_test_util.h"
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

// A copy of Params in backend memory: what Mlp reads and writes.
struct BackendParams {
  Backend* backend;
  std::vector<Buffer> values;
  std::vector<Buffer> grads;

  BackendParams(Backend* b, const Params& host) : backend(b) {
    for (const auto& v : host.values) values.push_back(ToBackend(backend, v));
    // Grads start as NaN: every element must be written.
    for (const auto& g : host.grads) {
      grads.push_back(ToBackend(backend, std::vector<float>(g.size(), std::nanf(""))));
    }
  }
  std::vector<const float*> ValuePtrs() const {
    std::vector<const float*> ptrs;
    for (const Buffer& v : values) ptrs.push_back(v.get());
    return ptrs;
  }
  std::vector<float*> GradPtrs() const {
    std::vector<float*> ptrs;
    for (const Buffer& g : grads) ptrs.push_back(g.get());
    return ptrs;
  }
  // Copies the gradients into host.grads.
  void DownloadGrads(Params& host) const {
    for (size_t t = 0; t < grads.size(); ++t)
      host.grads[t] = FromBackend<float>(backend, grads[t], host.grads[t].size());
  }
  void UploadValues(const Params& host) const {
    for (size_t t = 0; t < values.size(); ++t) {
      const absl::Status status = backend->CopyFromHost(values[t].get(), host.values[t].data(),
                                                        sizeof(float) * host.values[t].size());
      EXPECT_TRUE(status.ok()) << status;
    }
  }
};

// Initializes per MlpTensors; scale_override > 0 replaces every tensor's init
// with uniform [-scale_override, scale_override] (non-zero biases).
Params MakeParams(const ModelConfig& config, uint64_t seed, float scale_override = 0.0f) {
  Params params;
  const std::vector<TensorInfo> tensors = MlpTensors(config);
  for (size_t t = 0; t < tensors.size(); ++t) {
    const TensorInfo& info = tensors[t];
    std::vector<float> v(info.size);
    if (scale_override > 0) {
      FillInit(InitKind::kUniform, scale_override, seed, static_cast<uint32_t>(t), 0, info.size, v.data());
    } else {
      FillInit(info.init, info.init_scale, seed, static_cast<uint32_t>(t), 0, info.size, v.data());
    }
    params.values.push_back(v);
    params.grads.emplace_back(info.size, 0.0f);
  }
  return params;
}

// Mean softmax cross-entropy of the MLP, computed in double precision.
double ReferenceLoss(const ModelConfig& config, const std::vector<std::vector<double>>& params,
                     const std::vector<float>& x, const std::vector<int32_t>& labels) {
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
        z[i * out + j] = l + 1 < num_layers ? ReferenceActivate(config.activation, sum) : sum;
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

class MlpBackendTest : public BackendFixture {
 protected:
  Backend* backend() { return backend_.get(); }
};

// Compares ForwardBackward's gradients with double-precision central
// differences of ReferenceLoss at the same (float) parameter values. Params,
// batch and gradients travel through backend memory.
void CheckGradients(Backend* backend, const ModelConfig& config) {
  Mlp mlp(config, backend);
  Params params = MakeParams(config, 17, 0.8f);
  const Batch batch = RandomBatch(config, 6, 5);
  BackendParams device(backend, params);
  Buffer x = ToBackend(backend, batch.x), labels = ToBackend(backend, batch.labels);
  BatchStats stats;
  const absl::Status status =
      mlp.ForwardBackward(device.ValuePtrs(), x.get(), labels.get<int32_t>(), 6, device.GradPtrs(), &stats);
  ASSERT_TRUE(status.ok()) << status;
  device.DownloadGrads(params);
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
      const double plus = ReferenceLoss(config, ref_params, batch.x, batch.labels);
      ref_params[t][e] = saved - kStep;
      const double minus = ReferenceLoss(config, ref_params, batch.x, batch.labels);
      ref_params[t][e] = saved;
      const double numeric = (plus - minus) / (2 * kStep);
      const double analytic = params.grads[t][e];
      EXPECT_NEAR(analytic, numeric, 2e-3 * std::max(std::fabs(numeric), std::fabs(analytic)) + 2e-5)
          << "tensor " << MlpTensors(config)[t].name << " element " << e;
    }
  }
}

TEST_P(MlpBackendTest, GradientsMatchFiniteDifferencesTanh) {
  CheckGradients(backend(), {5, {4, 3}, Activation::kTanh, 3});
}

TEST_P(MlpBackendTest, GradientsMatchFiniteDifferencesRelu) {
  CheckGradients(backend(), {5, {6, 4}, Activation::kRelu, 3});
}

TEST_P(MlpBackendTest, GradientsMatchFiniteDifferencesSigmoid) {
  CheckGradients(backend(), {4, {5}, Activation::kSigmoid, 4});
}

TEST_P(MlpBackendTest, GradientsMatchFiniteDifferencesSoftmaxRegression) {
  CheckGradients(backend(), {7, {}, Activation::kNone, 4});
}

TEST(MlpTest, TensorsHaveFixedOrderShapesAndInit) {
  const std::vector<TensorInfo> t = MlpTensors({784, {128, 64}, Activation::kRelu, 10});
  ASSERT_EQ(t.size(), 6u);
  const std::vector<std::string> names = {"layer0.weight", "layer0.bias",   "layer1.weight",
                                          "layer1.bias",   "layer2.weight", "layer2.bias"};
  const std::vector<std::vector<int64_t>> shapes = {{784, 128}, {128}, {128, 64}, {64}, {64, 10}, {10}};
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].name, names[i]);
    EXPECT_EQ(t[i].shape, shapes[i]);
    int64_t size = 1;
    for (int64_t d : shapes[i]) size *= d;
    EXPECT_EQ(t[i].size, size);
    if (i % 2 == 0) {
      EXPECT_EQ(t[i].init, InitKind::kUniform);
      EXPECT_FLOAT_EQ(t[i].init_scale, std::sqrt(6.0f / (shapes[i][0] + shapes[i][1])));
    } else {
      EXPECT_EQ(t[i].init, InitKind::kZeros);
    }
  }
}

TEST(MlpTest, NoHiddenLayersIsSoftmaxRegression) {
  const std::vector<TensorInfo> t = MlpTensors({784, {}, Activation::kNone, 10});
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].name, "layer0.weight");
  EXPECT_EQ(t[0].shape, (std::vector<int64_t>{784, 10}));
  EXPECT_EQ(t[1].name, "layer0.bias");
  EXPECT_EQ(t[1].shape, (std::vector<int64_t>{10}));
}

TEST_P(MlpBackendTest, RejectsWrongArguments) {
  const ModelConfig config{4, {3}, Activation::kTanh, 2};
  Mlp mlp(config, backend());
  const Params host = MakeParams(config, 1);
  BackendParams params(backend(), host);
  const Batch batch = RandomBatch(config, 2, 1);
  Buffer x = ToBackend(backend(), batch.x), labels = ToBackend(backend(), batch.labels);
  std::vector<const float*> too_few = params.ValuePtrs();
  too_few.pop_back();
  BatchStats stats;
  absl::Status status =
      mlp.ForwardBackward(too_few, x.get(), labels.get<int32_t>(), 2, params.GradPtrs(), &stats);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("expected 4"), std::string::npos) << status.message();
  std::vector<float*> grads = params.GradPtrs();
  grads.push_back(grads[0]);
  EXPECT_EQ(mlp.ForwardBackward(params.ValuePtrs(), x.get(), labels.get<int32_t>(), 2, grads, &stats).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mlp.Evaluate(too_few, x.get(), labels.get<int32_t>(), 2, &stats).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mlp.Evaluate(params.ValuePtrs(), x.get(), labels.get<int32_t>(), 0, &stats).code(),
            absl::StatusCode::kInvalidArgument);
  Buffer bad_labels = ToBackend(backend(), std::vector<int32_t>{0, 2});
  EXPECT_EQ(mlp.Evaluate(params.ValuePtrs(), x.get(), bad_labels.get<int32_t>(), 2, &stats).code(),
            absl::StatusCode::kInvalidArgument);
  status = mlp.ForwardBackward(params.ValuePtrs(), x.get(), bad_labels.get<int32_t>(), 2, params.GradPtrs(),
                               &stats);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("labels[1] = 2"), std::string::npos) << status.message();
  EXPECT_EQ(stats.count, 0) << "stats must be untouched on error";
}

TEST(MlpTest, RejectsInvalidConfig) {
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  Mlp mlp({4, {0}, Activation::kTanh, 2}, backend.get());
  const std::vector<float> x(8, 0.0f), w(64, 0.0f);
  const std::vector<int32_t> labels = {0, 1};
  const absl::Status status =
      mlp.Evaluate({w.data(), w.data(), w.data(), w.data()}, x.data(), labels.data(), 2, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("hidden[0]"), std::string::npos) << status.message();
}

TEST_P(MlpBackendTest, ScratchReuseAcrossBatchSizesGivesSameResults) {
  const ModelConfig config{6, {5}, Activation::kRelu, 3};
  Mlp reused(config, backend());
  Params host = MakeParams(config, 3, 0.5f);
  BackendParams params(backend(), host);
  const Batch big = RandomBatch(config, 16, 2);
  const Batch small = RandomBatch(config, 4, 3);
  Buffer big_x = ToBackend(backend(), big.x), big_labels = ToBackend(backend(), big.labels);
  Buffer small_x = ToBackend(backend(), small.x), small_labels = ToBackend(backend(), small.labels);
  ASSERT_TRUE(reused
                  .ForwardBackward(params.ValuePtrs(), big_x.get(), big_labels.get<int32_t>(), 16,
                                   params.GradPtrs(), nullptr)
                  .ok());
  ASSERT_TRUE(reused
                  .ForwardBackward(params.ValuePtrs(), small_x.get(), small_labels.get<int32_t>(), 4,
                                   params.GradPtrs(), nullptr)
                  .ok());
  params.DownloadGrads(host);
  const std::vector<std::vector<float>> reused_grads = host.grads;
  Mlp fresh(config, backend());
  ASSERT_TRUE(fresh
                  .ForwardBackward(params.ValuePtrs(), small_x.get(), small_labels.get<int32_t>(), 4,
                                   params.GradPtrs(), nullptr)
                  .ok());
  params.DownloadGrads(host);
  EXPECT_EQ(reused_grads, host.grads);
}

// Gradient accumulation: micro-batches of 5, 5 and 3 examples, scaled by the
// 13 of the whole and added up, leave the gradients of one batch of 13
// (within float rounding), and the same loss.
TEST_P(MlpBackendTest, MicroBatchesAccumulateToTheGradientsOfTheWholeBatch) {
  const ModelConfig config{6, {5, 4}, Activation::kTanh, 3};
  Mlp mlp(config, backend());
  Params host = MakeParams(config, 11, 0.7f);
  BackendParams params(backend(), host);
  const Batch whole = RandomBatch(config, 13, 4);
  Buffer x = ToBackend(backend(), whole.x), labels = ToBackend(backend(), whole.labels);
  BatchStats one;
  ASSERT_TRUE(
      mlp.ForwardBackward(params.ValuePtrs(), x.get(), labels.get<int32_t>(), 13, params.GradPtrs(), &one).ok());
  params.DownloadGrads(host);
  const std::vector<std::vector<float>> expected = host.grads;

  BatchStats parts;
  int first = 0;
  for (int size : {5, 5, 3}) {
    const MicroBatch micro{13, first > 0};
    const absl::Status status = mlp.ForwardBackward(params.ValuePtrs(), x.get() + first * config.input_dim,
                                                    labels.get<int32_t>() + first, size, params.GradPtrs(),
                                                    &parts, nullptr, micro);
    ASSERT_TRUE(status.ok()) << status;
    first += size;
  }
  params.DownloadGrads(host);
  EXPECT_EQ(parts.count, 13);
  EXPECT_NEAR(parts.loss_sum, one.loss_sum, 1e-5 * one.loss_sum);
  for (size_t t = 0; t < expected.size(); ++t) {
    for (size_t e = 0; e < expected[t].size(); ++e) {
      EXPECT_NEAR(host.grads[t][e], expected[t][e], 1e-5 * std::fabs(expected[t][e]) + 1e-7)
          << "tensor " << MlpTensors(config)[t].name << " element " << e;
    }
  }
  // A micro-batch larger than its batch is refused.
  EXPECT_EQ(mlp.ForwardBackward(params.ValuePtrs(), x.get(), labels.get<int32_t>(), 13, params.GradPtrs(), nullptr,
                                nullptr, MicroBatch{12, false})
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// What the trainer relies on to push layer k while layer k-1's backward runs:
// layer_done comes top layer first, once per layer, and a copy queued in it
// carries that layer's final gradients (the ones the whole pass leaves).
TEST_P(MlpBackendTest, LayerDoneComesTopDownWithEachLayersFinalGradients) {
  const ModelConfig config{7, {6, 5}, Activation::kTanh, 4};
  const int batch_size = 9;
  Mlp mlp(config, backend());
  Params host = MakeParams(config, 5, 0.6f);
  BackendParams params(backend(), host);
  const Batch batch = RandomBatch(config, batch_size, 8);
  Buffer x = ToBackend(backend(), batch.x), labels = ToBackend(backend(), batch.labels);

  std::vector<int> order;
  std::vector<std::vector<float>> streamed(host.grads.size());
  std::vector<int64_t> tickets;
  const std::vector<float*> grads = params.GradPtrs();
  BatchStats streamed_stats;
  const absl::Status status = mlp.ForwardBackward(
      params.ValuePtrs(), x.get(), labels.get<int32_t>(), batch_size, grads, &streamed_stats,
      [&](int layer) -> absl::Status {
        order.push_back(layer);
        for (int t : {2 * layer, 2 * layer + 1}) {
          streamed[t].assign(host.grads[t].size(), std::nanf(""));
          absl::StatusOr<int64_t> ticket =
              backend()->CopyToHostAsync(streamed[t].data(), grads[t], sizeof(float) * streamed[t].size());
          if (!ticket.ok()) return ticket.status();
          tickets.push_back(*ticket);
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(order, (std::vector<int>{2, 1, 0}));
  for (int64_t ticket : tickets) ASSERT_TRUE(backend()->WaitCopy(ticket).ok());

  params.DownloadGrads(host);
  for (size_t t = 0; t < host.grads.size(); ++t) EXPECT_EQ(streamed[t], host.grads[t]) << "tensor " << t;
  // And the callback changes nothing: a pass without one gives the same.
  BackendParams plain(backend(), MakeParams(config, 5, 0.6f));
  BatchStats plain_stats;
  ASSERT_TRUE(mlp.ForwardBackward(plain.ValuePtrs(), x.get(), labels.get<int32_t>(), batch_size,
                                  plain.GradPtrs(), &plain_stats)
                  .ok());
  Params plain_host = MakeParams(config, 5, 0.6f);
  plain.DownloadGrads(plain_host);
  EXPECT_EQ(plain_host.grads, host.grads);
  EXPECT_EQ(plain_stats.loss_sum, streamed_stats.loss_sum);
}

TEST_P(MlpBackendTest, LayerDoneErrorStopsThePass) {
  const ModelConfig config{4, {3}, Activation::kRelu, 2};
  Mlp mlp(config, backend());
  Params host = MakeParams(config, 2, 0.5f);
  BackendParams params(backend(), host);
  const Batch batch = RandomBatch(config, 3, 1);
  Buffer x = ToBackend(backend(), batch.x), labels = ToBackend(backend(), batch.labels);
  std::vector<int> order;
  BatchStats stats;
  const absl::Status status =
      mlp.ForwardBackward(params.ValuePtrs(), x.get(), labels.get<int32_t>(), 3, params.GradPtrs(), &stats,
                          [&](int layer) -> absl::Status {
                            order.push_back(layer);
                            return absl::UnavailableError("push stream broke");
                          });
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_EQ(order, std::vector<int>{1}) << "no layer after the failing one";
  EXPECT_EQ(stats.count, 0) << "stats untouched on error";
  params.DownloadGrads(host);
  for (float g : host.grads[0]) EXPECT_TRUE(std::isnan(g)) << "layer 0's backward never ran";
  EXPECT_TRUE(backend()->Synchronize().ok());
}

// The dataset in backend memory.
struct BackendDataset {
  Buffer features, labels;
  int64_t num_examples;
  int num_features;
};

BackendDataset ToBackend(Backend* backend, const Dataset& data) {
  return {ToBackend(backend, data.features), ToBackend(backend, data.labels), data.num_examples,
          data.num_features};
}

BatchStats EvaluateAll(Mlp& mlp, const BackendParams& params, const BackendDataset& data) {
  BatchStats stats;
  const absl::Status status =
      mlp.Evaluate(params.ValuePtrs(), data.features.get(), data.labels.get<int32_t>(),
                   static_cast<int>(data.num_examples), &stats);
  EXPECT_TRUE(status.ok()) << status;
  return stats;
}

// SGD on the host (gradients out, parameters in), forward and backward in
// backend memory, batches addressed inside the uploaded dataset.
TEST_P(MlpBackendTest, SgdTrainingOnSyntheticDataReducesLoss) {
  const Dataset train = MakeSynthetic(7, 1024, 16, 4, /*split=*/0);
  const Dataset test = MakeSynthetic(7, 512, 16, 4, /*split=*/1);
  const ModelConfig config{16, {32}, Activation::kTanh, 4};
  Mlp mlp(config, backend());
  Params host = MakeParams(config, 11);
  BackendParams params(backend(), host);
  const BackendDataset train_data = ToBackend(backend(), train);
  const BackendDataset test_data = ToBackend(backend(), test);
  const BatchStats before = EvaluateAll(mlp, params, test_data);

  constexpr int kBatch = 32;
  constexpr float kLearningRate = 0.1f;
  for (int epoch = 0; epoch < 5; ++epoch) {
    for (int64_t start = 0; start < train.num_examples; start += kBatch) {
      ASSERT_TRUE(
          mlp.ForwardBackward(params.ValuePtrs(), train_data.features.get() + start * train.num_features,
                              train_data.labels.get<int32_t>() + start, kBatch, params.GradPtrs(), nullptr)
              .ok());
      params.DownloadGrads(host);
      for (size_t t = 0; t < host.values.size(); ++t) {
        for (size_t e = 0; e < host.values[t].size(); ++e) {
          host.values[t][e] -= kLearningRate * host.grads[t][e];
        }
      }
      params.UploadValues(host);
    }
  }
  const BatchStats after = EvaluateAll(mlp, params, test_data);
  const double loss_before = before.loss_sum / before.count;
  const double loss_after = after.loss_sum / after.count;
  EXPECT_LT(loss_after, 0.5 * loss_before) << "before " << loss_before << " after " << loss_after;
  EXPECT_GT(static_cast<double>(after.correct) / after.count, 0.9);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, MlpBackendTest, ::testing::ValuesIn(AllBackendFactories()),
                         BackendTestName);

}  // namespace
}  // namespace kernels
}  // namespace fulcrum
