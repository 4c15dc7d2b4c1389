// Job spec defaults and validation. Every rejection is INVALID_ARGUMENT naming
// the field (by its JSON name, as users write it in YAML) and the allowed range.
#ifndef FULCRUM_SCHEDULER_JOB_SPEC_H_
#define FULCRUM_SCHEDULER_JOB_SPEC_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "fulcrum/v1/job.pb.h"

namespace fulcrum {

constexpr char kDefaultFashionMnistPath[] = "/usr/share/datasets/fashion-mnist";

// The most a job spec may take serialized (the CLI reads spec files of at
// most as many bytes of text): the scheduler keeps, stores and sends it with
// the job's status, assignments and checkpoints.
constexpr size_t kMaxJobSpecBytes = 1 << 20;

// Fills the documented defaults of fields left unset (epochs 1, numWorkers 1,
// mode BSP (ASP for click models), activation RELU, optimizer SGD, schedule
// CONSTANT, data path).
void ApplyJobSpecDefaults(v1::JobSpec* spec);

// Checks a spec after ApplyJobSpecDefaults. Also rejects unknown fields and
// enum values that a binary client may have sent.
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// A dataset path the workers will open (`field` names it in errors):
// absolute, printable, bounded. Where it may point is each worker's decision
// (fulcrum-worker --data-root).
absl::Status ValidateDataPath(const std::string& field, const std::string& path);

// The parts of ValidateJobSpec for click models (scheduler/job_spec_click.cc):
// their model, tables and data, and what they cannot use yet; and, for
// other models, that no click field is set.
absl::Status ValidateClickJob(const v1::JobSpec& spec);
absl::Status ValidateNotClick(const v1::JobSpec& spec);
// A GRAPH over dense data (FASHION_MNIST, SYNTHETIC) of an MLP's shape
// (kernels/graph_model.h GraphAsMlp; the others train on the click path,
// kernels/model_from_spec.h TrainsOnClickPath): the data's features and
// classes.
absl::Status ValidateDenseGraph(const v1::JobSpec& spec);

// Whether `spec` may start from a checkpoint of a job of spec `source`
// (both after ApplyJobSpecDefaults) as far as the specs tell: the
// checkpoint's optimizer state is read back slot for slot, so the dense
// optimizer and each table's (by name) must keep what their state means
// (ADAM, ADAMW and LAMB share Adam's moments; SGD with and without momentum
// do not). FAILED_PRECONDITION naming the change otherwise. The model's
// tensors and tables are checked against the checkpoint itself when the job
// starts.
absl::Status ValidateResume(const v1::JobSpec& source, const v1::JobSpec& spec);

}  // namespace fulcrum

#endif  // FULCRUM_SCHEDULER_JOB_SPEC_H_
