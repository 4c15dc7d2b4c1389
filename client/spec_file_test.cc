#include "client/spec_file.h"

#include "absl/strings/str_cat.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "fulcrum/v1/job.pb.h"
#include "common/test_util.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

// A unique, empty directory under the test's temp dir.
std::filesystem::path FreshTempDir(const std::string& name) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                              (std::string("spec_file_test_") + info->name() + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

constexpr char kCamelYaml[] = R"(
# comment
name: camel
model:
  kind: MLP
  hiddenSizes: [256, 128]
  activation: TANH
data:
  dataset: SYNTHETIC
  batchSize: 32
  epochs: 4
  syntheticExamples: 5000
  syntheticFeatures: 20
  syntheticClasses: 3
  shuffleSeed: 9
  maxSteps: 100
optimizer:
  kind: ADAM
  lr: 1e-3
  beta1: 0.8
  weightDecay: 0.1
lrSchedule:
  kind: WARMUP_COSINE
  warmupSteps: 10
  minLr: 0.0001
mode: ASP
numWorkers: 3
numShards: 2
seed: 18446744073709551615
)";

TEST(SpecFileTest, CamelCaseYamlParsesIntoTheRightFields) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(kCamelYaml, "camel.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "camel");
  EXPECT_EQ(spec->model().kind(), v1::ModelSpec::MLP);
  ASSERT_EQ(spec->model().hidden_sizes_size(), 2);
  EXPECT_EQ(spec->model().hidden_sizes(0), 256);
  EXPECT_EQ(spec->model().hidden_sizes(1), 128);
  EXPECT_EQ(spec->model().activation(), v1::TANH);
  EXPECT_EQ(spec->data().dataset(), v1::DataSpec::SYNTHETIC);
  EXPECT_EQ(spec->data().batch_size(), 32);
  EXPECT_EQ(spec->data().epochs(), 4);
  EXPECT_EQ(spec->data().synthetic_examples(), 5000);
  EXPECT_EQ(spec->data().synthetic_features(), 20);
  EXPECT_EQ(spec->data().synthetic_classes(), 3);
  EXPECT_EQ(spec->data().shuffle_seed(), 9u);
  EXPECT_EQ(spec->data().max_steps(), 100);
  EXPECT_EQ(spec->optimizer().kind(), v1::OptimizerSpec::ADAM);
  EXPECT_EQ(spec->optimizer().lr(), 1e-3f);
  EXPECT_EQ(spec->optimizer().beta1(), 0.8f);
  EXPECT_EQ(spec->optimizer().weight_decay(), 0.1f);
  EXPECT_EQ(spec->lr_schedule().kind(), v1::LrScheduleSpec::WARMUP_COSINE);
  EXPECT_EQ(spec->lr_schedule().warmup_steps(), 10);
  EXPECT_EQ(spec->lr_schedule().min_lr(), 0.0001f);
  EXPECT_EQ(spec->mode(), v1::ASP);
  EXPECT_EQ(spec->num_workers(), 3);
  EXPECT_EQ(spec->num_shards(), 2);
  EXPECT_EQ(spec->seed(), 18446744073709551615ull);
}

TEST(SpecFileTest, SnakeCaseYamlParsesIntoTheSameFields) {
  constexpr char kSnake[] = R"(
name: camel
model:
  kind: MLP
  hidden_sizes: [256, 128]
  activation: TANH
data:
  dataset: SYNTHETIC
  batch_size: 32
  epochs: 4
  synthetic_examples: 5000
  synthetic_features: 20
  synthetic_classes: 3
  shuffle_seed: 9
  max_steps: 100
optimizer:
  kind: ADAM
  lr: 1e-3
  beta1: 0.8
  weight_decay: 0.1
lr_schedule:
  kind: WARMUP_COSINE
  warmup_steps: 10
  min_lr: 0.0001
mode: ASP
num_workers: 3
num_shards: 2
seed: 18446744073709551615
)";
  absl::StatusOr<v1::JobSpec> snake = ParseJobSpec(kSnake, "snake.yaml");
  ASSERT_TRUE(snake.ok()) << snake.status();
  absl::StatusOr<v1::JobSpec> camel = ParseJobSpec(kCamelYaml, "camel.yaml");
  ASSERT_TRUE(camel.ok()) << camel.status();
  EXPECT_EQ(snake->SerializeAsString(), camel->SerializeAsString());
  EXPECT_EQ(snake->lr_schedule().min_lr(), 0.0001f);
  EXPECT_EQ(snake->data().batch_size(), 32);
}

TEST(SpecFileTest, BlockSequencesAndDecimalFloats) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(R"(
model:
  kind: MLP
  hiddenSizes:
    - 64
    - 32
    - 16
optimizer:
  lr: 0.1
  momentum: 0.9
  nesterov: true
)",
                                                  "block.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->model().hidden_sizes_size(), 3);
  EXPECT_EQ(spec->model().hidden_sizes(2), 16);
  EXPECT_EQ(spec->optimizer().lr(), 0.1f);
  EXPECT_EQ(spec->optimizer().momentum(), 0.9f);
  EXPECT_TRUE(spec->optimizer().nesterov());
}

TEST(SpecFileTest, Uint64SeedsKeepEveryDigit) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{9007199254740993ull},  // 2^53 + 1
                        uint64_t{9223372036854775807ull}, uint64_t{9223372036854775808ull},
                        uint64_t{18446744073709551615ull}}) {
    const std::string yaml = "seed: " + std::to_string(seed) + "\n";
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(yaml, "seed.yaml");
    ASSERT_TRUE(spec.ok()) << seed << ": " << spec.status();
    EXPECT_EQ(spec->seed(), seed);
  }
}

TEST(SpecFileTest, JsonInputWorks) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(
      R"({"name": "json-job", "model": {"kind": "SOFTMAX_REGRESSION"},
          "data": {"dataset": "FASHION_MNIST", "batchSize": 128, "path": "/tmp/fm"},
          "optimizer": {"kind": "SGD", "lr": 0.01},
          "mode": "BSP", "num_workers": 2, "seed": "18446744073709551615"})",
      "spec.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "json-job");
  EXPECT_EQ(spec->model().kind(), v1::ModelSpec::SOFTMAX_REGRESSION);
  EXPECT_EQ(spec->data().dataset(), v1::DataSpec::FASHION_MNIST);
  EXPECT_EQ(spec->data().batch_size(), 128);
  EXPECT_EQ(spec->data().path(), "/tmp/fm");
  EXPECT_EQ(spec->optimizer().lr(), 0.01f);
  EXPECT_EQ(spec->mode(), v1::BSP);
  EXPECT_EQ(spec->num_workers(), 2);
  EXPECT_EQ(spec->seed(), 18446744073709551615ull);
}

TEST(SpecFileTest, QuotedStringsStayStrings) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec("name: \"say \\\"hi\\\"\\tnow\"\ndata:\n  path: '/data/with space'\n",
                   "quoted.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "say \"hi\"\tnow");
  EXPECT_EQ(spec->data().path(), "/data/with space");
}

TEST(SpecFileTest, UnknownFieldIsInvalidArgumentNamingIt) {
  absl::StatusOr<v1::JobSpec> top = ParseJobSpec("name: x\nbatchSise: 3\n", "typo.yaml");
  EXPECT_EQ(top.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(top.status().message(), "batchSise"));
  EXPECT_TRUE(Contains(top.status().message(), "typo.yaml"));

  absl::StatusOr<v1::JobSpec> nested =
      ParseJobSpec("data:\n  batchSize: 3\n  learningRate: 0.1\n", "nested.yaml");
  EXPECT_EQ(nested.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(nested.status().message(), "learningRate"));
}

// A field given twice is refused, also when once by its JSON name and once
// by its proto name (the last one used to win).
TEST(SpecFileTest, AFieldGivenTwiceUnderItsTwoNamesIsRefused) {
  for (const char* text : {"data:\n  batchSize: 64\n  batch_size: 32\n",
                           "{\"data\": {\"batchSize\": 64, \"batch_size\": 32}}\n"}) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(text, "twice.yaml");
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(
        Contains(spec.status().message(), "field \"batch_size\" is given twice, also as \"batchSize\""))
        << spec.status();
  }
  absl::StatusOr<v1::JobSpec> same = ParseJobSpec("name: a\nname: b\n", "twice.yaml");
  EXPECT_TRUE(Contains(same.status().message(), "field \"name\" is given twice")) << same.status();
}

// A spec is one document: what follows it (a second JSON object, a "---"
// document, stray text) is refused, not dropped.
TEST(SpecFileTest, MoreThanOneDocumentIsRefused) {
  for (const char* text : {"{\"name\": \"a\"}{\"name\": \"b\"}\n", "{\"name\": \"a\"} xyz\n",
                           "{\"name\": \"a\"}\n{\"name\": \"b\"}\n", "name: a\n---\nname: b\n"}) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(text, "two.json");
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(Contains(spec.status().message(), "the spec must be one document")) << spec.status();
  }
  EXPECT_TRUE(ParseJobSpec("name: a\n---\n", "one.yaml").ok()) << "an empty document after the end marker";
}

TEST(SpecFileTest, WrongTypeIsInvalidArgument) {
  absl::StatusOr<v1::JobSpec> word = ParseJobSpec("data:\n  batchSize: \"abc\"\n", "t.yaml");
  EXPECT_EQ(word.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(word.status().message(), "t.yaml"));

  absl::StatusOr<v1::JobSpec> plain = ParseJobSpec("data:\n  batchSize: abc\n", "t.yaml");
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<v1::JobSpec> list = ParseJobSpec("data:\n  batchSize: [1, 2]\n", "t.yaml");
  EXPECT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<v1::JobSpec> fraction = ParseJobSpec("data:\n  batchSize: 1.5\n", "t.yaml");
  EXPECT_EQ(fraction.status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<v1::JobSpec> enum_value = ParseJobSpec("mode: FASTEST\n", "t.yaml");
  EXPECT_EQ(enum_value.status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<v1::JobSpec> not_a_message = ParseJobSpec("model: MLP\n", "t.yaml");
  EXPECT_EQ(not_a_message.status().code(), absl::StatusCode::kInvalidArgument);

  // In the spec's words: the field as written, what it takes.
  EXPECT_TRUE(Contains(word.status().message(), "(data.batchSize)")) << word.status();
  EXPECT_TRUE(Contains(word.status().message(), "must be a whole number")) << word.status();
  EXPECT_TRUE(Contains(list.status().message(), "takes one value, not a list")) << list.status();
  EXPECT_TRUE(Contains(enum_value.status().message(), "must be one of BSP, ASP, SSP")) << enum_value.status();
  EXPECT_TRUE(Contains(not_a_message.status().message(), "must be a mapping of fields"))
      << not_a_message.status();
  absl::StatusOr<v1::JobSpec> number = ParseJobSpec("optimizer: {lr: x}\n", "t.yaml");
  EXPECT_TRUE(Contains(number.status().message(), "(optimizer.lr): invalid value \"x\": it must be a number"))
      << number.status();
}

TEST(SpecFileTest, YamlSyntaxErrorIsInvalidArgumentWithLine) {
  // The unterminated flow sequence opened on line 3.
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec("name: x\nmodel:\n  hiddenSizes: [1, 2\n  kind: MLP\n", "broken.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(spec.status().message(), "broken.yaml"));
  EXPECT_TRUE(Contains(spec.status().message(), "line "));

  // A bad indentation on line 4.
  absl::StatusOr<v1::JobSpec> indent =
      ParseJobSpec("name: x\ndata:\n  batchSize: 1\n epochs: 2\n", "indent.yaml");
  ASSERT_EQ(indent.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(indent.status().message(), "line 4")) << indent.status();
}

// A kilobyte of YAML aliases that would expand to gigabytes: refused
// within the bound, quickly, without taking the memory.
TEST(SpecFileTest, AliasBombIsRefusedWithinTheBound) {
  std::string yaml = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  std::string previous = "a";
  for (char c = 'b'; c <= 'k'; ++c) {
    yaml += absl::StrCat(std::string(1, c), ": &", std::string(1, c), " [");
    for (int i = 0; i < 10; ++i) yaml += absl::StrCat(i ? ", " : "", "*", previous);
    yaml += "]\n";
    previous = std::string(1, c);
  }
  yaml += "name: *k\n";
  ASSERT_LT(yaml.size(), 2048u);
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(yaml, "bomb.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SpecFileTest, DeepNestingAndHugeSpecsAreRefused) {
  const std::string deep = "name: " + std::string(100000, '[') + std::string(100000, ']') + "\n";
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(deep, "deep.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(spec.status().message(), "nested")) << spec.status();
  const std::string huge = "name: \"" + std::string(2 << 20, 'x') + "\"\n";
  spec = ParseJobSpec(huge, "huge.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(spec.status().message(), "bytes")) << spec.status();
}

// The nesting bound counts flow collections only: brackets inside quoted
// strings (with escaped quotes), comments and plain scalars are text. Found
// by the spec fuzzer: a name holding \" and many '[' parsed from YAML but
// not from its own JSON.
TEST(SpecFileTest, BracketsInTextAreNotNesting) {
  const std::string brackets(100, '[');
  const std::pair<std::string, bool> cases[] = {  // the text, whether the name holds the brackets
      {"name: \"a\\\"" + brackets + "\"\n", true},
      {"{\"name\": \"\\u000b\\\"  " + brackets + " \\\"\"}", true},
      {"name: '" + brackets + "'\n", true},
      {"name: x" + brackets + "\n", true},
      {"# " + brackets + "\nname: x\n", false},
      {"name: x # " + brackets + "\n", false}};
  for (const auto& [text, in_name] : cases) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(text, "brackets.yaml");
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    EXPECT_EQ(Contains(spec->name(), brackets), in_name) << text;
  }
  // A quote in the middle of a plain scalar opens nothing: the brackets
  // after it are still counted.
  const std::string hidden = "name: [a'b, " + std::string(100, '[') + std::string(101, ']') + "\n";
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(hidden, "hidden.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(spec.status().message(), "nested")) << spec.status();
}

// A file that is not a spec (a password file given by mistake) is refused
// without echoing what it holds.
TEST(SpecFileTest, ContentOfANonSpecFileIsNotEchoed) {
  for (const char* text : {"root:$6$saltsalt$hashhashhash:19000:0:99999:7:::\nbin:*:19000:0:99999:7:::\n",
                           "sup3rs3cret-password: hunter2\n", "data:\n  s3cr3t$k3y: 1\n"}) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(text, "shadow");
    ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << text;
    for (const char* secret : {"hashhash", "hunter2", "s3cr3t", "sup3rs3cret", "saltsalt"}) {
      EXPECT_FALSE(Contains(spec.status().message(), secret)) << spec.status();
    }
  }
}

TEST(SpecFileTest, NonMappingDocumentIsInvalidArgument) {
  for (const char* text : {"- a\n- b\n", "just a string\n", "42\n", ""}) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(text, "list.yaml");
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << "'" << text << "'";
    EXPECT_TRUE(Contains(spec.status().message(), "mapping")) << "'" << text << "'";
  }
}

TEST(SpecFileTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = (FreshTempDir("missing") / "no-such-spec.yaml").string();
  absl::StatusOr<v1::JobSpec> spec = ReadJobSpecFile(path);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(spec.status().message(), path));
}

TEST(SpecFileTest, ReadsAFile) {
  const std::filesystem::path path = FreshTempDir("read") / "job.yaml";
  {
    std::ofstream out(path);
    out << kCamelYaml;
  }
  absl::StatusOr<v1::JobSpec> spec = ReadJobSpecFile(path.string());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "camel");
  EXPECT_EQ(spec->seed(), 18446744073709551615ull);

  // Errors from a file name the file.
  const std::filesystem::path bad = path.parent_path() / "bad.yaml";
  {
    std::ofstream out(bad);
    out << "bogus: 1\n";
  }
  absl::StatusOr<v1::JobSpec> rejected = ReadJobSpecFile(bad.string());
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(rejected.status().message(), bad.string()));
}

TEST(SpecFileTest, EveryExampleParses) {
  const std::string file = __FILE__;
  const std::string suffix = "client/spec_file_test.cc";
  if (!absl::EndsWith(file, suffix)) GTEST_SKIP() << "unexpected __FILE__ " << file;
  const std::filesystem::path examples =
      std::filesystem::path(file.substr(0, file.size() - suffix.size())) / "examples";
  if (!std::filesystem::is_directory(examples)) {
    GTEST_SKIP() << "no examples directory at " << examples;
  }
  int parsed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(examples)) {
    if (entry.path().extension() != ".yaml") continue;
    absl::StatusOr<v1::JobSpec> spec = ReadJobSpecFile(entry.path().string());
    ASSERT_TRUE(spec.ok()) << entry.path() << ": " << spec.status();
    EXPECT_NE(spec->model().kind(), v1::ModelSpec::KIND_UNSPECIFIED) << entry.path();
    EXPECT_NE(spec->data().dataset(), v1::DataSpec::DATASET_UNSPECIFIED) << entry.path();
    EXPECT_GT(spec->optimizer().lr(), 0) << entry.path();
    ++parsed;
  }
  EXPECT_GT(parsed, 0) << "no *.yaml in " << examples;
}

}  // namespace
}  // namespace fulcrum
