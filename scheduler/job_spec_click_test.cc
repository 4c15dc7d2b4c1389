// The click models' part of the job spec: valid specs pass with their
// defaults, and each misuse is INVALID_ARGUMENT naming the field.
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "common/table_spec.h"
#include "common/test_util.h"
#include "gtest/gtest.h"
#include "kernels/model_from_spec.h"
#include "scheduler/job_spec.h"

namespace fulcrum {
namespace {

// A valid DeepFM on synthetic click data; defaults applied after `mutate`.
v1::JobSpec ClickSpec(const std::function<void(v1::JobSpec*)>& mutate = nullptr) {
  v1::JobSpec spec;
  spec.mutable_model()->set_kind(v1::ModelSpec::DEEPFM);
  spec.mutable_model()->set_embedding_dim(8);
  spec.mutable_model()->add_hidden_sizes(16);
  spec.mutable_data()->set_dataset(v1::DataSpec::SYNTHETIC_CTR);
  spec.mutable_data()->mutable_synthetic_ctr()->set_examples(10000);
  spec.mutable_data()->mutable_synthetic_ctr()->set_dense(3);
  spec.mutable_data()->set_batch_size(64);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
  spec.mutable_optimizer()->set_lr(0.001f);
  spec.set_replicas(1);
  if (mutate) mutate(&spec);
  ApplyJobSpecDefaults(&spec);
  return spec;
}

TEST(ClickSpecTest, EachClickModelIsValidAndRunsAsynchronouslyByDefault) {
  const v1::JobSpec deepfm = ClickSpec();
  EXPECT_EQ(deepfm.mode(), v1::ASP);
  EXPECT_TRUE(ValidateJobSpec(deepfm).ok()) << ValidateJobSpec(deepfm);
  const v1::JobSpec lr = ClickSpec([](v1::JobSpec* s) {
    s->mutable_model()->set_kind(v1::ModelSpec::LOGISTIC_REGRESSION);
    s->mutable_model()->clear_embedding_dim();
    s->mutable_model()->clear_hidden_sizes();
  });
  EXPECT_TRUE(ValidateJobSpec(lr).ok()) << ValidateJobSpec(lr);
  const v1::JobSpec fm = ClickSpec([](v1::JobSpec* s) {
    s->mutable_model()->set_kind(v1::ModelSpec::FM);
    s->mutable_model()->clear_hidden_sizes();
    s->set_mode(v1::SSP);
    s->set_staleness(2);
    s->set_replicas(2);  // tables are replicated like the dense chunks
  });
  EXPECT_TRUE(ValidateJobSpec(fm).ok()) << ValidateJobSpec(fm);
  const v1::JobSpec wide = ClickSpec([](v1::JobSpec* s) {
    s->mutable_model()->set_kind(v1::ModelSpec::WIDE_AND_DEEP);
    v1::TableSpec* table = s->mutable_model()->add_tables();
    table->set_name("linear");
    table->mutable_optimizer()->set_kind(v1::SparseOptimizerSpec::FTRL);
    table->mutable_optimizer()->set_l1(0.1f);
    table->set_admit_after(2);
    table->set_expire_after(1000);
  });
  EXPECT_TRUE(ValidateJobSpec(wide).ok()) << ValidateJobSpec(wide);
}

TEST(ClickSpecTest, DlrmIsAClickModelWithABottomMlpAndOnlyAnEmbeddingTable) {
  const v1::JobSpec dlrm = ClickSpec([](v1::JobSpec* s) {
    s->mutable_model()->set_kind(v1::ModelSpec::DLRM);
    s->mutable_model()->add_bottom_sizes(8);
    s->mutable_model()->add_tables()->set_name("embedding");
  });
  ASSERT_TRUE(ValidateJobSpec(dlrm).ok()) << ValidateJobSpec(dlrm);
  const ModelLayout layout = LayoutFor(dlrm, 0, 0);
  EXPECT_TRUE(layout.click);
  ASSERT_EQ(layout.tables.size(), 1u);
  EXPECT_EQ(layout.tables[0].name, "embedding");
  EXPECT_EQ(layout.tensors[1].name, "bottom0.weight");
}

TEST(ClickSpecTest, BspClickJobsTakeSynchronousOrAsynchronousTables) {
  const v1::JobSpec bsp = ClickSpec([](v1::JobSpec* s) { s->set_mode(v1::BSP); });
  EXPECT_TRUE(ValidateJobSpec(bsp).ok()) << ValidateJobSpec(bsp);
  const v1::JobSpec hybrid = ClickSpec([](v1::JobSpec* s) {
    s->set_mode(v1::BSP);
    v1::TableSpec* table = s->mutable_model()->add_tables();
    table->set_name("embedding");
    table->set_consistency(v1::TableSpec::ASYNC);
    v1::TableSpec* linear = s->mutable_model()->add_tables();
    linear->set_name("linear");
    linear->set_consistency(v1::TableSpec::SYNC);
  });
  EXPECT_TRUE(ValidateJobSpec(hybrid).ok()) << ValidateJobSpec(hybrid);
  const v1::JobSpec async = ClickSpec([](v1::JobSpec* s) {
    v1::TableSpec* table = s->mutable_model()->add_tables();
    table->set_name("embedding");
    table->set_consistency(v1::TableSpec::ASYNC);
  });
  EXPECT_TRUE(ValidateJobSpec(async).ok()) << ValidateJobSpec(async);
}

TEST(ClickSpecTest, LayoutsFollowTheModelKind) {
  const ModelLayout deepfm = LayoutFor(ClickSpec(), 0, 0);
  ASSERT_TRUE(deepfm.click);
  EXPECT_EQ(deepfm.ctr.num_fields, 8) << "the synthetic data's default";
  EXPECT_EQ(deepfm.ctr.num_dense, 3);
  EXPECT_TRUE(deepfm.ctr.fm);
  ASSERT_EQ(deepfm.tables.size(), 2u);
  EXPECT_EQ(deepfm.tables[1].name, "embedding");
  EXPECT_EQ(deepfm.tables[1].dim, 8);
  const ModelLayout lr = LayoutFor(ClickSpec([](v1::JobSpec* s) {
                                     s->mutable_model()->set_kind(v1::ModelSpec::LOGISTIC_REGRESSION);
                                   }),
                                   0, 0);
  ASSERT_EQ(lr.tables.size(), 1u);
  EXPECT_EQ(lr.tables[0].name, "linear");
  EXPECT_TRUE(lr.ctr.hidden.empty());
}

// A matrix factorization over per-field tables as a layer graph:
// users(field 0) . items(field 1) + a bias, on 2-field synthetic data.
v1::JobSpec GraphSpec(const std::function<void(v1::JobSpec*)>& mutate = nullptr) {
  return ClickSpec([&mutate](v1::JobSpec* s) {
    v1::ModelSpec* model = s->mutable_model();
    model->Clear();
    model->set_kind(v1::ModelSpec::GRAPH);
    s->mutable_data()->mutable_synthetic_ctr()->set_fields(2);
    s->mutable_data()->mutable_synthetic_ctr()->set_dense(0);
    v1::LayerSpec* users = AddLayer(model, "users", v1::LayerSpec::EMBEDDING, {});
    users->set_table("users");
    users->set_dim(4);
    users->add_fields(0);
    v1::LayerSpec* items = AddLayer(model, "items", v1::LayerSpec::EMBEDDING, {});
    items->set_table("items");
    items->set_dim(4);
    items->add_fields(1);
    AddLayer(model, "dot", v1::LayerSpec::DOT, {"users", "items"});
    AddLayer(model, "logit", v1::LayerSpec::ADD, {"dot"})->set_bias(true);
    AddLayer(model, "loss", v1::LayerSpec::LOSS, {"logit"});
    if (mutate) mutate(s);
  });
}

// A spec is at most kMaxJobSpecBytes serialized, whatever makes it big: it
// is kept, stored and sent with the job's status and assignments. Here
// layers that each sum one layer 256 times under a 64-character name, each
// of them valid, make a graph of `layers` layers.
v1::JobSpec SpecOfManySums(int layers) {
  return GraphSpec([layers](v1::JobSpec* s) {
    v1::ModelSpec* model = s->mutable_model();
    model->mutable_layers()->DeleteSubrange(3, 2);  // logit and loss come last
    std::string previous = "dot";
    for (int i = 0; i < layers - 5; ++i) {
      std::string name = absl::StrCat("sum", i, "_");
      name.resize(64, 'x');
      AddLayer(model, name, v1::LayerSpec::ADD, std::vector<std::string>(256, previous));
      previous = name;
    }
    AddLayer(model, "logit", v1::LayerSpec::ADD, {previous})->set_bias(true);
    AddLayer(model, "loss", v1::LayerSpec::LOSS, {"logit"});
  });
}

TEST(ClickSpecTest, ASpecPastItsSizeBoundIsRefusedWhateverMakesItBig) {
  const v1::JobSpec small = SpecOfManySums(40);
  ASSERT_LT(small.ByteSizeLong(), kMaxJobSpecBytes);
  EXPECT_TRUE(ValidateJobSpec(small).ok()) << ValidateJobSpec(small);
  const v1::JobSpec big = SpecOfManySums(256);
  ASSERT_GT(big.ByteSizeLong(), kMaxJobSpecBytes);
  const absl::Status status = ValidateJobSpec(big);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "the spec takes")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "at most 1.0 MiB")) << status;
}

TEST(ClickSpecTest, AGraphIsAClickModelWithTheTablesItsLayersName) {
  const v1::JobSpec graph = GraphSpec([](v1::JobSpec* s) {
    v1::TableSpec* table = s->mutable_model()->add_tables();
    table->set_name("items");
    table->mutable_optimizer()->set_kind(v1::SparseOptimizerSpec::FTRL);
    table->set_init_scale(0);  // FTRL's rows start at zero
  });
  ASSERT_TRUE(ValidateJobSpec(graph).ok()) << ValidateJobSpec(graph);
  EXPECT_EQ(graph.mode(), v1::ASP);
  const ModelLayout layout = LayoutFor(graph, 0, 0);
  EXPECT_TRUE(layout.click);
  EXPECT_TRUE(layout.graph);
  ASSERT_EQ(layout.tables.size(), 2u);
  EXPECT_EQ(layout.tables[0].name, "users");
  EXPECT_EQ(layout.tables[1].name, "items");
  EXPECT_EQ(layout.tables[1].dim, 4);
  EXPECT_EQ(layout.table_fields, (std::vector<std::vector<int32_t>>{{0}, {1}}));
  ASSERT_EQ(layout.tensors.size(), 1u);
  EXPECT_EQ(layout.tensors[0].name, "logit.bias");
  // The preset kinds' tables read every field.
  EXPECT_EQ(LayoutFor(ClickSpec(), 0, 0).table_fields,
            (std::vector<std::vector<int32_t>>(2, {0, 1, 2, 3, 4, 5, 6, 7})));
}

// Over dense data a GRAPH of an MLP's shape trains as kind MLP does; any
// other graph trains on the click path (TrainsOnClickPath), with no fields
// and the data's features as dense ones, and must end in a softmax over
// the data's classes.
TEST(ClickSpecTest, AGraphOverDenseDataIsAnMlpOrTrainsOnTheClickPath) {
  auto spec_of = [](const std::function<void(v1::ModelSpec*)>& edit) {
    v1::JobSpec spec;
    spec.mutable_model()->set_kind(v1::ModelSpec::GRAPH);
    v1::ModelSpec* model = spec.mutable_model();
    AddLayer(model, "x", v1::LayerSpec::DENSE_INPUT);
    AddLayer(model, "h", v1::LayerSpec::LINEAR, {"x"})->set_units(32);
    AddLayer(model, "a", v1::LayerSpec::ACTIVATION, {"h"})->set_activation(v1::TANH);
    AddLayer(model, "out", v1::LayerSpec::LINEAR, {"a"})->set_units(10);
    AddLayer(model, "loss", v1::LayerSpec::LOSS, {"out"})->set_loss(v1::LayerSpec::SOFTMAX_CROSS_ENTROPY);
    if (edit) edit(model);
    spec.mutable_data()->set_dataset(v1::DataSpec::FASHION_MNIST);
    spec.mutable_data()->set_path("/usr/share/datasets/fashion-mnist");
    spec.mutable_data()->set_batch_size(64);
    spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
    spec.mutable_optimizer()->set_lr(0.1f);
    ApplyJobSpecDefaults(&spec);
    return spec;
  };
  const v1::JobSpec good = spec_of(nullptr);
  ASSERT_TRUE(ValidateJobSpec(good).ok()) << ValidateJobSpec(good);
  EXPECT_EQ(good.mode(), v1::BSP) << "a dense job's default";
  EXPECT_FALSE(TrainsOnClickPath(good));
  const ModelLayout layout = LayoutFor(good, 784, 10);
  EXPECT_FALSE(layout.click);
  EXPECT_EQ(layout.config.hidden, std::vector<int>{32});
  EXPECT_EQ(layout.config.activation, kernels::Activation::kTanh);
  ASSERT_EQ(layout.tensors.size(), 4u);
  EXPECT_EQ(layout.tensors[0].name, "h.weight");
  EXPECT_EQ(layout.tensors[0].shape, (std::vector<int64_t>{784, 32}));
  EXPECT_EQ(layout.tensors[3].name, "out.bias");
  // Not an MLP: a sum where the activation was, two activation kinds.
  const std::vector<std::function<void(v1::ModelSpec*)>> graphs = {
      [](v1::ModelSpec* m) {
        m->mutable_layers(2)->set_type(v1::LayerSpec::REDUCE_SUM);
        m->mutable_layers(2)->clear_activation();
      },
      [](v1::ModelSpec* m) {
        m->clear_layers();
        AddLayer(m, "x", v1::LayerSpec::DENSE_INPUT);
        AddLayer(m, "h", v1::LayerSpec::LINEAR, {"x"})->set_units(32);
        AddLayer(m, "a", v1::LayerSpec::ACTIVATION, {"h"})->set_activation(v1::TANH);
        AddLayer(m, "h2", v1::LayerSpec::LINEAR, {"a"})->set_units(16);
        AddLayer(m, "a2", v1::LayerSpec::ACTIVATION, {"h2"})->set_activation(v1::RELU);
        AddLayer(m, "out", v1::LayerSpec::LINEAR, {"a2"})->set_units(10);
        AddLayer(m, "loss", v1::LayerSpec::LOSS, {"out"})->set_loss(v1::LayerSpec::SOFTMAX_CROSS_ENTROPY);
      },
  };
  for (const auto& edit : graphs) {
    const v1::JobSpec spec = spec_of(edit);
    EXPECT_TRUE(TrainsOnClickPath(spec));
    ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
    EXPECT_EQ(spec.mode(), v1::BSP) << "a dense job's default";
    const ModelLayout click = LayoutFor(spec, 0, 0);
    EXPECT_TRUE(click.click && click.graph);
    EXPECT_EQ(click.graph_config.num_fields, 0);
    EXPECT_EQ(click.graph_config.num_dense, 784);
    EXPECT_TRUE(click.tables.empty());
    EXPECT_EQ(click.tensors.front().name, "h.weight");
  }
  const std::vector<std::pair<std::function<void(v1::ModelSpec*)>, std::string>> bad = {
      {[](v1::ModelSpec* m) { m->mutable_layers(3)->set_units(7); },
       "layer 3 (\"out\", LINEAR): units = 7, the data has 10 classes"},
      {[](v1::ModelSpec* m) { m->mutable_layers(4)->set_loss(v1::LayerSpec::MEAN_SQUARED_ERROR); },
       "layer 4 (\"loss\", LOSS): \"out\" has 10 values; this loss scores 1"},
      {[](v1::ModelSpec* m) {
         m->mutable_layers(2)->set_type(v1::LayerSpec::REDUCE_SUM);
         m->mutable_layers(2)->clear_activation();
         m->mutable_layers(3)->set_units(7);
       },
       "a GRAPH ends in a SOFTMAX_CROSS_ENTROPY loss over the data's 10 classes (got SOFTMAX_CROSS_ENTROPY "
       "over 7 outputs)"},
      {[](v1::ModelSpec* m) {
         m->mutable_layers(0)->set_type(v1::LayerSpec::EMBEDDING);
         m->mutable_layers(0)->set_table("t");
         m->mutable_layers(0)->set_dim(4);
       },
       "EMBEDDING reads categorical fields, which FASHION_MNIST has none of"},
  };
  for (const auto& [edit, message] : bad) {
    const absl::Status status = ValidateJobSpec(spec_of(edit));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_TRUE(Contains(status.message(), message)) << status;
  }
  // What the layer-graph engine does not do, named for such a graph.
  const std::vector<std::pair<std::function<void(v1::JobSpec*)>, std::string>> limits = {
      {[](v1::JobSpec* j) { j->mutable_local_sgd()->set_steps(4); },
       "localSgd.steps applies to the MLP path only (kinds MLP, SOFTMAX_REGRESSION, and GRAPHs of an MLP's "
       "shape"},
      {[](v1::JobSpec* j) { j->set_precision(v1::BF16); },
       "precision must be FP32 for a click model or a GRAPH that is not an MLP"},
      {[](v1::JobSpec* j) { j->set_wire_format(v1::WIRE_BF16); },
       "wireFormat must be WIRE_FP32 without compression for a click model or a GRAPH that is not an MLP"},
      {[](v1::JobSpec* j) { j->mutable_data()->set_test_path("/data/test.svm"); },
       "syntheticCtr, csv, libsvm, testPath and onBadRecord apply to click data"},
      {[](v1::JobSpec* j) {
         j->mutable_early_stopping()->set_metric(v1::EarlyStoppingSpec::TEST_AUC);
         j->mutable_early_stopping()->set_patience(2);
       },
       "TEST_AUC needs a click model on click data (models over FASHION_MNIST and SYNTHETIC report accuracy "
       "and loss)"},
      {[](v1::JobSpec* j) {
         v1::ModelSpec* m = j->mutable_model();
         m->mutable_layers(5)->set_units(1);
         m->mutable_layers(6)->set_loss(v1::LayerSpec::SIGMOID_CROSS_ENTROPY);
       },
       "a SOFTMAX_CROSS_ENTROPY loss over the data's 10 classes (got SIGMOID_CROSS_ENTROPY over 1 output)"},
  };
  for (const auto& [edit, message] : limits) {
    v1::JobSpec spec = spec_of(graphs[1]);
    edit(&spec);
    const absl::Status status = ValidateJobSpec(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_TRUE(Contains(status.message(), message)) << status;
  }
  // A graph without parameters: named as such, not as a graph of tables.
  const absl::Status bare = ValidateJobSpec(spec_of([](v1::ModelSpec* m) {
    m->clear_layers();
    AddLayer(m, "x", v1::LayerSpec::DENSE_INPUT);
    AddLayer(m, "a", v1::LayerSpec::ACTIVATION, {"x"})->set_activation(v1::TANH);
    AddLayer(m, "loss", v1::LayerSpec::LOSS, {"a"})->set_loss(v1::LayerSpec::SOFTMAX_CROSS_ENTROPY);
  }));
  EXPECT_TRUE(Contains(bare.message(), "need a dense tensor")) << bare;
  EXPECT_TRUE(Contains(bare.message(), "a graph without parameters")) << bare;
}

struct ClickReject {
  std::string name;
  std::function<void(v1::JobSpec*)> mutate;
  std::vector<std::string> parts;  // each must appear in the message
};

// Makes `s` train on libsvm files (`fields` 0), or on libffm files of
// `fields` fields.
void LibsvmData(int32_t fields, v1::JobSpec* s) {
  s->mutable_data()->set_dataset(v1::DataSpec::LIBSVM);
  s->mutable_data()->clear_synthetic_ctr();
  s->mutable_data()->set_path(fields == 0 ? "/data/x.libsvm" : "/data/x.libffm");
  if (fields != 0) s->mutable_data()->mutable_libsvm()->set_fields(fields);
}

// Makes `s` train on CSV files of a label and a `column`, split by `delimiter`.
void CsvData(const std::string& delimiter, v1::CsvSpec::Column column, v1::JobSpec* s) {
  s->mutable_data()->set_dataset(v1::DataSpec::CSV);
  s->mutable_data()->clear_synthetic_ctr();
  s->mutable_data()->set_path("/data/x.csv");
  s->mutable_data()->mutable_csv()->add_columns(v1::CsvSpec::LABEL);
  s->mutable_data()->mutable_csv()->add_columns(column);
  s->mutable_data()->mutable_csv()->set_delimiter(delimiter);
}

// Early stopping watches the test set: files need a testPath for it (a job
// without one used to run to its end, never stopping).
TEST(ClickSpecTest, EarlyStoppingOverFilesWatchesTheirTestSet) {
  v1::JobSpec spec = ClickSpec([](v1::JobSpec* s) {
    LibsvmData(4, s);
    s->mutable_early_stopping()->set_metric(v1::EarlyStoppingSpec::TEST_AUC);
    s->mutable_early_stopping()->set_patience(2);
  });
  EXPECT_EQ(ValidateJobSpec(spec).code(), absl::StatusCode::kInvalidArgument);
  spec.mutable_data()->set_test_path("/data/x-test.libffm");
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

// A CSV delimiter is any printable character no number holds, a space or a
// tab.
TEST(ClickSpecTest, CsvDelimitersThatNoNumberHoldsAreAccepted) {
  for (const std::string delimiter : {"", ",", ";", "|", "\t", " ", ":", "#"}) {
    const absl::Status status = ValidateJobSpec(ClickSpec([&](v1::JobSpec* s) {
      CsvData(delimiter, v1::CsvSpec::CATEGORICAL, s);
      s->mutable_data()->mutable_csv()->add_columns(v1::CsvSpec::CATEGORICAL);  // DeepFM pairs two fields
    }));
    EXPECT_TRUE(status.ok()) << Quote(delimiter) << ": " << status;
  }
}

// libffm lines (data.libsvm.fields) give LIBSVM data that many fields, so
// the models that pair fields take it.
TEST(ClickSpecTest, LibffmDataHasTheFieldsItsSpecNames) {
  for (const v1::ModelSpec::Kind kind : {v1::ModelSpec::FM, v1::ModelSpec::DEEPFM, v1::ModelSpec::DLRM}) {
    const v1::JobSpec spec = ClickSpec([kind](v1::JobSpec* s) {
      s->mutable_model()->set_kind(kind);
      if (kind == v1::ModelSpec::FM) {
        s->mutable_model()->clear_hidden_sizes();
        s->mutable_model()->clear_activation();
      }
      LibsvmData(39, s);
    });
    const absl::Status status = ValidateJobSpec(spec);
    EXPECT_TRUE(status.ok()) << v1::ModelSpec::Kind_Name(kind) << ": " << status;
    EXPECT_EQ(ClickFields(spec.data()), 39);
  }
}

class ClickSpecRejectTest : public testing::TestWithParam<ClickReject> {};

TEST_P(ClickSpecRejectTest, IsInvalidArgumentNamingTheField) {
  const absl::Status status = ValidateJobSpec(ClickSpec(GetParam().mutate));
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  for (const std::string& part : GetParam().parts) EXPECT_TRUE(Contains(status.message(), part)) << status;
}

std::vector<ClickReject> ClickRejects() {
  using S = v1::JobSpec;
  auto table = [](S* s, const std::string& name) {
    v1::TableSpec* t = s->mutable_model()->add_tables();
    t->set_name(name);
    return t;
  };
  // CSV data of a label and a dense column, split by `delimiter`.
  auto csv_delimited = [](const std::string& delimiter) {
    return [delimiter](S* s) { CsvData(delimiter, v1::CsvSpec::DENSE, s); };
  };
  return {
      {"NoEmbeddingDim", [](S* s) { s->mutable_model()->clear_embedding_dim(); }, {"model.embeddingDim"}},
      {"EmbeddingDimTooLarge",
       [](S* s) { s->mutable_model()->set_embedding_dim(1025); },
       {"model.embeddingDim"}},
      {"EmbeddingDimOnLogisticRegression",
       [](S* s) {
         s->mutable_model()->set_kind(v1::ModelSpec::LOGISTIC_REGRESSION);
         s->mutable_model()->clear_hidden_sizes();
       },
       {"model.embeddingDim", "FM"}},
      {"DeepFmWithoutHiddenSizes",
       [](S* s) { s->mutable_model()->clear_hidden_sizes(); },
       {"model.hiddenSizes"}},
      {"FmWithHiddenSizes",
       [](S* s) { s->mutable_model()->set_kind(v1::ModelSpec::FM); },
       {"model.hiddenSizes"}},
      {"ClickModelOnImages",
       [](S* s) {
         s->mutable_data()->set_dataset(v1::DataSpec::FASHION_MNIST);
         s->mutable_data()->clear_synthetic_ctr();
       },
       {"data.dataset", "SYNTHETIC_CTR"}},
      {"NoExamples",
       [](S* s) { s->mutable_data()->mutable_synthetic_ctr()->set_examples(0); },
       {"data.syntheticCtr.examples"}},
      {"TooManyFields",
       [](S* s) { s->mutable_data()->mutable_synthetic_ctr()->set_fields(257); },
       {"data.syntheticCtr.fields"}},
      {"NegativeZipf",
       [](S* s) { s->mutable_data()->mutable_synthetic_ctr()->set_zipf_exponent(-1); },
       {"data.syntheticCtr.zipfExponent"}},
      {"NanBias",
       [](S* s) { s->mutable_data()->mutable_synthetic_ctr()->set_bias(std::nanf("")); },
       {"data.syntheticCtr.bias"}},
      {"UnknownTable",
       [table](S* s) { table(s, "user_embedding"); },
       {"model.tables[0].name", "linear, embedding"}},
      {"TableTwice",
       [table](S* s) {
         table(s, "linear");
         table(s, "linear");
       },
       {"model.tables[1].name", "twice"}},
      {"NegativeTableLr",
       [table](S* s) { table(s, "linear")->mutable_optimizer()->set_lr(-1); },
       {"model.tables[0].optimizer.lr"}},
      {"ZeroEpsilonOnAdam",
       [table](S* s) {
         v1::TableSpec* t = table(s, "embedding");
         t->mutable_optimizer()->set_kind(v1::SparseOptimizerSpec::ADAM);
         t->mutable_optimizer()->set_epsilon(0);
       },
       {"model.tables[0].optimizer.epsilon", "> 0", "0 by 0"}},
      {"ZeroEpsilonOnAdagradWithoutAnAccumulator",
       [table](S* s) { table(s, "embedding")->mutable_optimizer()->set_epsilon(0); },
       {"model.tables[0].optimizer.epsilon", "initialAccumulator > 0"}},
      {"BetaOnAdagrad",
       [table](S* s) { table(s, "embedding")->mutable_optimizer()->set_beta1(0.5f); },
       {"model.tables[0].optimizer.beta1", "ADAM"}},
      {"L1OnAdam",
       [table](S* s) {
         v1::TableSpec* t = table(s, "embedding");
         t->mutable_optimizer()->set_kind(v1::SparseOptimizerSpec::ADAM);
         t->mutable_optimizer()->set_l1(1);
       },
       {"model.tables[0].optimizer.l1", "FTRL"}},
      {"FtrlWithRandomStart",
       [table](S* s) {
         v1::TableSpec* t = table(s, "embedding");
         t->mutable_optimizer()->set_kind(v1::SparseOptimizerSpec::FTRL);
         t->set_init_scale(0.1f);
       },
       {"model.tables[0].initScale", "FTRL"}},
      {"FtrlOnATableThatStartsRandomByDefault",
       [table](S* s) { table(s, "embedding")->mutable_optimizer()->set_kind(v1::SparseOptimizerSpec::FTRL); },
       {"model.tables[0].initScale", "FTRL", "set initScale: 0", "unset: table embedding starts uniform"}},
      {"NegativeAdmitAfter",
       [table](S* s) { table(s, "linear")->set_admit_after(-1); },
       {"model.tables[0].admitAfter"}},
      {"TooManyBuckets",
       [table](S* s) { table(s, "linear")->set_buckets(4097); },
       {"model.tables[0].buckets"}},
      {"SyncTableInAsp",
       [table](S* s) { table(s, "linear")->set_consistency(v1::TableSpec::SYNC); },
       {"model.tables[0].consistency", "BSP jobs only", "SYNC in an ASP job"}},
      {"SyncTableInSsp",
       [table](S* s) {
         s->set_mode(v1::SSP);
         s->set_staleness(2);
         table(s, "embedding")->set_consistency(v1::TableSpec::SYNC);
       },
       {"model.tables[0].consistency", "BSP jobs only"}},
      {"BottomSizesOnFm",
       [](S* s) { s->mutable_model()->add_bottom_sizes(4); },
       {"model.bottomSizes", "applies to DLRM only"}},
      {"DlrmBottomSizeZero",
       [](S* s) {
         s->mutable_model()->set_kind(v1::ModelSpec::DLRM);
         s->mutable_model()->add_bottom_sizes(0);
       },
       {"model.bottomSizes[0]"}},
      {"DlrmWithoutHiddenSizes",
       [](S* s) {
         s->mutable_model()->set_kind(v1::ModelSpec::DLRM);
         s->mutable_model()->clear_hidden_sizes();
       },
       {"model.hiddenSizes", "DLRM"}},
      {"DlrmLinearTable",
       [table](S* s) {
         s->mutable_model()->set_kind(v1::ModelSpec::DLRM);
         table(s, "linear");
       },
       {"model.tables[0].name", "embedding"}},
      {"UnknownConsistency",
       [table](S* s) { table(s, "linear")->set_consistency(static_cast<v1::TableSpec::Consistency>(9)); },
       {"model.tables[0].consistency", "is not a known value", "9"}},
      {"Bf16Compute", [](S* s) { s->set_precision(v1::BF16); }, {"precision"}},
      {"Compressed",
       [](S* s) { s->mutable_compression()->set_kind(v1::CompressionSpec::INT8); },
       {"wireFormat"}},
      {"DeepFmOverLibsvm",
       [](S* s) { LibsvmData(0, s); },
       {"model.kind", "DEEPFM over 1 field", "LIBSVM data is one field", "data.libsvm.fields", "CSV"}},
      {"LibffmFieldsOutOfRange", [](S* s) { LibsvmData(4097, s); }, {"data.libsvm.fields", "4097"}},
      {"NegativeLibffmFields", [](S* s) { LibsvmData(-1, s); }, {"data.libsvm.fields", "-1"}},
      {"LibsvmSpecOnCsvData",
       [](S* s) {
         CsvData(",", v1::CsvSpec::CATEGORICAL, s);
         s->mutable_data()->mutable_csv()->add_columns(v1::CsvSpec::CATEGORICAL);
         s->mutable_data()->mutable_libsvm()->set_fields(2);
       },
       {"data.libsvm", "LIBSVM data only", "CSV"}},
      {"LibsvmSpecOnSyntheticData",
       [](S* s) { s->mutable_data()->mutable_libsvm(); },
       {"data.libsvm", "applies to LIBSVM data only", "SYNTHETIC_CTR"}},
      {"DlrmOverTooManyLibffmFields",
       [](S* s) {
         s->mutable_model()->set_kind(v1::ModelSpec::DLRM);
         LibsvmData(1450, s);
       },
       {"model.kind", "1450 vectors", "1050525 pairs, more than 1048576", "(1448 vectors at most)", "DEEPFM",
        "DLRM over 1450 fields"}},
      {"AnEvaluationBatchTooLarge",
       [](S* s) {  // a million pairs an example, at a step batch of 1
         s->mutable_model()->set_kind(v1::ModelSpec::DLRM);
         LibsvmData(1448, s);
         s->mutable_data()->set_batch_size(1);
       },
       {"model", "for a batch of 1000 (an evaluation's", "fewer fields"}},
      {"AWeightBeyondAGraphsBound",
       [](S* s) {  // deep1's weight: 4097 x 65536 floats, past 2^28 (its graph's shapes stopped there)
         s->mutable_model()->set_kind(v1::ModelSpec::WIDE_AND_DEEP);
         s->mutable_model()->set_embedding_dim(1);
         s->mutable_model()->clear_hidden_sizes();
         s->mutable_model()->add_hidden_sizes(4097);
         s->mutable_model()->add_hidden_sizes(65536);
         s->mutable_data()->mutable_synthetic_ctr()->set_fields(1);
         s->mutable_data()->mutable_synthetic_ctr()->set_dense(0);
         s->mutable_data()->set_batch_size(1000);
       },
       {"model (WIDE_AND_DEEP) as its layer graph", "4097 x 65536", "model.hiddenSizes"}},
      {"FmOverOneCsvColumn",
       [](S* s) {
         s->mutable_model()->set_kind(v1::ModelSpec::FM);
         s->mutable_model()->clear_hidden_sizes();
         s->mutable_model()->clear_activation();
         CsvData(",", v1::CsvSpec::CATEGORICAL, s);
       },
       {"model.kind", "FM over 1 field"}},
      {"DlrmOverLibsvm",
       [](S* s) {
         s->mutable_model()->set_kind(v1::ModelSpec::DLRM);
         LibsvmData(0, s);
       },
       {"model.kind", "DLRM over 1 field and no dense features"}},
      {"LibsvmWithoutPath",
       [](S* s) {
         s->mutable_data()->set_dataset(v1::DataSpec::LIBSVM);
         s->mutable_data()->clear_synthetic_ctr();
       },
       {"data.path", "absolute"}},
      {"LibsvmWithSyntheticCtr",
       [](S* s) {
         s->mutable_data()->set_dataset(v1::DataSpec::LIBSVM);
         s->mutable_data()->set_path("/data/x.libsvm");
       },
       {"data.syntheticCtr", "SYNTHETIC_CTR"}},
      {"EarlyStoppingWithoutATestSet",
       [](S* s) {
         LibsvmData(4, s);
         s->mutable_early_stopping()->set_metric(v1::EarlyStoppingSpec::TEST_AUC);
         s->mutable_early_stopping()->set_patience(2);
       },
       {"earlyStopping", "needs a test set to watch: set data.testPath", "LIBSVM", "patience 2"}},
      {"RelativeTestPath",
       [](S* s) {
         LibsvmData(0, s);
         s->mutable_data()->set_test_path("y.libsvm");
       },
       {"data.testPath", "absolute"}},
      {"CsvWithoutLabel",
       [](S* s) {
         s->mutable_data()->set_dataset(v1::DataSpec::CSV);
         s->mutable_data()->clear_synthetic_ctr();
         s->mutable_data()->set_path("/data/x.csv");
         s->mutable_data()->mutable_csv()->add_columns(v1::CsvSpec::DENSE);
       },
       {"data.csv.columns", "LABEL"}},
      {"CsvWithTwoCharacterDelimiter", csv_delimited("::"), {"data.csv.delimiter"}},
      {"CsvWithADigitDelimiter",
       csv_delimited("1"),
       {"data.csv.delimiter", "printable character other than"}},
      {"CsvWithANulDelimiter",
       csv_delimited(std::string(1, '\0')),
       {"data.csv.delimiter", "printable character other than"}},
      {"CsvWithAMinusDelimiter",
       csv_delimited("-"),
       {"data.csv.delimiter", "printable character other than"}},
      {"OnBadRecordOnSyntheticData",
       [](S* s) { s->mutable_data()->set_on_bad_record(v1::DataSpec::FAIL); },
       {"onBadRecord"}},
      {"TablesOnAnMlp",
       [table](S* s) {
         s->mutable_model()->set_kind(v1::ModelSpec::MLP);
         s->mutable_model()->clear_embedding_dim();
         table(s, "linear");
       },
       {"model.tables", "click models"}},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, ClickSpecRejectTest, testing::ValuesIn(ClickRejects()),
                         [](const testing::TestParamInfo<ClickReject>& info) { return info.param.name; });

TEST(ClickSpecTest, AGraphsMistakesAreInvalidArgumentNamingTheLayerOrField) {
  using S = v1::JobSpec;
  const std::vector<ClickReject> rejects = {
      {"LayersOnAPresetKind", [](S* s) {
         s->mutable_model()->set_kind(v1::ModelSpec::FM);
         s->mutable_model()->set_embedding_dim(4);
       },
       {"model.layers", "GRAPH only"}},
      {"PresetSettingOnAGraph", [](S* s) { s->mutable_model()->set_embedding_dim(8); }, {"model.embeddingDim", "GRAPH"}},
      {"HiddenSizesOnAGraph", [](S* s) { s->mutable_model()->add_hidden_sizes(8); }, {"model.hiddenSizes", "LINEAR"}},
      {"NoLayers", [](S* s) { s->mutable_model()->clear_layers(); }, {"model.layers", "1 to 256"}},
      {"UnknownLayerType", [](S* s) { s->mutable_model()->mutable_layers(2)->set_type(static_cast<v1::LayerSpec::Type>(42)); },
       {"model.layers[2].type", "is not a known value", "42"}},
      {"UnknownLoss", [](S* s) { s->mutable_model()->mutable_layers(4)->set_loss(static_cast<v1::LayerSpec::Loss>(7)); },
       {"model.layers[4].loss", "is not a known value"}},
      {"DotOfDifferentDims", [](S* s) { s->mutable_model()->mutable_layers(1)->set_dim(5); },
       {"model.layers: layer 2 (\"dot\", DOT)", "DOT pairs vectors of one dim"}},
      {"FieldTheDataHasNot", [](S* s) { s->mutable_model()->mutable_layers(1)->set_fields(0, 2); },
       {"layer 1 (\"items\", EMBEDDING)", "field 2 is outside the data's fields [0, 2)"}},
      {"TableSpecOfNoLayer", [](S* s) { s->mutable_model()->add_tables()->set_name("embedding"); },
       {"model.tables[0].name", "users, items"}},
      {"AucOfASquaredError",
       [](S* s) {
         s->mutable_model()->mutable_layers(4)->set_loss(v1::LayerSpec::MEAN_SQUARED_ERROR);
         s->mutable_early_stopping()->set_metric(v1::EarlyStoppingSpec::TEST_AUC);
         s->mutable_early_stopping()->set_patience(2);
       },
       {"earlyStopping.metric", "SIGMOID_CROSS_ENTROPY"}},
      {"NoDenseTensor", [](S* s) { s->mutable_model()->mutable_layers(3)->set_bias(false); },
       {"model.layers", "need a dense tensor"}},
      {"ScratchBeyondBounds",
       [](S* s) {
         // 65536 examples of 1024 + 1024 + 2048 + 3 values: more than 2^28.
         s->mutable_data()->set_batch_size(65536);
         v1::ModelSpec* model = s->mutable_model();
         model->mutable_layers(0)->set_dim(1024);
         model->mutable_layers(1)->set_dim(1024);
         AddLayer(model, "both", v1::LayerSpec::CONCAT, {"users", "items"});
         model->mutable_layers()->SwapElements(2, 5);  // before "dot"
         for (int i = 5; i > 3; --i) model->mutable_layers()->SwapElements(i, i - 1);
         model->mutable_layers(3)->clear_inputs();
         model->mutable_layers(3)->add_inputs("both");
       },
       {"model.layers", "more than 2^28"}},
      {"CombinerOnADot", [](S* s) { s->mutable_model()->mutable_layers(2)->set_combiner(v1::ModelSpec::SUM); },
       {"model.layers[2].combiner", "EMBEDDING layers only"}},
      {"LossOnAnAdd",
       [](S* s) { s->mutable_model()->mutable_layers(3)->set_loss(v1::LayerSpec::SIGMOID_CROSS_ENTROPY); },
       {"model.layers[3].loss", "LOSS layer only"}},
      {"LayersOnAnMlp",
       [](S* s) {
         s->mutable_model()->set_kind(v1::ModelSpec::MLP);
         s->mutable_model()->add_hidden_sizes(4);
         s->mutable_data()->Clear();
         s->mutable_data()->set_dataset(v1::DataSpec::SYNTHETIC);
       },
       {"model.layers", "GRAPH only"}},
  };
  for (const ClickReject& reject : rejects) {
    const absl::Status status = ValidateJobSpec(GraphSpec(reject.mutate));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << reject.name << ": " << status;
    for (const std::string& part : reject.parts) EXPECT_TRUE(Contains(status.message(), part)) << reject.name << ": " << status;
  }
}

}  // namespace
}  // namespace fulcrum
