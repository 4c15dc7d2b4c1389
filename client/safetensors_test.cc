#include "client/safetensors.h"

#include <sys/wait.h>

#include <cstdint>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/test_util.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

// A unique, empty directory under the test's temp dir.
std::filesystem::path FreshTempDir() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / (std::string("safetensors_test_") + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::vector<SafetensorsTensor> SampleTensors() {
  return {
      {"layer0.weight", {2, 3}, {1.5f, -2.0f, 0.25f, 3e-8f, -1e30f, 7.0f}},
      {"layer0.bias", {3}, {0.1f, 0.2f, 0.3f}},
      {"step", {1}, {42.0f}},
  };
}

void ExpectSameTensors(const std::vector<SafetensorsTensor>& expected,
                       const std::vector<SafetensorsTensor>& actual) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual[i].name, expected[i].name);
    EXPECT_EQ(actual[i].shape, expected[i].shape) << expected[i].name;
    EXPECT_EQ(actual[i].data, expected[i].data) << expected[i].name;
  }
}

// A file with the given header text (unpadded) and data bytes.
std::string FileWithHeader(absl::string_view header, absl::string_view data) {
  std::string out;
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i)));
  return absl::StrCat(out, header, data);
}

// The data section for `n` float32 values (contents do not matter).
std::string Zeros(int n) { return std::string(4 * n, '\0'); }

uint64_t HeaderLength(absl::string_view file) {
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= static_cast<uint64_t>(static_cast<unsigned char>(file[i])) << (8 * i);
  return length;
}

TEST(SafetensorsTest, RoundTripsSeveralTensorsAndMetadata) {
  std::vector<SafetensorsTensor> tensors = SampleTensors();
  std::map<std::string, std::string> metadata = {{"format", "pt"}, {"fulcrum.job", "mnist \"v2\""}};
  absl::StatusOr<std::string> bytes = EncodeSafetensors(tensors, metadata);
  ASSERT_TRUE(bytes.ok()) << bytes.status();

  std::map<std::string, std::string> decoded_metadata = {{"stale", "entry"}};
  absl::StatusOr<std::vector<SafetensorsTensor>> decoded = DecodeSafetensors(*bytes, &decoded_metadata);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSameTensors(tensors, *decoded);
  EXPECT_EQ(decoded_metadata, metadata);
}

TEST(SafetensorsTest, RoundTripsScalarEmptyAndNoTensors) {
  std::vector<SafetensorsTensor> tensors = {
      {"scalar", {}, {3.0f}}, {"empty", {0, 4}, {}}, {"after_empty", {2}, {1.0f, 2.0f}}};
  absl::StatusOr<std::string> bytes = EncodeSafetensors(tensors, {});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<std::vector<SafetensorsTensor>> decoded = DecodeSafetensors(*bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSameTensors(tensors, *decoded);

  bytes = EncodeSafetensors({}, {});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  decoded = DecodeSafetensors(*bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(decoded->empty());
}

TEST(SafetensorsTest, RoundTripsNamesThatNeedJsonEscaping) {
  std::vector<SafetensorsTensor> tensors = {
      {"quote\"back\\slash/", {1}, {1.0f}},
      {"tab\tnewline\ncontrol\x01", {1}, {2.0f}},
      {"caf\xc3\xa9 \xf0\x9f\x98\x80", {1}, {3.0f}},
  };
  absl::StatusOr<std::string> bytes = EncodeSafetensors(tensors, {{"k\"ey", "va\\lue\n"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_TRUE(Contains(*bytes, R"("quote\"back\\slash/")"));
  EXPECT_TRUE(Contains(*bytes, R"("tab\tnewline\ncontrol\u0001")"));

  std::map<std::string, std::string> metadata;
  absl::StatusOr<std::vector<SafetensorsTensor>> decoded = DecodeSafetensors(*bytes, &metadata);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSameTensors(tensors, *decoded);
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"k\"ey", "va\\lue\n"}}));
}

TEST(SafetensorsTest, WritesTheDocumentedByteLayout) {
  absl::StatusOr<std::string> bytes = EncodeSafetensors({{"a", {2}, {1.0f, -2.5f}}}, {{"format", "pt"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();

  const std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  uint64_t header_length = HeaderLength(*bytes);
  EXPECT_EQ(header_length % 8, 0u);
  EXPECT_EQ(header_length, (json.size() + 7) / 8 * 8);
  ASSERT_EQ(bytes->size(), 8 + header_length + 8);
  absl::string_view header = absl::string_view(*bytes).substr(8, header_length);
  EXPECT_EQ(header.substr(0, json.size()), json);
  EXPECT_EQ(header.substr(json.size()), std::string(header_length - json.size(), ' '));

  // 1.0f is 0x3F800000 and -2.5f is 0xC0200000, least significant byte first.
  const unsigned char expected_data[] = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x20, 0xC0};
  EXPECT_EQ(bytes->substr(8 + header_length),
            std::string(reinterpret_cast<const char*>(expected_data), sizeof(expected_data)));
}

TEST(SafetensorsTest, LaysTensorsOutInTheOrderGiven) {
  absl::StatusOr<std::string> bytes = EncodeSafetensors({{"z", {1}, {1.0f}}, {"a", {2}, {2.0f, 3.0f}}}, {});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_TRUE(Contains(*bytes, R"("z":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})"));
  EXPECT_TRUE(Contains(*bytes, R"("a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]})"));
}

TEST(SafetensorsTest, RejectsDuplicateAndEmptyNames) {
  absl::StatusOr<std::string> duplicate = EncodeSafetensors({{"w", {1}, {1.0f}}, {"w", {1}, {2.0f}}}, {});
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(duplicate.status().message(), "duplicate tensor name \"w\""));

  absl::StatusOr<std::string> empty = EncodeSafetensors({{"", {1}, {1.0f}}}, {});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(empty.status().message(), "empty"));

  absl::StatusOr<std::string> reserved = EncodeSafetensors({{"__metadata__", {1}, {1.0f}}}, {});
  EXPECT_EQ(reserved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(reserved.status().message(), "reserved"));

  absl::StatusOr<std::string> not_utf8 = EncodeSafetensors({{"bad\xff", {1}, {1.0f}}}, {});
  EXPECT_EQ(not_utf8.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(not_utf8.status().message(), "not valid UTF-8"));
}

TEST(SafetensorsTest, RejectsDataSizeThatIsNotTheShapeProduct) {
  absl::StatusOr<std::string> bytes = EncodeSafetensors({{"w", {2, 3}, {1.0f, 2.0f}}}, {});
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bytes.status().message(), "tensor \"w\": shape [2, 3] holds 6 values but data has 2"));

  bytes = EncodeSafetensors({{"w", {2, -3}, {}}}, {});
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bytes.status().message(), "negative dimension"));
}

TEST(SafetensorsTest, WritesAndReadsAFileAtomically) {
  std::filesystem::path dir = FreshTempDir();
  std::string path = (dir / "model.safetensors").string();
  ASSERT_TRUE(WriteSafetensorsFile(path, SampleTensors(), {{"format", "pt"}}).ok());

  std::map<std::string, std::string> metadata;
  absl::StatusOr<std::vector<SafetensorsTensor>> read = ReadSafetensorsFile(path, &metadata);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameTensors(SampleTensors(), *read);
  EXPECT_EQ(metadata.at("format"), "pt");
  // Only the file itself: no temp file left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()),
            1);
}

TEST(SafetensorsTest, FileErrorsNameThePath) {
  std::filesystem::path dir = FreshTempDir();
  std::string missing_dir = (dir / "no_such_dir" / "model.safetensors").string();
  absl::Status write = WriteSafetensorsFile(missing_dir, SampleTensors(), {});
  EXPECT_FALSE(write.ok());
  EXPECT_TRUE(Contains(write.message(), missing_dir));

  absl::Status invalid = WriteSafetensorsFile((dir / "x.safetensors").string(), {{"w", {2}, {1.0f}}}, {});
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(invalid.message(), (dir / "x.safetensors").string()));
  EXPECT_FALSE(std::filesystem::exists(dir / "x.safetensors"));

  absl::StatusOr<std::vector<SafetensorsTensor>> read = ReadSafetensorsFile(missing_dir);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(read.status().message(), missing_dir));

  std::string garbage = (dir / "garbage.safetensors").string();
  std::ofstream(garbage) << "abc";
  read = ReadSafetensorsFile(garbage);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(read.status().message(), garbage));
}

TEST(SafetensorsTest, DecoderRejectsEveryTruncation) {
  absl::StatusOr<std::string> bytes = EncodeSafetensors(SampleTensors(), {{"format", "pt"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  for (size_t size = 0; size < bytes->size(); ++size) {
    absl::StatusOr<std::vector<SafetensorsTensor>> decoded = DecodeSafetensors(bytes->substr(0, size));
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss) << "truncated to " << size << " bytes";
  }
  uint64_t data_start = 8 + HeaderLength(*bytes);
  EXPECT_TRUE(Contains(DecodeSafetensors(bytes->substr(0, 5)).status().message(),
                       "truncated: the file has 5 bytes, fewer than the 8-byte header length"));
  EXPECT_TRUE(Contains(DecodeSafetensors(bytes->substr(0, 20)).status().message(), "header length"));
  EXPECT_TRUE(Contains(DecodeSafetensors(bytes->substr(0, data_start + 10)).status().message(),
                       "end past the 10-byte data section (file truncated?)"));
}

TEST(SafetensorsTest, DecoderRejectsHeaderLongerThanTheFile) {
  std::string file = FileWithHeader("{}", "");
  file[0] = static_cast<char>(200);
  absl::StatusOr<std::vector<SafetensorsTensor>> decoded = DecodeSafetensors(file);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(
      Contains(decoded.status().message(), "header length 200 exceeds the 2 bytes after the length field"));
}

TEST(SafetensorsTest, DecoderRejectsOverlapsGapsAndOutOfRangeOffsets) {
  auto decode_error = [](absl::string_view header, int values) {
    return DecodeSafetensors(FileWithHeader(header, Zeros(values))).status();
  };
  absl::Status overlap = decode_error(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      3);
  EXPECT_EQ(overlap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(overlap.message(),
                       "tensor \"b\": data_offsets [4, 12] overlap tensor \"a\", which ends at 8"));

  absl::Status gap = decode_error(
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
      3);
  EXPECT_EQ(gap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(gap.message(), "tensor \"b\": data_offsets [8, 12] leave a gap"));

  absl::Status past_end = decode_error(R"({"a":{"dtype":"F32","shape":[100],"data_offsets":[0,400]}})", 4);
  EXPECT_EQ(past_end.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(
      Contains(past_end.message(), "tensor \"a\": data_offsets [0, 400] end past the 16-byte data section"));

  absl::Status trailing = decode_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 2);
  EXPECT_EQ(trailing.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(trailing.message(), "data section has 8 bytes but the tensors cover only 4"));

  absl::Status backwards = decode_error(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", 1);
  EXPECT_EQ(backwards.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(backwards.message(), "end before they begin"));

  absl::Status huge = decode_error(
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[9223372036854775800,9223372036854775804]}})", 1);
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(huge.message(), "leave a gap"));
}

TEST(SafetensorsTest, DecoderRejectsEntriesThatDisagreeWithTheirShapeOrDtype) {
  auto decode_error = [](absl::string_view header, int values) {
    return DecodeSafetensors(FileWithHeader(header, Zeros(values))).status();
  };
  absl::Status f16 = decode_error(R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 1);
  EXPECT_EQ(f16.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(f16.message(), "tensor \"h\": dtype \"F16\" is not supported (only F32 and U64)"));

  absl::Status shape = decode_error(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 5);
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(shape.message(),
                       "tensor \"w\": shape [2, 3] needs 24 bytes but data_offsets [0, 20] span 20"));

  absl::Status missing = decode_error(R"({"w":{"dtype":"F32","shape":[1]}})", 1);
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(missing.message(), "tensor \"w\": missing \"data_offsets\""));

  absl::Status unknown = decode_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":"y"}})", 1);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(unknown.message(), "tensor \"w\": unknown key \"x\""));

  absl::Status three_offsets = decode_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 1);
  EXPECT_EQ(three_offsets.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(three_offsets.message(), "data_offsets must be [begin, end], got [0, 4, 8]"));
}

// A sparse table's ids are U64, 8 bytes each, beside F32 rows.
TEST(SafetensorsTest, RoundTripsUint64IdsBesideFloats) {
  std::vector<SafetensorsTensor> tensors = {
      SafetensorsTensor::Ids("table.t.ids", {3}, {0, 1ULL << 63, 0xfedcba9876543210ULL}),
      {"table.t.rows", {3, 2}, {1, 2, 3, 4, 5, 6}},
      SafetensorsTensor::Ids("table.empty.ids", {0}, {})};
  absl::StatusOr<std::string> bytes = EncodeSafetensors(tensors, {});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_TRUE(Contains(*bytes, R"("table.t.ids":{"dtype":"U64","shape":[3],"data_offsets":[0,24]})")) << *bytes;
  absl::StatusOr<std::vector<SafetensorsTensor>> decoded = DecodeSafetensors(*bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->size(), 3u);
  EXPECT_EQ((*decoded)[0].dtype, SafetensorsTensor::Dtype::kU64);
  EXPECT_EQ((*decoded)[0].u64, tensors[0].u64);
  EXPECT_EQ((*decoded)[1].data, tensors[1].data);
  EXPECT_TRUE((*decoded)[2].u64.empty());

  std::vector<SafetensorsTensor> wrong = {SafetensorsTensor::Ids("ids", {4}, {1, 2, 3})};
  EXPECT_EQ(EncodeSafetensors(wrong, {}).status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Status short_ids =
      DecodeSafetensors(FileWithHeader(R"({"i":{"dtype":"U64","shape":[2],"data_offsets":[0,12]}})", Zeros(3)))
          .status();
  EXPECT_EQ(short_ids.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(short_ids.message(), "needs 16 bytes")) << short_ids;
}

TEST(SafetensorsTest, DecoderRejectsGarbageJson) {
  struct Case {
    const char* header;
    const char* problem;
  };
  const Case cases[] = {
      {"", "expected '{' to start an object (found the end of the header)"},
      {"not json", "expected '{' to start an object (found 'n')"},
      {"[1, 2]", "expected '{' to start an object"},
      {R"({"a" {}})", "expected ':' after an object key"},
      {R"({"a":{"dtype":F32}})", "expected '\"' to start a string"},
      {R"({"a":{"dtype":"F32")", "expected ',' or '}' in an object"},
      {R"({"a":{"dtype":"F32"}} x)", "unexpected text after the header object"},
      {R"({"a":{"shape":[1.5]}})", "expected an integer, not a fraction or exponent"},
      {R"({"a":{"shape":[-1]}})", "negative number"},
      {R"({"a":{"shape":[99999999999999999999]}})", "integer too large"},
      {R"({"a":{"shape":[01]}})", "leading zero"},
      {R"({"a":{"shape":[1,]}})", "expected an integer"},
      {R"({"a":{"shape":"1"}})", "expected '[' to start an array of integers"},
      {R"({"a\q":{}})", "invalid escape in a string"},
      {R"({"a\u12":{}})", "\\u escape needs four hex digits"},
      {R"({"a\ud800":{}})", "high surrogate without a low one"},
      {R"({"a\udc00":{}})", "unpaired low surrogate"},
      {"{\"a\nb\":{}}", "unescaped control character in a string"},
      {"{\"a\xff\":{}}", "string is not valid UTF-8"},
      {R"({"a)", "unterminated string"},
      {R"({"a":{},"a":{}})", "duplicate key \"a\""},
      {R"({"__metadata__":{"k":1}})", "expected '\"' to start a string"},
  };
  for (const Case& c : cases) {
    absl::Status status = DecodeSafetensors(FileWithHeader(c.header, "")).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.header;
    EXPECT_TRUE(Contains(status.message(), c.problem)) << c.header;
    EXPECT_TRUE(Contains(status.message(), "safetensors: header JSON at byte ")) << c.header;
  }
}

// Other writers (Python's json.dumps escapes all non-ASCII) spell names with \u escapes.
TEST(SafetensorsTest, DecoderUnderstandsEveryJsonEscape) {
  std::string header =
      R"( { "caf\u00e9 \ud83d\ude00 \"\\\/\b\f\n\r\t" : { "data_offsets" : [ 0 , 4 ] , "shape" : [ ] ,)"
      R"( "dtype" : "F32" } , "__metadata__" : { } }   )";
  absl::StatusOr<std::vector<SafetensorsTensor>> decoded =
      DecodeSafetensors(FileWithHeader(header, Zeros(1)));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->size(), 1u);
  EXPECT_EQ((*decoded)[0].name, "caf\xc3\xa9 \xf0\x9f\x98\x80 \"\\/\b\f\n\r\t");
  EXPECT_TRUE((*decoded)[0].shape.empty());
  EXPECT_EQ((*decoded)[0].data, std::vector<float>{0.0f});
}

TEST(SafetensorsTest, DecoderSortsByOffset) {
  std::string header = R"({"second":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                       R"("first":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  absl::StatusOr<std::vector<SafetensorsTensor>> decoded =
      DecodeSafetensors(FileWithHeader(header, Zeros(2)));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->size(), 2u);
  EXPECT_EQ((*decoded)[0].name, "first");
  EXPECT_EQ((*decoded)[1].name, "second");
}

// Every byte as \xHH, so any name is a valid Python bytes literal.
std::string PythonBytesLiteral(absl::string_view bytes) {
  std::string out = "b'";
  for (unsigned char c : bytes) absl::StrAppendFormat(&out, "\\x%02x", c);
  return out + "'";
}

// A Python dict literal {name: (shape, values)} of what the file must hold.
std::string PythonExpectedTensors(const std::vector<SafetensorsTensor>& tensors) {
  std::string out = "{";
  for (const SafetensorsTensor& tensor : tensors) {
    std::vector<std::string> values;
    for (float value : tensor.data) values.push_back(absl::StrFormat("%.9g", value));
    absl::StrAppend(&out, PythonBytesLiteral(tensor.name), ".decode('utf-8'): ([",
                    absl::StrJoin(tensor.shape, ", "), "], [", absl::StrJoin(values, ", "), "]),\n");
  }
  return out + "}";
}

constexpr char kPythonChecker[] = R"(
import json, struct, sys
import numpy as np

with open(sys.argv[1], 'rb') as f:
    raw = f.read()
(n,) = struct.unpack('<Q', raw[:8])
assert n % 8 == 0, f'header length {n} is not a multiple of 8'
header = json.loads(raw[8:8 + n].decode('utf-8'))
data = raw[8 + n:]
assert header.pop('__metadata__') == {'format': 'pt', 'note': 'caf\u00e9 "quoted"'}, 'metadata differs'
assert set(header) == set(EXPECTED), f'names differ: {sorted(header)}'
end = 0
for name, info in header.items():
    shape, values = EXPECTED[name]
    begin, stop = info['data_offsets']
    assert info['dtype'] == 'F32' and info['shape'] == shape, f'{name}: {info}'
    end = max(end, stop)
    array = np.frombuffer(data[begin:stop], dtype='<f4').reshape(shape)
    expected = np.array(values, dtype=np.float32).reshape(shape)
    assert np.array_equal(array, expected), f'{name}: {array} != {expected}'
assert end == len(data), f'data section has {len(data)} bytes, tensors end at {end}'
print('OK')
)";

// Checks the file with an independent reader: Python's json module and numpy.
TEST(SafetensorsTest, PythonJsonAndNumpyReadWhatWeWrite) {
  // Debian's python3-numpy belongs to the system interpreter.
  const std::string python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  if (std::system((python + " -c 'import numpy' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << "python3 with numpy is not available; skipping the cross-check against json + numpy";
  }
  std::filesystem::path dir = FreshTempDir();
  std::vector<SafetensorsTensor> tensors = SampleTensors();
  tensors.push_back({"odd \"name\"\\ caf\xc3\xa9", {2, 1, 2}, {-0.0f, 1e-40f, 3.4e38f, 0.5f}});
  std::string path = (dir / "model.safetensors").string();
  ASSERT_TRUE(
      WriteSafetensorsFile(path, tensors, {{"format", "pt"}, {"note", "caf\xc3\xa9 \"quoted\""}}).ok());

  std::filesystem::path script = dir / "check.py";
  std::ofstream(script) << "EXPECTED = " << PythonExpectedTensors(tensors) << "\n" << kPythonChecker;
  std::filesystem::path output = dir / "output.txt";
  std::string command = absl::StrCat(python, " ", script.string(), " ", path, " >", output.string(), " 2>&1");
  int status = std::system(command.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(output);
  EXPECT_EQ(ReadFile(output), "OK\n");
}

}  // namespace
}  // namespace fulcrum
