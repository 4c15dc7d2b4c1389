// Admission: what a job claims of the memory budgets of the processes that
// run it, computed from its spec alone (no gRPC, no state: pure functions the
// JobManager calls at submit and when it places a job).
//
// Every server and worker registers its budget (--memory-budget). A job that
// cannot fit the cluster's processes at all is refused at submit with
// RESOURCE_EXHAUSTED naming the numbers; one that fits but not now (other
// jobs hold the memory) waits in the queue with a reason that says so.
#ifndef FULCRUM_SCHEDULER_ADMISSION_H_
#define FULCRUM_SCHEDULER_ADMISSION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fulcrum/v1/job.pb.h"

namespace fulcrum {

struct JobClaims {
  int64_t parameters = 0;    // float32 values of the model
  int64_t tensors = 0;       // dense tensors (each cut into chunks of its own)
  // Each worker: the training and test sets, its parameter, gradient and
  // landing buffers, activations of one batch.
  int64_t worker_bytes = 0;
  int64_t worker_data_bytes = 0;  // the datasets alone
  // Each replica of each parameter on a server: value, optimizer state and
  // (BSP) a gradient buffer per data partition and a sum buffer.
  int64_t server_bytes_per_parameter = 0;
  // The most bytes a pushed gradient value takes on the wire: float32's 4,
  // or TOPK's 8 a kept value (index and value) times the ratio kept, which
  // passes 4 above a ratio of 1/2.
  double pushed_bytes_per_parameter = 4;
};

// The dataset shape a spec implies: Fashion-MNIST's files, or the synthetic
// generator's sizes (test set a fifth of the training set). Click data: its
// fields and dense features, no training examples held (synthetic ones are
// made per step; files are measured by the workers as they read them) and
// the synthetic click test set.
struct DataShape {
  int64_t train_examples = 0;
  int64_t test_examples = 0;
  int features = 0;
  int classes = 0;
  // Bytes a held example takes; 0: its features as floats and a label.
  int64_t example_bytes = 0;
};
DataShape DataShapeOf(const v1::DataSpec& data);

// `spec` after ApplyJobSpecDefaults and validation.
JobClaims ClaimsOf(const v1::JobSpec& spec);

// The most chunks a job's dense tensors are cut into: its shard map goes
// with its status, every worker's assignment and every server's setup, and
// its checkpoints list every chunk with its holders, each within a message
// (a 203,530-parameter MLP cut into 203,530 chunks by --chunk-bytes 4 took
// seconds a step).
constexpr int64_t kMaxJobChunks = 8192;

// The elements per chunk for a job: `chunk_elems` (--chunk-bytes / 4), more
// when the job would take over kMaxJobChunks chunks, and fewer when a
// chunk's whole state (values, optimizer slots and, in BSP, a buffer per
// data partition) or its pushed gradient (top-k at a ratio above 1/2 takes
// more than its floats) would not fit kMaxChunkStateBytes: a job with many
// partitions gets smaller chunks, so re-replication and checkpoint reads,
// which send a chunk's state as one message, and a push of one chunk
// always work. The state bound
// wins: CheckChunkCount refuses a job it leaves over kMaxJobChunks chunks.
int64_t ChunkElemsFor(const JobClaims& claims, int64_t chunk_elems);

// INVALID_ARGUMENT when ChunkElemsFor still cuts the job's dense tensors
// into more than kMaxJobChunks chunks, naming the numbers.
absl::Status CheckChunkCount(const JobClaims& claims, int64_t chunk_elems);

// The most any one server holds of the job when `servers` servers carry its
// shards (numShards, or one per server) with spec.replicas() each.
int64_t PerServerBytes(const JobClaims& claims, const v1::JobSpec& spec, int servers);

// The most any one server holds of a restored copy of `copy_bytes` (a
// checkpoint's CheckpointInfo.server_bytes) laid over `servers` servers with
// `replicas` replicas: the checkpoint's tables as they had grown, which the
// spec's estimate does not know of.
int64_t RestoredShareBytes(int64_t copy_bytes, int replicas, int servers);

// What a job takes on each of `servers` servers: its estimate, or the share
// of the checkpoint it restores from (`restored_copy_bytes`, 0: none) when
// more.
int64_t PerServerClaimBytes(const JobClaims& claims, const v1::JobSpec& spec, int64_t restored_copy_bytes,
                            int servers);

// OK when the job could run on processes with these budgets (empty: none
// registered, nothing to check); RESOURCE_EXHAUSTED naming what it needs and
// what the cluster has otherwise. A budget of 0 is unknown (not checked).
// `restored_copy_bytes`: the server bytes of the checkpoint it resumes from
// (0: none), which it needs on the servers when more than its estimate.
absl::Status CheckFitsBudgets(const JobClaims& claims, const v1::JobSpec& spec,
                              const std::vector<int64_t>& worker_budgets,
                              const std::vector<int64_t>& server_budgets, int64_t restored_copy_bytes = 0);

}  // namespace fulcrum

#endif  // FULCRUM_SCHEDULER_ADMISSION_H_
