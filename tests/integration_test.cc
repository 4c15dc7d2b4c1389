// Multi-process integration tests: a real scheduler, servers and workers on
// loopback (started through LocalCluster, the code behind `fulcrum local up`),
// driven through the public gRPC API and the `fulcrum` CLI. Every process is
// killed by pid in teardown, also when a test fails.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/local_cluster.h"
#include "common/rpc.h"
#include "common/sync.h"
#include "common/tensor_codec.h"
#include "common/test_util.h"
#include "fulcrum/v1/cluster.grpc.pb.h"
#include "fulcrum/v1/job.grpc.pb.h"
#include "fulcrum/v1/parameter.grpc.pb.h"
#include "tests/click_job.h"
#include "tests/cluster_fixture.h"
#include "tests/live_export.h"
#include "worker/ctr_data.h"
#include "worker/parameter_client.h"

namespace fulcrum {
namespace {

// Payload bytes the servers took in pushes and sent in pulls.
const char kPushedBytes[] = "fulcrum_rpc_received_bytes_total{method=\"Push\"}";
const char kPulledBytes[] = "fulcrum_rpc_sent_bytes_total{method=\"Pull\"}";

TEST_F(ClusterTest, BspTwoWorkersMatchOneWorkerWithDoubleBatch) {
  constexpr int64_t kSteps = 25;
  auto two = Submit(SyntheticSpec(v1::BSP, 2, 16, kSteps));
  ASSERT_TRUE(two.ok()) << two.status();
  v1::JobStatus two_done = WaitForEnd(*two);
  ASSERT_EQ(two_done.state(), v1::SUCCEEDED) << two_done.reason();
  auto one = Submit(SyntheticSpec(v1::BSP, 1, 32, kSteps));
  ASSERT_TRUE(one.ok()) << one.status();
  v1::JobStatus one_done = WaitForEnd(*one);
  ASSERT_EQ(one_done.state(), v1::SUCCEEDED) << one_done.reason();
  EXPECT_EQ(two_done.progress().step(), kSteps);

  std::vector<float> a = FinalParameters(two_done);
  std::vector<float> b = FinalParameters(one_done);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 0u);
  double max_scale = 0, max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_scale = std::max(max_scale, std::fabs(double{b[i]}));
    max_diff = std::max(max_diff, std::fabs(double{a[i]} - b[i]));
  }
  EXPECT_LE(max_diff, 1e-5 * std::max(1.0, max_scale)) << "max |diff| " << max_diff;
}

TEST_F(ClusterTest, SeededBspJobIsBitForBitReproducible) {
  std::vector<std::vector<float>> results;
  for (int run = 0; run < 2; ++run) {
    auto id = Submit(SyntheticSpec(v1::BSP, 2, 16, 30));
    ASSERT_TRUE(id.ok()) << id.status();
    v1::JobStatus done = WaitForEnd(*id);
    ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
    results.push_back(FinalParameters(done));
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)));
}

// A GRAPH over dense data is an MLP: written as layers (DENSE_INPUT,
// LINEAR + ACTIVATION, LINEAR, softmax LOSS), the synthetic job runs on the
// workers' backend exactly as the kind MLP does, bit for bit, its tensors
// named after its LINEAR layers.
TEST_F(ClusterTest, AnMlpWrittenAsAGraphTrainsBitForBitAsTheKindMlp) {
  const v1::JobSpec mlp = SyntheticSpec(v1::BSP, 2, 16, 30);
  v1::JobSpec graph = mlp;
  v1::ModelSpec* model = graph.mutable_model();
  model->Clear();
  model->set_kind(v1::ModelSpec::GRAPH);
  AddLayer(model, "pixels", v1::LayerSpec::DENSE_INPUT);
  AddLayer(model, "hidden", v1::LayerSpec::LINEAR, {"pixels"})->set_units(16);
  AddLayer(model, "squash", v1::LayerSpec::ACTIVATION, {"hidden"})->set_activation(v1::TANH);
  AddLayer(model, "scores", v1::LayerSpec::LINEAR, {"squash"})->set_units(4);
  AddLayer(model, "loss", v1::LayerSpec::LOSS, {"scores"})->set_loss(v1::LayerSpec::SOFTMAX_CROSS_ENTROPY);
  std::vector<std::vector<float>> results;
  for (const v1::JobSpec& spec : {mlp, graph}) {
    auto id = Submit(spec);
    ASSERT_TRUE(id.ok()) << id.status();
    v1::JobStatus done = WaitForEnd(*id);
    ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
    results.push_back(FinalParameters(done));
    if (&spec == &graph) {
      std::set<std::string> names;
      for (const auto& [name, tensor] : LiveExport(done.job_id(), cluster_->scheduler_address())) names.insert(name);
      EXPECT_EQ(names, (std::set<std::string>{"hidden.weight", "hidden.bias", "scores.weight", "scores.bias"}));
    }
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  ASSERT_GT(results[0].size(), 0u);
  EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)))
      << DescribeDifference(results[0], results[1]);
}

TEST_F(ClusterTest, AspJobLearns) {
  auto id = Submit(SyntheticSpec(v1::ASP, 2, 32, 0));
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  ASSERT_GT(done.history_size(), 0);
  EXPECT_LT(done.progress().train_loss(), 0.3);
  EXPECT_GT(done.progress().test_accuracy(), 0.9);
}

// Each click model trains over sparse tables spread on both servers, to
// within a margin of the best AUC its data allows (the true probabilities'):
// logistic regression on data from a logistic model within 0.01; FM, whose
// form the data's interactions have, within 0.045 (in two epochs, PyTorch
// comes to 0.024 from it on the same data, bench/torch_ctr_reference.py;
// asynchronous runs here came to 0.019 to 0.030); the MLP models within
// 0.06 (runs here: 0.03 to 0.045); DLRM, which has no first-order terms
// while the data's model does, within 0.08 (PyTorch: 0.068 from it; runs
// here: 0.064).
TEST_F(ClusterTest, ClickModelsApproachTheGroundTruthAucOverTablesOnEveryServer) {
  const std::vector<std::tuple<v1::ModelSpec::Kind, int32_t, double>> cases = {
      {v1::ModelSpec::LOGISTIC_REGRESSION, 0, 0.01},
      {v1::ModelSpec::FM, 2, 0.045},
      {v1::ModelSpec::WIDE_AND_DEEP, 2, 0.06},
      {v1::ModelSpec::DEEPFM, 2, 0.06},
      {v1::ModelSpec::DLRM, 2, 0.08},
  };
  for (const auto& [kind, fm_dim, margin] : cases) {
    SCOPED_TRACE(v1::ModelSpec::Kind_Name(kind));
    const v1::JobSpec spec = ClickSpec(kind, fm_dim);
    v1::JobStatus done;
    ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &done));
    ASSERT_TRUE(done.progress().has_test_auc());
    const double best = BestAuc(spec);
    EXPECT_GT(best, 0.7) << "the data has signal to learn";
    EXPECT_GE(done.progress().test_auc(), best - margin) << "best reachable " << best;
    EXPECT_LE(done.progress().test_auc(), best + 0.005);
    EXPECT_LT(done.progress().train_loss(), 0.6);
    const bool one_table = kind == v1::ModelSpec::LOGISTIC_REGRESSION || kind == v1::ModelSpec::DLRM;
    ASSERT_EQ(done.shard_map().tables_size(), one_table ? 1 : 2);
    std::set<int32_t> shards(done.shard_map().tables(0).bucket_shards().begin(),
                             done.shard_map().tables(0).bucket_shards().end());
    EXPECT_EQ(shards.size(), 2u) << "the table's buckets are spread over both servers";
    // The servers' gauges count the table's rows: every id of the data at
    // most, and the training set's first epoch touches most of them.
    const double rows =
        ServersTableTotal(cluster_->file(), "rows", done.job_id(), done.shard_map().tables(0).name());
    EXPECT_GT(rows, 0.9 * 4 * 100);
    EXPECT_LE(rows, 4 * 100);
  }
  // FTRL-proximal on the table, behind a frequency filter (a key gets a row
  // at its second push), on data from a logistic model: within 0.025 (runs
  // here: 0.010 to 0.013). The rows the servers hold are those admitted
  // (here every id passes the filter; SparseTableTest counts it exactly).
  v1::JobSpec ftrl = ClickSpec(v1::ModelSpec::LOGISTIC_REGRESSION, 0);
  v1::TableSpec* linear = ftrl.mutable_model()->mutable_tables(0);
  linear->mutable_optimizer()->set_kind(v1::SparseOptimizerSpec::FTRL);
  linear->mutable_optimizer()->set_lr(2.0f);
  linear->mutable_optimizer()->set_l1(0.001f);
  linear->mutable_optimizer()->set_l2(0.001f);
  linear->set_admit_after(2);
  v1::JobStatus done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(ftrl, &done));
  const double best = BestAuc(ftrl);
  EXPECT_GE(done.progress().test_auc(), best - 0.025) << "best reachable " << best;
  const double rows = ServersTableTotal(cluster_->file(), "rows", done.job_id(), "linear");
  EXPECT_GT(rows, 0.9 * 4 * 100);
  EXPECT_EQ(ServersTableTotal(cluster_->file(), "admitted_rows", done.job_id(), "linear"), rows);
  // `fulcrum get` shows a binary task's test log-loss beside its AUC.
  auto [get_rc, get_out] =
      RunCli(absl::StrCat("get ", done.job_id(), " --scheduler ", cluster_->scheduler_address()));
  EXPECT_EQ(get_rc, 0) << get_out;
  EXPECT_NE(get_out.find(absl::StrFormat("test log-loss %.4f  test AUC %.4f", done.progress().test_loss(),
                                         done.progress().test_auc())),
            std::string::npos)
      << get_out;

  // PERSIA's hybrid: an FM in BSP whose `embedding` table is ASYNC (its
  // pushes applied as they come, not summed per step) approaches the ground
  // truth as the FM does.
  v1::JobSpec hybrid = ClickSpec(v1::ModelSpec::FM, 2);
  hybrid.set_mode(v1::BSP);
  hybrid.mutable_model()->mutable_tables(1)->set_consistency(v1::TableSpec::ASYNC);
  ASSERT_EQ(hybrid.model().tables(1).name(), "embedding");
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(hybrid, &done));
  EXPECT_GE(done.progress().test_auc(), BestAuc(hybrid) - 0.045) << "best reachable " << BestAuc(hybrid);
}

// A GRAPH over dense data that is not an MLP (a residual connection, two
// activation kinds, the input also fed past the hidden layers) trains on
// the click path: it learns the synthetic blobs, reports a test accuracy
// and keeps its tensors under its layers' names. An MLP-shaped graph still
// trains as kind MLP does (AnMlpWrittenAsAGraphTrainsBitForBitAsTheKindMlp).
TEST_F(ClusterTest, AGraphOverDenseDataThatIsNotAnMlpTrains) {
  v1::JobSpec spec = SyntheticSpec(v1::BSP, 2, 32, 0);
  v1::ModelSpec* model = spec.mutable_model();
  model->Clear();
  model->set_kind(v1::ModelSpec::GRAPH);
  AddLayer(model, "x", v1::LayerSpec::DENSE_INPUT);
  AddLayer(model, "h1", v1::LayerSpec::LINEAR, {"x"})->set_units(16);
  AddLayer(model, "a1", v1::LayerSpec::ACTIVATION, {"h1"})->set_activation(v1::RELU);
  AddLayer(model, "h2", v1::LayerSpec::LINEAR, {"a1"})->set_units(16);
  AddLayer(model, "a2", v1::LayerSpec::ACTIVATION, {"h2"})->set_activation(v1::TANH);
  AddLayer(model, "res", v1::LayerSpec::ADD, {"a1", "a2"});
  AddLayer(model, "both", v1::LayerSpec::CONCAT, {"res", "x"});
  AddLayer(model, "scores", v1::LayerSpec::LINEAR, {"both"})->set_units(4);
  AddLayer(model, "loss", v1::LayerSpec::LOSS, {"scores"})->set_loss(v1::LayerSpec::SOFTMAX_CROSS_ENTROPY);
  v1::JobStatus done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &done));
  EXPECT_GT(done.progress().test_accuracy(), 0.9) << "the blobs are well apart";
  EXPECT_LT(done.progress().train_loss(), 0.5);
  std::set<std::string> names;
  for (const auto& [name, tensor] : LiveExport(done.job_id(), cluster_->scheduler_address())) names.insert(name);
  EXPECT_EQ(names, (std::set<std::string>{"h1.weight", "h1.bias", "h2.weight", "h2.bias", "scores.weight",
                                          "scores.bias"}));

  // Its loss must score the data's classes; EMBEDDING layers need click data.
  v1::JobSpec narrow = spec;
  narrow.mutable_model()->mutable_layers(7)->set_units(3);
  absl::StatusOr<std::string> refused = Submit(narrow);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("SOFTMAX_CROSS_ENTROPY loss over the data's 4 classes"), std::string::npos)
      << refused.status();
  v1::JobSpec embedded = spec;
  v1::LayerSpec* ids = embedded.mutable_model()->add_layers();
  *ids = embedded.model().layers(0);
  ids->set_name("ids");
  ids->set_type(v1::LayerSpec::EMBEDDING);
  refused = Submit(embedded);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("EMBEDDING reads categorical fields, which SYNTHETIC has none of"),
            std::string::npos)
      << refused.status();
}

// A layer graph of the user's own: a weight per id over every field (table
// "linear"), fields 0-1 in table "users" and 2-3 in table "items" (each
// table holds only its own fields' ids), their FM and the dot products of
// the user and item vectors. Trained in BSP with gradient accumulation, it
// approaches the ground truth as the FM kind does, and the servers' gauges
// show each table holding its own fields' ids.
TEST_F(ClusterTest, AGraphModelWithPerFieldTablesApproachesTheGroundTruthAuc) {
  v1::JobSpec spec = ClickSpec(v1::ModelSpec::FM, 2);
  v1::ModelSpec* model = spec.mutable_model();
  model->Clear();
  model->set_kind(v1::ModelSpec::GRAPH);
  auto embedding = [model](const std::string& name, const std::string& table, int dim, std::vector<int> fields) {
    v1::LayerSpec* l = AddLayer(model, name, v1::LayerSpec::EMBEDDING);
    l->set_table(table);
    l->set_dim(dim);
    for (int f : fields) l->add_fields(f);
  };
  embedding("ids", "linear", 1, {});
  embedding("user", "users", 4, {0, 1});
  embedding("item", "items", 4, {2, 3});
  AddLayer(model, "wide", v1::LayerSpec::REDUCE_SUM, {"ids"});
  AddLayer(model, "fields", v1::LayerSpec::CONCAT, {"user", "item"});
  AddLayer(model, "fm", v1::LayerSpec::FM, {"fields"});
  AddLayer(model, "logit", v1::LayerSpec::ADD, {"wide", "fm"})->set_bias(true);
  AddLayer(model, "loss", v1::LayerSpec::LOSS, {"logit"})->set_loss(v1::LayerSpec::SIGMOID_CROSS_ENTROPY);
  for (const char* name : {"linear", "users", "items"}) {
    v1::TableSpec* table = model->add_tables();
    table->set_name(name);
    table->mutable_optimizer()->set_kind(v1::SparseOptimizerSpec::ADAGRAD);
    table->mutable_optimizer()->set_lr(0.1f);
  }
  spec.set_mode(v1::BSP);
  spec.mutable_data()->set_batch_size(32);
  spec.mutable_data()->set_gradient_accumulation(2);
  v1::JobStatus done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &done));
  ASSERT_TRUE(done.progress().has_test_auc());
  const double best = BestAuc(spec);
  EXPECT_GE(done.progress().test_auc(), best - 0.045) << "best reachable " << best;
  EXPECT_LE(done.progress().test_auc(), best + 0.005);
  ASSERT_EQ(done.shard_map().tables_size(), 3);
  auto rows = [&](const std::string& table) {
    return ServersTableTotal(cluster_->file(), "rows", done.job_id(), table);
  };
  // 100 ids a field: "linear" holds the 4 fields' ids, the others 2 fields' each.
  EXPECT_GT(rows("linear"), 0.9 * 4 * 100);
  EXPECT_LE(rows("linear"), 4 * 100);
  for (const char* table : {"users", "items"}) {
    EXPECT_GT(rows(table), 0.9 * 2 * 100) << table;
    EXPECT_LE(rows(table), 2 * 100) << table << " holds only its own fields' ids";
  }
}

// Click jobs on users' files (LIBSVM, CSV) the workers may read: written
// here from synthetic click data of a known logistic model, with a few bad
// lines among them. The workers' memory budget is smaller than the training
// files would take held whole: they index them and read records as steps
// need them.
class ClickFileTest : public ClusterTest {
 protected:
  static constexpr int64_t kWorkerBudget = int64_t{1} << 20;
  static void SetUpTestSuite() {
    data_dir_ = new std::string(MakeTempDir());
    StartCluster(2, 2, 1, {}, {"--data-root=" + *data_dir_, "--memory-budget=1MiB"});
  }
  static void TearDownTestSuite() {
    ClusterTest::TearDownTestSuite();
    std::filesystem::remove_all(*data_dir_);
  }

  // The data of a format: with 2 dense features for CSV (libsvm has none).
  static SyntheticCtrSpec Data(const std::string& format) {
    SyntheticCtrSpec data;
    data.seed = 11;
    data.examples = 30000;
    data.fields = 4;
    data.vocabulary = 100;
    data.dense = format == "csv" ? 2 : 0;
    return data;
  }
  static ClickTextFormat TextFormat(const std::string& format) {
    return format == "csv"      ? ClickTextFormat::kCsv
           : format == "libffm" ? ClickTextFormat::kLibffm
                                : ClickTextFormat::kLibsvm;
  }
  // Writes split `split` of Data() as `name` in `format` ("libsvm", "libffm", "csv"),
  // in `parts` files (name.0, name.1, ...), a bad line in the first.
  static void Write(const std::string& name, int split, const std::string& format, int parts) {
    const SyntheticCtrSpec spec = Data(format);
    const int64_t examples = split == 0 ? spec.examples : spec.examples / 5;
    const SparseDataset data = MakeSyntheticCtr(spec, split, 0, examples);
    for (int part = 0; part < parts; ++part) {
      std::ofstream out(absl::StrCat(*data_dir_, "/", name, ".", part));
      if (part == 0) out << (format == "csv" ? "1,x,2,a,b,c,d,e\n" : "1 notanid:1\n");
      for (int64_t e = part; e < examples; e += parts)
        out << ClickRecordText(data, e, TextFormat(format)).value();
    }
  }
  // An FM (embeddings of 4) over libffm files `name`-train.* of two fields.
  static v1::JobSpec FmFileSpec(const std::string& name) {
    v1::JobSpec spec = FileSpec(v1::DataSpec::LIBSVM, name);
    spec.mutable_data()->mutable_libsvm()->set_fields(2);
    spec.mutable_model()->set_kind(v1::ModelSpec::FM);
    spec.mutable_model()->set_embedding_dim(4);
    spec.mutable_model()->add_tables()->set_name("embedding");
    return spec;
  }
  static double BestAuc(const std::string& format) {
    std::vector<float> truth;
    const SparseDataset test = MakeSyntheticCtr(Data(format), 1, 0, Data(format).examples / 5, &truth);
    return Auc(truth, test.labels);
  }
  static v1::JobSpec FileSpec(v1::DataSpec::Dataset dataset, const std::string& name) {
    v1::JobSpec spec;
    spec.mutable_model()->set_kind(v1::ModelSpec::LOGISTIC_REGRESSION);
    v1::TableSpec* table = spec.mutable_model()->add_tables();
    table->set_name("linear");
    table->mutable_optimizer()->set_lr(0.1f);
    v1::DataSpec* data = spec.mutable_data();
    data->set_dataset(dataset);
    data->set_path(absl::StrCat(*data_dir_, "/", name, "-train.*"));
    data->set_test_path(absl::StrCat(*data_dir_, "/", name, "-test.0"));
    if (dataset == v1::DataSpec::CSV) {
      v1::CsvSpec* csv = data->mutable_csv();
      csv->add_columns(v1::CsvSpec::LABEL);
      for (int i = 0; i < 2; ++i) csv->add_columns(v1::CsvSpec::DENSE);
      for (int i = 0; i < 4; ++i) csv->add_columns(v1::CsvSpec::CATEGORICAL);
    }
    data->set_batch_size(64);
    data->set_epochs(2);
    spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
    spec.mutable_optimizer()->set_lr(0.01f);
    spec.set_num_workers(2);
    spec.set_replicas(1);
    return spec;
  }
  static std::string* data_dir_;
};
std::string* ClickFileTest::data_dir_ = nullptr;

// Logistic regression on libsvm files (a glob of two) and on CSV with dense
// and categorical columns reaches the data's ground-truth AUC; the bad lines
// are skipped. The training records, held whole, would take more than the
// workers' memory budget.
TEST_F(ClickFileTest, LibsvmAndCsvFilesBiggerThanTheWorkersBudgetTrainToTheGroundTruthAuc) {
  for (const std::string format : {"libsvm", "csv"}) {
    SCOPED_TRACE(format);
    const double best = BestAuc(format);
    const SyntheticCtrSpec shape = Data(format);
    // A label, the dense values, and per id its key, weight and offset.
    const int64_t whole_bytes = shape.examples * (4 + 4 * int64_t{shape.dense} + int64_t{shape.fields} * (8 + 4 + 8));
    ASSERT_GT(whole_bytes, 2 * kWorkerBudget);
    Write(format + "-train", 0, format, 2);
    Write(format + "-test", 1, format, 1);
    v1::JobSpec spec = FileSpec(format == "csv" ? v1::DataSpec::CSV : v1::DataSpec::LIBSVM, format);
    v1::JobStatus done;
    ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &done));
    ASSERT_TRUE(done.progress().has_test_auc());
    EXPECT_GE(done.progress().test_auc(), best - 0.01) << "best reachable " << best;
    // Every good record of the two files, in full global batches per epoch.
    EXPECT_EQ(done.progress().total_steps(), 2 * (Data(format).examples / 128));
    // The bad lines are skipped and told once as an event: one in the first
    // training file and one in the test file (every worker reads them).
    int skipped = 0;
    for (const auto& event : done.events()) {
      if (!Contains(event.message(),
                    " skipped 2 bad records of the data files (data.onBadRecord: SKIP); the first: "))
        continue;
      ++skipped;
      EXPECT_TRUE(Contains(event.message(), format + "-train.0:1: ")) << event.message();
    }
    EXPECT_EQ(skipped, 1) << "one event a job";
  }
}

// An FM job on libffm files (data.libsvm.fields): every id in its field's
// bag, so the model pairs the fields, trained to the data's ground-truth
// AUC; the same data read as plain libsvm (one field) cannot train an FM
// and is refused at submit.
TEST_F(ClickFileTest, FmOnLibffmFilesPairsTheFieldsAndReachesTheGroundTruthAuc) {
  Write("libffm-train", 0, "libffm", 2);
  Write("libffm-test", 1, "libffm", 1);
  v1::JobSpec spec = FileSpec(v1::DataSpec::LIBSVM, "libffm");
  spec.mutable_model()->set_kind(v1::ModelSpec::FM);
  spec.mutable_model()->set_embedding_dim(4);
  v1::TableSpec* embedding = spec.mutable_model()->add_tables();
  embedding->set_name("embedding");
  embedding->mutable_optimizer()->set_lr(0.05f);
  const absl::StatusOr<std::string> refused = Submit(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(refused.status().message(), "data.libsvm.fields")) << refused.status();

  spec.mutable_data()->mutable_libsvm()->set_fields(Data("libffm").fields);
  v1::JobStatus done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &done));
  ASSERT_TRUE(done.progress().has_test_auc());
  const double best = BestAuc("libffm");
  EXPECT_GE(done.progress().test_auc(), best - 0.01) << "best reachable " << best;
  EXPECT_EQ(done.progress().total_steps(), 2 * (Data("libffm").examples / 128));
}

// A value far beyond float32's useful range (1e30, a good record) makes the
// gradients overflow: the job fails saying the model diverged or the data's
// values are too large, naming the step and the table or tensor. The worker
// finds it before it pushes: nothing of the step reaches the servers.
TEST_F(ClickFileTest, ValuesTooLargeForFloatFailTheJobSayingSo) {
  {
    std::ofstream out(*data_dir_ + "/huge-train.0");
    for (int i = 0; i < 2000; ++i) out << (i % 2) << " 0:3:1e30 1:" << 4 + i % 7 << ":1\n";
  }
  v1::JobSpec spec = FmFileSpec("huge");
  spec.mutable_data()->clear_test_path();
  v1::JobStatus done;
  ASSERT_NO_FATAL_FAILURE(RunToFailure(spec, &done));
  EXPECT_TRUE(Contains(done.reason(), "non-finite gradient in t"))
      << "names the table or tensor: " << done.reason();
  EXPECT_TRUE(Contains(done.reason(), "it was not pushed"))
      << "the worker checks before pushing: " << done.reason();
  EXPECT_TRUE(Contains(done.reason(), "too large for float32")) << done.reason();
  EXPECT_TRUE(Contains(done.reason(), "step ")) << done.reason();
}

// A test record the model cannot score (1e30 in a libffm record: the FM
// term squares it past float32) fails the job at its first evaluation,
// naming the example and why; the worker used to hang ranking the NaN
// score for the AUC.
TEST_F(ClickFileTest, ATestRecordTheModelCannotScoreFailsTheJobSayingSo) {
  {
    std::ofstream train(*data_dir_ + "/unscorable-train.0");
    for (int i = 0; i < 2000; ++i) train << (i % 2) << " 0:3:1 1:" << 4 + i % 7 << ":1\n";
    std::ofstream test(*data_dir_ + "/unscorable-test.0");
    test << "1 0:5:1e30 1:6:1\n0 0:3:1 1:4:1\n";
  }
  v1::JobSpec spec = FmFileSpec("unscorable");
  v1::JobStatus done;
  ASSERT_NO_FATAL_FAILURE(RunToFailure(spec, &done));
  EXPECT_TRUE(Contains(done.reason(), "the model's output for test example 0 is")) << done.reason();
  EXPECT_TRUE(Contains(done.reason(), "too large for float32")) << done.reason();
}

// A step's records read from indexed files are bounded by what the
// worker's budget leaves beside its data: lines of 3000 ids each (the files
// take more than half the workers' 1 MiB, so they are indexed; a batch of
// 64 such lines takes 2.3 MB) fail the job saying so, where nothing bounded
// them.
TEST_F(ClickFileTest, AStepOfLinesTooLongForTheWorkersBudgetFailsTheJobSayingSo) {
  {
    std::ofstream out(*data_dir_ + "/wide-train.0");
    for (int r = 0; r < 128; ++r) {
      out << r % 2;
      for (int k = 0; k < 3000; ++k) out << " " << r * 3000 + k << ":1";
      out << "\n";
    }
  }
  v1::JobSpec spec = FileSpec(v1::DataSpec::LIBSVM, "wide");
  spec.mutable_data()->clear_test_path();
  v1::JobStatus done;
  ASSERT_NO_FATAL_FAILURE(RunToFailure(spec, &done));
  EXPECT_TRUE(Contains(done.reason(), "its batch of 64 examples: the ")) << done.reason();
  EXPECT_TRUE(Contains(done.reason(), " records read (the last record ")) << done.reason();
  EXPECT_TRUE(Contains(done.reason(), "leaves beside its data")) << done.reason();
  EXPECT_TRUE(Contains(done.reason(), "lower data.batchSize")) << done.reason();
}

// A step's rows are bounded by what the worker's budget leaves beside its
// data: records of 600 distinct ids each under FM's tables of 1 and 8
// floats (38,400 ids a batch of 64 in each table: 2.8 MB of rows and
// gradients against the workers' 1 MiB; the records themselves take 460 KB)
// fail the job saying so, where nothing bounded them.
TEST_F(ClickFileTest, AStepWhoseRowsExceedTheWorkersBudgetFailsTheJobSayingSo) {
  {
    std::ofstream out(*data_dir_ + "/widerows-train.0");
    for (int r = 0; r < 128; ++r) {
      out << r % 2;
      for (int k = 0; k < 600; ++k) out << " " << k % 2 << ":" << r * 600 + k << ":1";
      out << "\n";
    }
  }
  v1::JobSpec spec = FmFileSpec("widerows");
  spec.mutable_model()->set_embedding_dim(8);
  spec.mutable_data()->clear_test_path();
  v1::JobStatus done;
  ASSERT_NO_FATAL_FAILURE(RunToFailure(spec, &done));
  EXPECT_TRUE(Contains(done.reason(), "its batch has 76800 distinct ids")) << done.reason();
  EXPECT_TRUE(Contains(done.reason(), "leaves beside its data")) << done.reason();
  EXPECT_TRUE(Contains(done.reason(), "lower data.batchSize")) << done.reason();
}

// An evaluation takes its test set in batches whose rows fit the worker's
// budget: 1000 test records of 20 distinct ids each (800 KB of rows and
// gradients under FM's two tables, beyond what the workers' 1 MiB leaves
// beside their data) are evaluated in smaller batches, and the job ends
// with its test AUC.
TEST_F(ClickFileTest, AnEvaluationTakesItsTestSetInBatchesThatFitTheBudget) {
  {
    std::ofstream train(*data_dir_ + "/widetest-train.0");
    for (int i = 0; i < 2000; ++i) train << (i % 2) << " 0:" << i % 50 << ":1 1:" << 50 + i % 7 << ":1\n";
    std::ofstream test(*data_dir_ + "/widetest-test.0");
    for (int r = 0; r < 1000; ++r) {
      test << r % 2;
      for (int k = 0; k < 20; ++k) test << " " << k % 2 << ":" << 1000 + r * 20 + k << ":1";
      test << "\n";
    }
  }
  v1::JobSpec spec = FmFileSpec("widetest");
  v1::JobStatus done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &done));
  EXPECT_TRUE(done.progress().has_test_auc());
}

// A bad record under onBadRecord FAIL fails the job naming its file and
// line; files outside the workers' data roots, and a pattern that matches
// nothing, fail it naming the path.
TEST_F(ClickFileTest, BadRecordsAndPathsFailTheJobNamingThem) {
  Write("strict-train", 0, "libsvm", 1);
  v1::JobSpec spec = FileSpec(v1::DataSpec::LIBSVM, "strict");
  spec.mutable_data()->clear_test_path();
  spec.mutable_data()->set_on_bad_record(v1::DataSpec::FAIL);
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus done = WaitForEnd(*id);
  EXPECT_EQ(done.state(), v1::FAILED);
  EXPECT_NE(done.reason().find("strict-train.0:1"), std::string::npos) << done.reason();

  spec.mutable_data()->set_on_bad_record(v1::DataSpec::SKIP);
  spec.mutable_data()->set_path("/etc/*.conf");
  id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  done = WaitForEnd(*id);
  EXPECT_EQ(done.state(), v1::FAILED);
  EXPECT_NE(done.reason().find("/etc/*.conf"), std::string::npos)
      << "the pattern is named: " << done.reason();

  spec.mutable_data()->set_path(*data_dir_ + "/nothing-*.libsvm");
  id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  done = WaitForEnd(*id);
  EXPECT_EQ(done.state(), v1::FAILED);
  EXPECT_NE(done.reason().find("nothing-*.libsvm"), std::string::npos) << done.reason();
}

// A training file rewritten while the job runs (other records where the
// index has its records) fails the job, naming the file, instead of training
// on records no one chose.
// Graphs take the labels their losses need from the files as they are
// (click models make them 0 or 1): class numbers for softmax cross-entropy,
// real values for squared error. On CSV files whose label is a function of
// an id (class: id % 3; value: 2 x + id % 3 - 1 with x the dense feature),
// a graph of the id's embedding and x learns it: the softmax job's test
// accuracy, the regression's test loss (it reports no accuracy, and neither
// an AUC).
TEST_F(ClickFileTest, GraphsTrainOnClassNumbersAndRealValuedLabelsFromFiles) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> ids(0, 29);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const std::string split : {"train", "test"}) {
    std::ofstream classes(absl::StrCat(*data_dir_, "/classes-", split, ".0"));
    std::ofstream values(absl::StrCat(*data_dir_, "/values-", split, ".0"));
    for (int i = 0; i < (split == "train" ? 6000 : 1000); ++i) {
      const int id = ids(rng);
      const float x = uniform(rng);
      classes << id % 3 << "," << x << ",c" << id << "\n";
      values << 2 * x + static_cast<float>(id % 3) - 1 << "," << x << ",c" << id << "\n";
    }
  }
  for (const auto loss : {v1::LayerSpec::SOFTMAX_CROSS_ENTROPY, v1::LayerSpec::MEAN_SQUARED_ERROR}) {
    SCOPED_TRACE(v1::LayerSpec::Loss_Name(loss));
    const bool softmax = loss == v1::LayerSpec::SOFTMAX_CROSS_ENTROPY;
    v1::JobSpec spec = FileSpec(v1::DataSpec::CSV, softmax ? "classes" : "values");
    v1::CsvSpec* csv = spec.mutable_data()->mutable_csv();
    csv->clear_columns();
    csv->add_columns(v1::CsvSpec::LABEL);
    csv->add_columns(v1::CsvSpec::DENSE);
    csv->add_columns(v1::CsvSpec::CATEGORICAL);
    // The regression's test loss about halves an epoch and varies run to
    // run (ASP): after 5 epochs one CI run ended at 0.197, above the bound,
    // so it trains 8.
    const int epochs = softmax ? 5 : 8;
    spec.mutable_data()->set_epochs(epochs);
    v1::ModelSpec* model = spec.mutable_model();
    model->Clear();
    model->set_kind(v1::ModelSpec::GRAPH);
    v1::LayerSpec* id = AddLayer(model, "id", v1::LayerSpec::EMBEDDING, {});
    id->set_table("ids");
    id->set_dim(4);
    AddLayer(model, "x", v1::LayerSpec::DENSE_INPUT, {});
    AddLayer(model, "both", v1::LayerSpec::CONCAT, {"id", "x"});
    AddLayer(model, "out", v1::LayerSpec::LINEAR, {"both"})->set_units(softmax ? 3 : 1);
    AddLayer(model, "loss", v1::LayerSpec::LOSS, {"out"})->set_loss(loss);
    v1::TableSpec* table = model->add_tables();
    table->set_name("ids");
    table->mutable_optimizer()->set_lr(0.1f);
    v1::JobStatus done;
    ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &done));
    std::string evaluations_seen;  // step: test loss, as the scheduler took them
    for (const v1::MetricPoint& point : done.history()) {
      if (point.evaluation())
        absl::StrAppend(&evaluations_seen, " ", point.step(), ": ", point.test_loss(), ";");
    }
    SCOPED_TRACE(absl::StrCat("evaluations", evaluations_seen, " ended at step ", done.progress().step(),
                              " of ", done.progress().total_steps()));
    EXPECT_FALSE(done.progress().has_test_auc());
    ASSERT_TRUE(done.progress().has_test_loss());
    if (softmax) {
      EXPECT_GT(done.progress().test_accuracy(), 0.95);
      EXPECT_LT(done.progress().test_loss(), 0.3);
      EXPECT_NE(done.reason().find("test accuracy"), std::string::npos) << done.reason();
    } else {
      EXPECT_LT(done.progress().test_accuracy(), 0) << "a regression has no accuracy";
      // The labels' variance is about 2 (4/3 from x, 2/3 from the id).
      EXPECT_LT(done.progress().test_loss(), 0.1);
      EXPECT_NE(done.reason().find("test loss"), std::string::npos) << done.reason();
      int evaluations = 0;
      for (const v1::MetricPoint& point : done.history()) evaluations += point.evaluation() ? 1 : 0;
      EXPECT_GE(evaluations, epochs) << "one an epoch";
    }
  }
}

TEST_F(ClickFileTest, ATrainingFileChangedWhileTheJobRunsFailsItNamingTheFile) {
  Write("changing-train", 0, "libsvm", 1);
  v1::JobSpec spec = FileSpec(v1::DataSpec::LIBSVM, "changing");
  spec.mutable_data()->clear_test_path();
  spec.mutable_data()->set_epochs(1000);  // it cannot end before the change
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  const v1::JobStatus running = WaitForStep(*id, 5);
  ASSERT_EQ(running.state(), v1::RUNNING) << running.reason();
  const std::string path = *data_dir_ + "/changing-train.0";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    for (int i = 0; i < 40000; ++i) out << "1 " << i << ":1\n";
  }
  const v1::JobStatus done = WaitForEnd(*id);
  EXPECT_EQ(done.state(), v1::FAILED);
  EXPECT_NE(done.reason().find(path), std::string::npos) << done.reason();
  EXPECT_NE(done.reason().find("changed since it was indexed"), std::string::npos) << done.reason();
}

// What click jobs cannot do yet is refused by name, not run without it.
// earlyStopping on the test AUC: with a minDelta no evaluation can pass, the
// job ends after the first evaluation and `patience` more, long before its
// last step, SUCCEEDED with the reason saying why; every process goes on.
TEST_F(ClusterTest, ClickJobStopsEarlyWhenItsAucStopsImproving) {
  v1::JobSpec spec = ClickSpec(v1::ModelSpec::LOGISTIC_REGRESSION, 0);
  spec.mutable_data()->set_eval_every_steps(20);
  spec.mutable_early_stopping()->set_metric(v1::EarlyStoppingSpec::TEST_AUC);
  spec.mutable_early_stopping()->set_patience(2);
  spec.mutable_early_stopping()->set_min_delta(0.5f);
  v1::JobStatus done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &done));
  EXPECT_NE(done.reason().find("stopped early at step"), std::string::npos) << done.reason();
  EXPECT_NE(done.reason().find("test AUC did not improve by more than 0.5 in 2 evaluations"), std::string::npos)
      << done.reason();
  EXPECT_LT(done.progress().step(), done.progress().total_steps() / 2) << "it ran on";
  // The cluster takes the next job.
  v1::JobStatus next;
  spec.clear_early_stopping();
  spec.mutable_data()->set_max_steps(50);
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &next));
}

// data.gradientAccumulation on a click model: 4 micro-batches of 16 train
// the model that batches of 64 train (one worker, so the pushes apply in one
// order), within float rounding: the same test loss and AUC. (Batches of 16
// without accumulation end 4e-3 away in AUC and 5e-3 in loss: the
// tolerances tell them apart.)
TEST_F(ClusterTest, ClickJobGradientAccumulationTrainsAsOneBatchOfItsSize) {
  v1::JobSpec spec = ClickSpec(v1::ModelSpec::FM, 2);
  spec.set_num_workers(1);
  spec.mutable_data()->set_epochs(1);
  v1::JobStatus whole;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &whole));
  spec.mutable_data()->set_batch_size(16);
  spec.mutable_data()->set_gradient_accumulation(4);
  v1::JobStatus micro;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &micro));
  EXPECT_EQ(micro.progress().total_steps(), whole.progress().total_steps());
  ASSERT_TRUE(whole.progress().has_test_auc());
  ASSERT_TRUE(micro.progress().has_test_auc());
  EXPECT_NEAR(micro.progress().test_auc(), whole.progress().test_auc(), 2e-4);
  auto last_test_loss = [](const v1::JobStatus& job) {
    double loss = -1;
    for (const auto& point : job.history()) {
      if (point.test_accuracy() >= 0) loss = point.test_loss();
    }
    return loss;
  };
  ASSERT_GT(last_test_loss(whole), 0);
  EXPECT_NEAR(last_test_loss(micro), last_test_loss(whole), 2e-4 * last_test_loss(whole));
  // It learned: well above chance.
  EXPECT_GT(micro.progress().test_auc(), 0.7);
}

// LAMB on a click model's dense tensors (BSP; the tables keep their own
// optimizers): the norms' half of each step runs beside the tables' pushes
// and the job learns; in ASP it is refused naming the field.
TEST_F(ClusterTest, ClickJobTrainsItsDenseTensorsWithLambInBsp) {
  v1::JobSpec spec = ClickSpec(v1::ModelSpec::DEEPFM, 2);
  spec.set_mode(v1::BSP);
  spec.mutable_data()->set_epochs(1);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::LAMB);
  spec.mutable_optimizer()->set_lr(0.01f);
  v1::JobStatus done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &done));
  ASSERT_TRUE(done.progress().has_test_auc());
  EXPECT_GT(done.progress().test_auc(), 0.7);
  spec.set_mode(v1::ASP);
  absl::StatusOr<std::string> refused = Submit(spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("optimizer.kind"), std::string::npos) << refused.status();
}

TEST_F(ClusterTest, ClickJobsRefuseWhatTheyCannotDoYet) {
  v1::JobSpec spec = ClickSpec(v1::ModelSpec::FM, 2);
  spec.mutable_model()->mutable_tables(0)->set_consistency(v1::TableSpec::SYNC);
  absl::StatusOr<std::string> id = Submit(spec);
  ASSERT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("SYNC applies to BSP jobs only"), std::string::npos) << id.status();
}

// Workers whose click models compute through their backend's ops (the path
// a GPU worker takes: kernels::GraphModel on a backend, a preset kind as its
// graph), here the CPU backend's.
class BackendClickTest : public ClusterTest {
 protected:
  static void SetUpTestSuite() { StartCluster(2, 2, 1, {}, {"--click_models_on_backend"}); }
};

// A preset kind with a dense first-order term (DeepFM: its graph has a bias
// the kind has not), DLRM's dot interaction, and a graph of the user's own,
// in BSP: each approaches the ground truth as on the host (the margins of
// ClickModelsApproachTheGroundTruthAucOverTablesOnEveryServer), and the
// workers say where they computed.
TEST_F(BackendClickTest, ClickModelsOnTheBackendApproachTheGroundTruthAuc) {
  const std::vector<std::tuple<v1::ModelSpec::Kind, double>> cases = {
      {v1::ModelSpec::DEEPFM, 0.06},
      {v1::ModelSpec::DLRM, 0.08},
      {v1::ModelSpec::GRAPH, 0.045},
  };
  for (const auto& [kind, margin] : cases) {
    SCOPED_TRACE(v1::ModelSpec::Kind_Name(kind));
    v1::JobSpec spec = ClickSpec(kind == v1::ModelSpec::GRAPH ? v1::ModelSpec::FM : kind, 2);
    if (kind == v1::ModelSpec::GRAPH) {
      // FM written as a graph, with a mean bag for the first-order ids.
      v1::ModelSpec* model = spec.mutable_model();
      model->set_kind(v1::ModelSpec::GRAPH);
      model->clear_embedding_dim();
      v1::LayerSpec* ids = AddLayer(model, "ids", v1::LayerSpec::EMBEDDING);
      ids->set_table("linear");
      ids->set_dim(1);
      ids->set_combiner(v1::ModelSpec::MEAN);
      v1::LayerSpec* emb = AddLayer(model, "emb", v1::LayerSpec::EMBEDDING);
      emb->set_table("embedding");
      emb->set_dim(4);
      AddLayer(model, "wide", v1::LayerSpec::REDUCE_SUM, {"ids"});
      AddLayer(model, "fm", v1::LayerSpec::FM, {"emb"});
      AddLayer(model, "logit", v1::LayerSpec::ADD, {"wide", "fm"})->set_bias(true);
      AddLayer(model, "loss", v1::LayerSpec::LOSS, {"logit"})->set_loss(v1::LayerSpec::SIGMOID_CROSS_ENTROPY);
    }
    spec.set_mode(v1::BSP);
    v1::JobStatus done;
    ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &done));
    ASSERT_TRUE(done.progress().has_test_auc());
    const double best = BestAuc(spec);
    EXPECT_GE(done.progress().test_auc(), best - margin) << "best reachable " << best;
    EXPECT_LE(done.progress().test_auc(), best + 0.005);
    int said = 0;
    for (const auto& entry : std::filesystem::directory_iterator(cluster_->dir() + "/logs")) {
      if (entry.path().filename().string().rfind("worker", 0) != 0) continue;
      std::ifstream log(entry.path());
      const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      said += text.find("job " + done.job_id() + ": the click model computes on backend cpu") != std::string::npos;
    }
    EXPECT_EQ(said, 2) << "each worker computes on its backend";
  }
}

// data.evalEverySteps: the test set is also evaluated between epoch ends,
// at every multiple of it (BSP: global steps), each one a history point.
// localSgd and gradientAccumulation through the whole cluster: the
// scheduler and the workers count the same larger steps (4096 / (16 x 4 x 2)
// = 32 an epoch; a worker counting others fails the job), and the model
// learns.
TEST_F(ClusterTest, LocalSgdAndGradientAccumulationJobsTrainOverTheirLargerSteps) {
  for (const bool local : {true, false}) {
    SCOPED_TRACE(local ? "localSgd" : "gradientAccumulation");
    v1::JobSpec spec = SyntheticSpec(v1::BSP, 2, 16, 0);
    if (local) {
      spec.mutable_local_sgd()->set_steps(4);
      spec.mutable_local_sgd()->set_lr(0.1f);
      spec.mutable_optimizer()->set_lr(1.0f);
      spec.mutable_optimizer()->set_momentum(0);
    } else {
      spec.mutable_data()->set_gradient_accumulation(4);
    }
    v1::JobStatus done;
    ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &done));
    EXPECT_EQ(done.progress().total_steps(), 3 * 32);
    EXPECT_GT(done.progress().test_accuracy(), 0.9) << "4 well separated classes";
  }
}

TEST_F(ClusterTest, EvalEveryStepsEvaluatesBetweenEpochs) {
  v1::JobSpec spec = SyntheticSpec(v1::BSP, 2, 16, 0);  // 4096 / 32 = 128 steps an epoch
  spec.mutable_data()->set_epochs(2);
  spec.mutable_data()->set_eval_every_steps(50);
  v1::JobStatus done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &done));
  std::vector<int64_t> evaluated;
  for (const auto& point : done.history()) {
    if (point.test_accuracy() >= 0) evaluated.push_back(point.step());
  }
  EXPECT_EQ(evaluated, (std::vector<int64_t>{50, 100, 128, 150, 200, 250, 256}));
  // And the loss of every step: one point a step, learning as it goes.
  const v1::LossCurve& curve = done.loss_curve();
  ASSERT_EQ(curve.steps(), 256);
  ASSERT_EQ(curve.steps_per_point(), 1);
  ASSERT_EQ(curve.loss_size(), 256);
  double first = 0, last = 0;
  for (int i = 0; i < 16; ++i) {
    first += curve.loss(i);
    last += curve.loss(255 - i);
  }
  EXPECT_LT(last, first / 2) << "the loss of the last 16 steps is not below half that of the first 16";
}

// A 16-bit wire format halves what pushes carry and trains as well: the
// same job in fp32, bf16 and fp16 (servers count the payload bytes).
TEST_F(ClusterTest, SixteenBitWireFormatsTrainAlikeOnHalfTheBytes) {
  struct Run {
    double accuracy;
    double push_bytes;
    double pull_bytes;
    int64_t pushes;
    std::vector<float> parameters;
  };
  std::map<v1::WireFormat, Run> runs;
  for (v1::WireFormat format : {v1::WIRE_FP32, v1::WIRE_BF16, v1::WIRE_FP16}) {
    v1::JobSpec spec = SyntheticSpec(v1::BSP, 2, 32, 0);
    spec.mutable_model()->set_hidden_sizes(0, 256);  // 6.4 K parameters: payload, not headers, dominates
    spec.set_wire_format(format);
    const double push_before = ServersTotal(cluster_->file(), kPushedBytes), pull_before = ServersTotal(cluster_->file(), kPulledBytes);
    v1::JobStatus done;
    RunToSuccess(spec, &done);
    ASSERT_EQ(done.spec().wire_format(), format);
    runs[format] = {done.progress().test_accuracy(), ServersTotal(cluster_->file(), kPushedBytes) - push_before,
                    ServersTotal(cluster_->file(), kPulledBytes) - pull_before, done.progress().step(), FinalParameters(done)};
  }
  const Run& fp32 = runs[v1::WIRE_FP32];
  EXPECT_GT(fp32.accuracy, 0.9);
  ASSERT_GT(fp32.push_bytes, 0);
  for (v1::WireFormat format : {v1::WIRE_BF16, v1::WIRE_FP16}) {
    const Run& run = runs[format];
    const char* name = WireFormatName(format);
    EXPECT_EQ(run.pushes, fp32.pushes) << name;
    EXPECT_NEAR(run.accuracy, fp32.accuracy, 0.02) << name;
    // Workers computed on rounded parameters and sent rounded gradients: the
    // result differs from fp32's, a little.
    ASSERT_EQ(run.parameters.size(), fp32.parameters.size());
    double max_diff = 0, max_scale = 0;
    for (size_t i = 0; i < run.parameters.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(double{run.parameters[i]} - fp32.parameters[i]));
      max_scale = std::max(max_scale, std::fabs(double{fp32.parameters[i]}));
    }
    EXPECT_GT(max_diff, 0) << name << ": no rounding happened";
    EXPECT_LT(max_diff, 0.1 * max_scale) << name;
    // The same pushes (BSP: one per partition and step) with half the
    // payload; message headers (ids, step, audit) stay.
    const double push_ratio = run.push_bytes / fp32.push_bytes;
    std::fprintf(stderr, "%s: test accuracy %.4f (fp32 %.4f), parameters differ by at most %g (largest %g), "
                 "push bytes %.0f (%.3f of fp32), pull bytes %.0f (%.3f)\n", name, run.accuracy, fp32.accuracy,
                 max_diff, max_scale, run.push_bytes, push_ratio, run.pull_bytes, run.pull_bytes / fp32.pull_bytes);
    EXPECT_GT(push_ratio, 0.45) << name;
    EXPECT_LT(push_ratio, 0.6) << name;
    EXPECT_LT(run.pull_bytes, 0.7 * fp32.pull_bytes) << name << ": " << run.pull_bytes << " vs " << fp32.pull_bytes;
  }
}

// Compressed pushes (JobSpec.compression) carry a fraction of the bytes and
// still learn: the same job pushing fp32, int8 and top-k 10% (servers count
// the payload bytes; pulls stay fp32).
TEST_F(ClusterTest, CompressedPushesCarryFewerBytesAndStillLearn) {
  struct Variant {
    const char* name;
    v1::CompressionSpec::Kind kind;
    double ratio;
    double max_push_ratio;  // push bytes against fp32's
  };
  double fp32_accuracy = 0, fp32_push = 0, fp32_pull = 0;
  int64_t fp32_steps = 0;
  for (const Variant& variant : {Variant{"fp32", v1::CompressionSpec::NONE, 0, 1.01},
                                 Variant{"int8", v1::CompressionSpec::INT8, 0, 0.35},
                                 Variant{"top-k 10%", v1::CompressionSpec::TOPK, 0.1, 0.3}}) {
    v1::JobSpec spec = SyntheticSpec(v1::BSP, 2, 32, 0);
    spec.mutable_model()->set_hidden_sizes(0, 256);  // 6.4 K parameters: payload, not headers, dominates
    spec.mutable_compression()->set_kind(variant.kind);
    spec.mutable_compression()->set_topk_ratio(variant.ratio);
    const double push_before = ServersTotal(cluster_->file(), kPushedBytes), pull_before = ServersTotal(cluster_->file(), kPulledBytes);
    v1::JobStatus done;
    RunToSuccess(spec, &done);
    ASSERT_EQ(done.spec().compression().kind(), variant.kind);
    const double accuracy = done.progress().test_accuracy();
    const double push = ServersTotal(cluster_->file(), kPushedBytes) - push_before, pull = ServersTotal(cluster_->file(), kPulledBytes) - pull_before;
    if (variant.kind == v1::CompressionSpec::NONE) {
      fp32_accuracy = accuracy;
      fp32_push = push;
      fp32_pull = pull;
      fp32_steps = done.progress().step();
      EXPECT_GT(accuracy, 0.9);
      continue;
    }
    std::fprintf(stderr, "%s: test accuracy %.4f (fp32 %.4f), push bytes %.0f (%.3f of fp32), pull bytes %.3f of fp32\n",
                 variant.name, accuracy, fp32_accuracy, push, push / fp32_push, pull / fp32_pull);
    EXPECT_EQ(done.progress().step(), fp32_steps) << variant.name;
    EXPECT_NEAR(accuracy, fp32_accuracy, 0.03) << variant.name;
    EXPECT_LT(push, variant.max_push_ratio * fp32_push) << variant.name;
    EXPECT_GT(push, 0.05 * fp32_push) << variant.name;
    EXPECT_NEAR(pull / fp32_pull, 1.0, 0.1) << variant.name << ": pulls stay float32";
  }
}

TEST_F(ClusterTest, CancelStopsARunningJobAndFreesItsWorkers) {
  v1::JobSpec long_spec = SyntheticSpec(v1::BSP, 2, 1, 0);
  long_spec.mutable_data()->set_epochs(1000);
  auto id = Submit(long_spec);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus running = WaitForStep(*id, 0);
  ASSERT_EQ(running.state(), v1::RUNNING) << running.reason();
  {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_job_id(*id);
    v1::JobStatus response;
    ASSERT_TRUE(stub_->CancelJob(&context, request, &response).ok());
    EXPECT_EQ(response.state(), v1::CANCELLED);
  }
  // Both workers are free again: a 2-worker job runs to the end.
  auto next = Submit(SyntheticSpec(v1::BSP, 2, 16, 10));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(WaitForEnd(*next).state(), v1::SUCCEEDED);
  // And cancelling an ended job is refused.
  grpc::ClientContext context;
  v1::CancelJobRequest request;
  request.set_job_id(*id);
  v1::JobStatus response;
  EXPECT_EQ(stub_->CancelJob(&context, request, &response).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ClusterTest, BadSpecIsRejectedNamingTheField) {
  v1::JobSpec spec = SyntheticSpec(v1::BSP, 1, 0, 0);
  auto id = Submit(spec);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("data.batchSize"), std::string::npos) << id.status();
}

TEST_F(ClusterTest, UnknownJobIsNotFound) {
  grpc::ClientContext context;
  v1::GetJobRequest request;
  request.set_job_id("job-does-not-exist");
  v1::JobStatus response;
  EXPECT_EQ(stub_->GetJob(&context, request, &response).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ClusterTest, MissingDataFileFailsTheJobNamingThePath) {
  v1::JobSpec spec = SyntheticSpec(v1::BSP, 1, 16, 0);
  spec.mutable_data()->set_dataset(v1::DataSpec::FASHION_MNIST);
  spec.mutable_data()->clear_synthetic_examples();
  spec.mutable_data()->clear_synthetic_features();
  spec.mutable_data()->clear_synthetic_classes();
  spec.mutable_data()->set_path("/nonexistent/fashion");
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus done = WaitForEnd(*id);
  EXPECT_EQ(done.state(), v1::FAILED);
  EXPECT_NE(done.reason().find("/nonexistent/fashion"), std::string::npos) << done.reason();
}

// A daemon's command line holds flags only: a stray argument (a second
// command line pasted after the first, a value without its flag) stops it
// at start-up, exit code 1, naming the argument, instead of being ignored.
TEST(DaemonFlagsTest, AnArgumentThatIsNoFlagIsRefused) {
  for (const char* binary : {"fulcrum-scheduler", "fulcrum-server", "fulcrum-worker"}) {
    SCOPED_TRACE(binary);
    auto [rc, out] =
        RunCommand(absl::StrCat(DefaultBinDir(), "/", binary, " --log_level=info stray-argument 2>&1"));
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("unexpected argument \"stray-argument\""), std::string::npos) << out;
  }
}

// `fulcrum local restart` starts a killed scheduler on its old port (the
// members find it again) and refuses a process that still runs; `local
// down` stops a paused process cleanly.
TEST(LocalUpTest, ARestartedSchedulerKeepsItsAddress) {
  const std::string dir = MakeTempDir();
  auto down = absl::MakeCleanup([&dir] { RunCli(absl::StrCat("local down --dir ", dir)); });
  auto [rc, out] = RunCli(absl::StrCat("local up --servers 1 --workers 0 --detach --dir ", dir));
  ASSERT_EQ(rc, 0) << out;
  auto before = LocalCluster::Open(dir);
  ASSERT_TRUE(before.ok()) << before.status();
  const std::string address = (*before)->scheduler_address();
  ASSERT_TRUE((*before)->Signal("scheduler", SIGKILL).ok());
  auto [still_rc, still_out] =
      RunCommand(absl::StrCat(DefaultBinDir(), "/fulcrum local restart server-0 --dir ", dir, " 2>&1"));
  EXPECT_NE(still_rc, 0);
  EXPECT_NE(still_out.find("still running"), std::string::npos) << still_out;
  // The killed scheduler is not this process's child: until init reaps it,
  // its pid still answers; the restart is tried until it is gone.
  std::pair<int, std::string> restarted;
  for (int attempt = 0; attempt < 100; ++attempt) {
    restarted =
        RunCommand(absl::StrCat(DefaultBinDir(), "/fulcrum local restart scheduler --dir ", dir, " 2>&1"));
    if (restarted.first == 0 || restarted.second.find("still running") == std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(restarted.first, 0) << restarted.second;
  auto after = LocalCluster::Open(dir);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ((*after)->scheduler_address(), address);
  auto [cluster_rc, cluster_out] = RunCli(absl::StrCat("cluster --scheduler ", address));
  EXPECT_EQ(cluster_rc, 0) << cluster_out;
  // A paused process stops cleanly too: local down wakes it to handle its
  // SIGTERM (it was SIGKILLed after the grace, and the scheduler with it).
  ASSERT_TRUE((*after)->Signal("server-0", SIGSTOP).ok());
  auto [down_rc, down_out] =
      RunCommand(absl::StrCat(DefaultBinDir(), "/fulcrum local down --dir ", dir, " 2>&1"));
  EXPECT_EQ(down_rc, 0) << down_out;
  EXPECT_EQ(down_out.find("were killed"), std::string::npos) << down_out;
}

// A cluster killed whole (no `local down`, which removes cluster.json):
// `local up` in its folder starts every server it had, under their ids, one
// `local add server` added too, since their state folders hold the
// checkpoints its jobs resume from (the added one was left out, and the job
// waited for it in vain).
TEST(LocalUpTest, AKilledClusterComesBackWithEveryServerItHad) {
  LocalCluster::Options options;
  options.dir = MakeTempDir();
  options.servers = 1;
  options.workers = 0;
  options.replicas = 1;
  {
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    ASSERT_TRUE((*cluster)->AddServer().ok());
  }  // every process SIGKILLed; cluster.json stays
  auto again = LocalCluster::Start(options);
  ASSERT_TRUE(again.ok()) << again.status();
  std::set<std::string> servers;
  for (const auto& process : (*again)->file().processes()) {
    if (process.role() == "server") servers.insert(process.id());
  }
  EXPECT_EQ(servers, (std::set<std::string>{"server-0", "server-1"}));
}

// `fulcrum local up --server-memory-budget` gives every server that
// budget, also one added later with `local add server`; a value that is no
// size is refused before anything starts, and one beyond the machine's
// memory by the process it is given to.
TEST(LocalUpTest, MemoryBudgetsReachEveryServerAndWorker) {
  const std::string dir = MakeTempDir();
  for (const std::string role : {"server", "worker"}) {
    auto [bad_rc, bad_out] = RunCommand(absl::StrCat(DefaultBinDir(), "/fulcrum local up --servers 1 --workers 0 --detach --dir ",
                                                     dir, " --", role, "-memory-budget lots 2>&1"));
    EXPECT_NE(bad_rc, 0);
    EXPECT_NE(bad_out.find("--" + role + "-memory-budget must be a size"), std::string::npos) << bad_out;
    // A budget the machine cannot hold beside the process's own memory: the
    // process refuses to start, naming the most it can take.
    auto [big_rc, big_out] =
        RunCommand(absl::StrCat(DefaultBinDir(), "/fulcrum local up --servers 1 --workers 1 --detach --dir ",
                                dir, " --", role, "-memory-budget 4096TiB 2>&1"));
    EXPECT_NE(big_rc, 0);
    for (const char* part :
         {"--memory-budget 4096TiB: 4.0 PiB is more than this process can hold", "set at most"}) {
      EXPECT_NE(big_out.find(part), std::string::npos) << part << " in " << big_out;
    }
  }
  // However the test ends, the processes are stopped (by their recorded pids).
  auto down = absl::MakeCleanup([&dir] { RunCli(absl::StrCat("local down --dir ", dir)); });
  auto [rc, out] = RunCli(absl::StrCat("local up --servers 2 --workers 1 --detach --dir ", dir,
                                       " --server-memory-budget 64MiB --worker-memory-budget 48MiB"));
  ASSERT_EQ(rc, 0) << out;
  // Processes added later by another invocation get them too.
  for (const char* role : {"server", "worker"}) {
    auto [add_rc, add_out] = RunCli(absl::StrCat("local add ", role, " --dir ", dir));
    ASSERT_EQ(add_rc, 0) << add_out;
  }
  auto cluster = LocalCluster::Open(dir);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::map<std::string, int> processes;
  for (const auto& process : (*cluster)->file().processes()) {
    if (process.role() == "scheduler") continue;
    ++processes[process.role()];
    std::ifstream cmdline(absl::StrCat("/proc/", process.pid(), "/cmdline"));
    const std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    EXPECT_NE(args.find(process.role() == "server" ? "--memory_budget=64MiB" : "--memory_budget=48MiB"),
              std::string::npos)
        << process.id();
  }
  EXPECT_EQ(processes, (std::map<std::string, int>{{"server", 3}, {"worker", 2}}));
}

TEST_F(ClusterTest, CliSubmitWaitExitCodeFollowsTheJob) {
  std::string dir = MakeTempDir();
  std::string good = dir + "/good.yaml";
  std::string bad = dir + "/bad.yaml";
  FILE* f = fopen(good.c_str(), "w");
  fputs("name: cli\nmodel: {kind: SOFTMAX_REGRESSION}\n"
        "data: {dataset: SYNTHETIC, syntheticExamples: 512, syntheticFeatures: 8, syntheticClasses: 3,"
        " batchSize: 32, epochs: 1}\noptimizer: {kind: ADAM, lr: 0.01}\nnumWorkers: 2\n", f);
  fclose(f);
  f = fopen(bad.c_str(), "w");
  fputs("name: cli\nmodel: {kind: SOFTMAX_REGRESSION}\n"
        "data: {dataset: FASHION_MNIST, path: /missing/dir, batchSize: 32}\noptimizer: {lr: 0.01}\n", f);
  fclose(f);
  std::string scheduler = absl::StrCat(" --scheduler ", cluster_->scheduler_address());
  auto [good_rc, good_out] = RunCli(absl::StrCat("submit -f ", good, " --wait -o json", scheduler));
  EXPECT_EQ(good_rc, 0) << good_out;
  EXPECT_NE(good_out.find("\"state\": \"SUCCEEDED\""), std::string::npos) << good_out;
  auto [bad_rc, bad_out] = RunCli(absl::StrCat("submit -f ", bad, " --wait", scheduler));
  EXPECT_NE(bad_rc, 0) << bad_out;
  auto [list_rc, list_out] = RunCli(absl::StrCat("list -o json", scheduler));
  EXPECT_EQ(list_rc, 0);
  EXPECT_NE(list_out.find("\"jobs\""), std::string::npos);
  auto [get_rc, get_out] = RunCli(absl::StrCat("get job-nope", scheduler));
  EXPECT_EQ(get_rc, 1);
  // FULCRUM_SCHEDULER works like --scheduler.
  setenv("FULCRUM_SCHEDULER", cluster_->scheduler_address().c_str(), 1);
  auto [env_rc, env_out] = RunCli("list");
  unsetenv("FULCRUM_SCHEDULER");
  EXPECT_EQ(env_rc, 0);
  EXPECT_NE(env_out.find("JOB"), std::string::npos);
}

// Plain HTTP GET of /metrics.
TEST_F(ClusterTest, EveryProcessServesPrometheusMetrics) {
  for (const auto& process : cluster_->file().processes()) {
    std::string body = HttpGet(process.metrics_address(), "/metrics");
    EXPECT_NE(body.find("200 OK"), std::string::npos) << process.id();
    EXPECT_NE(body.find("fulcrum_"), std::string::npos) << process.id();
  }
}

// A raw unary call through the generic stub (what any gRPC client can do).
grpc::Status RawCall(const std::string& address, const std::string& method, const std::string& payload,
                     std::string* response_bytes) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  SetDeadline(&context, 10);
  grpc::Slice slice(payload);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status result;
  Notification done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status status) {
    result = std::move(status);
    done.Notify();
  });
  done.WaitForNotification();
  if (result.ok() && response_bytes != nullptr) {
    std::vector<grpc::Slice> slices;
    (void)response.Dump(&slices);
    response_bytes->clear();
    for (const auto& s : slices) response_bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return result;
}

bool Serving(const std::string& address) {
  std::string response;
  grpc::Status status = RawCall(address, "/grpc.health.v1.Health/Check", "", &response);
  // HealthCheckResponse{status: SERVING} is field 1, varint 1.
  return status.ok() && response == std::string("\x08\x01", 2);
}

TEST_F(ClusterTest, EveryGrpcProcessServesHealth) {
  int checked = 0;
  for (const auto& process : cluster_->file().processes()) {
    if (process.grpc_address().empty()) continue;
    EXPECT_TRUE(Serving(process.grpc_address())) << process.id();
    ++checked;
  }
  EXPECT_EQ(checked, 5);  // scheduler, two servers and two workers
}

TEST_F(ClusterTest, GarbageAndOversizedMessagesAreRejectedAndServersKeepServing) {
  std::string server;
  for (const auto& process : cluster_->file().processes()) {
    if (process.role() == "server") server = process.grpc_address();
  }
  ASSERT_FALSE(server.empty());
  // Not a protobuf at all.
  grpc::Status garbage = RawCall(server, "/fulcrum.v1.ParameterService/Push", std::string("\xff\xff\xff\xff\x0f", 5), nullptr);
  EXPECT_FALSE(garbage.ok());
  // Over the 8 MiB message limit.
  v1::PushRequest big;
  big.set_job_id("x");
  big.add_chunks()->set_data(std::string(9 << 20, 'a'));
  grpc::Status oversized = RawCall(server, "/fulcrum.v1.ParameterService/Push", big.SerializeAsString(), nullptr);
  EXPECT_EQ(oversized.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << oversized.error_message();
  // A well-formed push for a job the server does not hold.
  v1::PushRequest unknown;
  unknown.set_job_id("no-such-job");
  grpc::Status not_found = RawCall(server, "/fulcrum.v1.ParameterService/Push", unknown.SerializeAsString(), nullptr);
  EXPECT_EQ(not_found.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Serving(server));
  // And training still works.
  auto id = Submit(SyntheticSpec(v1::BSP, 2, 16, 5));
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(WaitForEnd(*id).state(), v1::SUCCEEDED);
}

class WorkerLossTest : public ClusterTest {
 protected:
  static void SetUpTestSuite() { StartCluster(1, 2); }

  // A BSP job long enough (a few seconds) to lose a worker in the middle.
  static v1::JobSpec LongBspSpec() {
    v1::JobSpec spec = SyntheticSpec(v1::BSP, 2, 2, 0);
    spec.mutable_data()->set_epochs(2);
    return spec;
  }
};

// Kill -9 a worker mid-job: its data partition moves to the survivor, the job
// succeeds, every example was used exactly once in each epoch (the servers'
// example audit), and the parameters are bit-identical to the same job
// without the kill.
TEST_F(WorkerLossTest, KilledWorkerJobSucceedsWithTheSameParameters) {
  v1::JobStatus reference_done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(LongBspSpec(), &reference_done));

  auto id = Submit(LongBspSpec());
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus running = WaitForStep(*id, 50);
  ASSERT_EQ(running.state(), v1::RUNNING) << "the job ended before the kill: " << running.reason();
  const std::string victim = running.workers(1).worker_id();
  ASSERT_TRUE(cluster_->Signal(victim, SIGKILL).ok());
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  bool moved = false;
  for (const auto& event : done.events()) moved |= event.message().find(victim) != std::string::npos;
  EXPECT_TRUE(moved) << "no event names " << victim;
  EXPECT_EQ(done.workers_size(), 1);

  ExpectEveryExampleUsedOncePerEpoch(done, 4096);
  ExpectSameParameters(FinalParameters(reference_done), done);
}

class WorkerJoinTest : public WorkerLossTest {
 protected:
  static void SetUpTestSuite() { StartCluster(1, 2); }
};

TEST_F(WorkerJoinTest, AddedWorkerTakesPartInTheRunningJob) {
  v1::JobSpec spec = LongBspSpec();
  spec.set_max_workers(3);  // three partitions; two workers to start with
  v1::JobStatus reference_done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &reference_done));

  auto id = Submit(spec);
  ASSERT_TRUE(id.ok());
  v1::JobStatus running = WaitForStep(*id, 20);
  ASSERT_EQ(running.state(), v1::RUNNING);
  auto added = cluster_->AddWorker();
  ASSERT_TRUE(added.ok()) << added.status();
  // The new worker joins, loads, and takes a partition while the job runs.
  v1::JobStatus joined = WaitFor(
      *id,
      [&](const v1::JobStatus& s) {
        for (const auto& w : s.workers()) {
          if (w.worker_id() == added->id() && w.partitions_size() > 0) return true;
        }
        return Terminal(s.state());
      },
      absl::Seconds(60));
  ASSERT_EQ(joined.state(), v1::RUNNING) << "the job ended before the new worker took part";
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.workers_size(), 3);
  // Who computes which partition does not change the result.
  ExpectEveryExampleUsedOncePerEpoch(done, 4096);
  ExpectSameParameters(FinalParameters(reference_done), done);
}

class SchedulerRestartTest : public WorkerLossTest {
 protected:
  static void SetUpTestSuite() { StartCluster(1, 2); }
};

// Kill -9 the scheduler mid-job and start it again on the same state folder:
// it reloads the job from RocksDB, the servers and workers register again,
// and the job finishes with the parameters of an undisturbed run.
TEST_F(SchedulerRestartTest, JobSurvivesSchedulerKillAndRestart) {
  v1::JobStatus reference_done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(LongBspSpec(), &reference_done));

  auto id = Submit(LongBspSpec());
  ASSERT_TRUE(id.ok());
  v1::JobStatus running = WaitForStep(*id, 50);
  ASSERT_EQ(running.state(), v1::RUNNING);
  ASSERT_TRUE(cluster_->Signal("scheduler", SIGKILL).ok());
  // Reaped by waitpid inside RestartScheduler's liveness check.
  absl::StatusOr<v1::LocalProcess> restarted;
  for (int attempt = 0; attempt < 100; ++attempt) {
    restarted = cluster_->RestartScheduler();
    if (restarted.ok() || restarted.status().code() != absl::StatusCode::kFailedPrecondition) break;
    absl::SleepFor(absl::Milliseconds(20));  // until the killed process is gone
  }
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  stub_ = v1::JobService::NewStub(MakeChannel(cluster_->scheduler_address()));
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  ExpectSameParameters(FinalParameters(reference_done), done);
  // The earlier job is still known too.
  grpc::ClientContext context;
  v1::GetJobRequest request;
  request.set_job_id(reference_done.job_id());
  v1::JobStatus again;
  ASSERT_TRUE(stub_->GetJob(&context, request, &again).ok());
  EXPECT_EQ(again.state(), v1::SUCCEEDED);
}

// Two servers, every shard on both (a primary and a backup).
class ServerFailoverTest : public WorkerLossTest {
 protected:
  static void SetUpTestSuite() { StartCluster(2, 2, /*replicas=*/2); }

  static v1::JobSpec OneShardSpec() {
    v1::JobSpec spec = LongBspSpec();
    spec.set_num_shards(1);  // one replica group: a primary and a backup
    return spec;
  }

  // Runs the reference job, then the same job with `disturb` applied to the
  // shard's primary or backup mid-job, and checks the two end bit-identical.
  static void RunDisturbed(bool primary, const std::function<void(const std::string&)>& disturb,
                           v1::JobStatus* disturbed = nullptr, const v1::JobSpec& spec = OneShardSpec()) {
    // A server killed by an earlier test of this suite is replaced.
    for (; killed_ > 0; --killed_) ASSERT_TRUE(cluster_->AddServer().ok());
    v1::JobStatus reference_done;
    ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &reference_done));
    ASSERT_EQ(reference_done.shards(0).backup_ids_size(), 1);
    std::vector<float> a = FinalParameters(reference_done);  // before any server goes away

    auto id = Submit(spec);
    ASSERT_TRUE(id.ok());
    v1::JobStatus running = WaitForStep(*id, 50);
    ASSERT_EQ(running.state(), v1::RUNNING);
    const std::string victim = primary ? running.shards(0).server_id() : running.shards(0).backup_ids(0);
    disturb(victim);
    v1::JobStatus done = WaitForEnd(*id);
    ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
    EXPECT_GT(done.shard_map().version(), 1) << "no failover happened";
    EXPECT_NE(done.shards(0).server_id(), primary ? victim : "") << "the dead primary still leads";
    bool logged = false;
    for (const auto& event : done.events()) logged |= event.message().find(victim) != std::string::npos;
    EXPECT_TRUE(logged) << "no event names " << victim;
    std::vector<float> b = FinalParameters(done);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
    ExpectEveryExampleUsedOncePerEpoch(done, 4096);  // no acknowledged update lost, none applied twice
    if (disturbed != nullptr) *disturbed = done;
  }

  static inline int killed_ = 0;
};

TEST_F(ServerFailoverTest, KilledPrimaryLosesNoUpdate) {
  RunDisturbed(/*primary=*/true, [](const std::string& victim) {
    ASSERT_TRUE(cluster_->Signal(victim, SIGKILL).ok());
    ++killed_;
  });
}

TEST_F(ServerFailoverTest, KilledBackupLosesNoUpdate) {
  RunDisturbed(/*primary=*/false, [](const std::string& victim) {
    ASSERT_TRUE(cluster_->Signal(victim, SIGKILL).ok());
    ++killed_;
  });
}

// LAMB with replicas: the norms that complete each step are a push too,
// forwarded to the backup; a primary killed mid-job leaves a backup that
// holds every step (whole, waiting for its norms, or applied) and the job
// ends bit-identical to an undisturbed one.
TEST_F(ServerFailoverTest, KilledPrimaryOfALambJobLosesNoUpdate) {
  v1::JobSpec spec = OneShardSpec();
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::LAMB);
  spec.mutable_optimizer()->set_lr(0.01f);
  spec.mutable_optimizer()->set_momentum(0);
  spec.mutable_optimizer()->set_weight_decay(0.01f);
  v1::JobStatus done;
  RunDisturbed(
      /*primary=*/true,
      [](const std::string& victim) {
        ASSERT_TRUE(cluster_->Signal(victim, SIGKILL).ok());
        ++killed_;
      },
      &done, spec);
  EXPECT_EQ(done.spec().optimizer().kind(), v1::OptimizerSpec::LAMB);
}

// ASP with replicas: the primary forwards and applies each push under one
// lock, so its backup applies the pushes in the same order and the two end
// bit-identical (values, optimizer state and update count).
TEST_F(ServerFailoverTest, AspReplicasStayBitIdentical) {
  for (; killed_ > 0; --killed_) ASSERT_TRUE(cluster_->AddServer().ok());
  v1::JobSpec spec = SyntheticSpec(v1::ASP, 2, 4, 0);
  spec.set_num_shards(1);
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  ASSERT_EQ(done.shard_map().shards(0).backup_addresses_size(), 1);
  auto primary = v1::ParameterService::NewStub(MakeChannel(done.shard_map().shards(0).address()));
  auto backup = v1::ParameterService::NewStub(MakeChannel(done.shard_map().shards(0).backup_addresses(0)));
  for (const v1::ChunkLocation& chunk : done.shard_map().chunks()) {
    v1::CopyChunkRequest request;
    request.set_job_id(*id);
    request.set_chunk_id(chunk.chunk_id());
    v1::ChunkState a, b;
    grpc::ClientContext ca, cb;
    ASSERT_TRUE(primary->CopyChunk(&ca, request, &a).ok());
    ASSERT_TRUE(backup->CopyChunk(&cb, request, &b).ok());
    EXPECT_EQ(a.version(), b.version()) << "chunk " << chunk.chunk_id();
    EXPECT_TRUE(a.values() == b.values()) << "chunk " << chunk.chunk_id() << ": replicas differ";
    ASSERT_EQ(a.optimizer_state_size(), b.optimizer_state_size());
    for (int i = 0; i < a.optimizer_state_size(); ++i) EXPECT_TRUE(a.optimizer_state(i) == b.optimizer_state(i));
  }
}

// The primary is cut off (SIGSTOP) past its lease, so the scheduler fails it
// over. When it resumes, a worker that still has the old shard map pushes to
// it: it is fenced (no lease, and its backup moved to the new map), refuses
// the write, and the job's result is unchanged.
TEST_F(ServerFailoverTest, PartitionedPrimaryIsFenced) {
  std::string address;  // the old primary's
  v1::JobStatus done;
  RunDisturbed(/*primary=*/true, [&](const std::string& victim) {
    for (const auto& p : cluster_->file().processes()) {
      if (p.id() == victim) address = p.grpc_address();
    }
    ASSERT_FALSE(address.empty());
    ASSERT_TRUE(cluster_->Signal(victim, SIGSTOP).ok());
    // Wait (bounded) until the scheduler has failed it over.
    v1::JobStatus moved;
    absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      grpc::ClientContext context;
      v1::ListJobsRequest request;
      v1::ListJobsResponse response;
      if (stub_->ListJobs(&context, request, &response).ok()) {
        for (const auto& job : response.jobs()) {
          if (job.state() == v1::RUNNING && !job.shards().empty() && job.shards(0).server_id() != victim) moved = job;
        }
      }
      if (!moved.job_id().empty()) break;
      absl::SleepFor(absl::Milliseconds(50));  // polling the scheduler's view
    }
    ASSERT_FALSE(moved.job_id().empty()) << "no failover within 30 s";
    ASSERT_TRUE(cluster_->Signal(victim, SIGCONT).ok());
    // A stale worker's push (shard map version 1) to the old primary.
    grpc::ClientContext get_context;
    v1::GetJobRequest get;
    get.set_job_id(moved.job_id());
    v1::JobStatus job;
    ASSERT_TRUE(stub_->GetJob(&get_context, get, &job).ok());
    ASSERT_GT(job.shard_map().chunks_size(), 0);
    v1::PushRequest push;
    push.set_job_id(job.job_id());
    push.set_worker_id("stale-worker");
    push.set_partition(0);
    push.set_seq(1);
    push.set_step(job.progress().step());
    push.set_map_version(1);
    v1::ChunkData* chunk = push.add_chunks();
    chunk->set_chunk_id(job.shard_map().chunks(0).chunk_id());
    chunk->set_data(std::string(job.shard_map().chunks(0).length() * 4, '\0'));
    auto old_primary = v1::ParameterService::NewStub(MakeChannel(address));
    grpc::ClientContext push_context;
    SetDeadline(&push_context, 10);
    v1::PushResponse response;
    grpc::Status status = old_primary->Push(&push_context, push, &response);
    EXPECT_FALSE(status.ok()) << "the fenced primary took a write";
    EXPECT_TRUE(status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                status.error_code() == grpc::StatusCode::ABORTED)
        << status.error_message();
  }, &done);
  // Back in touch with the scheduler, the old primary is told its copy is
  // stale and drops it (it may then be re-replicated afresh as a backup).
  bool dropped = false;
  for (const auto& event : done.events()) dropped |= event.message().find("stale copy; dropped") != std::string::npos;
  EXPECT_TRUE(dropped) << "no event says the old primary's stale copy was dropped";
}

// Three servers, two replicas per shard: after a failover the shard is short
// of a replica, and the spare server copies it from the new primary and joins.
class ReReplicationTest : public WorkerLossTest {
 protected:
  static void SetUpTestSuite() { StartCluster(3, 2, /*replicas=*/2); }
};

TEST_F(ReReplicationTest, SpareServerRestoresTheReplicaCountAndSurvivesASecondFailure) {
  v1::JobSpec spec = LongBspSpec();
  spec.set_num_shards(1);
  spec.mutable_data()->set_epochs(8);
  v1::JobStatus reference_done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &reference_done));
  std::vector<float> expected = FinalParameters(reference_done);

  auto id = Submit(spec);
  ASSERT_TRUE(id.ok());
  v1::JobStatus running = WaitForStep(*id, 50);
  ASSERT_EQ(running.state(), v1::RUNNING);
  const std::string first = running.shards(0).server_id();
  ASSERT_TRUE(cluster_->Signal(first, SIGKILL).ok());
  // The group is whole again: a primary and a backup, neither the dead one.
  v1::JobStatus whole = WaitFor(
      *id,
      [&](const v1::JobStatus& s) {
        if (Terminal(s.state())) return true;
        const auto& shard = s.shards(0);
        bool copied = false;
        for (const auto& e : s.events()) copied |= e.message().find("holds its copy") != std::string::npos;
        return copied && shard.server_id() != first && shard.backup_ids_size() == 1;
      },
      absl::Seconds(60));
  ASSERT_EQ(whole.state(), v1::RUNNING) << "the job ended before the group was whole again: " << whole.reason();
  // Now the new primary dies too: the copy takes over.
  const std::string second = whole.shards(0).server_id();
  const std::string copy = whole.shards(0).backup_ids(0);
  ASSERT_TRUE(cluster_->Signal(second, SIGKILL).ok());
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.shards(0).server_id(), copy);
  ExpectSameParameters(expected, done);
}

class ServerJoinTest : public WorkerLossTest {
 protected:
  static void SetUpTestSuite() { StartCluster(2, 2); }
};

// A server added mid-job becomes a new shard: about 1/N of the chunks move to
// it (copied from their primaries) while the workers train, and the result is
// that of an undisturbed run.
TEST_F(ServerJoinTest, AddedServerTakesAShareOfTheChunks) {
  v1::JobSpec spec = LongBspSpec();
  spec.mutable_model()->set_hidden_sizes(0, 256);  // 8 chunks of 4 KiB
  spec.mutable_data()->set_epochs(4);
  v1::JobStatus reference_done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &reference_done));
  std::vector<float> expected = FinalParameters(reference_done);
  const int chunks = reference_done.shard_map().chunks_size();

  auto id = Submit(spec);
  ASSERT_TRUE(id.ok());
  v1::JobStatus running = WaitForStep(*id, 50);
  ASSERT_EQ(running.state(), v1::RUNNING);
  ASSERT_EQ(running.shards_size(), 2);
  auto added = cluster_->AddServer();
  ASSERT_TRUE(added.ok()) << added.status();
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  ASSERT_EQ(done.shards_size(), 3) << "the new server did not join the job";
  EXPECT_EQ(done.shards(2).server_id(), added->id());
  EXPECT_GT(done.shards(2).chunks(), 0);
  EXPECT_LE(done.shards(2).chunks(), chunks / 3 + 2) << "more than about 1/N of the chunks moved";
  ExpectSameParameters(expected, done);
  // Once the move was committed, the servers the chunks left freed them
  // (each logs "job ID: freed N chunk(s) moved to other shards").
  auto freed = [&] {
    int total = 0;
    const std::string says = absl::StrCat("job ", *id, ": freed ");
    for (int s = 0; s < 2; ++s) {
      std::ifstream log(absl::StrCat(cluster_->file().dir(), "/logs/", done.shards(s).server_id(), ".log"));
      for (std::string line; std::getline(log, line);) {
        const size_t at = line.find(says);
        if (at != std::string::npos) total += std::atoi(line.c_str() + at + says.size());
      }
    }
    return total;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (freed() < done.shards(2).chunks() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(freed(), done.shards(2).chunks());
}

class ServerLeaveTest : public ServerJoinTest {
 protected:
  static void SetUpTestSuite() { StartCluster(2, 2); }
};

// SIGTERM to a server holding a shard (one replica only) mid-job: before it
// exits, its shard is copied to the other server, which takes it over; the
// job's result is unchanged and the server exits cleanly on its own.
TEST_F(ServerLeaveTest, TerminatedServerHandsItsShardOverFirst) {
  v1::JobSpec spec = LongBspSpec();
  spec.mutable_model()->set_hidden_sizes(0, 256);  // 8 chunks of 4 KiB over both servers
  spec.mutable_data()->set_epochs(4);
  v1::JobStatus reference_done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &reference_done));
  std::vector<float> expected = FinalParameters(reference_done);

  auto id = Submit(spec);
  ASSERT_TRUE(id.ok());
  v1::JobStatus running = WaitForStep(*id, 50);
  ASSERT_EQ(running.state(), v1::RUNNING);
  ASSERT_EQ(running.shards_size(), 2);
  ASSERT_GT(running.shards(1).chunks(), 0);
  const std::string leaving = running.shards(1).server_id();
  pid_t pid = 0;
  for (const auto& p : cluster_->file().processes()) {
    if (p.id() == leaving) pid = static_cast<pid_t>(p.pid());
  }
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(cluster_->Signal(leaving, SIGTERM).ok());
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);  // it exits by itself once drained
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  for (const auto& shard : done.shards()) EXPECT_NE(shard.server_id(), leaving);
  bool logged = false;
  for (const auto& e : done.events()) logged |= e.message().find(leaving + " leaves") != std::string::npos;
  EXPECT_TRUE(logged);
  ExpectSameParameters(expected, done);
}

class SspTest : public WorkerLossTest {
 protected:
  static void SetUpTestSuite() { StartCluster(1, 2); }
};

// SSP with staleness s: one worker is paused (SIGSTOP, shorter than its
// lease) mid-job; the other runs ahead up to s steps and then waits. The
// workers report the largest lead they computed at: never more than s.
TEST_F(SspTest, NoWorkerRunsMoreThanStalenessStepsAhead) {
  constexpr int kStaleness = 3;
  v1::JobSpec spec = LongBspSpec();
  spec.set_mode(v1::SSP);
  spec.set_staleness(kStaleness);
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus running = WaitForStep(*id, 50);
  ASSERT_EQ(running.state(), v1::RUNNING);
  const std::string paused = running.workers(1).worker_id();
  ASSERT_TRUE(cluster_->Signal(paused, SIGSTOP).ok());
  absl::SleepFor(absl::Milliseconds(500));  // the pause itself, well inside the 1.5 s lease
  ASSERT_TRUE(cluster_->Signal(paused, SIGCONT).ok());
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_LE(done.progress().max_staleness_seen(), kStaleness);
  EXPECT_GE(done.progress().max_staleness_seen(), 1) << "the pause never let a worker run ahead";
  // It learned (4 classes: chance is 0.25); stale gradients make the exact figure vary.
  EXPECT_GT(done.progress().test_accuracy(), 0.5);
}

class PushOverlapTest : public ClusterTest {
 protected:
  static void SetUpTestSuite() { StartCluster(1, 2); }

  static std::vector<std::string> MemberIds(v1::Role role) {
    auto cluster = v1::ClusterService::NewStub(MakeChannel(cluster_->scheduler_address()));
    grpc::ClientContext context;
    SetDeadline(&context, 10);
    v1::ListMembersResponse members;
    grpc::Status status = cluster->ListMembers(&context, v1::ListMembersRequest(), &members);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<std::string> ids;
    for (const auto& m : members.members()) {
      if (m.role() == role) ids.push_back(m.member_id());
    }
    return ids;
  }
};

// Workers push each layer's gradients while the layers below are still being
// computed (--overlap_push) and ask for the next step's values of each layer
// as soon as they have pushed it (--prefetch_pull), both by default. That
// changes when bytes leave, never what arrives: the same seeded BSP job on
// workers that push the whole step at once and then pull ends with the same
// bits.
TEST_F(PushOverlapTest, StreamedPushesAndPrefetchedPullsGiveTheSameParametersAsWholeSteps) {
  const v1::JobSpec spec = SyntheticSpec(v1::BSP, 2, 16, 40);
  v1::JobStatus streamed;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &streamed));
  // The prefetches were used (one per worker and step, but for a late one).
  double used = 0, missed = 0;
  for (const auto& process : cluster_->file().processes()) {
    if (process.role() != "worker") continue;
    const std::string page = HttpGet(process.metrics_address(), "/metrics");
    used += std::max(0.0, MetricValue(page, "fulcrum_worker_prefetches_total{result=\"used\"}"));
    missed += std::max(0.0, MetricValue(page, "fulcrum_worker_prefetches_total{result=\"missed\"}"));
  }
  std::fprintf(stderr, "prefetched pulls: %.0f used, %.0f missed\n", used, missed);
  EXPECT_GE(used, 2 * 40 * 0.5) << "most of 2 workers x 40 steps; missed " << missed;

  // Replace both workers by ones that push whole steps, then pull.
  const std::vector<std::string> originals = MemberIds(v1::WORKER);
  ASSERT_EQ(originals.size(), 2u);
  std::vector<std::string> added;
  for (int i = 0; i < 2; ++i) {
    auto worker = cluster_->AddWorker({"--overlap_push=false", "--prefetch_pull=false"});
    ASSERT_TRUE(worker.ok()) << worker.status();
    added.push_back(worker->id());
  }
  for (const std::string& id : originals) ASSERT_TRUE(cluster_->Signal(id, SIGTERM).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::vector<std::string> workers = MemberIds(v1::WORKER);
  while (absl::Now() < deadline) {
    std::sort(workers.begin(), workers.end());
    std::sort(added.begin(), added.end());
    if (workers == added) break;
    absl::SleepFor(absl::Milliseconds(50));  // polling the membership for the leave and the joins
    workers = MemberIds(v1::WORKER);
  }
  ASSERT_EQ(workers, added) << "the original workers did not leave or the new ones did not join";

  v1::JobStatus whole;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &whole));
  for (const auto& w : whole.workers()) {
    EXPECT_TRUE(std::find(added.begin(), added.end(), w.worker_id()) != added.end()) << w.worker_id();
  }
  EXPECT_EQ(whole.progress().step(), streamed.progress().step());
  ExpectSameParameters(FinalParameters(streamed), whole);
}

TEST_F(WorkerLossTest, SigtermStopsEveryProcessCleanly) {
  absl::Status status = cluster_->Down(absl::Seconds(15));
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace fulcrum
