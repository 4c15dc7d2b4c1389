#include "kernels/graph_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/backend_test_util.h"
#include "kernels/ctr_model.h"

namespace fulcrum {
namespace kernels {
namespace {

GraphLayer Layer(const std::string& name, LayerType type, std::vector<std::string> inputs = {}) {
  return MakeLayer(name, type, std::move(inputs));
}
GraphLayer Linear(const std::string& name, const std::string& input, int units) { return LinearLayer(name, input, units); }
GraphLayer Act(const std::string& name, const std::string& input, Activation act) {
  return ActivationLayer(name, input, act);
}
GraphLayer Embedding(const std::string& name, const std::string& table, int dim, std::vector<int32_t> fields = {},
                     BagCombiner combiner = BagCombiner::kSum) {
  return EmbeddingLayer(name, table, dim, std::move(fields), combiner);
}

GraphLayer Add(const std::string& name, std::vector<std::string> inputs, bool bias) {
  GraphLayer layer = Layer(name, LayerType::kAdd, std::move(inputs));
  layer.bias = bias;
  return layer;
}

GraphLayer Loss(const std::string& input, LossKind loss = LossKind::kSigmoidCrossEntropy) {
  GraphLayer layer = Layer("loss", LayerType::kLoss, {input});
  layer.loss = loss;
  return layer;
}

// A random batch: `fields` fields, bags of 0 to 3 ids over a small vocabulary
// (so ids repeat), weights, dense features, labels.
struct Data {
  int32_t batch = 0;
  std::vector<float> labels, dense, weights;
  std::vector<int64_t> offsets = {0};
  std::vector<uint64_t> ids;
  std::vector<int32_t> field_of;  // per id
};

Data RandomData(int32_t batch, int fields, int dense, std::mt19937& rng) {
  Data d;
  d.batch = batch;
  std::uniform_int_distribution<int> bag_size(0, 3), id(0, 9);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f), weight(0.2f, 2.0f);
  for (int32_t e = 0; e < batch; ++e) {
    d.labels.push_back(static_cast<float>(e % 2));
    for (int i = 0; i < dense; ++i) d.dense.push_back(uniform(rng));
    for (int f = 0; f < fields; ++f) {
      const int n = bag_size(rng);
      for (int j = 0; j < n; ++j) {
        d.ids.push_back(static_cast<uint64_t>(id(rng)));
        d.weights.push_back(weight(rng));
        d.field_of.push_back(f);
      }
      d.offsets.push_back(static_cast<int64_t>(d.ids.size()));
    }
  }
  return d;
}

// Per table: the distinct ids of the fields it reads, and each id's row.
struct TableRows {
  std::vector<std::vector<int32_t>> rows;
  std::vector<int32_t> unique;
};

TableRows RowsFor(const Data& d, const std::vector<std::vector<int32_t>>& table_fields) {
  TableRows out;
  for (const auto& fields : table_fields) {
    std::map<uint64_t, int32_t> index;
    std::vector<int32_t>& rows = out.rows.emplace_back(d.ids.size(), -1);
    for (size_t j = 0; j < d.ids.size(); ++j) {
      if (std::find(fields.begin(), fields.end(), d.field_of[j]) == fields.end()) continue;
      rows[j] = index.try_emplace(d.ids[j], static_cast<int32_t>(index.size())).first->second;
    }
    out.unique.push_back(static_cast<int32_t>(index.size()));
  }
  return out;
}

GraphBatch BatchOf(const Data& d, const TableRows& rows, bool weights = true) {
  GraphBatch b;
  b.batch = d.batch;
  b.labels = d.labels.data();
  b.dense = d.dense.empty() ? nullptr : d.dense.data();
  b.offsets = d.offsets.data();
  b.weights = weights ? d.weights.data() : nullptr;
  for (const auto& r : rows.rows) b.rows.push_back(r.data());
  b.unique_rows = rows.unique;
  return b;
}

struct Buffers {
  std::vector<std::vector<float>> dense, tables;
  CtrParams Params() const {
    CtrParams p;
    for (const auto& t : dense) p.dense.push_back(t.data());
    for (const auto& t : tables) p.tables.push_back(t.data());
    return p;
  }
  CtrGrads Grads() {
    CtrGrads g;
    for (auto& t : dense) g.dense.push_back(t.data());
    for (auto& t : tables) g.tables.push_back(t.data());
    return g;
  }
};

Buffers Shaped(const std::vector<TensorInfo>& tensors, const std::vector<CtrTableInfo>& tables,
               const std::vector<int32_t>& unique, float fill) {
  Buffers b;
  for (const TensorInfo& t : tensors) b.dense.emplace_back(t.size, fill);
  for (size_t t = 0; t < tables.size(); ++t) b.tables.emplace_back(int64_t{unique[t]} * tables[t].dim, fill);
  return b;
}

void Randomize(Buffers* b, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> uniform(-scale, scale);
  for (auto& t : b->dense) {
    for (float& x : t) x = uniform(rng);
  }
  for (auto& t : b->tables) {
    for (float& x : t) x = uniform(rng);
  }
}

void ExpectNear(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(want[i], got[i], 2e-5 + 2e-5 * std::fabs(want[i])) << what << " element " << i;
  }
}

// Each preset kind and its graph compute the same loss, logits and
// gradients from the same parameters (up to float rounding: the graph adds
// its terms in another order).
// One config of each preset kind: LR, MF (an FM over two fields), DeepFM
// (a dense first-order term: its graph has an extra bias; mean bags),
// Wide & Deep, DLRM.
std::vector<CtrModelConfig> PresetConfigs() {
  std::vector<CtrModelConfig> configs;
  CtrModelConfig lr;
  lr.num_fields = 3;
  lr.num_dense = 2;
  configs.push_back(lr);
  CtrModelConfig mf;  // FM over (user, item): biased matrix factorization
  mf.num_fields = 2;
  mf.embedding_dim = 4;
  mf.fm = true;
  configs.push_back(mf);
  CtrModelConfig deepfm;
  deepfm.num_fields = 4;
  deepfm.num_dense = 3;
  deepfm.embedding_dim = 4;
  deepfm.fm = true;
  deepfm.hidden = {8, 5};
  deepfm.activation = Activation::kTanh;
  deepfm.combiner = BagCombiner::kMean;
  configs.push_back(deepfm);
  CtrModelConfig wide_deep = deepfm;
  wide_deep.fm = false;
  wide_deep.activation = Activation::kRelu;
  wide_deep.combiner = BagCombiner::kSum;
  configs.push_back(wide_deep);
  CtrModelConfig dlrm;
  dlrm.num_fields = 3;
  dlrm.num_dense = 5;
  dlrm.embedding_dim = 4;
  dlrm.linear = false;
  dlrm.hidden = {6};
  dlrm.dot_interaction = true;
  dlrm.bottom = {7};
  configs.push_back(dlrm);
  return configs;
}

// The batch of a preset kind (its tables read every field: one row index).
CtrBatch CtrBatchOf(const Data& d, const TableRows& rows) {
  CtrBatch ctr;
  ctr.batch = d.batch;
  ctr.labels = d.labels.data();
  ctr.dense = d.dense.empty() ? nullptr : d.dense.data();
  ctr.offsets = d.offsets.data();
  ctr.weights = d.weights.data();
  ctr.rows = rows.rows.empty() ? nullptr : rows.rows[0].data();
  ctr.unique_rows = rows.unique.empty() ? 0 : rows.unique[0];
  return ctr;
}

TEST(GraphModelTest, ThePresetKindsAsGraphsComputeWhatTheKindsCompute) {
  const std::vector<CtrModelConfig> configs = PresetConfigs();
  std::mt19937 rng(7);
  for (size_t k = 0; k < configs.size(); ++k) {
    SCOPED_TRACE(k);
    const CtrModelConfig& c = configs[k];
    ASSERT_TRUE(ValidateCtrModelConfig(c).ok());
    const GraphConfig g = CtrModelAsGraph(c);
    ASSERT_TRUE(ValidateGraphConfig(g).ok()) << ValidateGraphConfig(g);
    const Data d = RandomData(16, c.num_fields, c.num_dense, rng);
    const TableRows rows = RowsFor(d, GraphTableFields(g));

    // The kind's parameters, then the graph's by name.
    const std::vector<TensorInfo> kind_tensors = CtrDenseTensors(c);
    const std::vector<int32_t> unique(CtrTables(c).size(), rows.unique.empty() ? 0 : rows.unique[0]);
    Buffers kind = Shaped(kind_tensors, CtrTables(c), unique, 0.0f);
    Randomize(&kind, rng, 0.5f);
    GraphModel graph(g);
    ASSERT_EQ(graph.tables().size(), CtrTables(c).size());
    Buffers mine = Shaped(graph.dense_tensors(), graph.tables(), rows.unique, 0.0f);
    mine.tables = kind.tables;  // same names, same order
    const std::vector<int> mapped = CtrTensorsOfGraph(c);
    ASSERT_EQ(mapped.size(), graph.dense_tensors().size());
    for (size_t t = 0; t < mapped.size(); ++t) {
      if (mapped[t] < 0) {
        EXPECT_EQ(graph.dense_tensors()[t].name, "dense_lin.bias");  // 0, its gradient is the bias's
        continue;
      }
      EXPECT_EQ(graph.dense_tensors()[t].size, kind_tensors[static_cast<size_t>(mapped[t])].size);
      mine.dense[t] = kind.dense[static_cast<size_t>(mapped[t])];
    }

    const CtrBatch ctr = CtrBatchOf(d, rows);
    CtrModel model(c);
    Buffers kind_grads = Shaped(kind_tensors, CtrTables(c), unique, 0.0f);
    CtrStats kind_stats;
    std::vector<float> kind_logits(static_cast<size_t>(d.batch));
    ASSERT_TRUE(model.ForwardBackward(ctr, kind.Params(), kind_grads.Grads(), &kind_stats, kind_logits.data()).ok());

    Buffers grads = Shaped(graph.dense_tensors(), graph.tables(), rows.unique, std::nanf(""));
    CtrStats stats;
    std::vector<float> logits(static_cast<size_t>(d.batch));
    ASSERT_TRUE(graph.ForwardBackward(BatchOf(d, rows), mine.Params(), grads.Grads(), &stats, logits.data()).ok());

    EXPECT_NEAR(stats.loss_sum, kind_stats.loss_sum, 1e-5 * std::fabs(kind_stats.loss_sum));
    EXPECT_EQ(stats.count, kind_stats.count);
    ExpectNear(kind_logits, logits, "logits");
    for (size_t t = 0; t < mapped.size(); ++t) {
      if (mapped[t] >= 0) ExpectNear(kind_grads.dense[static_cast<size_t>(mapped[t])], grads.dense[t], graph.dense_tensors()[t].name);
    }
    for (size_t t = 0; t < grads.tables.size(); ++t) ExpectNear(kind_grads.tables[t], grads.tables[t], graph.tables()[t].name);
  }
}

// A graph with every layer type, per-field and shared tables, ending in
// `loss`.
GraphConfig EveryLayerGraph(LossKind loss) {
  GraphConfig g;
  g.num_fields = 3;
  g.num_dense = 2;
  g.layers = {
      Layer("dense", LayerType::kDenseInput),
      Embedding("users", "a", 3, {0, 1}, BagCombiner::kMean),
      Embedding("items", "b", 3, {2}),
      Embedding("shared", "a", 3, {2}),
      Layer("fields", LayerType::kConcat, {"users", "items"}),
      Layer("fm", LayerType::kFm, {"fields"}),
      Layer("dots", LayerType::kDot, {"users", "items", "shared"}),
      Linear("hidden", "dense", 6),
      Act("squash", "hidden", Activation::kTanh),
      Layer("both", LayerType::kConcat, {"dots", "squash"}),
      Linear("top", "both", 4),
      Act("top_act", "top", Activation::kSigmoid),
      Add("sum4", {"top_act", "top"}, /*bias=*/true),
      Layer("total", LayerType::kReduceSum, {"sum4"}),
      Add("logit", {"fm", "total"}, /*bias=*/true),
  };
  if (loss == LossKind::kSoftmaxCrossEntropy) {
    g.layers.push_back(Linear("classes", "logit", 3));
    g.layers.push_back(Loss("classes", loss));
  } else {
    g.layers.push_back(Loss("logit", loss));
  }
  return g;
}

// Random data for EveryLayerGraph(loss), with labels that loss takes.
Data EveryLayerData(LossKind loss, int32_t batch, std::mt19937& rng) {
  Data d = RandomData(batch, 3, 2, rng);
  if (loss == LossKind::kSoftmaxCrossEntropy) {
    for (int32_t e = 0; e < d.batch; ++e) d.labels[static_cast<size_t>(e)] = static_cast<float>(e % 3);
  } else if (loss == LossKind::kMeanSquaredError) {
    for (int32_t e = 0; e < d.batch; ++e)
      d.labels[static_cast<size_t>(e)] = 0.3f * static_cast<float>(e % 7) - 0.5f;
  }
  return d;
}

constexpr LossKind kAllLosses[] = {LossKind::kSigmoidCrossEntropy, LossKind::kSoftmaxCrossEntropy,
                                   LossKind::kMeanSquaredError};

// EveryLayerGraph checked against central differences of its loss, for each
// loss.
TEST(GraphModelTest, EveryLayersGradientMatchesFiniteDifferences) {
  for (LossKind loss : kAllLosses) {
    SCOPED_TRACE(static_cast<int>(loss));
    const GraphConfig g = EveryLayerGraph(loss);
    ASSERT_TRUE(ValidateGraphConfig(g).ok()) << ValidateGraphConfig(g);
    EXPECT_EQ(GraphTableFields(g), (std::vector<std::vector<int32_t>>{{0, 1, 2}, {2}}));
    std::mt19937 rng(11);
    const Data d = EveryLayerData(loss, 6, rng);
    const TableRows rows = RowsFor(d, GraphTableFields(g));
    GraphModel model(g);
    Buffers params = Shaped(model.dense_tensors(), model.tables(), rows.unique, 0.0f);
    Randomize(&params, rng, 0.6f);
    Buffers grads = Shaped(model.dense_tensors(), model.tables(), rows.unique, std::nanf(""));
    const GraphBatch batch = BatchOf(d, rows);
    ASSERT_TRUE(model.ForwardBackward(batch, params.Params(), grads.Grads(), nullptr).ok());

    auto loss_at = [&](Buffers& p) {
      CtrStats stats;
      EXPECT_TRUE(model.Forward(batch, p.Params(), &stats, nullptr).ok());
      return stats.loss_sum / static_cast<double>(stats.count);
    };
    auto check = [&](std::vector<std::vector<float>>* values, const std::vector<std::vector<float>>& got,
                     const std::string& what) {
      for (size_t t = 0; t < values->size(); ++t) {
        for (size_t i = 0; i < (*values)[t].size(); ++i) {
          float& x = (*values)[t][i];
          const float saved = x, h = 1e-2f;
          x = saved + h;
          const double up = loss_at(params);
          x = saved - h;
          const double down = loss_at(params);
          x = saved;
          const double numeric = (up - down) / (2 * h);
          ASSERT_NEAR(got[t][i], numeric, 3e-3 + 2e-2 * std::fabs(numeric)) << what << " " << t << " element " << i;
        }
      }
    };
    check(&params.dense, grads.dense, "dense");
    check(&params.tables, grads.tables, "table");
  }
}

TEST(GraphModelTest, ValidationNamesTheLayerAndTheMismatch) {
  auto base = [] {
    GraphConfig g;
    g.num_fields = 2;
    g.num_dense = 3;
    g.layers = {Embedding("emb", "e", 4), Layer("fm", LayerType::kFm, {"emb"}), Loss("fm")};
    return g;
  };
  ASSERT_TRUE(ValidateGraphConfig(base()).ok());
  struct Case {
    std::string why;
    std::function<void(GraphConfig&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"no layers", [](GraphConfig& g) { g.layers.clear(); }, "has 0 layers"},
      {"unknown input", [](GraphConfig& g) { g.layers[1].inputs = {"nope"}; },
       "layer 1 (\"fm\", FM): reads \"nope\", which is not a layer before it"},
      {"input after", [](GraphConfig& g) { g.layers[0].inputs = {"fm"}; },
       "layer 0 (\"emb\", EMBEDDING): reads no layer"},
      {"duplicate name", [](GraphConfig& g) { g.layers[1].name = "emb"; }, "has the name of layer 0"},
      {"bad name", [](GraphConfig& g) { g.layers[1].name = "a b"; }, "a name is 1 to 64"},
      {"no type", [](GraphConfig& g) { g.layers[1].type = LayerType::kUnspecified; }, "has no type"},
      {"loss not last",
       [](GraphConfig& g) { g.layers.push_back(Layer("extra", LayerType::kReduceSum, {"loss"})); },
       "a LOSS must be the last layer"},
      {"last not loss", [](GraphConfig& g) { g.layers.pop_back(); }, "the last layer must be the LOSS"},
      {"unread layer",
       [](GraphConfig& g) { g.layers.insert(g.layers.begin(), Layer("dense", LayerType::kDenseInput)); },
       "layer 0 (\"dense\", DENSE_INPUT): no later layer reads it"},
      {"fm of one vector", [](GraphConfig& g) { g.layers[0].fields = {1}; },
       "has 1 vector; FM pairs at least 2"},
      {"field out of range",
       [](GraphConfig& g) {
         g.layers[0].fields = {0, 2};
       },
       "field 2 is outside the data's fields [0, 2)"},
      {"field twice",
       [](GraphConfig& g) {
         g.layers[0].fields = {1, 1};
       },
       "lists field 1 twice"},
      {"dim out of range", [](GraphConfig& g) { g.layers[0].dim = 2000; }, "dim = 2000 is outside [1, 1024]"},
      {"table dims disagree",
       [](GraphConfig& g) {
         g.layers.insert(g.layers.begin() + 1, Embedding("emb2", "e", 8));
         g.layers[2].inputs = {"emb"};
         g.layers.insert(g.layers.begin() + 3, Layer("fm2", LayerType::kFm, {"emb2"}));
         g.layers[4] = Add("sum", {"fm", "fm2"}, false);
         g.layers.push_back(Loss("sum"));
         g.layers[4].name = "sum";
       },
       "table \"e\" has dim 4 in an earlier layer, here 8"},
      {"loss width", [](GraphConfig& g) { g.layers[2].inputs = {"emb"}; },
       "\"emb\" has 8 values; this loss scores 1"},
      {"softmax of one", [](GraphConfig& g) { g.layers[2].loss = LossKind::kSoftmaxCrossEntropy; },
       "SOFTMAX_CROSS_ENTROPY scores 2 to 65536 classes"},
      {"setting on the wrong type", [](GraphConfig& g) { g.layers[1].units = 3; },
       "units applies to LINEAR only"},
      {"activation unset", [](GraphConfig& g) { g.layers[1] = Act("fm", "emb", Activation::kNone); },
       "activation must be RELU, TANH or SIGMOID"},
      {"dot dims differ",
       [](GraphConfig& g) {
         g.layers.insert(g.layers.begin(), Layer("dense", LayerType::kDenseInput));
         g.layers[2] = Layer("fm", LayerType::kDot, {"emb", "dense"});
       },
       "\"dense\"'s vectors have 3 values, \"emb\"'s 4; DOT pairs vectors of one dim"},
      {"add widths differ",
       [](GraphConfig& g) {
         g.layers[1] = Add("fm", {"emb", "emb"}, false);
         g.layers.insert(g.layers.begin() + 1, Layer("one", LayerType::kReduceSum, {"emb"}));
         g.layers[2].inputs = {"emb", "one"};
       },
       "\"one\" has 1 values, \"emb\" 8; ADD sums equal widths"},
      {"no dense features",
       [](GraphConfig& g) {
         g.num_dense = 0;
         g.layers.insert(g.layers.begin(), Layer("dense", LayerType::kDenseInput));
         g.layers[2].inputs = {"emb"};
       },
       "the data has no dense features"},
      {"huge linear",
       [](GraphConfig& g) {
         g.layers[1] = Linear("fm", "emb", 65536);
         g.layers.insert(g.layers.begin() + 2, Linear("big", "fm", 65536));
         g.layers[3].inputs = {"big"};
       },
       "more than 2^28"},
      {"dot of one layer many times",
       [](GraphConfig& g) {
         // 256 vectors of 65536 values side by side: 16.7 M an example
         // (on a backend a buffer of them, and one of their gradients).
         g.layers[1] = Linear("h", "emb", 65536);
         g.layers.insert(g.layers.begin() + 2,
                         Layer("fm", LayerType::kDot, std::vector<std::string>(256, "h")));
       },
       "layer 2 (\"fm\", DOT): its inputs take 16777216 values an example together, more than 2^20"},
  };
  for (const Case& c : cases) {
    GraphConfig g = base();
    c.edit(g);
    const absl::Status status = ValidateGraphConfig(g);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.why;
    EXPECT_NE(status.message().find(c.message), std::string::npos) << c.why << ": " << status.message();
    // An invalid graph computes nothing.
    GraphModel model(g);
    EXPECT_FALSE(model.Forward(GraphBatch(), CtrParams(), nullptr, nullptr).ok()) << c.why;
  }
}

// Labels each loss does not take, rows that do not fit the table's fields,
// and non-finite values are refused before anything is written.
TEST(GraphModelTest, BadBatchesAreRefusedWithNothingWritten) {
  GraphConfig g;
  g.num_fields = 2;
  g.layers = {Embedding("a", "ta", 2, {0}), Embedding("b", "tb", 2, {1}), Layer("dot", LayerType::kDot, {"a", "b"}),
              Linear("scores", "dot", 3), Loss("scores", LossKind::kSoftmaxCrossEntropy)};
  ASSERT_TRUE(ValidateGraphConfig(g).ok()) << ValidateGraphConfig(g);
  std::mt19937 rng(3);
  Data d = RandomData(4, 2, 0, rng);
  for (int32_t e = 0; e < d.batch; ++e) d.labels[static_cast<size_t>(e)] = static_cast<float>(e % 3);
  TableRows rows = RowsFor(d, GraphTableFields(g));
  GraphModel model(g);
  Buffers params = Shaped(model.dense_tensors(), model.tables(), rows.unique, 0.1f);
  auto refused = [&](const GraphBatch& batch, const std::string& message) {
    Buffers grads = Shaped(model.dense_tensors(), model.tables(), batch.unique_rows, 7.0f);
    CtrStats stats;
    const absl::Status status = model.ForwardBackward(batch, params.Params(), grads.Grads(), &stats);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_NE(status.message().find(message), std::string::npos) << status.message();
    EXPECT_EQ(stats.count, 0);
    for (const auto& t : grads.dense) EXPECT_TRUE(std::all_of(t.begin(), t.end(), [](float x) { return x == 7.0f; }));
  };
  {
    Buffers grads = Shaped(model.dense_tensors(), model.tables(), rows.unique, 0.0f);
    ASSERT_TRUE(model.ForwardBackward(BatchOf(d, rows), params.Params(), grads.Grads(), nullptr).ok());
  }
  Data bad = d;
  bad.labels[1] = 3;
  refused(BatchOf(bad, rows), "is not a class number in [0, 3)");
  bad.labels[1] = 0.5f;
  refused(BatchOf(bad, rows), "is not a class number in [0, 3)");
  TableRows crossed = rows;
  for (size_t j = 0; j < d.ids.size(); ++j) {
    if (d.field_of[j] == 1 && crossed.rows[0][j] == -1) {
      crossed.rows[0][j] = 0;  // table "ta" given an id of field 1, which it does not read
      break;
    }
  }
  if (crossed.rows[0] != rows.rows[0]) refused(BatchOf(d, crossed), "which table \"ta\" does not read, must be -1");
  Data negative = d;
  if (!negative.weights.empty()) {
    negative.weights[0] = -1.0f;
    refused(BatchOf(negative, rows), "must be finite and >= 0");
  }
  params.tables[0][0] = std::nanf("");
  if (rows.unique[0] > 0) refused(BatchOf(d, rows), "is not finite");
}

// --- On a backend --------------------------------------------------------------

class GraphOnBackendTest : public BackendFixture {};

// One pass on the host and on the backend from the same parameters: the
// same loss, outputs and gradients within float rounding.
void ExpectBackendComputesWhatTheHostComputes(GraphModel* host, GraphModel* on_backend, const Data& d,
                                              bool weights, std::mt19937& rng) {
  const GraphConfig& g = host->config();
  const TableRows rows = RowsFor(d, GraphTableFields(g));
  Buffers params = Shaped(host->dense_tensors(), host->tables(), rows.unique, 0.0f);
  Randomize(&params, rng, 0.6f);
  const GraphBatch batch = BatchOf(d, rows, weights);
  const auto width = static_cast<size_t>(GraphOutputWidth(g));
  Buffers want = Shaped(host->dense_tensors(), host->tables(), rows.unique, std::nanf(""));
  Buffers got = Shaped(host->dense_tensors(), host->tables(), rows.unique, std::nanf(""));
  CtrStats want_stats, got_stats;
  std::vector<float> want_out(width * static_cast<size_t>(d.batch)), got_out(want_out.size(), std::nanf(""));
  ASSERT_TRUE(host->ForwardBackward(batch, params.Params(), want.Grads(), &want_stats, want_out.data()).ok());
  const absl::Status status =
      on_backend->ForwardBackward(batch, params.Params(), got.Grads(), &got_stats, got_out.data());
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_NEAR(got_stats.loss_sum, want_stats.loss_sum, 1e-5 * (1 + std::fabs(want_stats.loss_sum)));
  EXPECT_EQ(got_stats.count, want_stats.count);
  ExpectNear(want_out, got_out, "outputs");
  for (size_t t = 0; t < want.dense.size(); ++t)
    ExpectNear(want.dense[t], got.dense[t], host->dense_tensors()[t].name);
  for (size_t t = 0; t < want.tables.size(); ++t)
    ExpectNear(want.tables[t], got.tables[t], host->tables()[t].name);
  // Without stats the gradients are the same (the loss is not read back).
  Buffers quiet = Shaped(host->dense_tensors(), host->tables(), rows.unique, std::nanf(""));
  ASSERT_TRUE(on_backend->ForwardBackward(batch, params.Params(), quiet.Grads(), nullptr).ok());
  for (size_t t = 0; t < want.dense.size(); ++t) ExpectNear(want.dense[t], quiet.dense[t], "without stats");
  // Forward only, with and without the loss.
  CtrStats forward_stats;
  std::fill(got_out.begin(), got_out.end(), std::nanf(""));
  ASSERT_TRUE(on_backend->Forward(batch, params.Params(), &forward_stats, got_out.data()).ok());
  EXPECT_NEAR(forward_stats.loss_sum, want_stats.loss_sum, 1e-5 * (1 + std::fabs(want_stats.loss_sum)));
  ExpectNear(want_out, got_out, "forward outputs");
  std::fill(got_out.begin(), got_out.end(), std::nanf(""));
  GraphBatch unlabelled = batch;
  unlabelled.labels = nullptr;
  ASSERT_TRUE(on_backend->Forward(unlabelled, params.Params(), nullptr, got_out.data()).ok());
  ExpectNear(want_out, got_out, "unlabelled outputs");
}

// Every layer type, each loss, weighted and plain bags; one model a loss
// through batches that grow and shrink (its buffers are reused, then grown).
TEST_P(GraphOnBackendTest, EveryLayerComputesWhatTheHostComputes) {
  for (LossKind loss : kAllLosses) {
    GraphModel host(EveryLayerGraph(loss)), on_backend(EveryLayerGraph(loss), backend_.get());
    ASSERT_EQ(on_backend.backend(), backend_.get());
    std::mt19937 rng(13);
    for (int32_t batch : {6, 45, 6, 70}) {
      for (bool weights : {true, false}) {
        SCOPED_TRACE(testing::Message() << "loss " << static_cast<int>(loss) << ", batch " << batch
                                        << (weights ? ", weighted" : ""));
        ExpectBackendComputesWhatTheHostComputes(&host, &on_backend, EveryLayerData(loss, batch, rng),
                                                 weights, rng);
      }
    }
  }
}

// A graph over dense data only (no fields, no tables: how a graph that is
// not an MLP trains on FASHION_MNIST), wide input, softmax over classes.
TEST_P(GraphOnBackendTest, ADenseOnlyGraphComputesWhatTheHostComputes) {
  GraphConfig g;
  g.num_dense = 300;
  g.layers = {
      Layer("x", LayerType::kDenseInput),
      Linear("h1", "x", 24),
      Act("a1", "h1", Activation::kRelu),
      Linear("h2", "a1", 24),
      Act("a2", "h2", Activation::kTanh),
      Add("res", {"a1", "a2"}, /*bias=*/false),
      Layer("both", LayerType::kConcat, {"res", "x"}),
      Linear("scores", "both", 5),
      Loss("scores", LossKind::kSoftmaxCrossEntropy),
  };
  ASSERT_TRUE(ValidateGraphConfig(g).ok()) << ValidateGraphConfig(g);
  GraphModel host(g), on_backend(g, backend_.get());
  std::mt19937 rng(23);
  for (int32_t batch : {37, 64}) {
    SCOPED_TRACE(batch);
    Data d = RandomData(batch, 0, g.num_dense, rng);
    for (int32_t e = 0; e < d.batch; ++e) d.labels[static_cast<size_t>(e)] = static_cast<float>(e % 5);
    ExpectBackendComputesWhatTheHostComputes(&host, &on_backend, d, /*weights=*/false, rng);
  }
}

// The preset kinds as GPU workers run them (PresetAsGraph: the kind's
// tensors in and out, through its graph on the backend) against the kinds'
// own fused code on the host.
TEST_P(GraphOnBackendTest, ThePresetKindsComputeWhatTheirFusedCodeComputes) {
  for (const CtrModelConfig& c : PresetConfigs()) {
    ASSERT_TRUE(ValidateCtrModelConfig(c).ok()) << ValidateCtrModelConfig(c);
    PresetAsGraph on_backend(c, backend_.get());
    ASSERT_TRUE(on_backend.status().ok()) << on_backend.status();
    CtrModel fused(c);
    std::mt19937 rng(17);
    for (int32_t size : {33, 9}) {
      const Data d = RandomData(size, c.num_fields, c.num_dense, rng);
      const TableRows rows = RowsFor(d, GraphTableFields(on_backend.graph().config()));
      const int32_t unique = rows.unique.empty() ? 0 : rows.unique[0];
      const std::vector<int32_t> uniques(CtrTables(c).size(), unique);
      Buffers params = Shaped(CtrDenseTensors(c), CtrTables(c), uniques, 0.0f);
      Randomize(&params, rng, 0.5f);
      const CtrBatch ctr = CtrBatchOf(d, rows);
      Buffers want = Shaped(CtrDenseTensors(c), CtrTables(c), uniques, 0.0f);
      Buffers got = Shaped(CtrDenseTensors(c), CtrTables(c), uniques, std::nanf(""));
      CtrStats want_stats, got_stats;
      std::vector<float> want_out(static_cast<size_t>(d.batch)), got_out(want_out.size(), std::nanf(""));
      ASSERT_TRUE(
          fused.ForwardBackward(ctr, params.Params(), want.Grads(), &want_stats, want_out.data()).ok());
      const absl::Status status = on_backend.ForwardBackward(BatchOf(d, rows), params.Params(), got.Grads(),
                                                             &got_stats, got_out.data());
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_NEAR(got_stats.loss_sum, want_stats.loss_sum, 1e-5 * (1 + std::fabs(want_stats.loss_sum)));
      ExpectNear(want_out, got_out, "logits");
      for (size_t t = 0; t < want.dense.size(); ++t)
        ExpectNear(want.dense[t], got.dense[t], CtrDenseTensors(c)[t].name);
      for (size_t t = 0; t < want.tables.size(); ++t)
        ExpectNear(want.tables[t], got.tables[t], CtrTables(c)[t].name);
    }
  }
}

// Bad input is refused before the backend is touched, with the host's words.
TEST_P(GraphOnBackendTest, BadInputIsRefusedAsOnTheHost) {
  const GraphConfig g = EveryLayerGraph(LossKind::kSigmoidCrossEntropy);
  std::mt19937 rng(19);
  Data d = EveryLayerData(LossKind::kSigmoidCrossEntropy, 8, rng);
  d.labels[3] = 0.5f;
  const TableRows rows = RowsFor(d, GraphTableFields(g));
  GraphModel host(g), on_backend(g, backend_.get());
  const Buffers params = Shaped(host.dense_tensors(), host.tables(), rows.unique, 0.1f);
  Buffers host_grads = Shaped(host.dense_tensors(), host.tables(), rows.unique, 7.0f);
  Buffers grads = Shaped(host.dense_tensors(), host.tables(), rows.unique, 7.0f);
  const absl::Status want =
      host.ForwardBackward(BatchOf(d, rows), params.Params(), host_grads.Grads(), nullptr);
  const absl::Status got =
      on_backend.ForwardBackward(BatchOf(d, rows), params.Params(), grads.Grads(), nullptr);
  EXPECT_EQ(want.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got, want);
  for (const auto& t : grads.dense)
    EXPECT_TRUE(std::all_of(t.begin(), t.end(), [](float x) { return x == 7.0f; }));
}

INSTANTIATE_TEST_SUITE_P(AllBackends, GraphOnBackendTest, ::testing::ValuesIn(AllBackendFactories()),
                         BackendTestName);

}  // namespace
}  // namespace kernels
}  // namespace fulcrum
