// libFuzzer: the job spec parser (YAML and JSON, as `fulcrum submit -f`
// reads them), then the scheduler's defaults and validation. Properties: no
// crash, no unbounded work, an error is INVALID_ARGUMENT, and a spec that
// parses survives a JSON round trip unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "client/spec_file.h"
#include "google/protobuf/util/json_util.h"
#include "scheduler/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<fulcrum::v1::JobSpec> spec = fulcrum::ParseJobSpec(text, "fuzz.yaml");
  if (!spec.ok()) {
    if (spec.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(*spec, &json).ok()) std::abort();
  absl::StatusOr<fulcrum::v1::JobSpec> again = fulcrum::ParseJobSpec(json, "round-trip.json");
  if (!again.ok() || again->SerializeAsString() != spec->SerializeAsString()) std::abort();
  fulcrum::ApplyJobSpecDefaults(&*spec);
  absl::Status valid = fulcrum::ValidateJobSpec(*spec);
  if (!valid.ok() && valid.code() != absl::StatusCode::kInvalidArgument) std::abort();
  return 0;
}
