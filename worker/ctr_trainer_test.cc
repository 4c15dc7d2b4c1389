#include "worker/ctr_trainer.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/test_util.h"
#include "fulcrum/v1/job.pb.h"
#include "gtest/gtest.h"
#include "worker/dataset.h"
#include "worker/parameter_transport.h"
#include "worker/trainer.h"

namespace fulcrum {
namespace {

TEST(AffineOrderTest, EachEpochVisitsEveryExampleOnceInItsOwnOrder) {
  for (int64_t n : {1, 2, 7, 1000, 1024}) {
    std::set<int64_t> seen;
    const AffineOrder first(3, 0, n), second(3, 1, n);
    bool differ = false;
    for (int64_t i = 0; i < n; ++i) {
      seen.insert(first[i]);
      differ |= first[i] != second[i];
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), n);
    EXPECT_EQ(*seen.begin(), 0);
    if (n > 2) {
      EXPECT_TRUE(differ) << n;
    }
  }
}

// A data path is a file or a glob: its matches come sorted; no match, a
// folder that does not exist and a file taken for a folder are each "no file
// matches", the first naming what is missing.
TEST(ExpandPathTest, MatchesComeSortedAndAMissingFolderIsNamed) {
  std::string dir = ::testing::TempDir() + "/expand-path-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  for (const char* name : {"b.libsvm", "a.libsvm", "c.txt"}) std::ofstream(dir + "/" + name) << "1 1:1\n";

  absl::StatusOr<std::vector<std::string>> files = ExpandPath(dir + "/*.libsvm");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, (std::vector<std::string>{dir + "/a.libsvm", dir + "/b.libsvm"}));
  files = ExpandPath(dir + "/c.txt");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, std::vector<std::string>{dir + "/c.txt"});

  // A name with a pattern's characters that matches nothing else is the file.
  std::ofstream(dir + "/day[1]*?.csv") << "1,2\n";
  files = ExpandPath(dir + "/day[1]*?.csv");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, std::vector<std::string>{dir + "/day[1]*?.csv"});

  files = ExpandPath(dir + "/*.tsv");
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(files.status().message(), "no file matches " + dir + "/*.tsv");
  files = ExpandPath(dir + "/*.csv");
  ASSERT_TRUE(files.ok()) << "a pattern still matches: " << files.status();
  std::filesystem::remove(dir + "/day[1]*?.csv");
  files = ExpandPath(dir + "/*.csv");
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(files.status().message(), "no file matches " + dir + "/*.csv");

  files = ExpandPath(dir + "/missing/train-*.libsvm");
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(files.status().message(), "no file matches " + dir + "/missing/train-*.libsvm (" + dir +
                                          "/missing: No such file or directory)");

  files = ExpandPath(dir + "/a.libsvm/*");
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound) << files.status();

  // What the missing folder's expansion noted does not stay for the next one.
  files = ExpandPath(dir + "/missing/*");
  files = ExpandPath(dir + "/*.csv");
  EXPECT_EQ(files.status().message(), "no file matches " + dir + "/*.csv");

  for (const char* name : {"a.libsvm", "b.libsvm", "c.txt"}) std::remove((dir + "/" + name).c_str());
  rmdir(dir.c_str());
}

// Files without one good record fail the load with the first bad one's
// reason, file and line (the rest are in the worker's log).
TEST(LoadClickDataTest, FilesWithoutAGoodRecordNameTheFirstBadOne) {
  std::string dir = ::testing::TempDir() + "/no-good-record-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  std::ofstream(dir + "/train.libsvm") << "1 notanid:1\n0 5:nan\n";
  v1::JobSpec spec;
  spec.mutable_model()->set_kind(v1::ModelSpec::LOGISTIC_REGRESSION);
  spec.mutable_data()->set_dataset(v1::DataSpec::LIBSVM);
  spec.mutable_data()->set_path(dir + "/train.libsvm");
  const absl::StatusOr<ClickData> loaded = LoadClickData(spec, {}, 0);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument) << loaded.status();
  EXPECT_TRUE(
      Contains(loaded.status().message(),
               "train.libsvm: no good record in 1 file (2 bad, the first " + dir + "/train.libsvm:1: "))
      << loaded.status();
  std::remove((dir + "/train.libsvm").c_str());
  rmdir(dir.c_str());
}

// Steps are cut from the examples by number, so every worker must read the
// same ones: a worker whose files make another number of steps an epoch
// than the scheduler counts (files that differ between machines, or changed
// since the job started; fewer than a step's used to divide by zero and
// kill the process) refuses to train, naming both counts.
TEST(RunClickJobTest, AWorkerReadingOtherDataThanTheSchedulerCountsRefusesToTrain) {
  std::string dir = ::testing::TempDir() + "/other-data-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  {
    std::ofstream out(dir + "/train.libsvm");
    for (int i = 0; i < 10; ++i) out << i % 2 << " " << i << ":1\n";
  }
  v1::Assignment assignment;
  assignment.set_job_id("job-0001");
  v1::JobSpec* spec = assignment.mutable_spec();
  spec->mutable_model()->set_kind(v1::ModelSpec::LOGISTIC_REGRESSION);
  spec->mutable_model()->add_tables()->set_name("linear");
  spec->mutable_data()->set_dataset(v1::DataSpec::LIBSVM);
  spec->mutable_data()->set_path(dir + "/train.libsvm");
  spec->mutable_data()->set_batch_size(64);  // more than the 10 records read here
  v1::TableLayout* linear = assignment.mutable_shard_map()->add_tables();
  linear->set_name("linear");
  linear->set_dim(1);
  linear->set_buckets(1);
  linear->add_bucket_shards(0);
  assignment.set_num_partitions(1);
  assignment.add_partitions(0);
  // Nothing is called: the run refuses before any request.
  class NoTransport final : public ParameterTransport {
   public:
    std::unique_ptr<Call> NewCall(const std::string&, Method) override {
      ADD_FAILURE() << "a request was made";
      return nullptr;
    }
  } transport;
  std::vector<v1::WorkReport> reports;
  TrainerHooks hooks;
  hooks.report = [&](v1::WorkReport report) { reports.push_back(std::move(report)); };
  hooks.should_stop = [] { return false; };
  hooks.latest_assignment = [&] { return assignment; };
  for (int64_t counted : {int64_t{0}, int64_t{1000}}) {
    SCOPED_TRACE(counted);
    assignment.set_steps_per_epoch(counted);
    assignment.set_total_steps(counted);
    absl::StatusOr<ClickData> data = LoadClickData(*spec, {}, 0);
    ASSERT_TRUE(data.ok()) << data.status();
    const absl::Status ran = RunClickJob("worker-0", hooks, &transport, assignment, *std::move(data));
    EXPECT_EQ(ran.code(), absl::StatusCode::kFailedPrecondition) << ran;
    EXPECT_TRUE(Contains(ran.message(), "(10 examples) makes 0 steps an epoch, the scheduler counts " +
                                            std::to_string(counted) + ": the workers read different data"))
        << ran;
  }
  EXPECT_TRUE(reports.empty());
  std::remove((dir + "/train.libsvm").c_str());
  rmdir(dir.c_str());
}

// A GRAPH over SYNTHETIC (or FASHION_MNIST) data that is not an MLP trains
// on the click path: the worker holds both splits as click data with no
// fields, the features as dense ones and the class numbers as labels, the
// same examples the dense path would train on; its READY report counts
// them; beyond its memory budget the load is refused naming the split.
TEST(LoadClickDataTest, DenseDataIsHeldAsClickDataWithItsFeaturesAndClasses) {
  v1::JobSpec spec;
  spec.set_seed(9);
  spec.mutable_model()->set_kind(v1::ModelSpec::GRAPH);
  v1::DataSpec* data = spec.mutable_data();
  data->set_dataset(v1::DataSpec::SYNTHETIC);
  data->set_synthetic_examples(500);
  data->set_synthetic_features(6);
  data->set_synthetic_classes(3);
  absl::StatusOr<ClickData> loaded = LoadClickData(spec, {}, 0);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_NE(loaded->train, nullptr);
  ASSERT_NE(loaded->test, nullptr);
  const Dataset dense = MakeSynthetic(9, 500, 6, 3, /*split=*/0);
  const SparseDataset& train = *loaded->train;
  EXPECT_EQ(train.num_fields, 0);
  EXPECT_EQ(train.num_dense, 6);
  EXPECT_EQ(train.dense, dense.features);
  ASSERT_EQ(train.num_examples(), 500);
  for (int64_t e = 0; e < train.num_examples(); ++e) {
    ASSERT_EQ(train.labels[static_cast<size_t>(e)], static_cast<float>(dense.labels[static_cast<size_t>(e)]))
        << e;
  }
  EXPECT_EQ(train.offsets, std::vector<int64_t>{0});
  EXPECT_TRUE(train.ids.empty());
  EXPECT_EQ(loaded->test->num_examples(), 100);
  const v1::WorkReport ready = ClickReadyReport(spec, *loaded);
  EXPECT_EQ(ready.train_examples(), 500);
  EXPECT_EQ(ready.test_examples(), 100);
  EXPECT_EQ(ready.features(), 6);
  EXPECT_EQ(ready.classes(), 3);

  absl::StatusOr<ClickData> refused = LoadClickData(spec, {}, /*memory_budget=*/1000);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("the synthetic training set (500 examples x 6 features)"),
            std::string::npos)
      << refused.status();
}

}  // namespace
}  // namespace fulcrum
