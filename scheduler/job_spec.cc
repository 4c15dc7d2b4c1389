#include "scheduler/job_spec.h"

#include <cmath>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/data_partition.h"
#include "common/lr_scaling.h"
#include "common/memory_budget.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/table_spec.h"
#include "common/tensor_codec.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "google/protobuf/unknown_field_set.h"
#include "kernels/model_from_spec.h"
#include "scheduler/job_spec_checks.h"

namespace fulcrum {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

using job_spec_checks::CheckFloat;
using job_spec_checks::CheckRange;
using job_spec_checks::Invalid;

// Unknown fields and out-of-range enum numbers, recursively.
absl::Status CheckWellFormed(const Message& message, const std::string& path) {
  const auto* reflection = message.GetReflection();
  const auto& unknown = reflection->GetUnknownFields(message);
  if (!unknown.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: unknown field number ",
                                                   unknown.field(0).number(), " in ",
                                                   path.empty() ? "the spec" : path));
  }
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    std::string name = path.empty() ? field->json_name() : absl::StrCat(path, ".", field->json_name());
    if (field->type() == FieldDescriptor::TYPE_ENUM && !field->is_repeated()) {
      int number = reflection->GetEnumValue(message, field);
      if (field->enum_type()->FindValueByNumber(number) == nullptr) {
        return Invalid(name, "is not a known value", absl::StrCat(number));
      }
    }
    if (field->type() == FieldDescriptor::TYPE_MESSAGE && !field->is_repeated()) {
      RETURN_IF_ERROR(CheckWellFormed(reflection->GetMessage(message, field), name));
    }
    if (field->type() == FieldDescriptor::TYPE_ENUM && field->is_repeated()) {
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        const int number = reflection->GetRepeatedEnumValue(message, field, i);
        if (field->enum_type()->FindValueByNumber(number) == nullptr) {
          return Invalid(absl::StrCat(name, "[", i, "]"), "is not a known value", absl::StrCat(number));
        }
      }
    }
    if (field->type() == FieldDescriptor::TYPE_MESSAGE && field->is_repeated() && !field->is_map()) {
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        RETURN_IF_ERROR(CheckWellFormed(reflection->GetRepeatedMessage(message, field, i), absl::StrCat(name, "[", i, "]")));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const v1::ModelSpec& model) {
  switch (model.kind()) {
    case v1::ModelSpec::SOFTMAX_REGRESSION:
      if (model.hidden_sizes_size() > 0) {
        return Invalid("model.hiddenSizes", "must be empty for SOFTMAX_REGRESSION (use MLP)",
                       absl::StrCat(model.hidden_sizes_size(), " sizes"));
      }
      return absl::OkStatus();
    case v1::ModelSpec::MLP:
      if (model.hidden_sizes_size() < 1 || model.hidden_sizes_size() > 16) {
        return Invalid("model.hiddenSizes", "must list 1 to 16 layer sizes for MLP",
                       absl::StrCat(model.hidden_sizes_size(), " sizes"));
      }
      for (int i = 0; i < model.hidden_sizes_size(); ++i) {
        RETURN_IF_ERROR(CheckRange(absl::StrCat("model.hiddenSizes[", i, "]"),
                                   model.hidden_sizes(i), 1, 65536));
      }
      return absl::OkStatus();
    default:
      return Invalid("model.kind",
                     "must be SOFTMAX_REGRESSION, MLP, LOGISTIC_REGRESSION, FM, WIDE_AND_DEEP, DEEPFM, DLRM or GRAPH",
                     "unset");
  }
}

absl::Status ValidateData(const v1::DataSpec& data) {
  if (data.dataset() == v1::DataSpec::FASHION_MNIST) {
    RETURN_IF_ERROR(ValidateDataPath("data.path", data.path()));
    if (data.synthetic_examples()) return Invalid("data.syntheticExamples", "applies to SYNTHETIC data only", "a value");
    if (data.synthetic_features()) return Invalid("data.syntheticFeatures", "applies to SYNTHETIC data only", "a value");
    if (data.synthetic_classes()) return Invalid("data.syntheticClasses", "applies to SYNTHETIC data only", "a value");
  } else if (data.dataset() == v1::DataSpec::SYNTHETIC) {
    if (!data.path().empty()) return Invalid("data.path", "applies to FASHION_MNIST data only", Quote(data.path()));
    RETURN_IF_ERROR(CheckRange<int64_t>("data.syntheticExamples", data.synthetic_examples(), 1, 100000000));
    RETURN_IF_ERROR(CheckRange("data.syntheticFeatures", data.synthetic_features(), 1, 65536));
    RETURN_IF_ERROR(CheckRange("data.syntheticClasses", data.synthetic_classes(), 2, 65536));
  } else {
    return Invalid("data.dataset", "must be FASHION_MNIST or SYNTHETIC", "unset");
  }
  return absl::OkStatus();
}

// How a job steps through its data, whatever the dataset.
absl::Status ValidateDataSteps(const v1::DataSpec& data) {
  RETURN_IF_ERROR(CheckRange("data.batchSize", data.batch_size(), 1, 65536));
  RETURN_IF_ERROR(CheckRange("data.gradientAccumulation", data.gradient_accumulation(), 0, 1024));
  RETURN_IF_ERROR(CheckRange("data.epochs", data.epochs(), 1, 10000));
  RETURN_IF_ERROR(CheckRange<int64_t>("data.maxSteps", data.max_steps(), 0, int64_t{1} << 40));
  RETURN_IF_ERROR(CheckRange<int64_t>("data.evalEverySteps", data.eval_every_steps(), 0, int64_t{1} << 40));
  return absl::OkStatus();
}

// What one step of a data partition computes: micro-batches (gradient
// accumulation) or local SGD steps, and how many examples that takes.
absl::Status ValidateStepShape(const v1::JobSpec& spec) {
  const v1::LocalSgdSpec& local = spec.local_sgd();
  RETURN_IF_ERROR(CheckRange("localSgd.steps", local.steps(), 0, 1024));
  if (local.steps() > 1) {
    RETURN_IF_ERROR(CheckFloat("localSgd.lr", local.lr(), 0, 1000, true, false));
    if (spec.data().gradient_accumulation() > 1) {
      return Invalid("localSgd.steps", "cannot be combined with data.gradientAccumulation",
                     absl::StrCat(local.steps()));
    }
    if (spec.optimizer().lr_scaling() == v1::OptimizerSpec::LINEAR) {
      return Invalid("optimizer.lrScaling",
                     "must not be LINEAR with localSgd (its pushes are parameter deltas, not gradients)", "LINEAR");
    }
  } else if (local.lr() != 0) {
    return Invalid("localSgd.lr", "needs localSgd.steps > 1", absl::StrCat(local.lr()));
  }
  if (StepBatchSize(spec) > kMaxStepExamples) {
    return Invalid(local.steps() > 1 ? "localSgd.steps" : "data.gradientAccumulation",
                   absl::StrCat("makes a step of ", StepBatchSize(spec), " examples (data.batchSize x ",
                                BatchesPerStep(spec), "), more than ", kMaxStepExamples),
                   absl::StrCat(BatchesPerStep(spec)));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const v1::OptimizerSpec& opt) {
  RETURN_IF_ERROR(CheckFloat("optimizer.lr", opt.lr(), 0, 1000, true, false));
  RETURN_IF_ERROR(CheckFloat("optimizer.weightDecay", opt.weight_decay(), 0, 10, false, false));
  RETURN_IF_ERROR(CheckFloat("optimizer.momentum", opt.momentum(), 0, 1, false, true));
  RETURN_IF_ERROR(CheckFloat("optimizer.beta1", opt.beta1(), 0, 1, false, true));
  RETURN_IF_ERROR(CheckFloat("optimizer.beta2", opt.beta2(), 0, 1, false, true));
  RETURN_IF_ERROR(CheckFloat("optimizer.epsilon", opt.epsilon(), 0, 1, false, false));
  RETURN_IF_ERROR(CheckFloat("optimizer.initialAccumulator", opt.initial_accumulator(), 0, 1e6, false, false));
  RETURN_IF_ERROR(CheckFloat("optimizer.alpha", opt.alpha(), 0, 1, false, true));
  bool sgd = opt.kind() == v1::OptimizerSpec::SGD;
  bool adam = opt.kind() == v1::OptimizerSpec::ADAM || opt.kind() == v1::OptimizerSpec::ADAMW ||
              opt.kind() == v1::OptimizerSpec::LAMB;
  bool rmsprop = opt.kind() == v1::OptimizerSpec::RMSPROP;
  if (!sgd && !rmsprop && opt.momentum() != 0) {
    return Invalid("optimizer.momentum", "applies to SGD and RMSPROP only", absl::StrCat(opt.momentum()));
  }
  if (!sgd && opt.nesterov()) return Invalid("optimizer.nesterov", "applies to SGD only", "true");
  if (!rmsprop && opt.has_alpha()) return Invalid("optimizer.alpha", "applies to RMSPROP only", "a value");
  if (!rmsprop && opt.centered()) return Invalid("optimizer.centered", "applies to RMSPROP only", "true");
  if (opt.nesterov() && opt.momentum() <= 0) {
    return Invalid("optimizer.nesterov", "needs optimizer.momentum > 0", "momentum 0");
  }
  if (!adam && opt.has_beta1()) return Invalid("optimizer.beta1", "applies to ADAM, ADAMW and LAMB only", "a value");
  if (!adam && opt.has_beta2()) return Invalid("optimizer.beta2", "applies to ADAM, ADAMW and LAMB only", "a value");
  if (sgd && opt.has_epsilon()) {
    return Invalid("optimizer.epsilon", "applies to ADAM, ADAMW, LAMB, ADAGRAD and RMSPROP only", "a value");
  }
  if (opt.kind() != v1::OptimizerSpec::ADAGRAD && opt.initial_accumulator() != 0) {
    return Invalid("optimizer.initialAccumulator", "applies to ADAGRAD only", "a value");
  }
  if (opt.has_epsilon() && opt.epsilon() == 0 &&
      !(opt.kind() == v1::OptimizerSpec::ADAGRAD && opt.initial_accumulator() > 0)) {
    return Invalid(
        "optimizer.epsilon",
        "must be > 0 (or, for ADAGRAD, optimizer.initialAccumulator > 0): a zero gradient would divide "
        "0 by 0",
        "0");
  }
  return absl::OkStatus();
}

absl::Status ValidateSchedule(const v1::LrScheduleSpec& schedule, float lr) {
  RETURN_IF_ERROR(CheckRange<int64_t>("lrSchedule.warmupSteps", schedule.warmup_steps(), 0, int64_t{1} << 40));
  RETURN_IF_ERROR(CheckFloat("lrSchedule.minLr", schedule.min_lr(), 0, lr, false, false));
  switch (schedule.kind()) {
    case v1::LrScheduleSpec::CONSTANT:
      if (schedule.warmup_steps() || schedule.step_size() || schedule.min_lr() || schedule.gamma()) {
        return Invalid("lrSchedule", "takes no parameters when kind is CONSTANT", "parameters");
      }
      return absl::OkStatus();
    case v1::LrScheduleSpec::WARMUP_COSINE:
      if (schedule.step_size()) return Invalid("lrSchedule.stepSize", "applies to STEP_DECAY only", "a value");
      if (schedule.gamma()) return Invalid("lrSchedule.gamma", "applies to STEP_DECAY only", "a value");
      return absl::OkStatus();
    case v1::LrScheduleSpec::STEP_DECAY:
      RETURN_IF_ERROR(CheckRange<int64_t>("lrSchedule.stepSize", schedule.step_size(), 1, int64_t{1} << 40));
      RETURN_IF_ERROR(CheckFloat("lrSchedule.gamma", schedule.gamma(), 0, 1, true, false));
      if (schedule.warmup_steps()) return Invalid("lrSchedule.warmupSteps", "applies to WARMUP_COSINE only", "a value");
      if (schedule.min_lr()) return Invalid("lrSchedule.minLr", "applies to WARMUP_COSINE only", "a value");
      return absl::OkStatus();
    default:
      return Invalid("lrSchedule.kind", "must be CONSTANT, WARMUP_COSINE or STEP_DECAY", "unset");
  }
}

}  // namespace

absl::Status ValidateDataPath(const std::string& field, const std::string& path) {
  constexpr size_t kMaxPath = 4096;
  if (path.size() > kMaxPath) {
    return Invalid(field, absl::StrCat("must be at most ", kMaxPath, " bytes"), absl::StrCat(path.size()));
  }
  if (!IsPrintable(path)) return Invalid(field, "must not contain NUL or other control characters", Quote(path));
  if (path.empty() || path[0] != '/') return Invalid(field, "must be an absolute path", Quote(path));
  return absl::OkStatus();
}

void ApplyJobSpecDefaults(v1::JobSpec* spec) {
  if (spec->data().epochs() == 0) spec->mutable_data()->set_epochs(1);
  if (spec->data().dataset() == v1::DataSpec::FASHION_MNIST && spec->data().path().empty()) {
    spec->mutable_data()->set_path(kDefaultFashionMnistPath);
  }
  if (spec->num_workers() == 0) spec->set_num_workers(1);
  if (spec->max_workers() == 0) spec->set_max_workers(spec->num_workers());
  if (spec->min_workers() == 0) spec->set_min_workers(1);
  if (spec->checkpoint().keep_last() == 0 &&
      (spec->checkpoint().every_steps() > 0 || spec->checkpoint().every_seconds() > 0)) {
    spec->mutable_checkpoint()->set_keep_last(3);
  }
  if (spec->checkpoint().full_every() == 0) spec->mutable_checkpoint()->set_full_every(8);
  // Click models default to ASP; dense data (every graph over it too) to BSP.
  if (spec->mode() == v1::MODE_UNSPECIFIED) spec->set_mode(IsClickModel(*spec) ? v1::ASP : v1::BSP);
  if (spec->precision() == v1::PRECISION_UNSPECIFIED) spec->set_precision(v1::FP32);
  if (spec->wire_format() == v1::WIRE_FORMAT_UNSPECIFIED) spec->set_wire_format(v1::WIRE_FP32);
  if (spec->compression().kind() == v1::CompressionSpec::TOPK && spec->compression().topk_ratio() == 0) {
    spec->mutable_compression()->set_topk_ratio(kDefaultTopkRatio);
  }
  if (spec->model().kind() == v1::ModelSpec::MLP &&
      spec->model().activation() == v1::ACTIVATION_UNSPECIFIED) {
    spec->mutable_model()->set_activation(v1::RELU);
  }
  if (spec->optimizer().kind() == v1::OptimizerSpec::KIND_UNSPECIFIED) {
    spec->mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  }
  if (spec->lr_schedule().kind() == v1::LrScheduleSpec::KIND_UNSPECIFIED) {
    spec->mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::CONSTANT);
  }
  if (spec->lr_schedule().kind() == v1::LrScheduleSpec::STEP_DECAY &&
      spec->lr_schedule().gamma() == 0) {
    spec->mutable_lr_schedule()->set_gamma(0.1f);
  }
}

absl::Status ValidateCompression(const v1::JobSpec& spec) {
  if (IsCompressedWire(spec.wire_format())) {
    return Invalid("wireFormat", "is WIRE_FP32, WIRE_BF16 or WIRE_FP16 (compressed pushes are set by compression.kind)",
                   v1::WireFormat_Name(spec.wire_format()));
  }
  const v1::CompressionSpec& compression = spec.compression();
  if (compression.kind() == v1::CompressionSpec::TOPK) {
    if (!(compression.topk_ratio() > 0 && compression.topk_ratio() <= 1)) {  // also NaN
      return Invalid("compression.topkRatio", "must be in (0, 1]", absl::StrCat(compression.topk_ratio()));
    }
  } else if (compression.topk_ratio() != 0) {
    return Invalid("compression.topkRatio", "applies to compression.kind TOPK only", absl::StrCat(compression.topk_ratio()));
  }
  if (compression.kind() != v1::CompressionSpec::NONE && spec.wire_format() != v1::WIRE_FP32 &&
      spec.wire_format() != v1::WIRE_FORMAT_UNSPECIFIED) {
    return Invalid("wireFormat", "must be WIRE_FP32 with compression (pushes are compressed from float32, pulls travel in float32)",
                   v1::WireFormat_Name(spec.wire_format()));
  }
  return absl::OkStatus();
}

absl::Status ValidateEarlyStopping(const v1::JobSpec& spec) {
  const v1::EarlyStoppingSpec& e = spec.early_stopping();
  RETURN_IF_ERROR(CheckRange("earlyStopping.patience", e.patience(), 0, 10000));
  RETURN_IF_ERROR(CheckFloat("earlyStopping.minDelta", e.min_delta(), 0.0f, 1e6f, false, false));
  if (e.patience() == 0) {
    if (e.metric() != v1::EarlyStoppingSpec::METRIC_UNSPECIFIED || e.min_delta() != 0) {
      return Invalid("earlyStopping.patience", "must be at least 1 for the job to stop early (metric or minDelta set)",
                     "0");
    }
    return absl::OkStatus();
  }
  if (e.metric() == v1::EarlyStoppingSpec::METRIC_UNSPECIFIED) {
    return Invalid("earlyStopping.metric", "must be TEST_LOSS, TEST_ACCURACY or TEST_AUC with a patience", "unset");
  }
  const v1::DataSpec::Dataset dataset = spec.data().dataset();
  if ((dataset == v1::DataSpec::LIBSVM || dataset == v1::DataSpec::CSV) && spec.data().test_path().empty()) {
    return Invalid(
        "earlyStopping",
        absl::StrCat("needs a test set to watch: set data.testPath (", v1::DataSpec::Dataset_Name(dataset),
                     " files are evaluated on it only; without it the job would never stop early)"),
        absl::StrCat("patience ", e.patience()));
  }
  if (e.metric() == v1::EarlyStoppingSpec::TEST_AUC && IsDenseData(spec.data())) {
    return Invalid(
        "earlyStopping.metric",
        "TEST_AUC needs a click model on click data (models over FASHION_MNIST and SYNTHETIC report accuracy and loss)",
        "TEST_AUC");
  }
  if (e.metric() == v1::EarlyStoppingSpec::TEST_AUC && !TrainsOnClickPath(spec)) {
    return Invalid("earlyStopping.metric", "TEST_AUC needs a click model (other models report no AUC)", "TEST_AUC");
  }
  if (spec.model().kind() == v1::ModelSpec::GRAPH && TrainsOnClickPath(spec) &&
      e.metric() != v1::EarlyStoppingSpec::TEST_LOSS) {
    const ModelLayout layout = LayoutFor(spec, 0, 0);
    const kernels::LossKind loss = kernels::GraphLossOf(layout.graph_config);
    if (e.metric() == v1::EarlyStoppingSpec::TEST_AUC && loss != kernels::LossKind::kSigmoidCrossEntropy) {
      return Invalid("earlyStopping.metric", "TEST_AUC needs a GRAPH with SIGMOID_CROSS_ENTROPY loss", "TEST_AUC");
    }
    if (e.metric() == v1::EarlyStoppingSpec::TEST_ACCURACY && loss == kernels::LossKind::kMeanSquaredError) {
      return Invalid("earlyStopping.metric", "TEST_ACCURACY needs a classification loss (MEAN_SQUARED_ERROR reports none)",
                     "TEST_ACCURACY");
    }
  }
  return absl::OkStatus();
}

namespace {

// What a dense optimizer's saved state holds, slot for slot.
std::string DenseStateOf(const v1::OptimizerSpec& opt) {
  switch (opt.kind()) {
    case v1::OptimizerSpec::ADAM:
    case v1::OptimizerSpec::ADAMW:
    case v1::OptimizerSpec::LAMB:
      return "Adam's two moments";
    case v1::OptimizerSpec::ADAGRAD:
      return "Adagrad's sum of squared gradients";
    case v1::OptimizerSpec::RMSPROP:
      return absl::StrCat("RMSprop's squared-gradient average", opt.centered() ? ", gradient average" : "",
                          opt.momentum() > 0 ? ", momentum buffer" : "");
    default:
      return opt.momentum() > 0 ? "SGD's momentum buffer" : "nothing (SGD without momentum)";
  }
}

// The same for a table's optimizer (KIND_UNSPECIFIED is Adagrad).
std::string TableStateOf(const v1::SparseOptimizerSpec& opt) {
  switch (opt.kind()) {
    case v1::SparseOptimizerSpec::SGD:
      return "nothing (SGD)";
    case v1::SparseOptimizerSpec::FTRL:
      return "FTRL's z and n";
    case v1::SparseOptimizerSpec::ADAM:
      return "lazy Adam's two moments";
    default:
      return "Adagrad's sum of squared gradients";
  }
}

std::string OptimizerName(const v1::OptimizerSpec& opt) {
  const std::string kind =
      opt.kind() == v1::OptimizerSpec::KIND_UNSPECIFIED ? "SGD" : v1::OptimizerSpec::Kind_Name(opt.kind());
  return absl::StrCat(kind, opt.momentum() > 0 ? " with momentum" : "", opt.centered() ? ", centered" : "");
}

std::string TableOptimizerName(const v1::SparseOptimizerSpec& opt) {
  return opt.kind() == v1::SparseOptimizerSpec::KIND_UNSPECIFIED
             ? "ADAGRAD"
             : v1::SparseOptimizerSpec::Kind_Name(opt.kind());
}

}  // namespace

absl::Status ValidateResume(const v1::JobSpec& source, const v1::JobSpec& spec) {
  const std::string from = DenseStateOf(source.optimizer()), to = DenseStateOf(spec.optimizer());
  if (from != to) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resumeFrom: the checkpoint's dense optimizer state is ", from, " (",
        OptimizerName(source.optimizer()), "), and this job's optimizer ", OptimizerName(spec.optimizer()),
        " keeps ", to,
        ": the state is read back as it was saved, so resume with the same optimizer (ADAM, ADAMW and LAMB "
        "may replace each other), or start without resumeFrom"));
  }
  // A table either spec names (one the other leaves out has the default optimizer).
  auto optimizer_of = [](const v1::JobSpec& of, const std::string& name) {
    for (const v1::TableSpec& table : of.model().tables()) {
      if (table.name() == name) return table.optimizer();
    }
    return v1::SparseOptimizerSpec();
  };
  std::set<std::string> names;
  for (const v1::JobSpec* of : {&source, &spec}) {
    for (const v1::TableSpec& table : of->model().tables()) names.insert(table.name());
  }
  for (const std::string& name : names) {
    const v1::SparseOptimizerSpec saved = optimizer_of(source, name), now = optimizer_of(spec, name);
    const std::string was = TableStateOf(saved), is = TableStateOf(now);
    if (was != is) {
      return absl::FailedPreconditionError(absl::StrCat(
          "resumeFrom: table ", name, "'s rows were saved with ", was, " (", TableOptimizerName(saved),
          "), and this job's table optimizer ", TableOptimizerName(now), " keeps ", is,
          ": resume with the same table optimizer, or start without resumeFrom"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateLrScaling(const v1::JobSpec& spec) {
  const v1::OptimizerSpec& opt = spec.optimizer();
  if (opt.lr_scaling() != v1::OptimizerSpec::LINEAR) {
    if (opt.base_batch_size() != 0) {
      return Invalid("optimizer.baseBatchSize", "applies to optimizer.lrScaling LINEAR only",
                     absl::StrCat(opt.base_batch_size()));
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CheckRange("optimizer.baseBatchSize", opt.base_batch_size(), 1, 1 << 24));
  const double scaled = static_cast<double>(opt.lr()) * LrScale(spec);
  if (!(scaled > 0 && scaled <= 1000)) {
    return Invalid("optimizer.lr", "scaled by lrScaling LINEAR must stay in (0, 1000]",
                   absl::StrCat(opt.lr(), " x ", LrScale(spec), " = ", scaled));
  }
  return absl::OkStatus();
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  if (const size_t bytes = spec.ByteSizeLong(); bytes > kMaxJobSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: the spec takes ",
                                                   FormatBytes(static_cast<int64_t>(bytes)),
                                                   " serialized, at most ", FormatBytes(kMaxJobSpecBytes)));
  }
  RETURN_IF_ERROR(CheckWellFormed(spec, ""));
  if (Utf8Length(spec.name()) > 128) {
    return Invalid("name", "must be at most 128 characters", absl::StrCat(Utf8Length(spec.name())));
  }
  if (!IsPrintable(spec.name())) return Invalid("name", "must not contain control characters", Quote(spec.name()));
  if (TrainsOnClickPath(spec)) {
    if (spec.model().kind() == v1::ModelSpec::GRAPH && IsDenseData(spec.data())) {
      RETURN_IF_ERROR(ValidateData(spec.data()));  // a GRAPH that is not an MLP
    }
    RETURN_IF_ERROR(ValidateClickJob(spec));
  } else {
    RETURN_IF_ERROR(ValidateNotClick(spec));
    if (spec.model().kind() == v1::ModelSpec::GRAPH) {
      RETURN_IF_ERROR(ValidateData(spec.data()));  // the graph's shape follows the data's
      RETURN_IF_ERROR(ValidateDenseGraph(spec));
    } else {
      RETURN_IF_ERROR(ValidateModel(spec.model()));
      RETURN_IF_ERROR(ValidateData(spec.data()));
    }
  }
  RETURN_IF_ERROR(ValidateDataSteps(spec.data()));
  RETURN_IF_ERROR(ValidateStepShape(spec));
  RETURN_IF_ERROR(ValidateOptimizer(spec.optimizer()));
  RETURN_IF_ERROR(ValidateSchedule(spec.lr_schedule(), spec.optimizer().lr()));
  RETURN_IF_ERROR(ValidateLrScaling(spec));
  if (spec.optimizer().kind() == v1::OptimizerSpec::LAMB && spec.mode() != v1::BSP) {
    // Each chunk applies its own pushes in ASP and SSP: no step is ever one
    // whole update of a tensor.
    return Invalid("optimizer.kind", "LAMB needs mode BSP: its trust ratio is a norm of each tensor's whole update "
                   "of one step, which ASP and SSP never have",
                   absl::StrCat("mode ", v1::Mode_Name(spec.mode())));
  }
  if (spec.mode() == v1::SSP) {
    RETURN_IF_ERROR(CheckRange("staleness", spec.staleness(), 0, 10000));
  } else if (spec.staleness() != 0) {
    return Invalid("staleness", "applies to mode SSP only", absl::StrCat(spec.staleness()));
  }
  RETURN_IF_ERROR(CheckRange("numWorkers", spec.num_workers(), 1, 1024));
  RETURN_IF_ERROR(CheckRange("maxWorkers", spec.max_workers(), spec.num_workers(), 1024));
  RETURN_IF_ERROR(CheckRange("minWorkers", spec.min_workers(), 1, spec.num_workers()));
  RETURN_IF_ERROR(CheckRange("numShards", spec.num_shards(), 0, 1024));
  RETURN_IF_ERROR(CheckRange("replicas", spec.replicas(), 0, 8));
  RETURN_IF_ERROR(CheckRange<int64_t>("checkpoint.everySteps", spec.checkpoint().every_steps(), 0, int64_t{1} << 40));
  RETURN_IF_ERROR(CheckRange<int64_t>("checkpoint.everySeconds", spec.checkpoint().every_seconds(), 0, int64_t{86400} * 365));
  RETURN_IF_ERROR(CheckRange("checkpoint.keepLast", spec.checkpoint().keep_last(), 0, 1000));
  RETURN_IF_ERROR(CheckRange("checkpoint.fullEvery", spec.checkpoint().full_every(), 0, 64));
  RETURN_IF_ERROR(ValidateCompression(spec));
  RETURN_IF_ERROR(ValidateEarlyStopping(spec));
  return absl::OkStatus();
}

}  // namespace fulcrum
