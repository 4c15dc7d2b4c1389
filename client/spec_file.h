// Reads a JobSpec from a YAML or JSON file whose field names are the proto's
// JSON names (snake_case also accepted). Unknown fields are an error.
#ifndef FULCRUM_CLIENT_SPEC_FILE_H_
#define FULCRUM_CLIENT_SPEC_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "fulcrum/v1/job.pb.h"

namespace fulcrum {

// INVALID_ARGUMENT naming the file and the problem; NOT_FOUND if unreadable.
absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path);
// Same for text already read ("-" or a path is only used in messages).
absl::StatusOr<v1::JobSpec> ParseJobSpec(const std::string& text, const std::string& source);
// YAML (a superset of JSON) to a JSON string.
absl::StatusOr<std::string> YamlToJson(const std::string& yaml);

}  // namespace fulcrum

#endif  // FULCRUM_CLIENT_SPEC_FILE_H_
