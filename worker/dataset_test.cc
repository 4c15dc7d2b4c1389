#include "worker/dataset.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

void AppendBigEndian32(uint32_t value, std::vector<uint8_t>* out) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    out->push_back(static_cast<uint8_t>(value >> shift));
  }
}

std::vector<uint8_t> IdxBytes(uint32_t magic, const std::vector<uint32_t>& dims,
                              const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> bytes;
  AppendBigEndian32(magic, &bytes);
  for (uint32_t d : dims) AppendBigEndian32(d, &bytes);
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  return bytes;
}

// 3 images of 2x2 pixels and their labels.
const std::vector<uint8_t> kPixels = {0, 255, 51, 102,  //
                                      255, 0, 0, 0,     //
                                      1, 2, 3, 4};
const std::vector<uint8_t> kLabels = {7, 0, 9};

std::vector<uint8_t> GoodImages() {
  return IdxBytes(0x803, {3, 2, 2}, kPixels);
}
std::vector<uint8_t> GoodLabels() { return IdxBytes(0x801, {3}, kLabels); }

class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/fulcrum_dataset_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
  }

  std::string WriteRaw(const std::string& name,
                       const std::vector<uint8_t>& bytes) {
    const std::string path = dir_ + "/" + name;
    FILE* f = std::fopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr) << path;
    if (f == nullptr) return path;
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    return path;
  }

  std::string WriteGz(const std::string& name,
                      const std::vector<uint8_t>& bytes) {
    const std::string path = dir_ + "/" + name;
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr) << path;
    if (f == nullptr) return path;
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
    return path;
  }

  std::string dir_;
};

void ExpectGoodDataset(const absl::StatusOr<Dataset>& dataset) {
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->num_examples, 3);
  EXPECT_EQ(dataset->num_features, 4);
  EXPECT_EQ(dataset->num_classes, 10);
  ASSERT_EQ(dataset->features.size(), kPixels.size());
  for (size_t i = 0; i < kPixels.size(); ++i) {
    EXPECT_FLOAT_EQ(dataset->features[i], kPixels[i] / 255.0f) << i;
  }
  EXPECT_FLOAT_EQ(dataset->features[1], 1.0f);
  EXPECT_FLOAT_EQ(dataset->features[2], 0.2f);
  EXPECT_EQ(dataset->labels, (std::vector<int32_t>{7, 0, 9}));
}

void ExpectError(const absl::Status& status, absl::StatusCode code,
                 const std::vector<std::string>& fragments) {
  EXPECT_EQ(status.code(), code) << status;
  for (const std::string& fragment : fragments) {
    EXPECT_NE(status.message().find(fragment), std::string::npos)
        << "missing '" << fragment << "' in: " << status.message();
  }
}

TEST_F(DatasetTest, LoadsGzipFiles) {
  ExpectGoodDataset(LoadIdx(WriteGz("images.gz", GoodImages()),
                            WriteGz("labels.gz", GoodLabels())));
}

TEST_F(DatasetTest, LoadsRawFiles) {
  ExpectGoodDataset(LoadIdx(WriteRaw("images", GoodImages()),
                            WriteRaw("labels", GoodLabels())));
}

TEST_F(DatasetTest, TruncatedImagesReportExpectedAndActualBytes) {
  std::vector<uint8_t> images = GoodImages();
  images.resize(images.size() - 5);
  const std::string path = WriteGz("images.gz", images);
  ExpectError(LoadIdx(path, WriteGz("labels.gz", GoodLabels())).status(),
              absl::StatusCode::kDataLoss,
              {path, "truncated", "expected 12 bytes", "got 7"});
}

TEST_F(DatasetTest, TruncatedHeaderIsReported) {
  const std::string path = WriteRaw("images", {0, 0, 8, 3, 0, 0});
  ExpectError(LoadIdx(path, WriteRaw("labels", GoodLabels())).status(),
              absl::StatusCode::kDataLoss, {path, "truncated"});
}

TEST_F(DatasetTest, TruncatedLabelsAreReported) {
  std::vector<uint8_t> labels = GoodLabels();
  labels.pop_back();
  const std::string path = WriteRaw("labels", labels);
  ExpectError(LoadIdx(WriteRaw("images", GoodImages()), path).status(),
              absl::StatusCode::kDataLoss,
              {path, "expected 3 bytes", "got 2"});
}

TEST_F(DatasetTest, WrongMagicNamesPathGotAndExpected) {
  // Label and image files swapped.
  const std::string images = WriteGz("images.gz", GoodLabels());
  ExpectError(LoadIdx(images, WriteGz("labels.gz", GoodImages())).status(),
              absl::StatusCode::kInvalidArgument,
              {images, "bad magic, expected 0x803", "images and labels swapped"});
  const std::string labels = WriteRaw("labels", IdxBytes(0x1234, {3}, kLabels));
  ExpectError(LoadIdx(WriteRaw("images", GoodImages()), labels).status(),
              absl::StatusCode::kInvalidArgument,
              {labels, "bad magic, expected 0x801", "not an IDX file"});
  EXPECT_EQ(LoadIdx(WriteRaw("images", GoodImages()), labels).status().message().find("0x1234"), std::string::npos)
      << "the bytes read are echoed";
}

// A Fashion-MNIST folder of the small test files, under dir_/root/fm.
TEST_F(DatasetTest, DataRootsConfineWhatAJobMayRead) {
  std::filesystem::create_directories(dir_ + "/root/fm");
  std::filesystem::create_directories(dir_ + "/outside");
  for (const char* split : {"train", "t10k"}) {
    WriteGz(absl::StrCat("root/fm/", split, "-images-idx3-ubyte.gz"), GoodImages());
    WriteGz(absl::StrCat("root/fm/", split, "-labels-idx1-ubyte.gz"), GoodLabels());
    WriteGz(absl::StrCat("outside/", split, "-images-idx3-ubyte.gz"), GoodImages());
    WriteGz(absl::StrCat("outside/", split, "-labels-idx1-ubyte.gz"), GoodLabels());
  }
  const std::vector<std::string> roots = {dir_ + "/root"};
  ExpectGoodDataset(LoadFashionMnist(dir_ + "/root/fm", true, roots));
  // Outside the roots, by name, by "..", through a linked folder and through
  // a linked file: refused before anything is opened, naming the roots.
  std::filesystem::create_directory_symlink(dir_ + "/outside", dir_ + "/root/link");
  std::filesystem::create_directories(dir_ + "/root/files");
  for (const char* split : {"train", "t10k"}) {
    std::filesystem::create_symlink(dir_ + absl::StrCat("/outside/", split, "-images-idx3-ubyte.gz"),
                                    dir_ + absl::StrCat("/root/files/", split, "-images-idx3-ubyte.gz"));
    std::filesystem::copy_file(dir_ + absl::StrCat("/root/fm/", split, "-labels-idx1-ubyte.gz"),
                               dir_ + absl::StrCat("/root/files/", split, "-labels-idx1-ubyte.gz"));
  }
  for (const std::string& path : {dir_ + "/outside", dir_ + "/root/../outside", dir_ + "/root/link",
                                  dir_ + "/root/files", std::string("/etc")}) {
    ExpectError(LoadFashionMnist(path, true, roots).status(), absl::StatusCode::kPermissionDenied,
                {path, "outside", dir_ + "/root", "--data-root"});
  }
  // No roots: anything goes.
  ExpectGoodDataset(LoadFashionMnist(dir_ + "/outside", true, {}));
}

TEST_F(DatasetTest, CountMismatchIsReported) {
  const std::string labels = WriteRaw("labels", IdxBytes(0x801, {2}, {1, 2}));
  const std::string images = WriteRaw("images", GoodImages());
  ExpectError(LoadIdx(images, labels).status(),
              absl::StatusCode::kInvalidArgument,
              {images, labels, "image count 3 != label count 2"});
}

TEST_F(DatasetTest, LabelOutOfRangeIsReported) {
  const std::string labels =
      WriteRaw("labels", IdxBytes(0x801, {3}, {1, 10, 2}));
  ExpectError(LoadIdx(WriteRaw("images", GoodImages()), labels).status(),
              absl::StatusCode::kInvalidArgument,
              {labels, "label[1] = 10", "num_classes = 10"});
}

TEST_F(DatasetTest, MissingFileNamesThePath) {
  const std::string missing = dir_ + "/no-such-images.gz";
  ExpectError(LoadIdx(missing, WriteRaw("labels", GoodLabels())).status(),
              absl::StatusCode::kNotFound, {missing});
}

// An image file that is a FIFO (or a folder) is refused at once, naming it;
// reading it would wait for a writer that may never come.
TEST_F(DatasetTest, AFileThatIsNoRegularFileIsRefusedWithoutWaiting) {
  const std::string labels = WriteRaw("labels", GoodLabels());
  const std::string fifo = dir_ + "/images-fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  ExpectError(LoadIdx(fifo, labels).status(), absl::StatusCode::kFailedPrecondition,
              {fifo, "is not a regular file (it is a FIFO)"});
  ExpectError(LoadIdx(dir_, labels).status(), absl::StatusCode::kFailedPrecondition,
              {dir_, "(it is a folder)"});
  std::filesystem::remove(fifo);
}

TEST_F(DatasetTest, CorruptGzipIsDataLoss) {
  std::vector<uint8_t> bytes = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
  bytes.insert(bytes.end(), 64, 0xff);  // not a valid deflate stream
  const std::string path = WriteRaw("images.gz", bytes);
  ExpectError(LoadIdx(path, WriteRaw("labels", GoodLabels())).status(),
              absl::StatusCode::kDataLoss, {path});
}

TEST_F(DatasetTest, FashionMnistLayoutFallsBackToRawNames) {
  WriteRaw("t10k-images-idx3-ubyte", GoodImages());
  WriteGz("t10k-labels-idx1-ubyte.gz", GoodLabels());
  ExpectGoodDataset(LoadFashionMnist(dir_, /*train=*/false));
  ExpectError(LoadFashionMnist(dir_, /*train=*/true).status(),
              absl::StatusCode::kNotFound,
              {dir_ + "/train-images-idx3-ubyte.gz",
               dir_ + "/train-images-idx3-ubyte"});
}

TEST(FashionMnistTest, LoadsRealData) {
  if (!std::filesystem::exists(kFashionMnistDir)) {
    GTEST_SKIP() << kFashionMnistDir << " is absent; install Fashion-MNIST "
                 << "there to run this test";
  }
  for (const bool train : {true, false}) {
    const absl::StatusOr<Dataset> data =
        LoadFashionMnist(kFashionMnistDir, train);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(data->num_examples, train ? 60000 : 10000);
    EXPECT_EQ(data->num_features, 784);
    EXPECT_EQ(data->num_classes, 10);
    EXPECT_EQ(data->features.size(), data->num_examples * 784u);
    EXPECT_EQ(data->labels.size(), static_cast<size_t>(data->num_examples));
    std::vector<int64_t> per_class(10, 0);
    for (int32_t label : data->labels) ++per_class[label];
    for (int64_t n : per_class) EXPECT_EQ(n, data->num_examples / 10);
    float max = 0;
    for (float v : data->features) {
      ASSERT_GE(v, 0.0f);
      ASSERT_LE(v, 1.0f);
      max = std::max(max, v);
    }
    EXPECT_EQ(max, 1.0f);
  }
}

TEST(SyntheticTest, ShapesAndLabelRange) {
  const Dataset d = MakeSynthetic(3, 200, 12, 5, 0);
  EXPECT_EQ(d.num_examples, 200);
  EXPECT_EQ(d.num_features, 12);
  EXPECT_EQ(d.num_classes, 5);
  EXPECT_EQ(d.features.size(), 200u * 12u);
  ASSERT_EQ(d.labels.size(), 200u);
  std::vector<int> seen(5, 0);
  for (int32_t label : d.labels) {
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 5);
    ++seen[label];
  }
  for (int n : seen) EXPECT_GT(n, 0);
}

TEST(SyntheticTest, DeterministicPerSeedAndSplit) {
  const Dataset a = MakeSynthetic(3, 100, 8, 4, 0);
  const Dataset b = MakeSynthetic(3, 100, 8, 4, 0);
  EXPECT_EQ(a.features, b.features);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(a.features, MakeSynthetic(3, 100, 8, 4, 1).features);
  EXPECT_NE(a.features, MakeSynthetic(4, 100, 8, 4, 0).features);
}

TEST(SyntheticTest, SplitsShareClassMeans) {
  // Per-class feature means of two splits agree to within sampling noise.
  const int f = 8, c = 3;
  const Dataset train = MakeSynthetic(5, 3000, f, c, 0);
  const Dataset test = MakeSynthetic(5, 3000, f, c, 1);
  auto class_means = [&](const Dataset& d) {
    std::vector<double> sums(f * c, 0.0), counts(c, 0.0);
    for (int64_t i = 0; i < d.num_examples; ++i) {
      counts[d.labels[i]] += 1;
      for (int j = 0; j < f; ++j) {
        sums[d.labels[i] * f + j] += d.features[i * f + j];
      }
    }
    for (int k = 0; k < f * c; ++k) sums[k] /= counts[k / f];
    return sums;
  };
  const std::vector<double> a = class_means(train), b = class_means(test);
  for (int k = 0; k < f * c; ++k) EXPECT_NEAR(a[k], b[k], 0.2) << k;
}

TEST(SyntheticTest, NonPositiveSizesGiveEmptyDataset) {
  EXPECT_EQ(MakeSynthetic(1, 0, 4, 2, 0).num_examples, 0);
  EXPECT_TRUE(MakeSynthetic(1, 10, -1, 2, 0).features.empty());
  EXPECT_TRUE(MakeSynthetic(1, 10, 4, 0, 0).labels.empty());
}

}  // namespace
}  // namespace fulcrum
