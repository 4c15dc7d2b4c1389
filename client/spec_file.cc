#include "client/spec_file.h"

#include <sys/stat.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"

namespace fulcrum {
namespace {

void AppendJsonString(const std::string& text, std::string* out) {
  out->push_back('"');
  for (unsigned char c : text) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\t': *out += "\\t"; break;
      case '\r': *out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

// Plain scalars become JSON strings, except true/false/null: protobuf's JSON
// parser accepts quoted numbers for numeric fields, and this way a string
// field keeps "2024" or "00123" exactly as written, and a uint64 keeps every
// digit. Types are then checked against the JobSpec by the parser.
void AppendScalar(const YAML::Node& node, std::string* out) {
  const std::string& text = node.Scalar();
  if (node.Tag() != "!" && (text == "true" || text == "false")) {
    *out += text;
  } else if (node.Tag() != "!" && (text == "null" || text == "~")) {
    *out += "null";
  } else {
    AppendJsonString(text, out);
  }
}

// Bounds on a spec: its text, its nesting, and what it expands to (YAML
// aliases can make a kilobyte stand for a gigabyte).
constexpr size_t kMaxSpecBytes = 1 << 20;
constexpr int kMaxDepth = 32;

// A field name is echoed in an error only if it looks like one (the file
// may be anything, e.g. a secret given by mistake).
std::string FieldName(const std::string& name) {
  bool plain = !name.empty() && name.size() <= 64;
  for (char c : name) plain = plain && (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_');
  return plain ? absl::StrCat("\"", name, "\"") : "a key that is not a field name";
}

struct Converter {
  std::string out;
  absl::Status Append(const YAML::Node& node, const google::protobuf::Descriptor* message, const std::string& path,
                      int depth);
};

absl::Status Converter::Append(const YAML::Node& node, const google::protobuf::Descriptor* message,
                               const std::string& path, int depth) {
  if (depth > kMaxDepth) return absl::InvalidArgumentError(absl::StrCat("nested more than ", kMaxDepth, " deep"));
  if (out.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the spec expands to more than ", kMaxSpecBytes,
                                                   " bytes (YAML aliases?)"));
  }
  switch (node.Type()) {
    case YAML::NodeType::Null:
      out += "null";
      return absl::OkStatus();
    case YAML::NodeType::Scalar:
      AppendScalar(node, &out);
      return absl::OkStatus();
    case YAML::NodeType::Sequence: {
      out.push_back('[');
      bool first = true;
      for (const YAML::Node& item : node) {
        if (!first) out.push_back(',');
        first = false;
        RETURN_IF_ERROR(Append(item, message, path, depth + 1));
      }
      out.push_back(']');
      return absl::OkStatus();
    }
    case YAML::NodeType::Map: {
      out.push_back('{');
      bool first = true;
      std::set<std::string> seen;
      std::map<int, std::string> fields_seen;  // by field number: its JSON and proto names are one field
      for (const auto& entry : node) {
        if (!entry.first.IsScalar()) return absl::InvalidArgumentError("map keys must be plain names");
        const std::string& key = entry.first.Scalar();
        const int line = entry.first.Mark().line + 1;
        if (!seen.insert(key).second) {
          return absl::InvalidArgumentError(absl::StrCat("field ", FieldName(key), " is given twice (line ", line, ")"));
        }
        // Known fields only (by JSON or proto name); the JSON parser would
        // refuse others too, but echoing whatever the file holds.
        const google::protobuf::FieldDescriptor* field = nullptr;
        if (message != nullptr) {
          field = message->FindFieldByCamelcaseName(key);
          if (field == nullptr) field = message->FindFieldByName(key);
          if (field == nullptr) {
            return absl::InvalidArgumentError(absl::StrCat("unknown field ", FieldName(key),
                                                           path.empty() ? "" : absl::StrCat(" in ", path), " (line ",
                                                           line, ")"));
          }
          auto [earlier, first_time] = fields_seen.emplace(field->number(), key);
          if (!first_time) {
            return absl::InvalidArgumentError(absl::StrCat("field ", FieldName(key),
                                                           " is given twice, also as ",
                                                           FieldName(earlier->second), " (line ", line, ")"));
          }
        }
        if (!first) out.push_back(',');
        first = false;
        AppendJsonString(key, &out);
        out.push_back(':');
        const google::protobuf::Descriptor* inner =
            field != nullptr && field->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE ? field->message_type()
                                                                                                   : nullptr;
        const std::string inner_path = field != nullptr ? (path.empty() ? field->json_name()
                                                                         : absl::StrCat(path, ".", field->json_name()))
                                                        : path;
        RETURN_IF_ERROR(Append(entry.second, inner, inner_path, depth + 1));
      }
      out.push_back('}');
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError("undefined YAML node");
  }
}

// The deepest nesting of flow collections ([...] and {...}), an early and
// cheap bound (yaml-cpp parses them recursively; it stops itself only at a
// depth of 2000). Brackets inside quoted scalars, comments and block plain
// scalars (`name: a[b`) do not count: a quote or bracket opens something
// only where a node starts; inside a flow collection every bracket counts.
int FlowDepth(absl::string_view text) {
  int depth = 0, deepest = 0;
  char quote = 0;        // the quote of the quoted scalar we are in, if any
  bool escaped = false;  // after a backslash in a double-quoted scalar
  bool comment = false;
  bool blank = true;     // the previous character was a blank or a line break
  char prev = '\n';      // the previous character outside quotes that is not a blank
  for (char c : text) {
    if (quote != 0) {
      if (escaped) {
        escaped = false;
      } else if (quote == '"' && c == '\\') {
        escaped = true;
      } else if (c == quote) {
        quote = 0;
        prev = c;
        blank = false;
      }
      continue;
    }
    if (comment) {
      if (c != '\n') continue;
      comment = false;
    }
    if (c == ' ' || c == '\t') {
      blank = true;
      continue;
    }
    // Where a node may start: after an indicator, at a line's start, and in
    // a flow collection after an opening bracket or a comma.
    const bool node_start = prev == '\n' || prev == ':' || prev == '-' || prev == '?' ||
                            (depth > 0 && (prev == ',' || prev == '[' || prev == '{'));
    if (c == '#' && blank) {
      comment = true;
      continue;
    }
    prev = c;
    blank = c == '\n';
    if ((c == '"' || c == '\'') && node_start) {
      quote = c;
    } else if ((c == '[' || c == '{') && (depth > 0 || node_start)) {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    } else if (c == '[' || c == '{') {
      prev = 'a';  // text of a plain scalar
    }
  }
  return deepest;
}

// The events of a document, only to tell an empty one (a lone null) from
// one that holds something, and where it starts.
class DocumentProbe : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    start_ = mark;
    empty_ = true;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override { empty_ = false; }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {
    empty_ = false;
  }
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    empty_ = false;
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    empty_ = false;
  }
  void OnMapEnd() override {}
  bool empty() const { return empty_; }
  int line() const { return start_.line + 1; }

 private:
  YAML::Mark start_;
  bool empty_ = true;
};

// The line of a second document that holds something, if `yaml` has one.
// Two documents are read and no more: yaml-cpp's LoadAll loops for ever on
// some malformed input (found by fuzzing), and nothing past the second
// matters. Throws YAML::Exception as Load does.
std::optional<int> SecondDocumentLine(const std::string& yaml) {
  std::istringstream in(yaml);
  YAML::Parser parser(in);
  DocumentProbe probe;
  if (!parser.HandleNextDocument(probe) || !parser.HandleNextDocument(probe) || probe.empty())
    return std::nullopt;
  return probe.line();
}

absl::StatusOr<std::string> ToJson(const std::string& yaml, const google::protobuf::Descriptor* message) {
  if (yaml.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the spec is over ", kMaxSpecBytes, " bytes"));
  }
  if (FlowDepth(yaml) > kMaxDepth) {
    return absl::InvalidArgumentError(absl::StrCat("brackets nested more than ", kMaxDepth, " deep"));
  }
  YAML::Node root;
  std::optional<int> second_document;  // the line a second, non-empty document starts at
  try {  // yaml-cpp reports syntax errors by throwing; keep that at this edge.
    root = YAML::Load(yaml);
    second_document = SecondDocumentLine(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("YAML syntax error at line ", e.mark.line + 1,
                                                   ", column ", e.mark.column + 1, ": ", Printable(e.msg, 200)));
  }
  // One spec: a second document ("---", a second JSON object, or text after
  // the first) would otherwise be dropped without a word.
  if (second_document.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the spec must be one document; more follows the first at line ", *second_document,
                     " (a second \"---\" document, JSON object or stray text)"));
  }
  if (!root.IsMap()) return absl::InvalidArgumentError("the spec must be a mapping of field names to values");
  Converter converter;
  RETURN_IF_ERROR(converter.Append(root, message, "", 0));
  return std::move(converter.out);
}

// The JSON parser's message in the spec's own words: field paths as the
// spec writes them (lowerCamelCase, not the proto's snake_case) and what a
// value must be instead of the proto's type names.
std::string SpecWords(std::string message) {
  // "(data.batch_size): ..." -> "(data.batchSize): ..."
  if (absl::StartsWith(message, "(")) {
    const size_t close = message.find(')');
    if (close != std::string::npos) {
      std::string path;
      bool upper = false;
      for (char c : message.substr(1, close - 1)) {
        if (c == '_') {
          upper = true;
          continue;
        }
        path += upper ? absl::ascii_toupper(static_cast<unsigned char>(c)) : c;
        upper = false;
      }
      message = absl::StrCat("(", path, message.substr(close));
    }
  }
  const size_t type_at = message.find(" for type ");
  if (type_at != std::string::npos) {
    const std::string type = message.substr(type_at + 10);
    std::string expected;
    if (absl::StartsWith(type, "TYPE_INT") || absl::StartsWith(type, "TYPE_UINT") ||
        absl::StartsWith(type, "TYPE_SINT") || absl::StartsWith(type, "TYPE_FIXED") ||
        absl::StartsWith(type, "TYPE_SFIXED")) {
      expected = "a whole number in the field's range";
    } else if (type == "TYPE_FLOAT" || type == "TYPE_DOUBLE") {
      expected = "a number";
    } else if (type == "TYPE_BOOL") {
      expected = "true or false";
    } else if (absl::StartsWith(type, "type.googleapis.com/")) {
      const std::string name = type.substr(20);
      const auto* pool = google::protobuf::DescriptorPool::generated_pool();
      if (const google::protobuf::EnumDescriptor* e = pool->FindEnumTypeByName(name); e != nullptr) {
        std::string names;
        for (int i = 0; i < e->value_count(); ++i) {
          if (absl::EndsWith(e->value(i)->name(), "UNSPECIFIED")) continue;
          absl::StrAppend(&names, names.empty() ? "" : ", ", e->value(i)->name());
        }
        expected = absl::StrCat("one of ", names);
      } else if (pool->FindMessageTypeByName(name) != nullptr) {
        expected = "a mapping of fields";
      }
    }
    if (!expected.empty()) message = absl::StrCat(message.substr(0, type_at), ": it must be ", expected);
  }
  const size_t list = message.find("Proto field is not repeating, cannot start list.");
  if (list != std::string::npos)
    message = absl::StrCat(message.substr(0, list), "takes one value, not a list");
  return message;
}

}  // namespace

absl::StatusOr<std::string> YamlToJson(const std::string& yaml) { return ToJson(yaml, nullptr); }

absl::StatusOr<v1::JobSpec> ParseJobSpec(const std::string& text, const std::string& source) {
  auto json = ToJson(text, v1::JobSpec::descriptor());
  if (!json.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", json.status().message()));
  v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(*json, &spec, options);
  if (!status.ok()) {
    // The field names are known by now; the parser's message may quote a value.
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", Printable(SpecWords(std::string(status.message())), 300)));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path) {
  std::stringstream text;
  if (path == "-") {
    std::string input(kMaxSpecBytes + 1, '\0');
    std::cin.read(input.data(), static_cast<std::streamsize>(input.size()));
    input.resize(static_cast<size_t>(std::cin.gcount()));
    text << input;
  } else {
    struct stat info;
    std::ifstream in(path);
    if (stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode) || !in) {
      return absl::NotFoundError(absl::StrCat("cannot read job spec file ", path, " (no such regular file)"));
    }
    if (static_cast<uint64_t>(info.st_size) > kMaxSpecBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": the spec is over ", kMaxSpecBytes, " bytes"));
    }
    text << in.rdbuf();
  }
  return ParseJobSpec(text.str(), path == "-" ? "standard input" : path);
}

}  // namespace fulcrum
