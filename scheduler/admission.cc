#include "scheduler/admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/data_partition.h"
#include "common/memory_budget.h"
#include "common/rpc.h"
#include "common/table_spec.h"
#include "kernels/model_from_spec.h"

namespace fulcrum {
namespace {

constexpr int64_t kFloat = sizeof(float);

int64_t ExamplesBytes(int64_t examples, int64_t features) { return examples * (features * kFloat + 4); }

int OptimizerSlots(const v1::OptimizerSpec& optimizer) {
  switch (optimizer.kind()) {
    case v1::OptimizerSpec::ADAM:
    case v1::OptimizerSpec::ADAMW:
    case v1::OptimizerSpec::LAMB: return 2;
    case v1::OptimizerSpec::ADAGRAD: return 1;
    case v1::OptimizerSpec::RMSPROP: return 1 + (optimizer.centered() ? 1 : 0) + (optimizer.momentum() > 0 ? 1 : 0);
    default: return optimizer.momentum() > 0 ? 1 : 0;
  }
}

bool Synchronous(const v1::JobSpec& spec) { return spec.mode() == v1::BSP || spec.mode() == v1::MODE_UNSPECIFIED; }

int64_t CeilDiv(int64_t a, int64_t b) { return b <= 0 ? a : a / b + (a % b != 0 ? 1 : 0); }

}  // namespace

DataShape DataShapeOf(const v1::DataSpec& data) {
  DataShape shape;
  if (data.dataset() == v1::DataSpec::SYNTHETIC_CTR || data.dataset() == v1::DataSpec::LIBSVM ||
      data.dataset() == v1::DataSpec::CSV) {
    // Click data: synthetic training examples are made per step, not held;
    // users' files are of a size only the workers see (each checks its
    // budget as it reads them). The synthetic test set is held.
    shape.features = ClickFields(data) + ClickDense(data);
    shape.classes = 2;
    if (data.dataset() == v1::DataSpec::SYNTHETIC_CTR) {
      shape.test_examples = SyntheticCtrTestExamples(data.synthetic_ctr().examples());
      // As the worker holds it, and the evaluation's score.
      shape.example_bytes = SyntheticCtrExampleBytes(ClickFields(data), ClickDense(data)) + 4;
    }
    return shape;
  }
  if (data.dataset() == v1::DataSpec::SYNTHETIC) {
    shape.train_examples = data.synthetic_examples();
    shape.test_examples = std::max<int64_t>(1, data.synthetic_examples() / 5);
    shape.features = data.synthetic_features();
    shape.classes = data.synthetic_classes();
  } else {  // Fashion-MNIST (the Debian package's files)
    shape.train_examples = 60000;
    shape.test_examples = 10000;
    shape.features = kFashionMnistFeatures;
    shape.classes = kFashionMnistClasses;
  }
  return shape;
}

namespace {

// A click step's examples as a worker holds them (worker/ctr_trainer.cc): the
// whole step's (every micro-batch of data.gradientAccumulation), each id with
// its weight and bag offset, dense values and the label; the next step's,
// made meanwhile, and the records the next is made from; and per table the
// step's distinct ids, a row index an id and the hash map that finds them.
// Ids an example: one a field (synthetic data; files' lines may hold more,
// which their workers measure as they read them).
int64_t ClickStepBytes(const v1::JobSpec& spec, const ModelLayout& layout) {
  constexpr int64_t kIdBytes = 8 + 4 + 8;           // id, weight, offset
  constexpr int64_t kDistinctIdBytes = 8 + 4 + 40;  // key, row index, hash map slot just after it grew
  const int64_t ids = StepBatchSize(spec) * ClickFields(spec.data());
  const int64_t examples = StepBatchSize(spec) * (ClickDense(spec.data()) + 1) * kFloat;
  return 3 * (ids * kIdBytes + examples) +
         ids * kDistinctIdBytes * static_cast<int64_t>(layout.tables.size());
}

}  // namespace

JobClaims ClaimsOf(const v1::JobSpec& spec) {
  const DataShape data = DataShapeOf(spec.data());
  const ModelLayout layout = LayoutFor(spec, data.features, data.classes);
  JobClaims claims;
  int64_t widths = data.features + data.classes;
  for (int hidden : layout.config.hidden) widths += hidden;
  for (const auto& tensor : layout.tensors) claims.parameters += tensor.size;
  claims.tensors = static_cast<int64_t>(layout.tensors.size());
  claims.worker_data_bytes = data.example_bytes > 0
                                 ? (data.train_examples + data.test_examples) * data.example_bytes
                                 : ExamplesBytes(data.train_examples, data.features) +
                                       ExamplesBytes(data.test_examples, data.features);
  const bool half_wire = spec.wire_format() == v1::WIRE_BF16 || spec.wire_format() == v1::WIRE_FP16;
  const int64_t batch = spec.data().batch_size();
  // A click model's scratch: every layer's values and gradients for a batch
  // (or an evaluation's), kernels/graph_model.h; a preset kind's as its graph.
  const int64_t graph_bytes = ClickComputeBatch(spec) * ClickValuesPerExample(layout) * kFloat * 2;
  claims.worker_bytes =
      claims.worker_data_bytes + graph_bytes +
      claims.parameters * kFloat * 3 +               // parameters, pull landing, gradients
      (half_wire ? claims.parameters * 2 * 2 : 0) +  // 16-bit parameters and gradients
      (spec.local_sgd().steps() > 1 ? claims.parameters * kFloat : 0) +  // local SGD's own copy
      batch * widths * kFloat * 3 +  // activations, their gradients, the batch
      // a step's other micro-batches (data.gradientAccumulation), inputs and labels
      (layout.click ? ClickStepBytes(spec, layout)
                    : (StepBatchSize(spec) - batch) * (data.features + 1) * kFloat) +
      // compression's residuals: one copy of the gradients per partition it keeps
      (spec.compression().kind() != v1::CompressionSpec::NONE
           ? claims.parameters * kFloat * std::min(spec.max_workers(), 4)
           : 0);
  // Values, optimizer state and (BSP) a gradient per partition, their sum and
  // the previous step's values (JobShard::ChunkBytes).
  claims.server_bytes_per_parameter =
      kFloat * (1 + OptimizerSlots(spec.optimizer()) + (Synchronous(spec) ? spec.max_workers() + 2 : 0));
  // No other wire format sends more than float32's 4 bytes a value.
  if (spec.compression().kind() == v1::CompressionSpec::TOPK) {
    claims.pushed_bytes_per_parameter = 8 * std::max(spec.compression().topk_ratio(), 0.5);
  }
  return claims;
}

namespace {

// The longest chunk whose whole state, and whose pushed gradient, fit
// kMaxChunkStateBytes.
int64_t MaxChunkElems(const JobClaims& claims) {
  const int64_t by_state = kMaxChunkStateBytes / std::max<int64_t>(1, claims.server_bytes_per_parameter);
  const auto by_push = static_cast<int64_t>(static_cast<double>(kMaxChunkStateBytes) /
                                            std::max(1.0, claims.pushed_bytes_per_parameter));
  return std::max<int64_t>(1, std::min(by_state, by_push));
}

}  // namespace

int64_t ChunkElemsFor(const JobClaims& claims, int64_t chunk_elems) {
  // Each tensor may end in a short chunk: the others share what is left.
  const int64_t few_enough = CeilDiv(claims.parameters, std::max<int64_t>(1, kMaxJobChunks - claims.tensors));
  return std::min(std::max(chunk_elems, few_enough), MaxChunkElems(claims));
}

absl::Status CheckChunkCount(const JobClaims& claims, int64_t chunk_elems) {
  const int64_t elems = ChunkElemsFor(claims, chunk_elems);
  // Tensors are cut apart, so each may end in a short chunk.
  const int64_t chunks = CeilDiv(claims.parameters, elems) + claims.tensors;
  if (chunks <= kMaxJobChunks) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the model's ", claims.parameters, " dense parameters in ", claims.tensors,
      " tensors would be cut into ", chunks, " chunks of at most ", elems, " (a chunk's whole state, ",
      claims.server_bytes_per_parameter, " bytes a parameter with this optimizer and mode, must stay within ",
      FormatBytes(kMaxChunkStateBytes), "); a job has at most ", kMaxJobChunks,
      " chunks: a smaller model, fewer maxWorkers in BSP, a lighter optimizer, or a compression.topkRatio "
      "of at most 1/2"));
}

int64_t PerServerBytes(const JobClaims& claims, const v1::JobSpec& spec, int servers) {
  if (servers <= 0) return 0;
  const int64_t shards = spec.num_shards() > 0 ? spec.num_shards() : servers;
  const int64_t replicas = std::max(1, spec.replicas());
  // The busiest server holds ceil(shards * replicas / servers) shards (of at
  // most ceil(parameters / shards) each).
  const int64_t held = CeilDiv(shards * std::min<int64_t>(replicas, servers), servers);
  return held * CeilDiv(claims.parameters, shards) * claims.server_bytes_per_parameter;
}

int64_t RestoredShareBytes(int64_t copy_bytes, int replicas, int servers) {
  if (servers <= 0 || copy_bytes <= 0) return 0;
  // Keys hash to many buckets spread over the servers: each holds about
  // min(replicas, servers) / servers of the copies. (Divided first: a
  // reported count near 2^63 must not overflow.)
  const int64_t copies = std::min(std::max(1, replicas), servers);
  return CeilDiv(copy_bytes, servers) * copies;
}

int64_t PerServerClaimBytes(const JobClaims& claims, const v1::JobSpec& spec, int64_t restored_copy_bytes,
                            int servers) {
  return std::max(PerServerBytes(claims, spec, servers),
                  RestoredShareBytes(restored_copy_bytes, spec.replicas(), servers));
}

absl::Status CheckFitsBudgets(const JobClaims& claims, const v1::JobSpec& spec,
                              const std::vector<int64_t>& worker_budgets,
                              const std::vector<int64_t>& server_budgets, int64_t restored_copy_bytes) {
  if (!worker_budgets.empty()) {
    const int64_t largest = *std::max_element(worker_budgets.begin(), worker_budgets.end());
    if (largest > 0 && claims.worker_bytes > largest) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "each worker of this job needs ", FormatBytes(claims.worker_bytes), " (datasets ",
          FormatBytes(claims.worker_data_bytes), ", ", claims.parameters, " parameters and a batch of ",
          spec.data().batch_size(),
          BatchesPerStep(spec) > 1 ? absl::StrCat(" (", StepBatchSize(spec), " examples a step)") : std::string(),
          "); the largest worker's memory budget is ", FormatBytes(largest),
          " (fulcrum-worker --memory-budget): use a smaller model, batch or dataset"));
    }
  }
  if (!server_budgets.empty()) {
    const int servers = static_cast<int>(server_budgets.size());
    const int64_t per_server = PerServerBytes(claims, spec, servers);
    const int64_t largest = *std::max_element(server_budgets.begin(), server_budgets.end());
    int64_t total = 0;
    for (int64_t b : server_budgets) total += b;
    const int64_t needed = claims.parameters * claims.server_bytes_per_parameter * std::max(1, spec.replicas());
    const bool unknown = std::count(server_budgets.begin(), server_budgets.end(), 0) > 0;
    // A checkpoint whose tables grew past the estimate: its copies must fit.
    const int64_t restored_share = RestoredShareBytes(restored_copy_bytes, spec.replicas(), servers);
    const int64_t copies = std::min(std::max(1, spec.replicas()), servers);
    if (!unknown && restored_share > per_server &&
        (restored_share > largest || restored_copy_bytes > total / copies)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "resumeFrom: the checkpoint's state took ", FormatBytes(restored_copy_bytes),
          " of the servers' memory when it was taken (its tables as they had grown): ",
          FormatBytes(restored_share), " on each of ", servers, " servers holding ",
          copies == 1 ? std::string("one copy") : absl::StrCat(copies, " copies (replicas)"),
          "; their memory budgets are ", FormatBytes(largest), " at most and ", FormatBytes(total),
          " together (fulcrum-server --memory-budget): add servers or give them larger budgets"));
    }
    if (!unknown && (per_server > largest || needed > total)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this job's ", claims.parameters, " parameters need ", FormatBytes(needed), " on the servers (",
          claims.server_bytes_per_parameter, " bytes each: value, optimizer state",
          Synchronous(spec) ? " and BSP buffers (one per data partition, a sum, the last step's values)" : "", ", times ", std::max(1, spec.replicas()),
          " replicas), ", FormatBytes(per_server), " on the busiest of ", servers, " servers; their memory budgets are ",
          FormatBytes(largest), " at most and ", FormatBytes(total),
          " together (fulcrum-server --memory-budget): use a smaller model, fewer maxWorkers or more servers"));
    }
  }
  return absl::OkStatus();
}

}  // namespace fulcrum
