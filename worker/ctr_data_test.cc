#include "worker/ctr_data.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
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
  const std::string text = absl::StrCat("1 1:1\n",                            // 1 good
                                        "1 3:\n",                             // 2 truncated value
                                        "x 1:1\n",                            // 3 bad label
                                        "1 a:1\n",                            // 4 bad index
                                        "1 3:nan\n",                          // 5 non-finite value
                                        "1 3\n",                              // 6 not index:value
                                        "1 ", std::string(200, '9'), ":1\n",  // 7 index beyond uint64
                                        "1 3:0x10\n",                         // 8 a hexadecimal value
                                        "0x1p0 1:1\n",                        // 9 a hexadecimal label
                                        "0 2:1\n");                           // 10 good
  SparseDataset data;
  ReadStats stats;
  ASSERT_TRUE(ParseLibsvm(text, "day1.svm", {}, &data, &stats).ok());
  EXPECT_EQ(stats.records, 2);
  EXPECT_EQ(stats.bad, 8);
  ASSERT_EQ(stats.first_bad.size(), 8u);
  EXPECT_TRUE(Has(stats.first_bad[0], "day1.svm:2: value \"\" of feature 3")) << stats.first_bad[0];
  EXPECT_TRUE(Has(stats.first_bad[1], "day1.svm:3: label \"x\"")) << stats.first_bad[1];
  EXPECT_TRUE(Has(stats.first_bad[2], "day1.svm:4: feature index \"a\"")) << stats.first_bad[2];
  EXPECT_TRUE(Has(stats.first_bad[3], "day1.svm:5:")) << stats.first_bad[3];
  EXPECT_TRUE(Has(stats.first_bad[4], "day1.svm:6: feature \"3\" is not index:value")) << stats.first_bad[4];
  EXPECT_TRUE(Has(stats.first_bad[5], "day1.svm:7:")) << stats.first_bad[5];
  EXPECT_TRUE(Has(stats.first_bad[6], "day1.svm:8: value \"0x10\" of feature 3")) << stats.first_bad[6];
  EXPECT_TRUE(Has(stats.first_bad[7], "day1.svm:9: label \"0x1p0\"")) << stats.first_bad[7];
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

// libffm lines (LibsvmFormat.fields): each id goes to its field's bag, in
// any order on the line; a field out of range, a token without a field, a
// bad field number, and the libsvm errors after the field are bad records
// with file and line. The record index reads them the same.
TEST(CtrDataTest, LibffmRecordsPutEachIdInItsFieldsBag) {
  LibsvmFormat format;
  format.fields = 3;
  const std::string text = absl::StrCat("1 0:3:1 2:7:0.5 0:4:1\n",      // 1 good: field 1 empty
                                        "0 1:9:2 qid:4 # a comment\n",  // 2 good
                                        "1 3:5:1\n",                    // 3 field out of range
                                        "1 5:1\n",                      // 4 no field
                                        "1 x:5:1\n",                    // 5 bad field
                                        "1 -1:5:1\n",                   // 6 negative field
                                        "1 0:5:\n",                     // 7 truncated value
                                        "1 0:a:1\n",                    // 8 bad index
                                        "0\n");                         // 9 good: no ids
  SparseDataset data;
  ReadStats stats;
  ASSERT_TRUE(ParseLibsvm(text, "day1.ffm", format, &data, &stats).ok());
  EXPECT_EQ(stats.records, 3);
  EXPECT_EQ(stats.bad, 6);
  EXPECT_EQ(data.num_fields, 3);
  EXPECT_EQ(data.labels, (std::vector<float>{1, 0, 0}));
  EXPECT_EQ(data.ids, (std::vector<uint64_t>{3, 4, 7, 9}));
  EXPECT_EQ(data.weights, (std::vector<float>{1, 1, 0.5f, 2}));
  EXPECT_EQ(data.offsets, (std::vector<int64_t>{0, 2, 2, 3, 3, 4, 4, 4, 4, 4}));
  ASSERT_EQ(stats.first_bad.size(), 6u);
  EXPECT_TRUE(
      Has(stats.first_bad[0], "day1.ffm:3: field \"3\" of feature \"3:5:1\" is not a field number in [0, 3)"))
      << stats.first_bad[0];
  EXPECT_TRUE(Has(stats.first_bad[1], "day1.ffm:4: feature \"5:1\" is not field:index:value"))
      << stats.first_bad[1];
  EXPECT_TRUE(Has(stats.first_bad[2], "day1.ffm:5: field \"x\"")) << stats.first_bad[2];
  EXPECT_TRUE(Has(stats.first_bad[3], "day1.ffm:6: field \"-1\"")) << stats.first_bad[3];
  EXPECT_TRUE(Has(stats.first_bad[4], "day1.ffm:7: value \"\" of feature \"0:5:\" (id 5 of field 0)"))
      << stats.first_bad[4];
  EXPECT_TRUE(Has(stats.first_bad[5], "day1.ffm:8: feature index \"a\"")) << stats.first_bad[5];

  // A byte order mark starts a line well; a libffm value that is no number
  // names the whole token; libffm lines read as libsvm point to the setting.
  SparseDataset marked;
  ReadStats marked_stats;
  ASSERT_TRUE(ParseLibsvm("\xEF\xBB\xBF"
                          "1 0:3:1\n1 1:2:3:4\n",
                          "bom.ffm", format, &marked, &marked_stats)
                  .ok());
  EXPECT_EQ(marked.ids, (std::vector<uint64_t>{3}));
  ASSERT_EQ(marked_stats.first_bad.size(), 1u);
  EXPECT_TRUE(Has(marked_stats.first_bad[0],
                  "bom.ffm:2: value \"3:4\" of feature \"1:2:3:4\" (id 2 of field 1) is not a finite number"))
      << marked_stats.first_bad[0];
  SparseDataset plain;
  ReadStats plain_stats;
  ASSERT_TRUE(ParseLibsvm("1 0:3:1\n", "ffm.svm", {}, &plain, &plain_stats).ok());
  ASSERT_EQ(plain_stats.first_bad.size(), 1u);
  EXPECT_TRUE(Has(plain_stats.first_bad[0], "set data.libsvm.fields")) << plain_stats.first_bad[0];

  TempFile file(text);
  ReadStats index_stats;
  auto index = RecordIndex::BuildLibsvm({file.path()}, format, &index_stats);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ((*index)->num_fields(), 3);
  ASSERT_EQ((*index)->num_examples(), 3);
  SparseDataset read;
  for (int64_t e = 0; e < 3; ++e) ASSERT_TRUE((*index)->Read(e, &read).ok());
  EXPECT_EQ(read.ids, data.ids);
  EXPECT_EQ(read.offsets, data.offsets);
  EXPECT_EQ(read.weights, data.weights);
}

// A softmax model's labels are class numbers: with label_classes set, any
// other label is a bad record (skipped and counted, or failing the read),
// in CSV as in libsvm.
TEST(CtrDataTest, ALabelThatIsNotAClassNumberIsABadRecord) {
  const std::string text = "0 1:1\n2 1:1\n3 1:1\n-1 1:1\n1.5 1:1\n1 2:1\n";
  LibsvmFormat format;
  format.limits.label_classes = 3;
  SparseDataset data;
  ReadStats stats;
  ASSERT_TRUE(ParseLibsvm(text, "classes.svm", format, &data, &stats).ok());
  EXPECT_EQ(data.labels, (std::vector<float>{0, 2, 1}));
  EXPECT_EQ(stats.bad, 3);
  ASSERT_FALSE(stats.first_bad.empty());
  EXPECT_TRUE(Has(stats.first_bad[0], "classes.svm:3: label 3 is not a class number in [0, 3)")) << stats.first_bad[0];
  format.limits.on_bad_record = BadRecordPolicy::kFail;
  SparseDataset partial;
  absl::Status status = ParseLibsvm(text, "classes.svm", format, &partial, &stats);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(std::string(status.message()), "classes.svm:3:")) << status;
  TempFile csv("7,a\n1,b\n");
  CsvFormat columns;
  columns.columns = {CsvFormat::Column::kLabel, CsvFormat::Column::kCategorical};
  columns.limits.label_classes = 2;
  SparseDataset rows;
  ReadStats csv_stats;
  ASSERT_TRUE(ReadCsvFile(csv.path(), columns, &rows, &csv_stats).ok());
  EXPECT_EQ(rows.labels, (std::vector<float>{1}));
  EXPECT_EQ(csv_stats.bad, 1);
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
      "1,1,shop,y,tablet\n"        // 4: five columns
      "0,1,\"open,1,2,3\n"         // 5: a quote that never ends
      "0,abc,shop,y,tablet,1\n"    // 6: a dense value that is not a number
      "0,0x10,shop,y,tablet,1\n";  // 7: nor is a hexadecimal one
  SparseDataset data;
  ReadStats stats;
  ASSERT_TRUE(ParseCsv(text, "ads.csv", format, &data, &stats).ok());
  EXPECT_EQ(stats.records, 2);
  EXPECT_EQ(stats.bad, 4);
  ASSERT_EQ(stats.first_bad.size(), 4u);
  EXPECT_TRUE(Has(stats.first_bad[0], "ads.csv:4: 5 columns where the column spec has 6")) << stats.first_bad[0];
  EXPECT_TRUE(Has(stats.first_bad[1], "ads.csv:5: a quoted field")) << stats.first_bad[1];
  EXPECT_TRUE(Has(stats.first_bad[2], "ads.csv:6: dense value \"abc\" in column 2")) << stats.first_bad[2];
  EXPECT_TRUE(Has(stats.first_bad[3], "ads.csv:7: dense value \"0x10\" in column 2")) << stats.first_bad[3];
  EXPECT_EQ(data.num_dense, 2);
  EXPECT_EQ(data.num_fields, 2);
  EXPECT_EQ(data.labels, (std::vector<float>{1, 0}));
  EXPECT_EQ(data.dense, (std::vector<float>{2.5f, 30, 0, 0}));  // empty dense values are 0
  // Record 1: site and device; record 2: site only (an empty device is missing).
  EXPECT_EQ(data.offsets, (std::vector<int64_t>{0, 1, 2, 3, 3}));
  EXPECT_EQ(data.ids, (std::vector<uint64_t>{CategoricalId(0, "news.example"), CategoricalId(1, "phone, large"),
                                             CategoricalId(0, "shop")}));
  EXPECT_NE(CategoricalId(0, "shop"), CategoricalId(1, "shop")) << "the same value in two fields is two ids";
  // As the README's Python function computes them (its documented formula).
  EXPECT_EQ(CategoricalId(0, "u8"), 6865445688853725935ULL);
  EXPECT_EQ(CategoricalId(2, "12345"), 8759186506584096807ULL);
  EXPECT_EQ(CategoricalId(1, "\xc3\xa9"), 13072732595333664199ULL);  // UTF-8 bytes as they are
  EXPECT_EQ(data.weights, (std::vector<float>{1, 1, 1}));
}

// ClickRecordText writes lines the readers take back as the same records:
// libsvm ids and weights as they are (in one field), libffm the same in their
// fields, CSV dense values exactly and each id as its column's categorical
// value; what a format cannot hold is refused.
TEST(CtrDataTest, ClickRecordTextReadsBackAsTheSameRecords) {
  SyntheticCtrSpec spec;
  spec.seed = 3;
  spec.fields = 3;
  spec.vocabulary = 50;
  for (const ClickTextFormat kind :
       {ClickTextFormat::kLibsvm, ClickTextFormat::kLibffm, ClickTextFormat::kCsv}) {
    const bool csv = kind == ClickTextFormat::kCsv;
    SCOPED_TRACE(static_cast<int>(kind));
    spec.dense = csv ? 2 : 0;
    SparseDataset data = MakeSyntheticCtr(spec, 0, 0, 200);
    if (!csv) {
      for (size_t i = 0; i < data.weights.size(); i += 7) data.weights[i] = 1.0f / 3;  // not 1, not short
    }
    std::string text;
    for (int64_t e = 0; e < data.num_examples(); ++e) text += ClickRecordText(data, e, kind).value();
    SparseDataset read;
    ReadStats stats;
    if (csv) {
      CsvFormat format;
      format.columns = {CsvFormat::Column::kLabel, CsvFormat::Column::kDense, CsvFormat::Column::kDense};
      format.columns.insert(format.columns.end(), 3, CsvFormat::Column::kCategorical);
      ASSERT_TRUE(ParseCsv(text, "ctr.csv", format, &read, &stats).ok());
    } else {
      LibsvmFormat format;
      format.fields = kind == ClickTextFormat::kLibffm ? 3 : 0;
      ASSERT_TRUE(ParseLibsvm(text, "ctr.svm", format, &read, &stats).ok());
    }
    EXPECT_EQ(stats.bad, 0);
    ASSERT_EQ(read.num_examples(), 200);
    EXPECT_EQ(read.labels, data.labels);
    EXPECT_EQ(read.dense, data.dense);
    EXPECT_EQ(read.weights, data.weights);
    if (csv) {
      EXPECT_EQ(read.offsets, data.offsets);
      for (size_t i = 0; i < data.ids.size(); ++i) {
        ASSERT_EQ(read.ids[i], CategoricalId(static_cast<int32_t>(i % 3), std::to_string(data.ids[i]))) << i;
      }
    } else if (kind == ClickTextFormat::kLibffm) {
      EXPECT_EQ(read.ids, data.ids);  // libffm: the same ids in the same fields' bags
      EXPECT_EQ(read.num_fields, 3);
      EXPECT_EQ(read.offsets, data.offsets);
    } else {
      EXPECT_EQ(read.ids, data.ids);  // libsvm: the example's ids in one field, in order
      EXPECT_EQ(read.num_fields, 1);
    }
  }

  SparseDataset dense = MakeSyntheticCtr(spec, 0, 0, 2);  // spec.dense is 2 here
  absl::StatusOr<std::string> refused = ClickRecordText(dense, 0, ClickTextFormat::kLibsvm);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(std::string(refused.status().message()), "libsvm holds no dense features"))
      << refused.status();

  SparseDataset bags;  // one field: example 0 has no id, example 1 two
  bags.num_fields = 1;
  bags.labels = {0, 1};
  bags.ids = {5, 6};
  bags.weights = {1, 1};
  bags.offsets = {0, 0, 2};
  EXPECT_EQ(ClickRecordText(bags, 0, ClickTextFormat::kCsv).value(), "0,\n");
  EXPECT_EQ(ClickRecordText(bags, 1, ClickTextFormat::kLibsvm).value(), "1 5:1 6:1\n");
  bags.weights = {1, 0.5f};
  bags.offsets = {0, 1, 2};  // one id a bag; the second weighs 0.5
  EXPECT_EQ(ClickRecordText(bags, 1, ClickTextFormat::kLibsvm).value(), "1 6:0.5\n");
  refused = ClickRecordText(bags, 1, ClickTextFormat::kCsv);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(std::string(refused.status().message()), "has an id of weight 0.5")) << refused.status();
  bags.weights = {1, 1};
  bags.offsets = {0, 0, 2};
  refused = ClickRecordText(bags, 1, ClickTextFormat::kCsv);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      Has(std::string(refused.status().message()), "example 1 field 0 has 2 ids; a CSV column holds one"))
      << refused.status();
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

// A data path that names a FIFO, a folder or a device is refused at once,
// naming what it is: reading a FIFO would wait for a writer that may never
// come, holding the worker; an index is refused the same way.
TEST(CtrDataTest, APathThatIsNoRegularFileIsRefusedWithoutWaiting) {
  std::string dir = ::testing::TempDir() + "/ctr-data-special-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string fifo = dir + "/train.libsvm";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string socket_path = dir + "/train.sock";  // a socket cannot even be opened
  const int listener = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  ASSERT_LT(socket_path.size(), sizeof(address.sun_path));
  std::memcpy(address.sun_path, socket_path.c_str(), socket_path.size() + 1);
  ASSERT_EQ(bind(listener, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0)
      << std::strerror(errno);
  const std::pair<std::string, std::string> cases[] = {{fifo, "(it is a FIFO)"},
                                                       {dir, "(it is a folder)"},
                                                       {"/dev/null", "(it is a character device)"},
                                                       {socket_path, "(it is a socket)"}};
  for (const auto& [path, kind] : cases) {
    SparseDataset data;
    ReadStats stats;
    const absl::Status read = ReadLibsvmFile(path, {}, &data, &stats);
    EXPECT_EQ(read.code(), absl::StatusCode::kFailedPrecondition) << path << ": " << read;
    EXPECT_TRUE(Has(std::string(read.message()), "data file \"" + path + "\" is not a regular file " + kind))
        << read;
    EXPECT_EQ(data.num_examples(), 0);
    ReadStats index_stats;
    absl::StatusOr<std::unique_ptr<RecordIndex>> index = RecordIndex::BuildLibsvm({path}, {}, &index_stats);
    EXPECT_EQ(index.status().code(), absl::StatusCode::kFailedPrecondition) << path << ": " << index.status();
  }
  close(listener);
  unlink(socket_path.c_str());
  unlink(fifo.c_str());
  rmdir(dir.c_str());
}

// Appends every record of `index` read back one at a time, in order.
SparseDataset ReadAll(const RecordIndex& index) {
  SparseDataset all;
  for (int64_t e = 0; e < index.num_examples(); ++e) {
    const absl::Status read = index.Read(e, &all);
    EXPECT_TRUE(read.ok()) << e << ": " << read;
  }
  return all;
}

// An index over several files (blank, bad and too-long lines among the
// records, a CRLF line, a last line without newline, a CSV header in each
// file) reads back exactly the records a whole read keeps, in any order and
// from several threads, holding 8 bytes a record.
TEST(RecordIndexTest, ReadsBackEveryGoodRecordOfItsFilesAsAWholeReadHasThem) {
  std::vector<std::string> texts;
  for (int f = 0; f < 3; ++f) {
    std::string text;
    for (int i = 0; i < 300; ++i) {
      if (i % 37 == 5) text += "\n";                                     // blank
      if (i % 41 == 7) text += "1 x:1\n";                                // bad
      if (i % 53 == 9) text += "1 " + std::string(3000, '7') + ":1\n";  // too long
      absl::StrAppend(&text, (i + f) % 2, " ", f * 1000 + i, ":1 ", i + 7, ":0.5", i % 29 == 3 ? "\r\n" : "\n");
    }
    text += "1 99:2";  // no newline
    texts.push_back(text);
  }
  std::vector<std::unique_ptr<TempFile>> files;
  std::vector<std::string> paths;
  SparseDataset whole;
  ReadStats whole_stats;
  LibsvmFormat format;
  format.limits.max_line_bytes = 1000;
  for (const std::string& text : texts) {
    files.push_back(std::make_unique<TempFile>(text));
    paths.push_back(files.back()->path());
    ASSERT_TRUE(ParseLibsvm(text, paths.back(), format, &whole, &whole_stats).ok());
  }
  for (int64_t block : {int64_t{5}, int64_t{4096}, int64_t{4} << 20}) {
    ReadStats stats;
    auto index = RecordIndex::BuildLibsvm(paths, format, &stats, 0, block);
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_EQ(stats.records, whole_stats.records);
    EXPECT_EQ(stats.bad, whole_stats.bad);
    ASSERT_EQ((*index)->num_examples(), whole.num_examples());
    EXPECT_LE((*index)->bytes(), whole.num_examples() * 8 + 1024) << "8 bytes a record and the file list";
    const SparseDataset back = ReadAll(**index);
    EXPECT_EQ(back.labels, whole.labels) << block;
    EXPECT_EQ(back.ids, whole.ids) << block;
    EXPECT_EQ(back.weights, whole.weights) << block;
    EXPECT_EQ(back.offsets, whole.offsets) << block;
  }
  // Any order, from four threads at once: each record is its own.
  ReadStats stats;
  auto index = RecordIndex::BuildLibsvm(paths, format, &stats);
  ASSERT_TRUE(index.ok()) << index.status();
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 2000; ++i) {
        const int64_t e = static_cast<int64_t>(rng() % static_cast<uint64_t>(whole.num_examples()));
        SparseDataset one;
        if (!(*index)->Read(e, &one).ok() || one.labels[0] != whole.labels[static_cast<size_t>(e)] ||
            one.ids[0] != whole.ids[static_cast<size_t>(whole.offsets[static_cast<size_t>(e)])]) {
          ++wrong[static_cast<size_t>(t)];
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
  EXPECT_EQ((*index)->Read(whole.num_examples(), &whole).code(), absl::StatusCode::kOutOfRange);

  // CSV with a header in each file.
  CsvFormat csv;
  csv.columns = {CsvFormat::Column::kLabel, CsvFormat::Column::kDense, CsvFormat::Column::kCategorical};
  csv.header = true;
  TempFile a("y,x,site\n1,0.5,news\n0,,shop\n"), b("y,x,site\n1,2,\"a,b\"\nbad\n0,3,c");
  SparseDataset csv_whole;
  ReadStats csv_stats;
  ASSERT_TRUE(ReadCsvFile(a.path(), csv, &csv_whole, &csv_stats).ok());
  ASSERT_TRUE(ReadCsvFile(b.path(), csv, &csv_whole, &csv_stats).ok());
  ReadStats csv_index_stats;
  auto csv_index = RecordIndex::BuildCsv({a.path(), b.path()}, csv, &csv_index_stats);
  ASSERT_TRUE(csv_index.ok()) << csv_index.status();
  EXPECT_EQ(csv_index_stats.bad, 1);
  EXPECT_EQ((*csv_index)->num_dense(), 1);
  EXPECT_EQ((*csv_index)->num_fields(), 1);
  const SparseDataset csv_back = ReadAll(**csv_index);
  EXPECT_EQ(csv_back.labels, csv_whole.labels);
  EXPECT_EQ(csv_back.dense, csv_whole.dense);
  EXPECT_EQ(csv_back.ids, csv_whole.ids);
  EXPECT_EQ(csv_back.offsets, csv_whole.offsets);
}

// Bad records fail the index under FAIL (file and line named), a negative
// libsvm value is bad when the format says values must not be, an index
// beyond its byte limit is RESOURCE_EXHAUSTED, and a missing file NOT_FOUND.
TEST(RecordIndexTest, BadRecordsLimitsAndMissingFilesAreClearErrors) {
  TempFile file("1 1:1\n0 2:-0.5\n1 3:1\n");
  LibsvmFormat format;
  format.nonnegative_values = true;
  ReadStats stats;
  auto skipped = RecordIndex::BuildLibsvm({file.path()}, format, &stats);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ((*skipped)->num_examples(), 2);
  ASSERT_EQ(stats.first_bad.size(), 1u);
  EXPECT_TRUE(Has(stats.first_bad[0], ":2: value -0.5 of feature 2 is negative")) << stats.first_bad[0];
  format.limits.on_bad_record = BadRecordPolicy::kFail;
  auto failed = RecordIndex::BuildLibsvm({file.path()}, format, &stats);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(std::string(failed.status().message()), file.path() + ":2:")) << failed.status();

  std::string big;
  for (int i = 0; i < 1000; ++i) absl::StrAppend(&big, "1 ", i, ":1\n");
  TempFile large(big);
  auto over = RecordIndex::BuildLibsvm({large.path()}, {}, &stats, /*max_bytes=*/4000);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  // It stops inside the file, at the record past the limit.
  EXPECT_TRUE(Has(std::string(over.status().message()), large.path() + ":501: the index of 501 records"))
      << over.status();
  EXPECT_TRUE(RecordIndex::BuildLibsvm({large.path()}, {}, &stats, /*max_bytes=*/9000).ok());

  // A step's read of records is bounded too: long lines (here 100 ids each)
  // stop it at the record that passes its bytes.
  std::string wide;
  for (int line = 0; line < 10; ++line) {
    absl::StrAppend(&wide, "1");
    for (int i = 0; i < 100; ++i) absl::StrAppend(&wide, " ", line * 100 + i, ":1");
    absl::StrAppend(&wide, "\n");
  }
  TempFile wide_file(wide);
  auto wide_index = RecordIndex::BuildLibsvm({wide_file.path()}, {}, &stats);
  ASSERT_TRUE(wide_index.ok()) << wide_index.status();
  const std::vector<int64_t> step = {9, 3, 5, 1, 0};
  SparseDataset batch;
  // A record takes a label (4), 100 ids (100 x 12) and an offset (8): three fit.
  const absl::Status bounded =
      (*wide_index)->Read(step.data(), step.size(), &batch, /*max_bytes=*/3 * 1212 + 8);
  EXPECT_EQ(bounded.code(), absl::StatusCode::kResourceExhausted) << bounded;
  EXPECT_TRUE(Has(std::string(bounded.message()),
                  "the 4 records read (the last record 1) take 4856 bytes, more than 3644"))
      << bounded;
  SparseDataset whole;
  EXPECT_TRUE((*wide_index)->Read(step.data(), step.size(), &whole, /*max_bytes=*/5 * 1212 + 8).ok());
  EXPECT_EQ(whole.num_examples(), 5);

  auto missing = RecordIndex::BuildLibsvm({"/tmp/ctr_data_test_no_such_file"}, {}, &stats);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// A read into a dataset stops at the first record past max_dataset_bytes,
// naming the file and line, whether from text or from a file.
TEST(CtrDataTest, AReadStopsAtTheRecordPastItsByteLimit) {
  std::string text;
  for (int i = 0; i < 100; ++i) absl::StrAppend(&text, "1 ", i, ":1 ", i + 1, ":1\n");
  TempFile file(text);
  LibsvmFormat format;
  // Each record takes a label (4), two ids (2 x 12) and one offset (8).
  format.limits.max_dataset_bytes = 8 + 10 * 36;
  SparseDataset data;
  ReadStats stats;
  absl::Status status = ReadLibsvmFile(file.path(), format, &data, &stats);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_TRUE(Has(std::string(status.message()), file.path() + ":11:")) << status;
  EXPECT_LE(data.num_examples(), 11);
  SparseDataset fits;
  format.limits.max_dataset_bytes = 8 + 100 * 36;
  EXPECT_TRUE(ParseLibsvm(text, "f", format, &fits, &stats).ok());
  EXPECT_EQ(fits.num_examples(), 100);
  EXPECT_EQ(HeldBytes(fits), 8 + 100 * 36);
  // Read, its vectors grew ahead of their records; shrunk, they hold them alone.
  ShrinkToFit(&fits);
  EXPECT_EQ(fits.ids.capacity(), fits.ids.size());
  EXPECT_EQ(fits.weights.capacity(), fits.weights.size());
  EXPECT_EQ(fits.offsets.capacity(), fits.offsets.size());
  EXPECT_EQ(fits.labels.capacity(), fits.labels.size());
}

// A file changed after it was indexed (rewritten in place with other
// records at other offsets, cut short, removed and replaced, or replaced by
// a file of the same size and modification time) fails every read of it
// with DATA_LOSS naming it; no read yields another record.
TEST(RecordIndexTest, AFileChangedSinceItWasIndexedFailsItsReadsNamingIt) {
  const std::string text = "1 10:1\n0 20:1\n1 30:1\n";
  for (int change = 0; change < 4; ++change) {
    SCOPED_TRACE(change);
    TempFile file(text);
    ReadStats stats;
    auto index = RecordIndex::BuildLibsvm({file.path()}, {}, &stats);
    ASSERT_TRUE(index.ok()) << index.status();
    if (change == 3) {  // not opened since it was indexed
      const std::string other = file.path() + ".new";
      std::ofstream(other, std::ios::binary) << "1 11:1\n0 21:1\n1 31:1\n";
      struct stat old_times {};
      ASSERT_EQ(stat(file.path().c_str(), &old_times), 0);
      const timespec times[2] = {old_times.st_atim, old_times.st_mtim};
      ASSERT_EQ(utimensat(AT_FDCWD, other.c_str(), times, 0), 0);
      ASSERT_EQ(std::rename(other.c_str(), file.path().c_str()), 0);
      for (int64_t e = 0; e < 3; ++e) {
        SparseDataset out;
        const absl::Status read = (*index)->Read(e, &out);
        EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
        EXPECT_TRUE(out.labels.empty());
      }
      continue;
    }
    SparseDataset first;
    ASSERT_TRUE((*index)->Read(1, &first).ok());  // the file is now held open
    EXPECT_EQ(first.ids, (std::vector<uint64_t>{20}));
    if (change == 0) {  // same size, other records: only its time tells
      std::fstream(file.path(), std::ios::in | std::ios::out | std::ios::binary) << "1 11:1\n0 21:1\n1 31:1\n";
      timespec times[2] = {{0, UTIME_OMIT}, {0, 0}};
      ASSERT_EQ(clock_gettime(CLOCK_REALTIME, &times[1]), 0);
      times[1].tv_sec += 5;  // a step a coarse clock could not miss
      ASSERT_EQ(utimensat(AT_FDCWD, file.path().c_str(), times, 0), 0);
    } else if (change == 1) {
      ASSERT_EQ(truncate(file.path().c_str(), 10), 0);
    } else {
      std::remove(file.path().c_str());
      std::ofstream(file.path(), std::ios::binary) << "0 99:1\n";
    }
    for (int64_t e = 0; e < 3; ++e) {
      // Removing the file held open changes it too (its link count and
      // time): every worker fails alike, whichever held it open.
      SparseDataset out;
      const absl::Status read = (*index)->Read(e, &out);
      EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
      EXPECT_TRUE(Has(std::string(read.message()), file.path())) << read;
      EXPECT_TRUE(out.labels.empty());
    }
    if (change == 2) {
      // A new index of the same path opens the new file.
      auto fresh = RecordIndex::BuildLibsvm({file.path()}, {}, &stats);
      ASSERT_TRUE(fresh.ok());
      EXPECT_EQ((*fresh)->num_examples(), 1);
    }
  }
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

// A large count is made on several threads, and a generator makes the
// examples one at a time in any order: the same examples either way.
TEST(CtrDataTest, SyntheticCtrIsTheSameOnAnyNumberOfThreadsAndInAnyOrder) {
  SyntheticCtrSpec spec;
  spec.seed = 5;
  spec.fields = 3;
  spec.dense = 1;
  spec.fm_dim = 2;
  constexpr int64_t kFirst = 7, kCount = 300001;  // four threads' worth, not a multiple of four
  std::vector<float> one_truth, four_truth;
  const SparseDataset one = MakeSyntheticCtr(spec, 1, kFirst, kCount, &one_truth, /*threads=*/1);
  const SparseDataset four = MakeSyntheticCtr(spec, 1, kFirst, kCount, &four_truth, /*threads=*/4);
  ASSERT_EQ(one.num_examples(), kCount);
  EXPECT_EQ(four.labels, one.labels);
  EXPECT_EQ(four.dense, one.dense);
  EXPECT_EQ(four.ids, one.ids);
  EXPECT_EQ(four.weights, one.weights);
  EXPECT_EQ(four.offsets, one.offsets);
  EXPECT_EQ(four_truth, one_truth);
  // Laid out once, written in place: the set takes its records' bytes,
  // label, dense value and per id its key, weight and offset, and no more.
  EXPECT_EQ(HeldBytes(four), kCount * (4 + 4 + 3 * 20) + 8);
  EXPECT_EQ(four.ids.capacity(), four.ids.size());
  EXPECT_EQ(four.weights.capacity(), four.weights.size());
  EXPECT_EQ(four.offsets.capacity(), four.offsets.size());
  EXPECT_EQ(four.labels.capacity(), four.labels.size());
  EXPECT_EQ(four.dense.capacity(), four.dense.size());

  const SyntheticCtrGenerator generator(spec, 1);
  SparseDataset backwards;
  backwards.num_dense = spec.dense;
  backwards.num_fields = spec.fields;
  std::vector<float> truth;
  for (int64_t e = kFirst + 99; e >= kFirst; --e) generator.Append(e, &backwards, &truth);
  for (int64_t i = 0; i < 100; ++i) {
    const auto mine = static_cast<size_t>(99 - i), theirs = static_cast<size_t>(i);
    ASSERT_EQ(backwards.labels[mine], one.labels[theirs]) << i;
    ASSERT_EQ(backwards.dense[mine], one.dense[theirs]) << i;
    ASSERT_EQ(truth[mine], one_truth[theirs]) << i;
    for (size_t f = 0; f < 3; ++f) ASSERT_EQ(backwards.ids[mine * 3 + f], one.ids[theirs * 3 + f]) << i;
  }
}

TEST(CtrDataTest, AucCountsPairsInOrderAndTiesHalf) {
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75);  // the classic four-point example
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.2f, 0.3f}, {0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(Auc({0.3f, 0.2f, 0.1f}, {0, 1, 1}), 0.0);
  EXPECT_DOUBLE_EQ(Auc({0.5f, 0.5f}, {0, 1}), 0.5);
  EXPECT_DOUBLE_EQ(Auc({0.5f, 0.5f, 0.9f}, {0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.2f}, {1, 1}), 0.5) << "one class only";
}

// NaN scores (a diverged model's) end the count: they rank above every
// number, tied with each other (a run of NaNs used to never end).
TEST(CtrDataTest, AucOfNaNScoresEnds) {
  const float nan = std::nanf("");
  EXPECT_DOUBLE_EQ(Auc({nan, nan}, {0, 1}), 0.5);
  EXPECT_DOUBLE_EQ(Auc({0.1f, nan}, {0, 1}), 1.0);
  EXPECT_DOUBLE_EQ(Auc({nan, 0.1f, nan, 0.2f}, {1, 0, 0, 1}), 0.625);  // 0.2 > 0.1, NaN > 0.1, NaN = NaN
  std::vector<float> scores(1000), labels(1000);
  for (size_t i = 0; i < scores.size(); ++i) {
    scores[i] = i % 3 == 0 ? nan : static_cast<float>(i % 17);
    labels[i] = static_cast<float>(i % 2);
  }
  const double auc = Auc(scores, labels);
  EXPECT_GE(auc, 0.0);
  EXPECT_LE(auc, 1.0);
}

// A file's UTF-8 byte order mark (Excel's "CSV UTF-8" export writes one) is
// no part of its first record, in CSV as in libsvm; a libsvm line of a
// comment only (as scikit-learn's dump_svmlight_file writes) is no record
// and no bad one.
TEST(CtrDataTest, AByteOrderMarkAndCommentLinesAreNoPartOfAnyRecord) {
  CsvFormat csv;
  csv.columns = {CsvFormat::Column::kLabel, CsvFormat::Column::kCategorical};
  for (bool header : {false, true}) {
    SCOPED_TRACE(header ? "with a header" : "without a header");
    csv.header = header;
    SparseDataset data;
    ReadStats stats;
    const std::string text =
        std::string("\xEF\xBB\xBF") + (header ? "clicked,site\n" : "") + "1,news\n0,shop\n";
    ASSERT_TRUE(ParseCsv(text, "excel.csv", csv, &data, &stats).ok());
    EXPECT_EQ(stats.records, 2);
    EXPECT_EQ(stats.bad, 0) << (stats.first_bad.empty() ? "" : stats.first_bad[0]);
    EXPECT_EQ(data.labels, (std::vector<float>{1, 0}));
    EXPECT_EQ(data.ids, (std::vector<uint64_t>{CategoricalId(0, "news"), CategoricalId(0, "shop")}));
  }
  SparseDataset data;
  ReadStats stats;
  ASSERT_TRUE(ParseLibsvm("\xEF\xBB\xBF# written by dump_svmlight_file\n1 3:1\n  # another\n0 4:1 # kept\n",
                          "sk.svm", {}, &data, &stats)
                  .ok());
  EXPECT_EQ(stats.records, 2);
  EXPECT_EQ(stats.bad, 0) << (stats.first_bad.empty() ? "" : stats.first_bad[0]);
  EXPECT_EQ(data.ids, (std::vector<uint64_t>{3, 4}));
  // A byte order mark past the first line is no mark: its line is bad.
  SparseDataset late;
  ReadStats late_stats;
  ASSERT_TRUE(ParseLibsvm("1 3:1\n\xEF\xBB\xBF"
                          "0 4:1\n",
                          "late.svm", {}, &late, &late_stats)
                  .ok());
  EXPECT_EQ(late_stats.bad, 1);
}

}  // namespace
}  // namespace fulcrum
