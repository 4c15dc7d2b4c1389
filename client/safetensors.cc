#include "client/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/process.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace fulcrum {
namespace {

constexpr size_t kHeaderLengthBytes = 8;
// The reference reader refuses larger headers; so do we, before parsing one.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr char kMetadataKey[] = "__metadata__";
// Keeps every byte count (4 per value) representable as int64_t.
constexpr int64_t kMaxElements = std::numeric_limits<int64_t>::max() / 4;

absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

template <typename T>
absl::StatusOr<T> WithContext(absl::StatusOr<T> result, absl::string_view context) {
  if (result.ok()) return result;
  return WithContext(result.status(), context);
}

std::string TensorLabel(absl::string_view name) { return absl::StrCat("tensor \"", name, "\""); }

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// ---- UTF-8 -----------------------------------------------------------------

// Length of the sequence a lead byte starts (0 if it cannot start one); sets
// its payload bits and the smallest code point that may use that length.
int Utf8SequenceLength(unsigned char lead, uint32_t* bits, uint32_t* min_code) {
  if ((lead & 0xE0) == 0xC0) {
    *bits = lead & 0x1F;
    *min_code = 0x80;
    return 2;
  }
  if ((lead & 0xF0) == 0xE0) {
    *bits = lead & 0x0F;
    *min_code = 0x800;
    return 3;
  }
  if ((lead & 0xF8) == 0xF0) {
    *bits = lead & 0x07;
    *min_code = 0x10000;
    return 4;
  }
  return 0;
}

// JSON text must be UTF-8 and the reference reader (serde_json) enforces it:
// no overlong forms, no surrogates, nothing past U+10FFFF.
bool IsValidUtf8(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    unsigned char lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    uint32_t code = 0, min_code = 0;
    int length = Utf8SequenceLength(lead, &code, &min_code);
    if (length == 0 || text.size() - i < static_cast<size_t>(length)) return false;
    for (int k = 1; k < length; ++k) {
      unsigned char next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code = (code << 6) | (next & 0x3F);
    }
    if (code < min_code || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    i += length;
  }
  return true;
}

void AppendUtf8(uint32_t code, std::string* out) {
  if (code < 0x80) {
    out->push_back(static_cast<char>(code));
  } else if (code < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code >> 6)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else if (code < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
}

// ---- Encoding --------------------------------------------------------------

// Escapes as serde_json does: '"', '\\' and control characters; other UTF-8
// passes through unchanged.
void AppendJsonString(absl::string_view text, std::string* out) {
  out->push_back('"');
  for (char c : text) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(out, "\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

void AppendUint64LittleEndian(uint64_t value, std::string* out) {
  for (size_t i = 0; i < kHeaderLengthBytes; ++i) out->push_back(static_cast<char>(value >> (8 * i)));
}

uint64_t ReadUint64LittleEndian(absl::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < kHeaderLengthBytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  return value;
}

// Number of values `shape` holds. INVALID_ARGUMENT for a negative dimension
// or a byte size past int64_t.
absl::StatusOr<int64_t> ElementCount(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has a negative dimension"));
    }
    if (dim != 0 && count > kMaxElements / dim) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " is too large"));
    }
    count *= dim;
  }
  return count;
}

absl::Status CheckTensorName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("a tensor name is empty");
  if (name == kMetadataKey) {
    return absl::InvalidArgumentError("tensor name \"__metadata__\" is reserved for the metadata entry");
  }
  if (!IsValidUtf8(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor name \"", absl::CHexEscape(name), "\" is not valid UTF-8"));
  }
  return absl::OkStatus();
}

bool IsU64(const SafetensorsTensor& tensor) { return tensor.dtype == SafetensorsTensor::Dtype::kU64; }
size_t ValueCount(const SafetensorsTensor& tensor) { return IsU64(tensor) ? tensor.u64.size() : tensor.data.size(); }
int64_t ElementBytes(absl::string_view dtype) { return dtype == "U64" ? 8 : 4; }

absl::Status CheckTensor(const SafetensorsTensor& tensor, std::set<absl::string_view>* seen) {
  RETURN_IF_ERROR(CheckTensorName(tensor.name));
  if (!seen->insert(tensor.name).second) {
    return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name \"", tensor.name, "\""));
  }
  ASSIGN_OR_RETURN(int64_t count, WithContext(ElementCount(tensor.shape), TensorLabel(tensor.name)));
  const size_t size = ValueCount(tensor);
  if (static_cast<size_t>(count) != size) {
    return absl::InvalidArgumentError(absl::StrCat(TensorLabel(tensor.name), ": shape ",
                                                   ShapeString(tensor.shape), " holds ", count,
                                                   " values but data has ", size));
  }
  return absl::OkStatus();
}

absl::Status CheckMetadata(const std::map<std::string, std::string>& metadata) {
  for (const auto& [key, value] : metadata) {
    if (!IsValidUtf8(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata key \"", absl::CHexEscape(key), "\" is not valid UTF-8"));
    }
    if (!IsValidUtf8(value)) {
      return absl::InvalidArgumentError(absl::StrCat("metadata \"", key, "\": the value is not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

void AppendMetadata(const std::map<std::string, std::string>& metadata, std::string* json) {
  AppendJsonString(kMetadataKey, json);
  json->append(":{");
  for (auto it = metadata.begin(); it != metadata.end(); ++it) {
    if (it != metadata.begin()) json->push_back(',');
    AppendJsonString(it->first, json);
    json->push_back(':');
    AppendJsonString(it->second, json);
  }
  json->push_back('}');
}

// The JSON header, space-padded so that the data starts 8-byte aligned.
std::string EncodeHeader(const std::vector<SafetensorsTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::string json = "{";
  if (!metadata.empty()) AppendMetadata(metadata, &json);
  int64_t offset = 0;
  for (const SafetensorsTensor& tensor : tensors) {
    if (json.size() > 1) json.push_back(',');
    AppendJsonString(tensor.name, &json);
    const char* dtype = IsU64(tensor) ? "U64" : "F32";
    int64_t end = offset + ElementBytes(dtype) * static_cast<int64_t>(ValueCount(tensor));
    absl::StrAppend(&json, ":{\"dtype\":\"", dtype, "\",\"shape\":[", absl::StrJoin(tensor.shape, ","),
                    "],\"data_offsets\":[", offset, ",", end, "]}");
    offset = end;
  }
  json.push_back('}');
  json.append((8 - json.size() % 8) % 8, ' ');
  return json;
}

absl::StatusOr<std::string> Encode(const std::vector<SafetensorsTensor>& tensors,
                                   const std::map<std::string, std::string>& metadata) {
  std::set<absl::string_view> seen;
  for (const SafetensorsTensor& tensor : tensors) RETURN_IF_ERROR(CheckTensor(tensor, &seen));
  RETURN_IF_ERROR(CheckMetadata(metadata));
  std::string header = EncodeHeader(tensors, metadata);
  std::string out;
  AppendUint64LittleEndian(header.size(), &out);
  out += header;
  std::string values;
  for (const SafetensorsTensor& tensor : tensors) {
    if (IsU64(tensor)) {
      for (uint64_t id : tensor.u64) AppendUint64LittleEndian(id, &out);
      continue;
    }
    EncodeFloats(tensor.data.data(), static_cast<int64_t>(tensor.data.size()), &values);
    out += values;
  }
  return out;
}

// ---- Header parsing --------------------------------------------------------

// A recursive-descent parser for the JSON subset a safetensors header uses:
// objects, strings (with every JSON escape) and arrays of non-negative
// integers. Errors carry the byte offset within the header.
class JsonCursor {
 public:
  // Called with the cursor on a member's value, which it must consume.
  using MemberParser = std::function<absl::Status(const std::string& key)>;

  explicit JsonCursor(absl::string_view text) : text_(text) {}

  // Parses an object, rejecting duplicate keys.
  absl::Status ParseObject(const MemberParser& parse_member);
  absl::StatusOr<std::string> ParseString();
  absl::StatusOr<std::vector<int64_t>> ParseIntegerArray();
  // OK if nothing but whitespace (the padding) is left.
  absl::Status ExpectEnd();
  absl::Status Error(absl::string_view problem) const;

 private:
  void SkipWhitespace();
  // Skips whitespace, then consumes `c` if it is next.
  bool Consume(char c);
  absl::StatusOr<int64_t> ParseInteger();
  absl::Status ParseEscape(std::string* out);
  absl::Status ParseUnicodeEscape(std::string* out);
  absl::StatusOr<uint32_t> ParseHex4();

  absl::string_view text_;
  size_t pos_ = 0;
};

absl::Status JsonCursor::Error(absl::string_view problem) const {
  std::string found = pos_ < text_.size() ? absl::StrCat("'", absl::CHexEscape(text_.substr(pos_, 1)), "'")
                                          : std::string("the end of the header");
  return absl::InvalidArgumentError(
      absl::StrCat("header JSON at byte ", pos_, ": ", problem, " (found ", found, ")"));
}

void JsonCursor::SkipWhitespace() {
  while (pos_ < text_.size() && absl::string_view(" \t\n\r").find(text_[pos_]) != absl::string_view::npos) {
    ++pos_;
  }
}

bool JsonCursor::Consume(char c) {
  SkipWhitespace();
  if (pos_ >= text_.size() || text_[pos_] != c) return false;
  ++pos_;
  return true;
}

absl::Status JsonCursor::ExpectEnd() {
  SkipWhitespace();
  if (pos_ != text_.size()) return Error("unexpected text after the header object");
  return absl::OkStatus();
}

absl::Status JsonCursor::ParseObject(const MemberParser& parse_member) {
  if (!Consume('{')) return Error("expected '{' to start an object");
  if (Consume('}')) return absl::OkStatus();
  std::set<std::string> keys;
  do {
    ASSIGN_OR_RETURN(std::string key, ParseString());
    if (!keys.insert(key).second) return Error(absl::StrCat("duplicate key \"", key, "\""));
    if (!Consume(':')) return Error("expected ':' after an object key");
    RETURN_IF_ERROR(parse_member(key));
  } while (Consume(','));
  if (!Consume('}')) return Error("expected ',' or '}' in an object");
  return absl::OkStatus();
}

absl::StatusOr<std::string> JsonCursor::ParseString() {
  if (!Consume('"')) return Error("expected '\"' to start a string");
  std::string out;
  while (true) {
    if (pos_ >= text_.size()) return Error("unterminated string");
    char c = text_[pos_];
    if (static_cast<unsigned char>(c) < 0x20) return Error("unescaped control character in a string");
    ++pos_;
    if (c == '"') break;
    if (c == '\\') {
      RETURN_IF_ERROR(ParseEscape(&out));
    } else {
      out.push_back(c);
    }
  }
  if (!IsValidUtf8(out)) return Error("string is not valid UTF-8");
  return out;
}

absl::Status JsonCursor::ParseEscape(std::string* out) {
  if (pos_ >= text_.size()) return Error("unterminated escape in a string");
  char c = text_[pos_++];
  switch (c) {
    case '"':
    case '\\':
    case '/':
      out->push_back(c);
      return absl::OkStatus();
    case 'b':
      out->push_back('\b');
      return absl::OkStatus();
    case 'f':
      out->push_back('\f');
      return absl::OkStatus();
    case 'n':
      out->push_back('\n');
      return absl::OkStatus();
    case 'r':
      out->push_back('\r');
      return absl::OkStatus();
    case 't':
      out->push_back('\t');
      return absl::OkStatus();
    case 'u':
      return ParseUnicodeEscape(out);
    default:
      --pos_;
      return Error("invalid escape in a string");
  }
}

// \uXXXX, where a UTF-16 surrogate pair spells a code point past U+FFFF.
absl::Status JsonCursor::ParseUnicodeEscape(std::string* out) {
  ASSIGN_OR_RETURN(uint32_t code, ParseHex4());
  if (code >= 0xDC00 && code <= 0xDFFF) return Error("\\u escape is an unpaired low surrogate");
  if (code >= 0xD800 && code <= 0xDBFF) {
    if (text_.substr(pos_, 2) != "\\u") return Error("\\u escape is a high surrogate without a low one");
    pos_ += 2;
    ASSIGN_OR_RETURN(uint32_t low, ParseHex4());
    if (low < 0xDC00 || low > 0xDFFF) return Error("\\u escape is a high surrogate without a low one");
    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
  }
  AppendUtf8(code, out);
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> JsonCursor::ParseHex4() {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i, ++pos_) {
    if (pos_ >= text_.size() || !absl::ascii_isxdigit(text_[pos_])) {
      return Error("\\u escape needs four hex digits");
    }
    char c = absl::ascii_tolower(text_[pos_]);
    value = value * 16 + (absl::ascii_isdigit(c) ? c - '0' : c - 'a' + 10);
  }
  return value;
}

absl::StatusOr<int64_t> JsonCursor::ParseInteger() {
  SkipWhitespace();
  if (pos_ < text_.size() && text_[pos_] == '-') return Error("negative number (sizes and offsets are >= 0)");
  size_t start = pos_;
  int64_t value = 0;
  for (; pos_ < text_.size() && absl::ascii_isdigit(text_[pos_]); ++pos_) {
    int digit = text_[pos_] - '0';
    if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) return Error("integer too large");
    value = value * 10 + digit;
  }
  if (pos_ == start) return Error("expected an integer");
  if (text_[start] == '0' && pos_ - start > 1) return Error("integer with a leading zero");
  if (pos_ < text_.size() && absl::string_view(".eE").find(text_[pos_]) != absl::string_view::npos) {
    return Error("expected an integer, not a fraction or exponent");
  }
  return value;
}

absl::StatusOr<std::vector<int64_t>> JsonCursor::ParseIntegerArray() {
  if (!Consume('[')) return Error("expected '[' to start an array of integers");
  std::vector<int64_t> values;
  if (Consume(']')) return values;
  do {
    ASSIGN_OR_RETURN(int64_t value, ParseInteger());
    values.push_back(value);
  } while (Consume(','));
  if (!Consume(']')) return Error("expected ',' or ']' in an array of integers");
  return values;
}

// One tensor's entry in the header, as written (checked by CheckEntry).
struct HeaderEntry {
  std::string name;
  std::optional<std::string> dtype;
  std::optional<std::vector<int64_t>> shape;
  std::optional<std::vector<int64_t>> data_offsets;
};

absl::Status ParseTensorInfo(JsonCursor* cursor, HeaderEntry* entry) {
  return cursor->ParseObject([cursor, entry](const std::string& key) -> absl::Status {
    if (key == "dtype") {
      ASSIGN_OR_RETURN(entry->dtype, cursor->ParseString());
    } else if (key == "shape") {
      ASSIGN_OR_RETURN(entry->shape, cursor->ParseIntegerArray());
    } else if (key == "data_offsets") {
      ASSIGN_OR_RETURN(entry->data_offsets, cursor->ParseIntegerArray());
    } else {
      return cursor->Error(absl::StrCat(TensorLabel(entry->name), ": unknown key \"", key, "\""));
    }
    return absl::OkStatus();
  });
}

absl::Status ParseMetadata(JsonCursor* cursor, std::map<std::string, std::string>* metadata) {
  return cursor->ParseObject([cursor, metadata](const std::string& key) -> absl::Status {
    ASSIGN_OR_RETURN((*metadata)[key], cursor->ParseString());
    return absl::OkStatus();
  });
}

absl::Status ParseHeader(absl::string_view json, std::vector<HeaderEntry>* entries,
                         std::map<std::string, std::string>* metadata) {
  JsonCursor cursor(json);
  RETURN_IF_ERROR(cursor.ParseObject([&](const std::string& key) -> absl::Status {
    if (key == kMetadataKey) return ParseMetadata(&cursor, metadata);
    entries->emplace_back();
    entries->back().name = key;
    return ParseTensorInfo(&cursor, &entries->back());
  }));
  return cursor.ExpectEnd();
}

// ---- Validation ------------------------------------------------------------

absl::Status CheckEntryKeys(const HeaderEntry& entry) {
  const char* missing = !entry.dtype          ? "dtype"
                        : !entry.shape        ? "shape"
                        : !entry.data_offsets ? "data_offsets"
                                              : nullptr;
  if (missing == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(TensorLabel(entry.name), ": missing \"", missing, "\""));
}

// Checks one entry on its own: keys present, F32, offsets agree with shape.
absl::Status CheckEntry(const HeaderEntry& entry) {
  RETURN_IF_ERROR(CheckEntryKeys(entry));
  std::string label = TensorLabel(entry.name);
  if (*entry.dtype != "F32" && *entry.dtype != "U64") {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": dtype \"", *entry.dtype, "\" is not supported (only F32 and U64)"));
  }
  const std::vector<int64_t>& offsets = *entry.data_offsets;
  if (offsets.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": data_offsets must be [begin, end], got ", ShapeString(offsets)));
  }
  if (offsets[1] < offsets[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": data_offsets ", ShapeString(offsets), " end before they begin"));
  }
  ASSIGN_OR_RETURN(int64_t count, WithContext(ElementCount(*entry.shape), label));
  const int64_t element = ElementBytes(*entry.dtype);
  if (count > kMaxElements / 2 || count * element != offsets[1] - offsets[0]) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": shape ", ShapeString(*entry.shape), " needs ",
                                                   count * element, " bytes but data_offsets ",
                                                   ShapeString(offsets), " span ", offsets[1] - offsets[0]));
  }
  return absl::OkStatus();
}

// Sorts `entries` by offset and checks they tile the data section exactly.
absl::Status CheckLayout(size_t data_size, std::vector<HeaderEntry>* entries) {
  // (Callers checked that every entry has its offsets.)
  std::stable_sort(entries->begin(), entries->end(), [](const HeaderEntry& a, const HeaderEntry& b) {
    return a.data_offsets.value_or(std::vector<int64_t>()) < b.data_offsets.value_or(std::vector<int64_t>());
  });
  int64_t covered = 0;
  const HeaderEntry* previous = nullptr;
  for (const HeaderEntry& entry : *entries) {
    const std::vector<int64_t>& offsets = *entry.data_offsets;
    if (offsets[0] != covered) {
      std::string after = previous == nullptr
                              ? std::string("the start of the data")
                              : absl::StrCat(TensorLabel(previous->name), ", which ends at ", covered);
      return absl::InvalidArgumentError(
          absl::StrCat(TensorLabel(entry.name), ": data_offsets ", ShapeString(offsets),
                       offsets[0] < covered ? " overlap " : " leave a gap after ", after,
                       " (tensors must be contiguous)"));
    }
    covered = offsets[1];
    previous = &entry;
  }
  if (static_cast<uint64_t>(covered) > data_size) {
    return absl::DataLossError(absl::StrCat(TensorLabel(previous->name), ": data_offsets ",
                                            ShapeString(*previous->data_offsets), " end past the ", data_size,
                                            "-byte data section (file truncated?)"));
  }
  if (static_cast<uint64_t>(covered) < data_size) {
    return absl::DataLossError(absl::StrCat("the data section has ", data_size,
                                            " bytes but the tensors cover only ", covered,
                                            " (trailing bytes)"));
  }
  return absl::OkStatus();
}

// The JSON header (padding included) of a safetensors file.
absl::StatusOr<absl::string_view> SplitHeader(absl::string_view bytes) {
  if (bytes.size() < kHeaderLengthBytes) {
    return absl::DataLossError(absl::StrCat("truncated: the file has ", bytes.size(),
                                            " bytes, fewer than the 8-byte header length"));
  }
  uint64_t header_size = ReadUint64LittleEndian(bytes);
  if (header_size > bytes.size() - kHeaderLengthBytes) {
    return absl::DataLossError(absl::StrCat("header length ", header_size, " exceeds the ",
                                            bytes.size() - kHeaderLengthBytes,
                                            " bytes after the length field (file truncated?)"));
  }
  if (header_size > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header length ", header_size, " exceeds the limit of ", kMaxHeaderBytes, " bytes"));
  }
  return bytes.substr(kHeaderLengthBytes, header_size);
}

absl::StatusOr<SafetensorsTensor> ToTensor(const HeaderEntry& entry, absl::string_view data) {
  const std::vector<int64_t>& offsets = *entry.data_offsets;
  SafetensorsTensor tensor;
  tensor.name = entry.name;
  tensor.shape = *entry.shape;
  if (*entry.dtype == "U64") {
    tensor.dtype = SafetensorsTensor::Dtype::kU64;
    tensor.u64.resize(static_cast<size_t>((offsets[1] - offsets[0]) / 8));
    for (size_t i = 0; i < tensor.u64.size(); ++i) {
      tensor.u64[i] = ReadUint64LittleEndian(data.substr(static_cast<size_t>(offsets[0]) + 8 * i, 8));
    }
    return tensor;
  }
  int64_t count = (offsets[1] - offsets[0]) / 4;
  tensor.data.resize(count);
  RETURN_IF_ERROR(DecodeFloats(data.substr(offsets[0], offsets[1] - offsets[0]), count, tensor.data.data(),
                               TensorLabel(entry.name)));
  return tensor;
}

absl::StatusOr<std::vector<SafetensorsTensor>> Decode(absl::string_view bytes,
                                                      std::map<std::string, std::string>* metadata) {
  ASSIGN_OR_RETURN(absl::string_view header, SplitHeader(bytes));
  absl::string_view data = bytes.substr(kHeaderLengthBytes + header.size());
  std::vector<HeaderEntry> entries;
  std::map<std::string, std::string> parsed_metadata;
  RETURN_IF_ERROR(ParseHeader(header, &entries, &parsed_metadata));
  for (const HeaderEntry& entry : entries) RETURN_IF_ERROR(CheckEntry(entry));
  RETURN_IF_ERROR(CheckLayout(data.size(), &entries));
  std::vector<SafetensorsTensor> tensors;
  tensors.reserve(entries.size());
  for (const HeaderEntry& entry : entries) {
    ASSIGN_OR_RETURN(SafetensorsTensor tensor, ToTensor(entry, data));
    tensors.push_back(std::move(tensor));
  }
  if (metadata != nullptr) *metadata = std::move(parsed_metadata);
  return tensors;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open safetensors file ", path, ": ", strerror(errno)));
  }
  std::string bytes(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()))) {
    return absl::UnavailableError(absl::StrCat("cannot read safetensors file ", path));
  }
  return bytes;
}

std::string FileContext(const std::string& path) { return absl::StrCat("safetensors file ", path); }

}  // namespace

absl::StatusOr<std::string> EncodeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata) {
  return WithContext(Encode(tensors, metadata), "safetensors");
}

absl::Status WriteSafetensorsFile(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(std::string bytes, WithContext(Encode(tensors, metadata), FileContext(path)));
  return WriteFileAtomically(path, bytes);
}

absl::StatusOr<std::vector<SafetensorsTensor>> DecodeSafetensors(
    absl::string_view bytes, std::map<std::string, std::string>* metadata) {
  return WithContext(Decode(bytes, metadata), "safetensors");
}

absl::StatusOr<std::vector<SafetensorsTensor>> ReadSafetensorsFile(
    const std::string& path, std::map<std::string, std::string>* metadata) {
  ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  return WithContext(Decode(bytes, metadata), FileContext(path));
}

}  // namespace fulcrum
