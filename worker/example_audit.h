// The example audit: every push carries the number of examples behind its
// gradient and the sum of their ExampleDigest tags, and each chunk sums those
// of the gradients it accepts (ChunkState.examples_seen / examples_digest).
// After a job, every chunk must hold the audit of every example of every
// epoch used exactly once; the fault-tolerance tests and the failover
// benchmark check that.
#ifndef FULCRUM_WORKER_EXAMPLE_AUDIT_H_
#define FULCRUM_WORKER_EXAMPLE_AUDIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data_partition.h"
#include "fulcrum/v1/job.pb.h"

namespace fulcrum {

// The audit of every example of every epoch of `spec` (full epochs of
// `num_examples`, global batch = batch size x data partitions) used exactly once.
ExampleAudit ExpectedExampleAudit(const v1::JobSpec& spec, int64_t num_examples);

struct ChunkAudit {
  int32_t chunk_id = 0;
  std::string address;  // the primary it was read from
  ExampleAudit audit;
};

// Each chunk's audit as its primary in `job`'s shard map holds it (CopyChunk).
// The error of the first chunk that cannot be read, naming it and the server.
absl::StatusOr<std::vector<ChunkAudit>> ReadChunkAudits(const v1::JobStatus& job);

}  // namespace fulcrum

#endif  // FULCRUM_WORKER_EXAMPLE_AUDIT_H_
