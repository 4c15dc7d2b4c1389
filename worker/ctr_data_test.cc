#include "worker/ctr_data.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

bool Has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// A temporary file holding `text`, removed with the object.
class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    char name[] = "/tmp/ctr_data_test_XXXXXX";
    const int fd = mkstemp(name);
    EXPECT_GE(fd, 0);
    close(fd);
    path_ = name;
    std::ofstream(path_, std::ios::binary) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(CtrDataTest, LibsvmRecordsBecomeLabelsIdsAndWeights) {
  SparseDataset data;
  ReadStats stats;
  ASSERT_TRUE(ParseLibsvm("1 3:1 7:0.5\n0 2:1 # a comment\n\n-1 qid:3 5:2\r\n0\n", "train.svm", {}, &data, &stats).ok());
  EXPECT_EQ(stats.records, 4);
  EXPECT_EQ(stats.bad, 0);
  EXPECT_EQ(data.num_fields, 1);
  EXPECT_EQ(data.num_dense, 0);
  EXPECT_EQ(data.labels, (std::vector<float>{1, 0, -1, 0}));
  EXPECT_EQ(data.ids, (std::vector<uint64_t>{3, 7, 2, 5}));
  EXPECT_EQ(data.weights, (std::vector<float>{1, 0.5f, 1, 2}));
  EXPECT_EQ(data.offsets, (std::vector<int64_t>{0, 2, 3, 4, 4}));
}

// Each kind of bad record is counted and skipped with its file and line;
// the records around it are kept.
TEST(CtrDataTest, BadLibsvmRecordsAreSkippedAndCountedWithFileAndLine) {
  const std::string text = absl::StrCat("1 1:1\n",          // 1 good
                                        "1 3:\n",           // 2 truncated value
                                        "x 1:1\n",          // 3 bad label
                                        "1 a:1\n",          // 4 bad index
                                        "1 3:nan\n",        // 5 non-finite value
                                        "1 3\n",            // 6 not index:value
                                        "1 ", std::string(200, '9'), ":1\n",  // 7 index beyond uint64
                                        "0 2:1\n");         // 8 good
  SparseDataset data;
  ReadStats stats;
  ASSERT_TRUE(ParseLibsvm(text, "day1.svm", {}, &data, &stats).ok());
  EXPECT_EQ(stats.records, 2);
  EXPECT_EQ(stats.bad, 6);
  ASSERT_EQ(stats.first_bad.size(), 6u);
  EXPECT_TRUE(Has(stats.first_bad[0], "day1.svm:2: value \"\" of feature 3")) << stats.first_bad[0];
  EXPECT_TRUE(Has(stats.first_bad[1], "day1.svm:3: label \"x\"")) << stats.first_bad[1];
  EXPECT_TRUE(Has(stats.first_bad[2], "day1.svm:4: feature index \"a\"")) << stats.first_bad[2];
  EXPECT_TRUE(Has(stats.first_bad[3], "day1.svm:5:")) << stats.first_bad[3];
  EXPECT_TRUE(Has(stats.first_bad[4], "day1.svm:6: feature \"3\" is not index:value")) << stats.first_bad[4];
  EXPECT_TRUE(Has(stats.first_bad[5], "day1.svm:7:")) << stats.first_bad[5];
  EXPECT_EQ(data.ids, (std::vector<uint64_t>{1, 2}));
  // Under FAIL the first bad record ends the read, naming it.
  LibsvmFormat fail;
  fail.limits.on_bad_record = BadRecordPolicy::kFail;
  SparseDataset partial;
  ReadStats ignored;
  absl::Status status = ParseLibsvm(text, "day1.svm", fail, &partial, &ignored);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(std::string(status.message()), "day1.svm:2:")) << status;
}

TEST(CtrDataTest, TooManyIdsOnALineIsABadRecord) {
  LibsvmFormat format;
  format.limits.max_ids_per_line = 3;
  SparseDataset data;
  ReadStats stats;
  ASSERT_TRUE(ParseLibsvm("1 1:1 2:1 3:1\n1 1:1 2:1 3:1 4:1\n", "f", format, &data, &stats).ok());
  EXPECT_EQ(stats.records, 1);
  ASSERT_EQ(stats.bad, 1);
  EXPECT_TRUE(Has(stats.first_bad[0], "f:2: 4 feature ids")) << stats.first_bad[0];
}

TEST(CtrDataTest, CsvColumnsByTheSpecWithQuotesMissingValuesAndAHeader) {
  CsvFormat format;
  using C = CsvFormat::Column;
  format.columns = {C::kLabel, C::kDense, C::kCategorical, C::kIgnore, C::kCategorical, C::kDense};
  format.header = true;
  const std::string text =
      "clicked,price,site,note,device,age\n"
      "1,2.5,news.example,x,\"phone, large\",30\n"
      "0,,shop,\"a \"\"quoted\"\" note\",,\n"
      "1,1,shop,y,tablet\n"          // 4: five columns
      "0,1,\"open,1,2,3\n"            // 5: a quote that never ends
      "0,abc,shop,y,tablet,1\n";     // 6: a dense value that is not a number
  SparseDataset data;
  ReadStats stats;
  ASSERT_TRUE(ParseCsv(text, "ads.csv", format, &data, &stats).ok());
  EXPECT_EQ(stats.records, 2);
  EXPECT_EQ(stats.bad, 3);
  ASSERT_EQ(stats.first_bad.size(), 3u);
  EXPECT_TRUE(Has(stats.first_bad[0], "ads.csv:4: 5 columns where the column spec has 6")) << stats.first_bad[0];
  EXPECT_TRUE(Has(stats.first_bad[1], "ads.csv:5: a quoted field")) << stats.first_bad[1];
  EXPECT_TRUE(Has(stats.first_bad[2], "ads.csv:6: dense value \"abc\" in column 2")) << stats.first_bad[2];
  EXPECT_EQ(data.num_dense, 2);
  EXPECT_EQ(data.num_fields, 2);
  EXPECT_EQ(data.labels, (std::vector<float>{1, 0}));
  EXPECT_EQ(data.dense, (std::vector<float>{2.5f, 30, 0, 0}));  // empty dense values are 0
  // Record 1: site and device; record 2: site only (an empty device is missing).
  EXPECT_EQ(data.offsets, (std::vector<int64_t>{0, 1, 2, 3, 3}));
  EXPECT_EQ(data.ids, (std::vector<uint64_t>{CategoricalId(0, "news.example"), CategoricalId(1, "phone, large"),
                                             CategoricalId(0, "shop")}));
  EXPECT_NE(CategoricalId(0, "shop"), CategoricalId(1, "shop")) << "the same value in two fields is two ids";
  EXPECT_EQ(data.weights, (std::vector<float>{1, 1, 1}));
}

TEST(CtrDataTest, ACsvSpecNeedsExactlyOneLabelColumn) {
  CsvFormat format;
  format.columns = {CsvFormat::Column::kDense, CsvFormat::Column::kCategorical};
  SparseDataset data;
  ReadStats stats;
  absl::Status status = ParseCsv("1,a\n", "x.csv", format, &data, &stats);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(std::string(status.message()), "0 label columns")) << status;
}

// A file is read in blocks: records cut by block ends come out whole, a
// line beyond the limit is skipped without being held, and the last line
// needs no newline; the result is the same as parsing the whole text.
TEST(CtrDataTest, FilesStreamInBlocksWithTheSameRecordsAndLineNumbers) {
  std::string text;
  for (int i = 0; i < 200; ++i) absl::StrAppend(&text, i % 2, " ", i, ":1 ", i + 1000, ":0.25\n");
  text += "1 " + std::string(5000, '7') + ":1\n";  // line 201: too long
  text += "0 42:3";                                   // line 202, no newline
  TempFile file(text);
  LibsvmFormat format;
  format.limits.max_line_bytes = 1000;
  for (int64_t block : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{4096}, int64_t{1} << 20}) {
    SparseDataset streamed;
    ReadStats stats;
    ASSERT_TRUE(ReadLibsvmFile(file.path(), format, &streamed, &stats, block).ok()) << block;
    EXPECT_EQ(stats.records, 201) << block;
    ASSERT_EQ(stats.bad, 1) << block;
    EXPECT_TRUE(Has(stats.first_bad[0], ":201: a line longer than 1000 bytes")) << stats.first_bad[0];
    SparseDataset whole;
    ReadStats whole_stats;
    ASSERT_TRUE(ParseLibsvm(text, file.path(), format, &whole, &whole_stats).ok());
    EXPECT_EQ(streamed.ids, whole.ids) << block;
    EXPECT_EQ(streamed.weights, whole.weights) << block;
    EXPECT_EQ(streamed.offsets, whole.offsets) << block;
    EXPECT_EQ(streamed.labels, whole.labels) << block;
    EXPECT_EQ(streamed.ids.back(), 42u);
  }
}

TEST(CtrDataTest, FilesThatCannotBeReadOrDoNotMatchAreClearErrors) {
  SparseDataset data;
  ReadStats stats;
  absl::Status missing = ReadLibsvmFile("/tmp/ctr_data_test_no_such_file", {}, &data, &stats);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Has(std::string(missing.message()), "ctr_data_test_no_such_file")) << missing;
  // CSV records of one shape cannot join a dataset of another.
  CsvFormat format;
  format.columns = {CsvFormat::Column::kLabel, CsvFormat::Column::kDense};
  ASSERT_TRUE(ParseLibsvm("1 1:1\n", "a.svm", {}, &data, &stats).ok());
  absl::Status mixed = ParseCsv("1,2\n", "b.csv", format, &data, &stats);
  EXPECT_EQ(mixed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(std::string(mixed.message()), "cannot join")) << mixed;
}

// Rank frequencies follow k^-s: the top ranks' shares against the exact
// probabilities, for a small vocabulary and for 10^8 ids.
TEST(CtrDataTest, ZipfRanksFollowTheirDistribution) {
  for (const auto& [n, s] : {std::pair<int64_t, double>{1000, 1.1}, {100000000, 1.05}, {50, 0.7}}) {
    const ZipfSampler zipf(n, s);
    std::mt19937_64 random(3);
    std::uniform_real_distribution<double> unit(0, 1);
    constexpr int kSamples = 400000;
    std::map<int64_t, int> counts;
    for (int i = 0; i < kSamples; ++i) {
      const int64_t k = zipf.Sample([&] { return unit(random); });
      ASSERT_GE(k, 1);
      ASSERT_LE(k, n);
      if (k <= 3) ++counts[k];
    }
    double norm = 0;  // the generalized harmonic number H(n, s), summed to the tail's integral
    const int64_t exact = std::min<int64_t>(n, 2000000);
    for (int64_t k = 1; k <= exact; ++k) norm += std::pow(static_cast<double>(k), -s);
    if (exact < n) {
      norm += (std::pow(static_cast<double>(n) + 0.5, 1 - s) - std::pow(static_cast<double>(exact) + 0.5, 1 - s)) / (1 - s);
    }
    for (int64_t k = 1; k <= 3; ++k) {
      const double expected = std::pow(static_cast<double>(k), -s) / norm;
      const double got = static_cast<double>(counts[k]) / kSamples;
      EXPECT_NEAR(got, expected, 5 * std::sqrt(expected / kSamples) + 1e-4) << "n " << n << " rank " << k;
    }
  }
}

TEST(CtrDataTest, SyntheticCtrIsSeededSplittableAndLearnableToAKnownAuc) {
  SyntheticCtrSpec spec;
  spec.seed = 9;
  spec.fields = 6;
  spec.vocabulary = 100000000;
  spec.dense = 2;
  spec.fm_dim = 4;
  ASSERT_TRUE(ValidateSyntheticCtrSpec(spec).ok());
  std::vector<float> truth;
  const SparseDataset all = MakeSyntheticCtr(spec, 0, 0, 20000, &truth);
  EXPECT_EQ(all.num_examples(), 20000);
  EXPECT_EQ(all.num_fields, 6);
  EXPECT_EQ(all.num_dense, 2);
  EXPECT_EQ(all.ids.size(), 20000u * 6);
  EXPECT_EQ(all.offsets.size(), 20000u * 6 + 1);
  EXPECT_EQ(all.dense.size(), 20000u * 2);
  // Any range is the same examples as in the whole: workers make their own.
  std::vector<float> part_truth;
  const SparseDataset part = MakeSyntheticCtr(spec, 0, 1000, 50, &part_truth);
  EXPECT_EQ(std::vector<uint64_t>(part.ids.begin(), part.ids.end()),
            std::vector<uint64_t>(all.ids.begin() + 6000, all.ids.begin() + 6300));
  EXPECT_EQ(std::vector<float>(part.labels.begin(), part.labels.end()),
            std::vector<float>(all.labels.begin() + 1000, all.labels.begin() + 1050));
  EXPECT_EQ(part_truth, std::vector<float>(truth.begin() + 1000, truth.begin() + 1050));
  // Another split: other examples of the same model (the same ids mean the same).
  const SparseDataset test = MakeSyntheticCtr(spec, 1, 0, 50);
  EXPECT_NE(test.ids, part.ids);
  // Labels are draws from the true probabilities: their mean matches, and
  // the true model ranks them far better than chance, the AUC a learner can reach at best.
  double mean_p = 0, mean_label = 0;
  for (size_t i = 0; i < truth.size(); ++i) {
    mean_p += truth[i];
    mean_label += all.labels[i];
  }
  mean_p /= static_cast<double>(truth.size());
  mean_label /= static_cast<double>(truth.size());
  EXPECT_NEAR(mean_label, mean_p, 0.015);
  EXPECT_GT(mean_p, 0.1);
  EXPECT_LT(mean_p, 0.5);
  const double best = Auc(truth, all.labels);
  EXPECT_GT(best, 0.7);
  EXPECT_LT(best, 0.95);
  // Popular ids repeat (Zipf), so a model of per-id weights can learn them.
  std::map<uint64_t, int> field0;
  for (int64_t e = 0; e < all.num_examples(); ++e) ++field0[all.ids[static_cast<size_t>(e * 6)]];
  int most = 0;
  for (const auto& [id, n] : field0) most = std::max(most, n);
  EXPECT_GT(most, 1000) << "the top id of a field takes several percent of the examples";
  SyntheticCtrSpec bad = spec;
  bad.vocabulary = 0;
  EXPECT_EQ(ValidateSyntheticCtrSpec(bad).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CtrDataTest, AucCountsPairsInOrderAndTiesHalf) {
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75);  // the classic four-point example
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.2f, 0.3f}, {0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(Auc({0.3f, 0.2f, 0.1f}, {0, 1, 1}), 0.0);
  EXPECT_DOUBLE_EQ(Auc({0.5f, 0.5f}, {0, 1}), 0.5);
  EXPECT_DOUBLE_EQ(Auc({0.5f, 0.5f, 0.9f}, {0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.2f}, {1, 1}), 0.5) << "one class only";
}

}  // namespace
}  // namespace fulcrum
