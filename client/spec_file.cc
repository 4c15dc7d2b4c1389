#include "client/spec_file.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "common/status_macros.h"
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

// A plain (unquoted) scalar that reads as a number or boolean is emitted as
// one; everything else as a string. Protobuf's JSON parser then checks types.
void AppendScalar(const YAML::Node& node, std::string* out) {
  const std::string& text = node.Scalar();
  if (node.Tag() != "!") {
    double number;
    if (text == "true" || text == "false") {
      *out += text;
      return;
    }
    if (text == "null" || text == "~") {
      *out += "null";
      return;
    }
    int64_t integer;
    if (text.find_first_not_of("0123456789+-") == std::string::npos && absl::SimpleAtoi(text, &integer)) {
      *out += absl::StrCat(integer);
      return;
    }
    if (text.find_first_not_of("0123456789") == std::string::npos && !text.empty()) {
      AppendJsonString(text, out);  // beyond int64 (a uint64 seed): JSON string keeps every digit
      return;
    }
    if (text.find_first_not_of("0123456789+-.eE") == std::string::npos &&
        absl::SimpleAtod(text, &number)) {
      char buf[32];
      snprintf(buf, sizeof(buf), "%.17g", number);
      *out += buf;
      return;
    }
  }
  AppendJsonString(text, out);
}

absl::Status AppendNode(const YAML::Node& node, std::string* out) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      *out += "null";
      return absl::OkStatus();
    case YAML::NodeType::Scalar:
      AppendScalar(node, out);
      return absl::OkStatus();
    case YAML::NodeType::Sequence: {
      out->push_back('[');
      bool first = true;
      for (const YAML::Node& item : node) {
        if (!first) out->push_back(',');
        first = false;
        RETURN_IF_ERROR(AppendNode(item, out));
      }
      out->push_back(']');
      return absl::OkStatus();
    }
    case YAML::NodeType::Map: {
      out->push_back('{');
      bool first = true;
      for (const auto& entry : node) {
        if (!entry.first.IsScalar()) return absl::InvalidArgumentError("map keys must be plain names");
        if (!first) out->push_back(',');
        first = false;
        AppendJsonString(entry.first.Scalar(), out);
        out->push_back(':');
        RETURN_IF_ERROR(AppendNode(entry.second, out));
      }
      out->push_back('}');
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError("undefined YAML node");
  }
}

}  // namespace

absl::StatusOr<std::string> YamlToJson(const std::string& yaml) {
  YAML::Node root;
  try {  // yaml-cpp reports syntax errors by throwing; keep that at this edge.
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("YAML syntax error at line ", e.mark.line + 1,
                                                   ", column ", e.mark.column + 1, ": ", e.msg));
  }
  if (!root.IsMap()) return absl::InvalidArgumentError("the spec must be a mapping of field names to values");
  std::string json;
  RETURN_IF_ERROR(AppendNode(root, &json));
  return json;
}

absl::StatusOr<v1::JobSpec> ParseJobSpec(const std::string& text, const std::string& source) {
  auto json = YamlToJson(text);
  if (!json.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", json.status().message()));
  v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(*json, &spec, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", std::string(status.message())));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path) {
  std::stringstream text;
  if (path == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read job spec file ", path));
    text << in.rdbuf();
  }
  return ParseJobSpec(text.str(), path == "-" ? "standard input" : path);
}

}  // namespace fulcrum
