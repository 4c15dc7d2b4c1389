#include "client/spec_file.h"

#include <sys/stat.h>

#include <cstdlib>
#include <set>
#include <fstream>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
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
      std::set<std::string> seen;
      for (const auto& entry : node) {
        if (!entry.first.IsScalar()) return absl::InvalidArgumentError("map keys must be plain names");
        if (!seen.insert(entry.first.Scalar()).second) {
          return absl::InvalidArgumentError(absl::StrCat("field \"", entry.first.Scalar(), "\" is given twice (line ",
                                                         entry.first.Mark().line + 1, ")"));
        }
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
    struct stat info;
    std::ifstream in(path);
    if (stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode) || !in) {
      return absl::NotFoundError(absl::StrCat("cannot read job spec file ", path, " (no such regular file)"));
    }
    text << in.rdbuf();
  }
  return ParseJobSpec(text.str(), path == "-" ? "standard input" : path);
}

}  // namespace fulcrum
