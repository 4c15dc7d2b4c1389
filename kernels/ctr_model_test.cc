#include "kernels/ctr_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/param_init.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/backend_test_util.h"

namespace fulcrum {
namespace kernels {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A batch and the parameter values for it, all owned.
struct Problem {
  CtrModelConfig config;
  int32_t batch = 0;
  std::vector<float> labels;
  std::vector<float> dense;
  std::vector<int64_t> offsets;
  std::vector<int32_t> rows;
  std::vector<float> weights;  // empty: all 1
  int32_t unique_rows = 0;
  std::vector<std::vector<float>> dense_params;  // CtrDenseTensors order
  std::vector<std::vector<float>> tables;        // CtrTables order

  CtrBatch Batch() const {
    CtrBatch b;
    b.batch = batch;
    b.labels = labels.data();
    b.dense = dense.empty() ? nullptr : dense.data();
    b.offsets = offsets.empty() ? nullptr : offsets.data();
    b.rows = rows.empty() ? nullptr : rows.data();
    b.weights = weights.empty() ? nullptr : weights.data();
    b.unique_rows = unique_rows;
    return b;
  }
  CtrParams Params() const {
    CtrParams p;
    for (const auto& t : dense_params) p.dense.push_back(t.data());
    for (const auto& t : tables) p.tables.push_back(t.data());
    return p;
  }
};

// Gradient buffers, pre-filled (NaN by default: every element must be written).
struct Grads {
  std::vector<std::vector<float>> dense;
  std::vector<std::vector<float>> tables;

  explicit Grads(const Problem& p, float fill = kNaN) {
    for (const TensorInfo& t : CtrDenseTensors(p.config)) dense.emplace_back(t.size, fill);
    for (const CtrTableInfo& t : CtrTables(p.config))
      tables.emplace_back(int64_t{p.unique_rows} * t.dim, fill);
  }
  CtrGrads Ptrs() {
    CtrGrads g;
    for (auto& t : dense) g.dense.push_back(t.data());
    for (auto& t : tables) g.tables.push_back(t.data());
    return g;
  }
};

// Fills the parameters with uniform values in [-scale, scale] (biases too,
// so that every path carries signal).
void RandomParams(Problem& p, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> uniform(-scale, scale);
  p.dense_params.clear();
  p.tables.clear();
  for (const TensorInfo& t : CtrDenseTensors(p.config)) {
    p.dense_params.emplace_back(t.size);
    for (float& v : p.dense_params.back()) v = uniform(rng);
  }
  for (const CtrTableInfo& t : CtrTables(p.config)) {
    p.tables.emplace_back(int64_t{p.unique_rows} * t.dim);
    for (float& v : p.tables.back()) v = uniform(rng);
  }
}

// A random batch: bags of 0 to 3 ids over `unique_rows` rows, weights in
// [0.5, 1.5], normal dense features, random labels and parameters.
Problem RandomProblem(const CtrModelConfig& config, int32_t batch, int32_t unique_rows, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.config = config;
  p.batch = batch;
  p.unique_rows = unique_rows;
  std::uniform_int_distribution<int> bag_size(0, 3);
  std::uniform_int_distribution<int32_t> row(0, unique_rows - 1);
  std::uniform_real_distribution<float> weight(0.5f, 1.5f);
  std::normal_distribution<float> normal;
  p.offsets.push_back(0);
  for (int64_t b = 0; b < int64_t{batch} * config.num_fields; ++b) {
    const int n = bag_size(rng);
    for (int j = 0; j < n; ++j) {
      p.rows.push_back(row(rng));
      p.weights.push_back(weight(rng));
    }
    p.offsets.push_back(static_cast<int64_t>(p.rows.size()));
  }
  for (int64_t i = 0; i < int64_t{batch} * config.num_dense; ++i) p.dense.push_back(normal(rng));
  for (int32_t e = 0; e < batch; ++e) p.labels.push_back(static_cast<float>(rng() % 2));
  RandomParams(p, rng, 0.5f);
  return p;
}

int TensorIndex(const CtrModelConfig& config, const std::string& name) {
  const std::vector<TensorInfo> tensors = CtrDenseTensors(config);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) return static_cast<int>(i);
  }
  ADD_FAILURE() << "no dense tensor " << name;
  return 0;
}

// ---------------------------------------------------------------------------
// A double-precision reference of the model, written from the header's
// formulas, for the finite-difference check.

struct DoubleParams {
  std::vector<std::vector<double>> dense;
  std::vector<std::vector<double>> tables;
};

DoubleParams ToDouble(const Problem& p) {
  DoubleParams d;
  for (const auto& t : p.dense_params) d.dense.emplace_back(t.begin(), t.end());
  for (const auto& t : p.tables) d.tables.emplace_back(t.begin(), t.end());
  return d;
}

// The deep part's output for one example's input.
double ReferenceDeep(const Problem& p, const DoubleParams& params, std::vector<double> h) {
  const CtrModelConfig& c = p.config;
  for (size_t i = 0; i <= c.hidden.size(); ++i) {
    const std::vector<double>& w = params.dense[TensorIndex(c, "deep" + std::to_string(i) + ".weight")];
    const std::vector<double>& b = params.dense[TensorIndex(c, "deep" + std::to_string(i) + ".bias")];
    const size_t in = h.size(), out = b.size();
    std::vector<double> next(out);
    for (size_t o = 0; o < out; ++o) {
      double sum = b[o];
      for (size_t n = 0; n < in; ++n) sum += h[n] * w[n * out + o];
      next[o] = i < c.hidden.size() ? ReferenceActivate(c.activation, sum) : sum;
    }
    h.swap(next);
  }
  return h[0];
}

double ReferenceFm(int fields, int k, const std::vector<double>& v) {
  double fm = 0;
  for (int d = 0; d < k; ++d) {
    double sum = 0, squares = 0;
    for (int f = 0; f < fields; ++f) {
      sum += v[f * k + d];
      squares += v[f * k + d] * v[f * k + d];
    }
    fm += 0.5 * (sum * sum - squares);
  }
  return fm;
}

// The bottom MLP's output x0 for one example's dense features.
std::vector<double> ReferenceBottom(const Problem& p, const DoubleParams& params, std::vector<double> h) {
  const CtrModelConfig& c = p.config;
  for (size_t i = 0; i <= c.bottom.size(); ++i) {
    const std::vector<double>& w = params.dense[TensorIndex(c, "bottom" + std::to_string(i) + ".weight")];
    const std::vector<double>& b = params.dense[TensorIndex(c, "bottom" + std::to_string(i) + ".bias")];
    const size_t in = h.size(), out = b.size();
    std::vector<double> next(out);
    for (size_t o = 0; o < out; ++o) {
      double sum = b[o];
      for (size_t n = 0; n < in; ++n) sum += h[n] * w[n * out + o];
      next[o] = ReferenceActivate(c.activation, sum);
    }
    h.swap(next);
  }
  return h;
}

// The dot interaction: x0 (with dense features), then x_i . x_j for i < j
// over (x0, v_0, ..., v_{F-1}).
std::vector<double> ReferenceInteraction(const Problem& p, const DoubleParams& params, int e,
                                         const std::vector<double>& bags) {
  const CtrModelConfig& c = p.config;
  const int k = c.embedding_dim;
  std::vector<std::vector<double>> vectors;
  if (c.num_dense > 0) {
    vectors.push_back(ReferenceBottom(
        p, params, std::vector<double>(p.dense.begin() + e * c.num_dense, p.dense.begin() + (e + 1) * c.num_dense)));
  }
  for (int f = 0; f < c.num_fields; ++f) vectors.emplace_back(bags.begin() + f * k, bags.begin() + (f + 1) * k);
  std::vector<double> out;
  if (c.num_dense > 0) out = vectors[0];
  for (size_t i = 0; i < vectors.size(); ++i) {
    for (size_t j = i + 1; j < vectors.size(); ++j) {
      double dot = 0;
      for (int d = 0; d < k; ++d) dot += vectors[i][d] * vectors[j][d];
      out.push_back(dot);
    }
  }
  return out;
}

// The logit of example e.
double ReferenceLogit(const Problem& p, const DoubleParams& params, int e) {
  const CtrModelConfig& c = p.config;
  const int fields = c.num_fields, k = c.embedding_dim, dense = c.num_dense;
  const int linear_table = c.linear ? 0 : -1, embedding_table = c.linear ? 1 : 0;
  double z = params.dense[0][0];
  std::vector<double> input(fields * k + dense, 0.0);
  for (int f = 0; f < fields; ++f) {
    const int64_t bag = int64_t{e} * fields + f;
    double total = 0;
    for (int64_t j = p.offsets[bag]; j < p.offsets[bag + 1]; ++j)
      total += p.weights.empty() ? 1.0 : p.weights[j];
    for (int64_t j = p.offsets[bag]; j < p.offsets[bag + 1]; ++j) {
      double scale = p.weights.empty() ? 1.0 : p.weights[j];
      if (c.combiner == BagCombiner::kMean) scale = total > 0 ? scale / total : 0.0;
      const int32_t row = p.rows[j];
      if (linear_table >= 0) z += scale * params.tables[linear_table][row];
      for (int d = 0; d < k; ++d) input[f * k + d] += scale * params.tables[embedding_table][row * k + d];
    }
  }
  for (int d = 0; d < dense; ++d) {
    input[fields * k + d] = p.dense[e * dense + d];
    if (c.linear) z += params.dense[TensorIndex(c, "dense.weight")][d] * p.dense[e * dense + d];
  }
  if (c.fm) z += ReferenceFm(fields, k, input);
  if (c.dot_interaction) return z + ReferenceDeep(p, params, ReferenceInteraction(p, params, e, input));
  if (!c.hidden.empty()) z += ReferenceDeep(p, params, input);
  return z;
}

double ReferenceLoss(const Problem& p, const DoubleParams& params) {
  double loss = 0;
  for (int e = 0; e < p.batch; ++e) {
    const double z = ReferenceLogit(p, params, e), y = p.labels[e];
    loss += std::max(z, 0.0) - z * y + std::log1p(std::exp(-std::fabs(z)));
  }
  return loss / p.batch;
}

// Central difference of ReferenceLoss in *value.
double NumericGrad(const Problem& p, DoubleParams& params, double* value) {
  constexpr double kStep = 1e-6;
  const double saved = *value;
  *value = saved + kStep;
  const double plus = ReferenceLoss(p, params);
  *value = saved - kStep;
  const double minus = ReferenceLoss(p, params);
  *value = saved;
  return (plus - minus) / (2 * kStep);
}

// ---------------------------------------------------------------------------
// 1. A tiny case computed by hand.
//
// 2 fields, 1 dense feature, dim 2, linear + fm, sum combiner. Three unique
// keys A, B, C (rows 0, 1, 2):
//   bias = 0.5, dense.weight = 0.25
//   linear: A = 0.1, B = -0.2, C = 0.3
//   embedding: A = (1, 0), B = (0, 1), C = (1, -1)
// Example 0: field 0 = {A}, field 1 = {B, C}, dense 2, label 1.
//   v0 = A = (1, 0), v1 = B + C = (1, 0); fm = 0.5 * [(2^2 + 0^2) - (1 + 1)] = 1
//   z0 = 0.5 + 0.25 * 2 + (0.1) + (-0.2 + 0.3) + 1 = 2.2
// Example 1: field 0 = {C}, field 1 = {A}, dense -2, label 0.
//   v0 = C = (1, -1), v1 = A = (1, 0); fm = 0.5 * [(2^2 + 1^2) - (2 + 1)] = 1
//   z1 = 0.5 + 0.25 * -2 + 0.3 + 0.1 + 1 = 1.4
// loss = [log(1 + e^-2.2) + log(1 + e^1.4)] / 2
// g0 = d(loss)/d(z0) = (sigmoid(2.2) - 1) / 2, g1 = (sigmoid(1.4) - 0) / 2
//   bias: g0 + g1; dense.weight: 2 g0 - 2 g1
//   linear: A = g0 + g1 (in both examples), B = g0, C = g0 + g1
//   d(fm)/d(v_f) = sum_f' v_f' - v_f (the other field's bag, with 2 fields):
//     example 0: d/dv0 = g0 v1 = g0 (1, 0), d/dv1 = g0 v0 = g0 (1, 0)
//     example 1: d/dv0 = g1 v1 = g1 (1, 0), d/dv1 = g1 v0 = g1 (1, -1)
//   embedding: A = ex0 v0 + ex1 v1 = (g0 + g1, -g1)
//              B = ex0 v1 = (g0, 0)
//              C = ex0 v1 + ex1 v0 = (g0 + g1, 0)
Problem HandProblem() {
  Problem p;
  p.config.num_fields = 2;
  p.config.num_dense = 1;
  p.config.embedding_dim = 2;
  p.config.linear = true;
  p.config.fm = true;
  p.batch = 2;
  p.labels = {1, 0};
  p.dense = {2, -2};
  p.offsets = {0, 1, 3, 4, 5};
  p.rows = {0, 1, 2, 2, 0};
  p.unique_rows = 3;
  p.dense_params = {{0.5f}, {0.25f}};
  p.tables = {{0.1f, -0.2f, 0.3f}, {1, 0, 0, 1, 1, -1}};
  return p;
}

double Sigmoid(double z) { return 1 / (1 + std::exp(-z)); }

TEST(CtrModelTest, HandComputedLinearFmMatchesLogitsLossAndEveryGradient) {
  const Problem p = HandProblem();
  Grads grads(p);
  CtrModel model(p.config);
  CtrStats stats;
  float logits[2] = {kNaN, kNaN};
  const absl::Status status = model.ForwardBackward(p.Batch(), p.Params(), grads.Ptrs(), &stats, logits);
  ASSERT_TRUE(status.ok()) << status;

  EXPECT_NEAR(logits[0], 2.2, 1e-6);
  EXPECT_NEAR(logits[1], 1.4, 1e-6);
  EXPECT_EQ(stats.count, 2);
  EXPECT_NEAR(stats.loss_sum, std::log1p(std::exp(-2.2)) + std::log1p(std::exp(1.4)), 1e-6);
  const double g0 = (Sigmoid(2.2) - 1) / 2, g1 = Sigmoid(1.4) / 2;
  constexpr double kTol = 1e-6;
  EXPECT_NEAR(grads.dense[0][0], g0 + g1, kTol);
  EXPECT_NEAR(grads.dense[1][0], 2 * g0 - 2 * g1, kTol);
  const std::vector<double> linear = {g0 + g1, g0, g0 + g1};
  const std::vector<double> embedding = {g0 + g1, -g1, g0, 0, g0 + g1, 0};
  for (int r = 0; r < 3; ++r) EXPECT_NEAR(grads.tables[0][r], linear[r], kTol) << "linear row " << r;
  for (int i = 0; i < 6; ++i)
    EXPECT_NEAR(grads.tables[1][i], embedding[i], kTol) << "embedding element " << i;
}

// Mean combiner, by hand: 1 field, linear only, bias 0.25, linear A = 0.4,
// B = -0.8. Example 0's bag is {A with weight 1, B with weight 3}:
// z0 = 0.25 + (0.4 - 2.4) / 4 = -0.25; example 1's bag is empty: z1 = 0.25.
// d/d(linear A) = g0 / 4, d/d(linear B) = 3 g0 / 4.
TEST(CtrModelTest, MeanCombinerDividesByTheBagWeightAndEmptyBagsGiveZero) {
  Problem p;
  p.config.num_fields = 1;
  p.config.combiner = BagCombiner::kMean;
  p.batch = 2;
  p.labels = {0, 1};
  p.offsets = {0, 2, 2};
  p.rows = {0, 1};
  p.weights = {1, 3};
  p.unique_rows = 2;
  p.dense_params = {{0.25f}};
  p.tables = {{0.4f, -0.8f}};
  Grads grads(p);
  CtrModel model(p.config);
  float logits[2];
  const absl::Status status = model.ForwardBackward(p.Batch(), p.Params(), grads.Ptrs(), nullptr, logits);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_NEAR(logits[0], -0.25, 1e-6);
  EXPECT_NEAR(logits[1], 0.25, 1e-6);
  const double g0 = Sigmoid(-0.25) / 2;
  EXPECT_NEAR(grads.tables[0][0], g0 / 4, 1e-6);
  EXPECT_NEAR(grads.tables[0][1], 3 * g0 / 4, 1e-6);
}

// ---------------------------------------------------------------------------
// 2. Gradients against central differences of the double reference.

// 3 fields, 2 dense features, dim 3, linear + fm + deep {5, 4} tanh, batch 4,
// weights in [0.25, 2]. Key 0 twice in one bag, key 1 in two bags (of two
// examples), key 4 in two fields, empty bags, and row 6 that no id refers to.
Problem GradientProblem(BagCombiner combiner) {
  Problem p;
  p.config.num_fields = 3;
  p.config.num_dense = 2;
  p.config.embedding_dim = 3;
  p.config.linear = true;
  p.config.fm = true;
  p.config.hidden = {5, 4};
  p.config.activation = Activation::kTanh;
  p.config.combiner = combiner;
  p.batch = 4;
  p.labels = {1, 0, 0, 1};
  // Bags (example: field 0 | field 1 | field 2):
  //   0: {0, 0} | {1}    | {2, 3}
  //   1: {}     | {1, 4} | {5}
  //   2: {3}    | {}     | {0, 4}
  //   3: {2, 5} | {4}    | {1}
  p.rows = {0, 0, 1, 2, 3, 1, 4, 5, 3, 0, 4, 2, 5, 4, 1};
  p.offsets = {0, 2, 3, 5, 5, 7, 8, 9, 9, 11, 13, 14, 15};
  p.unique_rows = 7;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> weight(0.25f, 2.0f);
  for (size_t j = 0; j < p.rows.size(); ++j) p.weights.push_back(weight(rng));
  std::normal_distribution<float> normal;
  for (int i = 0; i < p.batch * p.config.num_dense; ++i) p.dense.push_back(normal(rng));
  RandomParams(p, rng, 0.5f);
  return p;
}

void ExpectGradientsMatchFiniteDifferences(const Problem& p) {
  Grads grads(p);
  CtrModel model(p.config);
  CtrStats stats;
  std::vector<float> logits(p.batch);
  const absl::Status status =
      model.ForwardBackward(p.Batch(), p.Params(), grads.Ptrs(), &stats, logits.data());
  ASSERT_TRUE(status.ok()) << status;

  DoubleParams params = ToDouble(p);
  for (int e = 0; e < p.batch; ++e)
    EXPECT_NEAR(logits[e], ReferenceLogit(p, params, e), 1e-5) << "example " << e;
  EXPECT_NEAR(stats.loss_sum / p.batch, ReferenceLoss(p, params), 1e-6);
  auto expect_near = [](double analytic, double numeric) {
    return std::fabs(analytic - numeric) <= 1e-3 * std::fabs(numeric) + 1e-6;
  };
  const std::vector<TensorInfo> tensors = CtrDenseTensors(p.config);
  for (size_t t = 0; t < params.dense.size(); ++t) {
    for (size_t i = 0; i < params.dense[t].size(); ++i) {
      const double numeric = NumericGrad(p, params, &params.dense[t][i]);
      EXPECT_PRED2(expect_near, grads.dense[t][i], numeric) << tensors[t].name << " element " << i;
    }
  }
  const std::vector<CtrTableInfo> tables = CtrTables(p.config);
  for (size_t t = 0; t < params.tables.size(); ++t) {
    for (size_t i = 0; i < params.tables[t].size(); ++i) {
      const double numeric = NumericGrad(p, params, &params.tables[t][i]);
      EXPECT_PRED2(expect_near, grads.tables[t][i], numeric) << tables[t].name << " element " << i;
    }
    for (int d = 0; d < tables[t].dim; ++d) EXPECT_EQ(grads.tables[t][6 * tables[t].dim + d], 0.0f);
  }
}

TEST(CtrModelTest, GradientsMatchFiniteDifferencesWithSumCombiner) {
  ExpectGradientsMatchFiniteDifferences(GradientProblem(BagCombiner::kSum));
}

TEST(CtrModelTest, GradientsMatchFiniteDifferencesWithMeanCombiner) {
  ExpectGradientsMatchFiniteDifferences(GradientProblem(BagCombiner::kMean));
}

// The same batch through a DLRM-style model: a bottom MLP of 2 -> 4 -> 3
// over the dense features, the dot products of x0 and the 3 fields' bags
// (6 pairs), an MLP of {5, 4} over them; and without dense features (no x0,
// the fields' 3 pairs).
Problem DlrmProblem(bool dense) {
  Problem p = GradientProblem(BagCombiner::kSum);
  p.config.linear = false;
  p.config.fm = false;
  p.config.dot_interaction = true;
  if (dense) {
    p.config.bottom = {4};
  } else {
    p.config.num_dense = 0;
    p.dense.clear();
  }
  std::mt19937 rng(11);
  RandomParams(p, rng, 0.5f);
  return p;
}

TEST(CtrModelTest, DlrmGradientsMatchFiniteDifferences) {
  ExpectGradientsMatchFiniteDifferences(DlrmProblem(/*dense=*/true));
}

TEST(CtrModelTest, DlrmWithoutDenseFeaturesPairsTheFieldsOnly) {
  const Problem p = DlrmProblem(/*dense=*/false);
  const std::vector<int64_t> deep = CtrDeepDims(p.config);
  ASSERT_FALSE(deep.empty());
  EXPECT_EQ(deep[0], 3) << "3 fields: 3 pairs, no x0";
  EXPECT_TRUE(CtrBottomDims(p.config).empty());
  ExpectGradientsMatchFiniteDifferences(p);
}

TEST(CtrModelTest, DlrmHasABottomMlpTheDeepLayersOverTheInteractionAndOnlyTheEmbeddingTable) {
  const Problem p = DlrmProblem(/*dense=*/true);
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const TensorInfo& t : CtrDenseTensors(p.config)) {
    names.push_back(t.name);
    shapes.push_back(t.shape);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"bias", "bottom0.weight", "bottom0.bias", "bottom1.weight",
                                             "bottom1.bias", "deep0.weight", "deep0.bias", "deep1.weight",
                                             "deep1.bias", "deep2.weight", "deep2.bias"}));
  EXPECT_EQ(shapes[1], (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(shapes[3], (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(shapes[5], (std::vector<int64_t>{3 + 6, 5})) << "x0 and the 6 pairs of 4 vectors";
  const std::vector<CtrTableInfo> tables = CtrTables(p.config);
  ASSERT_EQ(tables.size(), 1u);
  EXPECT_EQ(tables[0].name, "embedding");
}

TEST(CtrModelTest, BadDlrmConfigsAreRefused) {
  const CtrModelConfig good = DlrmProblem(/*dense=*/true).config;
  ASSERT_TRUE(ValidateCtrModelConfig(good).ok()) << ValidateCtrModelConfig(good);
  auto refused = [&](const std::function<void(CtrModelConfig*)>& mutate, const std::string& part) {
    CtrModelConfig c = good;
    mutate(&c);
    const absl::Status status = ValidateCtrModelConfig(c);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << part;
    EXPECT_NE(status.message().find(part), std::string::npos) << status;
  };
  refused([](CtrModelConfig* c) { c->hidden.clear(); }, "no term");
  refused([](CtrModelConfig* c) { c->fm = true; }, "dot_interaction needs");
  refused([](CtrModelConfig* c) { c->dot_interaction = false; }, "bottom applies to dot_interaction only");
  refused([](CtrModelConfig* c) { c->bottom = {0}; }, "bottom[0] = 0");
  refused([](CtrModelConfig* c) { c->bottom.assign(17, 2); }, "bottom has 17 layers");
  refused(
      [](CtrModelConfig* c) {
        c->num_dense = 0;
        c->bottom.clear();
        c->num_fields = 1;
      },
      "pairs 1 vectors");
  refused(
      [](CtrModelConfig* c) {
        c->num_dense = 0;
        c->num_fields = 4096;
      },
      "bottom needs num_dense > 0");
  refused(
      [](CtrModelConfig* c) {
        c->bottom.clear();
        c->num_fields = 4096;
      },
      "at most 1048576 pairs");
}

// ---------------------------------------------------------------------------
// 3. Tensor and table layouts of the model family.

struct Shape {
  std::string name;
  std::vector<int64_t> shape;
};

std::vector<Shape> Shapes(const CtrModelConfig& config) {
  std::vector<Shape> shapes;
  for (const TensorInfo& t : CtrDenseTensors(config)) shapes.push_back({t.name, t.shape});
  return shapes;
}

std::vector<std::pair<std::string, int32_t>> Tables(const CtrModelConfig& config) {
  std::vector<std::pair<std::string, int32_t>> tables;
  for (const CtrTableInfo& t : CtrTables(config)) tables.emplace_back(t.name, t.dim);
  return tables;
}

void ExpectShapes(const CtrModelConfig& config, const std::vector<Shape>& expected) {
  const std::vector<Shape> shapes = Shapes(config);
  ASSERT_EQ(shapes.size(), expected.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(shapes[i].name, expected[i].name);
    EXPECT_EQ(shapes[i].shape, expected[i].shape) << shapes[i].name;
  }
}

// Runs one step on a random batch: the layout is the one the model reads.
void ExpectOneStepRuns(const CtrModelConfig& config) {
  ASSERT_TRUE(ValidateCtrModelConfig(config).ok()) << ValidateCtrModelConfig(config);
  const Problem p = RandomProblem(config, 5, 9, 3);
  Grads grads(p);
  CtrModel model(config);
  CtrStats stats;
  const absl::Status status = model.ForwardBackward(p.Batch(), p.Params(), grads.Ptrs(), &stats);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(stats.count, 5);
  EXPECT_TRUE(std::isfinite(stats.loss_sum));
}

TEST(CtrModelTest, LogisticRegressionHasBiasDenseWeightAndLinearTable) {
  CtrModelConfig config;
  config.num_fields = 4;
  config.num_dense = 3;
  ExpectShapes(config, {{"bias", {1}}, {"dense.weight", {3}}});
  EXPECT_EQ(Tables(config), (std::vector<std::pair<std::string, int32_t>>{{"linear", 1}}));
  for (const TensorInfo& t : CtrDenseTensors(config)) EXPECT_EQ(t.init, InitKind::kZeros) << t.name;
  EXPECT_EQ(CtrTables(config)[0].init, InitKind::kZeros);
  ExpectOneStepRuns(config);
}

TEST(CtrModelTest, DeepOnlyModelHasBiasDeepLayersAndEmbeddingTable) {
  CtrModelConfig config;
  config.num_fields = 4;
  config.num_dense = 3;
  config.embedding_dim = 2;
  config.linear = false;
  config.hidden = {6};
  ExpectShapes(config, {{"bias", {1}},
                        {"deep0.weight", {11, 6}},
                        {"deep0.bias", {6}},
                        {"deep1.weight", {6, 1}},
                        {"deep1.bias", {1}}});
  EXPECT_EQ(Tables(config), (std::vector<std::pair<std::string, int32_t>>{{"embedding", 2}}));
  const std::vector<TensorInfo> tensors = CtrDenseTensors(config);
  EXPECT_EQ(tensors[1].init, InitKind::kUniform);
  EXPECT_FLOAT_EQ(tensors[1].init_scale, std::sqrt(6.0f / 17));
  EXPECT_EQ(tensors[2].init, InitKind::kZeros);
  EXPECT_EQ(tensors[1].size, 66);
  EXPECT_EQ(CtrTables(config)[0].init, InitKind::kUniform);
  EXPECT_GT(CtrTables(config)[0].init_scale, 0.0f);
  ExpectOneStepRuns(config);
}

TEST(CtrModelTest, WideAndDeepHasLinearTermsThenDeepLayers) {
  CtrModelConfig config;
  config.num_fields = 3;
  config.num_dense = 2;
  config.embedding_dim = 4;
  config.hidden = {8, 4};
  ExpectShapes(config, {{"bias", {1}},
                        {"dense.weight", {2}},
                        {"deep0.weight", {14, 8}},
                        {"deep0.bias", {8}},
                        {"deep1.weight", {8, 4}},
                        {"deep1.bias", {4}},
                        {"deep2.weight", {4, 1}},
                        {"deep2.bias", {1}}});
  EXPECT_EQ(Tables(config), (std::vector<std::pair<std::string, int32_t>>{{"linear", 1}, {"embedding", 4}}));
  EXPECT_FLOAT_EQ(CtrDenseTensors(config)[4].init_scale, std::sqrt(6.0f / 12));
  ExpectOneStepRuns(config);
}

TEST(CtrModelTest, DeepFmWithoutDenseFeaturesHasNoDenseWeight) {
  CtrModelConfig config;
  config.num_fields = 2;
  config.embedding_dim = 3;
  config.fm = true;
  config.hidden = {5};
  ExpectShapes(config, {{"bias", {1}},
                        {"deep0.weight", {6, 5}},
                        {"deep0.bias", {5}},
                        {"deep1.weight", {5, 1}},
                        {"deep1.bias", {1}}});
  EXPECT_EQ(Tables(config), (std::vector<std::pair<std::string, int32_t>>{{"linear", 1}, {"embedding", 3}}));
  ExpectOneStepRuns(config);
}

TEST(CtrModelTest, DeepOverDenseFeaturesOnlyHasNoTables) {
  CtrModelConfig config;
  config.num_dense = 4;
  config.hidden = {3};
  ExpectShapes(config, {{"bias", {1}},
                        {"dense.weight", {4}},
                        {"deep0.weight", {4, 3}},
                        {"deep0.bias", {3}},
                        {"deep1.weight", {3, 1}},
                        {"deep1.bias", {1}}});
  EXPECT_TRUE(CtrTables(config).empty());
  ExpectOneStepRuns(config);
}

// ---------------------------------------------------------------------------
// 4. Validation.

CtrModelConfig ValidConfig() {
  CtrModelConfig config;
  config.num_fields = 2;
  config.num_dense = 2;
  config.embedding_dim = 3;
  config.fm = true;
  config.hidden = {4};
  return config;
}

TEST(CtrModelTest, EachBadConfigNamesItsField) {
  struct Case {
    std::function<void(CtrModelConfig&)> mutate;
    std::string names;
  };
  const std::vector<Case> cases = {
      {[](CtrModelConfig& c) { c.num_fields = -1; }, "num_fields = -1"},
      {[](CtrModelConfig& c) { c.num_fields = 4097; }, "num_fields = 4097"},
      {[](CtrModelConfig& c) { c.num_dense = -2; }, "num_dense = -2"},
      {[](CtrModelConfig& c) { c.num_dense = 65537; }, "num_dense = 65537"},
      {[](CtrModelConfig& c) { c.embedding_dim = 4097; }, "embedding_dim = 4097"},
      {[](CtrModelConfig& c) {
         c.hidden = {8, 0};
       },
       "hidden[1] = 0"},
      {[](CtrModelConfig& c) { c.hidden = {65537}; }, "hidden[0] = 65537"},
      {[](CtrModelConfig& c) { c.hidden.assign(17, 4); }, "hidden has 17 layers"},
      {[](CtrModelConfig& c) { c.activation = static_cast<Activation>(9); }, "activation = 9"},
      {[](CtrModelConfig& c) { c.combiner = static_cast<BagCombiner>(5); }, "combiner = 5"},
      {[](CtrModelConfig& c) { c.embedding_dim = 0, c.hidden.clear(); }, "fm needs an embedding"},
      {[](CtrModelConfig& c) { c.fm = false, c.linear = false, c.hidden.clear(); }, "no term"},
      {[](CtrModelConfig& c) { c.num_fields = 0, c.num_dense = 0; }, "num_fields and num_dense are both 0"},
      {[](CtrModelConfig& c) { c.num_fields = 0, c.fm = false; }, "embedding_dim = 3 needs num_fields"},
      {[](CtrModelConfig& c) { c.fm = false, c.hidden.clear(); }, "no term reads the embedding"},
      {[](CtrModelConfig& c) { c.embedding_dim = 0, c.num_dense = 0, c.fm = false; },
       "hidden layers need an input"},
  };
  ASSERT_TRUE(ValidateCtrModelConfig(ValidConfig()).ok());
  const Problem p = RandomProblem(ValidConfig(), 3, 4, 1);
  for (const Case& c : cases) {
    CtrModelConfig config = ValidConfig();
    c.mutate(config);
    const absl::Status status = ValidateCtrModelConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.names;
    EXPECT_NE(status.message().find(c.names), std::string::npos) << status;
    // The model reports it on every call.
    CtrModel model(config);
    Grads grads(p);
    EXPECT_EQ(model.ForwardBackward(p.Batch(), p.Params(), grads.Ptrs(), nullptr), status);
  }
}

TEST(CtrModelTest, BadInputsAreInvalidArgumentAndWriteNothing) {
  struct Case {
    std::string names;
    std::function<void(Problem&)> mutate_data;
    std::function<void(CtrBatch&, CtrParams&, CtrGrads&)> mutate_pointers;
  };
  auto no_data = [](Problem&) {};
  auto no_pointers = [](CtrBatch&, CtrParams&, CtrGrads&) {};
  const std::vector<Case> cases = {
      {"batch.batch = 0", no_data, [](CtrBatch& b, CtrParams&, CtrGrads&) { b.batch = 0; }},
      {"unique_rows = -1", no_data, [](CtrBatch& b, CtrParams&, CtrGrads&) { b.unique_rows = -1; }},
      {"batch.labels is null", no_data, [](CtrBatch& b, CtrParams&, CtrGrads&) { b.labels = nullptr; }},
      {"batch.dense is null", no_data, [](CtrBatch& b, CtrParams&, CtrGrads&) { b.dense = nullptr; }},
      {"got 5 params.dense pointers, expected 6", no_data,
       [](CtrBatch&, CtrParams& p, CtrGrads&) { p.dense.pop_back(); }},
      {"a grads.tables pointer is null", no_data,
       [](CtrBatch&, CtrParams&, CtrGrads& g) { g.tables[1] = nullptr; }},
      {"batch.rows[2] = 8 is outside [0, unique_rows = 8)", [](Problem& p) { p.rows[2] = 8; }, no_pointers},
      {"batch.rows[0] = -1", [](Problem& p) { p.rows[0] = -1; }, no_pointers},
      {"batch.offsets[0] = 1 must be 0", [](Problem& p) { p.offsets[0] = 1; }, no_pointers},
      {"offsets must be non-decreasing", [](Problem& p) { p.offsets[3] = p.offsets[4] + 1; }, no_pointers},
      {"batch.weights[1] = -1", [](Problem& p) { p.weights[1] = -1; }, no_pointers},
      {"batch.labels[1] = 2 must be 0 or 1", [](Problem& p) { p.labels[1] = 2; }, no_pointers},
      {"batch.dense[3] (example 1, feature 1) = nan is not finite", [](Problem& p) { p.dense[3] = kNaN; },
       no_pointers},
      {"params.tables[1] (\"embedding\") row 2 element 1 = nan", [](Problem& p) { p.tables[1][7] = kNaN; },
       no_pointers},
      {"params.dense[2] (\"deep0.weight\") element 0 = inf",
       [](Problem& p) { p.dense_params[2][0] = std::numeric_limits<float>::infinity(); }, no_pointers},
  };
  for (const Case& c : cases) {
    Problem p = RandomProblem(ValidConfig(), 3, 8, 11);
    ASSERT_GE(p.rows.size(), 3u);
    c.mutate_data(p);
    Grads grads(p, 42.0f);
    CtrBatch batch = p.Batch();
    CtrParams params = p.Params();
    CtrGrads grad_ptrs = grads.Ptrs();
    c.mutate_pointers(batch, params, grad_ptrs);
    CtrModel model(p.config);
    CtrStats stats;
    std::vector<float> logits(3, 42.0f);
    const absl::Status status = model.ForwardBackward(batch, params, grad_ptrs, &stats, logits.data());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.names;
    EXPECT_NE(status.message().find(c.names), std::string::npos) << status;
    EXPECT_EQ(stats.count, 0) << c.names;
    EXPECT_EQ(stats.loss_sum, 0) << c.names;
    EXPECT_EQ(logits, std::vector<float>(3, 42.0f)) << c.names;
    for (const auto& g : grads.dense) EXPECT_EQ(g, std::vector<float>(g.size(), 42.0f)) << c.names;
    for (const auto& g : grads.tables) EXPECT_EQ(g, std::vector<float>(g.size(), 42.0f)) << c.names;
  }
}

TEST(CtrModelTest, ForwardMatchesForwardBackwardAndNeedsNoLabelsWithoutStats) {
  const Problem p = RandomProblem(ValidConfig(), 6, 10, 5);
  CtrModel model(p.config);
  Grads grads(p);
  CtrStats train_stats, eval_stats;
  std::vector<float> train_logits(6), eval_logits(6), infer_logits(6);
  ASSERT_TRUE(
      model.ForwardBackward(p.Batch(), p.Params(), grads.Ptrs(), &train_stats, train_logits.data()).ok());
  ASSERT_TRUE(model.Forward(p.Batch(), p.Params(), &eval_stats, eval_logits.data()).ok());
  CtrBatch unlabeled = p.Batch();
  unlabeled.labels = nullptr;
  ASSERT_TRUE(model.Forward(unlabeled, p.Params(), nullptr, infer_logits.data()).ok());
  EXPECT_EQ(train_logits, eval_logits);
  EXPECT_EQ(train_logits, infer_logits);
  EXPECT_EQ(train_stats.loss_sum, eval_stats.loss_sum);
  EXPECT_EQ(eval_stats.count, 6);
  EXPECT_EQ(model.Forward(unlabeled, p.Params(), &eval_stats, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// 5. Training sanity: SGD on a synthetic logistic problem.

// Examples over 3 fields of 100 keys each (global key = field * 100 + local
// id), 1 or 2 ids per field, 2 dense features; labels drawn from a logistic
// model with a true weight per key.
struct Synthetic {
  static constexpr int kFields = 3, kKeysPerField = 100, kDense = 2;
  std::vector<int64_t> offsets = {0};
  std::vector<int32_t> keys;
  std::vector<float> dense, labels;
  double bayes_loss_sum = 0;  // the true model's loss over the examples

  Synthetic(int examples, std::mt19937& rng, const std::vector<double>& true_weight) {
    std::uniform_int_distribution<int> bag_size(1, 2), key(0, kKeysPerField - 1);
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<double> uniform(0, 1);
    for (int e = 0; e < examples; ++e) {
      double z = -0.3;
      for (int f = 0; f < kFields; ++f) {
        for (int n = bag_size(rng); n > 0; --n) {
          keys.push_back(f * kKeysPerField + key(rng));
          z += true_weight[keys.back()];
        }
        offsets.push_back(static_cast<int64_t>(keys.size()));
      }
      for (int d = 0; d < kDense; ++d) dense.push_back(normal(rng));
      z += 0.8 * dense[dense.size() - 2] - 0.5 * dense.back();
      const double p = Sigmoid(z);
      labels.push_back(uniform(rng) < p ? 1.0f : 0.0f);
      bayes_loss_sum += labels.back() == 1.0f ? -std::log(p) : -std::log1p(-p);
    }
  }
  int size() const { return static_cast<int>(labels.size()); }
};

// A model's parameters as a worker would hold them: dense tensors, and every
// key's row in each table (pulled and pushed per batch).
struct Trainer {
  CtrModelConfig config;
  CtrModel model;
  std::vector<TensorInfo> tensors;
  std::vector<CtrTableInfo> table_infos;
  std::vector<std::vector<float>> dense;
  std::vector<std::vector<float>> tables;  // [keys * dim]

  Trainer(const CtrModelConfig& c, int keys)
      : config(c), model(c), tensors(CtrDenseTensors(c)), table_infos(CtrTables(c)) {
    for (size_t t = 0; t < tensors.size(); ++t) {
      dense.emplace_back(tensors[t].size);
      FillInit(tensors[t].init, tensors[t].init_scale, 1, static_cast<uint32_t>(t), 0, tensors[t].size,
               dense[t].data());
    }
    for (size_t t = 0; t < table_infos.size(); ++t) {
      tables.emplace_back(static_cast<size_t>(keys) * table_infos[t].dim);
      FillInit(table_infos[t].init, table_infos[t].init_scale, 1, static_cast<uint32_t>(100 + t), 0,
               static_cast<int64_t>(tables[t].size()), tables[t].data());
    }
  }

  // One batch [begin, end) of `data`, its keys de-duplicated and its rows
  // pulled into `p`; returns the unique keys.
  std::vector<int32_t> Pull(const Synthetic& data, int begin, int end, Problem& p) const {
    const int fields = Synthetic::kFields;
    p.config = config;
    p.batch = end - begin;
    p.labels.assign(data.labels.begin() + begin, data.labels.begin() + end);
    p.dense.assign(data.dense.begin() + begin * Synthetic::kDense,
                   data.dense.begin() + end * Synthetic::kDense);
    const int64_t first = data.offsets[begin * fields], last = data.offsets[end * fields];
    p.offsets.clear();
    for (int b = begin * fields; b <= end * fields; ++b) p.offsets.push_back(data.offsets[b] - first);
    std::vector<int32_t> unique;
    std::vector<int32_t> row_of(fields * Synthetic::kKeysPerField, -1);
    p.rows.clear();
    for (int64_t j = first; j < last; ++j) {
      const int32_t key = data.keys[j];
      if (row_of[key] < 0) {
        row_of[key] = static_cast<int32_t>(unique.size());
        unique.push_back(key);
      }
      p.rows.push_back(row_of[key]);
    }
    p.unique_rows = static_cast<int32_t>(unique.size());
    p.dense_params = dense;
    p.tables.clear();
    for (size_t t = 0; t < tables.size(); ++t) {
      const int dim = table_infos[t].dim;
      p.tables.emplace_back();
      for (int32_t key : unique) {
        p.tables.back().insert(p.tables.back().end(), tables[t].begin() + key * dim,
                               tables[t].begin() + (key + 1) * dim);
      }
    }
    return unique;
  }

  void Step(const Synthetic& data, int begin, int end, float lr) {
    Problem p;
    const std::vector<int32_t> unique = Pull(data, begin, end, p);
    Grads grads(p);
    ASSERT_TRUE(model.ForwardBackward(p.Batch(), p.Params(), grads.Ptrs(), nullptr).ok());
    for (size_t t = 0; t < dense.size(); ++t) {
      for (size_t i = 0; i < dense[t].size(); ++i) dense[t][i] -= lr * grads.dense[t][i];
    }
    for (size_t t = 0; t < tables.size(); ++t) {
      const int dim = table_infos[t].dim;
      for (size_t u = 0; u < unique.size(); ++u) {
        for (int d = 0; d < dim; ++d) tables[t][unique[u] * dim + d] -= lr * grads.tables[t][u * dim + d];
      }
    }
  }

  double MeanLoss(const Synthetic& data) {
    Problem p;
    Pull(data, 0, data.size(), p);
    CtrStats stats;
    EXPECT_TRUE(model.Forward(p.Batch(), p.Params(), &stats, nullptr).ok());
    return stats.loss_sum / static_cast<double>(stats.count);
  }
};

// Trains `config` by SGD (10 epochs of 8000 examples, batch 100, lr 2) and
// expects the held-out loss to fall from about log(2) to within `margin` of
// the true model's loss (0.48 here).
void ExpectTrainingApproachesTheTrueModel(const CtrModelConfig& config, double margin) {
  std::mt19937 rng(2024);
  std::vector<double> true_weight(Synthetic::kFields * Synthetic::kKeysPerField);
  std::normal_distribution<double> normal(0, 0.8);
  for (double& w : true_weight) w = normal(rng);
  const Synthetic train(8000, rng, true_weight), test(2000, rng, true_weight);
  Trainer trainer(config, Synthetic::kFields * Synthetic::kKeysPerField);
  const double initial = trainer.MeanLoss(test);
  constexpr int kBatch = 100, kEpochs = 10;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    for (int begin = 0; begin < train.size(); begin += kBatch) {
      trainer.Step(train, begin, begin + kBatch, 2.0f);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
  }
  const double trained = trainer.MeanLoss(test), bayes = test.bayes_loss_sum / test.size();
  EXPECT_GT(initial, 0.65);
  EXPECT_LT(trained, bayes + margin) << "initial " << initial << ", true model " << bayes;
}

// Held-out loss 0.69 -> 0.497, the true model's 0.482.
TEST(CtrModelTest, SgdOnLogisticDataBringsLogisticRegressionWithin003OfTheTrueLoss) {
  CtrModelConfig config;
  config.num_fields = Synthetic::kFields;
  config.num_dense = Synthetic::kDense;
  ExpectTrainingApproachesTheTrueModel(config, 0.03);
}

// Held-out loss 0.67 -> 0.531 (the fm and deep terms fit noise too).
TEST(CtrModelTest, SgdOnLogisticDataBringsDeepFmWithin008OfTheTrueLoss) {
  CtrModelConfig config;
  config.num_fields = Synthetic::kFields;
  config.num_dense = Synthetic::kDense;
  config.embedding_dim = 4;
  config.fm = true;
  config.hidden = {16};
  ExpectTrainingApproachesTheTrueModel(config, 0.08);
}

}  // namespace
}  // namespace kernels
}  // namespace fulcrum

namespace fulcrum {
namespace kernels {
namespace {

// The FM model's logits and gradients on a batch whose keys repeat across
// examples, against PyTorch (EmbeddingBag-free autograd of the same formula,
// float32): z = b + sum linear[id] + 0.5 * sum_d((sum_f V[id])^2 - sum_f V[id]^2).
TEST(CtrModelTorchTest, FmMatchesPyTorchOnRepeatedKeys) {
  CtrModelConfig config;
  config.num_fields = 4;
  config.embedding_dim = 2;
  config.fm = true;
  CtrModel model(config);
  const std::vector<int32_t> rows = {0, 1, 2, 3, 0, 4, 5, 3, 6, 1, 5, 7};
  const std::vector<int64_t> offsets = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const std::vector<float> labels = {1, 0, 1};
  std::vector<float> v(16), linear(8);
  for (int r = 0; r < 8; ++r) {
    for (int d = 0; d < 2; ++d) {
      v[r * 2 + d] = static_cast<float>(0.1 * (r + 1) * (d + 1) - 0.37 * ((r * 3 + d) % 4));
    }
    linear[r] = static_cast<float>(0.01 * r - 0.02);
  }
  const float bias = 0.1f;
  CtrBatch batch;
  batch.batch = 3;
  batch.labels = labels.data();
  batch.offsets = offsets.data();
  batch.rows = rows.data();
  batch.unique_rows = 8;
  float dbias = 0;
  std::vector<float> dv(16), dlinear(8), logits(3);
  CtrParams params{{&bias}, {linear.data(), v.data()}};
  CtrGrads grads{{&dbias}, {dlinear.data(), dv.data()}};
  CtrStats stats;
  ASSERT_TRUE(model.ForwardBackward(batch, params, grads, &stats, logits.data()).ok());
  const std::vector<float> torch_z = {0.10580001771450043f, 0.4312000274658203f, 2.672499895095825f};
  const std::vector<float> torch_dv = {0.21241390705108643f, 0.38977381587028503f, 0.05152066424489021f,
                                       0.0472564734518528f,  0.12312940508127213f, -0.04577888175845146f,
                                       0.21550758183002472f, 0.3796089291572571f,  -0.0767802745103836f,
                                       0.22023819386959076f, 0.13849368691444397f, 0.07168299704790115f,
                                       0.02132316865026951f, -0.052984848618507385f, 0.03144628927111626f,
                                       -0.040707871317863464f};
  const std::vector<float> torch_dlinear = {0.04419517517089844f,  -0.17939676344394684f, -0.157858207821846f,
                                            0.04419517517089844f,  0.20205338299274445f,  0.18051482737064362f,
                                            -0.02153855562210083f, -0.02153855562210083f};
  for (int e = 0; e < 3; ++e) EXPECT_NEAR(logits[e], torch_z[e], 1e-5) << e;
  EXPECT_NEAR(stats.loss_sum / 3, 0.5467514991760254, 1e-6);
  EXPECT_NEAR(dbias, 0.022656619548797607f, 1e-6);
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(dv[i], torch_dv[i], 1e-5) << "dV element " << i;
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(dlinear[i], torch_dlinear[i], 1e-6) << "dL element " << i;
}

}  // namespace
}  // namespace kernels
}  // namespace fulcrum

namespace fulcrum {
namespace kernels {
namespace {

// One model object serves every step: a call's gradients must not depend on
// the calls before it (scratch is reused, never accumulated into). Each
// model kind, the same batch three times with another batch in between.
TEST(CtrModelReuseTest, RepeatedCallsGiveTheSameGradientsForEveryModelKind) {
  std::vector<CtrModelConfig> configs(5);
  for (CtrModelConfig& c : configs) {
    c.num_fields = 3;
    c.num_dense = 2;
  }
  configs[1].embedding_dim = 2;  // FM
  configs[1].fm = true;
  configs[2].embedding_dim = 2;  // Wide & Deep
  configs[2].hidden = {4};
  configs[3] = configs[2];  // DeepFM
  configs[3].fm = true;
  configs[4] = configs[2];  // DLRM
  configs[4].linear = false;
  configs[4].dot_interaction = true;
  configs[4].bottom = {3};
  for (const CtrModelConfig& config : configs) {
    SCOPED_TRACE(absl::StrCat("fm ", config.fm, " hidden ", config.hidden.size(), " dim ", config.embedding_dim,
                              " dot ", config.dot_interaction));
    CtrModel model(config);
    const std::vector<int32_t> first_rows = {0, 1, 2, 1, 3, 0}, second_rows = {3, 3, 2, 0, 1, 2};
    const std::vector<int64_t> offsets = {0, 1, 2, 3, 4, 5, 6};
    const std::vector<float> labels = {1, 0}, dense = {0.5f, -1.0f, 2.0f, 0.25f};
    std::vector<std::vector<float>> params_storage;
    CtrParams params;
    for (const TensorInfo& t : CtrDenseTensors(config)) {
      std::vector<float> values(static_cast<size_t>(t.size));
      for (size_t i = 0; i < values.size(); ++i) values[i] = 0.1f * static_cast<float>(static_cast<int>(i % 5) - 2);
      params_storage.push_back(values);
    }
    for (const CtrTableInfo& t : CtrTables(config)) {
      std::vector<float> values(static_cast<size_t>(4 * t.dim));
      for (size_t i = 0; i < values.size(); ++i) values[i] = 0.2f * static_cast<float>(static_cast<int>(i % 7) - 3);
      params_storage.push_back(values);
    }
    const size_t dense_count = CtrDenseTensors(config).size();
    for (size_t i = 0; i < params_storage.size(); ++i) {
      (i < dense_count ? params.dense : params.tables).push_back(params_storage[i].data());
    }
    auto gradients = [&](const std::vector<int32_t>& rows) {
      std::vector<std::vector<float>> storage;
      CtrGrads grads;
      for (size_t i = 0; i < params_storage.size(); ++i) storage.emplace_back(params_storage[i].size(), 7.0f);
      for (size_t i = 0; i < storage.size(); ++i) (i < dense_count ? grads.dense : grads.tables).push_back(storage[i].data());
      CtrBatch batch;
      batch.batch = 2;
      batch.labels = labels.data();
      batch.dense = dense.data();
      batch.offsets = offsets.data();
      batch.rows = rows.data();
      batch.unique_rows = 4;
      EXPECT_TRUE(model.ForwardBackward(batch, params, grads, nullptr).ok());
      return storage;
    };
    const auto once = gradients(first_rows);
    EXPECT_EQ(gradients(first_rows), once);
    gradients(second_rows);
    EXPECT_EQ(gradients(first_rows), once);
  }
}

}  // namespace
}  // namespace kernels
}  // namespace fulcrum
