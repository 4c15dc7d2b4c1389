// `fulcrum export`: a job's parameters (as they are now, or as a committed
// checkpoint holds them) written as one safetensors file.
#ifndef FULCRUM_CLIENT_EXPORT_H_
#define FULCRUM_CLIENT_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/safetensors.h"

namespace fulcrum {

struct ExportResult {
  std::vector<SafetensorsTensor> tensors;  // in the model's order, named as in the shard map
  int64_t step = 0;  // the step of the exported state (ASP, SSP live: the slowest partition's)
  int64_t checkpoint_id = 0;               // 0: the live parameters
  // The sparse tables (live or checkpointed), each as two tensors: "table.NAME.ids"
  // (U64, [rows]) and "table.NAME.rows" (F32, [rows, dim]), rows in
  // ascending id order, the values only (no optimizer state).
  std::vector<SafetensorsTensor> tables;
};

// Gathers the parameters of `job_id` through the scheduler at `scheduler`:
// checkpoint_id 0 pulls the live dense ones (a running BSP job is read at
// one step) and copies each table bucket from its shard's primary (a running
// job's buckets as each is when read), otherwise reads every chunk of that
// committed checkpoint, table buckets included, from a server holding it
// (checksum verified; the servers' current addresses come from the cluster's
// member list). RPCs time out after `timeout_seconds`.
absl::StatusOr<ExportResult> GatherParameters(const std::string& scheduler, const std::string& job_id,
                                              int64_t checkpoint_id, double timeout_seconds);

}  // namespace fulcrum

#endif  // FULCRUM_CLIENT_EXPORT_H_
