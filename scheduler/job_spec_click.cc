// Validation of the click models' parts of a job spec: the model, its
// sparse tables, the synthetic click data, and what such a job cannot use
// yet. Every rejection names the field as users write it.
#include <cmath>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/table_spec.h"
#include "kernels/graph_model.h"
#include "kernels/model_from_spec.h"
#include "scheduler/job_spec.h"
#include "scheduler/job_spec_checks.h"

namespace fulcrum {
namespace {

using job_spec_checks::CheckFloat;
using job_spec_checks::CheckRange;
using job_spec_checks::Invalid;

bool HasHidden(v1::ModelSpec::Kind kind) {
  return kind == v1::ModelSpec::WIDE_AND_DEEP || kind == v1::ModelSpec::DEEPFM || kind == v1::ModelSpec::DLRM;
}

// A GRAPH sets per layer what the preset kinds set for the whole model.
absl::Status ValidateGraphShape(const v1::ModelSpec& model) {
  if (model.embedding_dim() != 0) {
    return Invalid("model.embeddingDim", "applies to the preset kinds; a GRAPH's EMBEDDING layers set dim",
                   absl::StrCat(model.embedding_dim()));
  }
  if (model.hidden_sizes_size() > 0 || model.bottom_sizes_size() > 0) {
    return Invalid("model.hiddenSizes and model.bottomSizes", "apply to the preset kinds; a GRAPH lists LINEAR layers",
                   absl::StrCat(model.hidden_sizes_size() + model.bottom_sizes_size(), " sizes"));
  }
  if (model.activation() != v1::ACTIVATION_UNSPECIFIED) {
    return Invalid("model.activation", "applies to the preset kinds; a GRAPH lists ACTIVATION layers",
                   v1::Activation_Name(model.activation()));
  }
  if (model.combiner() != v1::ModelSpec::COMBINER_UNSPECIFIED) {
    return Invalid("model.combiner", "applies to the preset kinds; a GRAPH's EMBEDDING layers set combiner",
                   v1::ModelSpec::Combiner_Name(model.combiner()));
  }
  if (model.layers_size() < 1 || model.layers_size() > 256) {
    return Invalid("model.layers", "must list 1 to 256 layers for GRAPH", absl::StrCat(model.layers_size(), " layers"));
  }
  // Settings the kernels' defaults would hide when set on another type.
  for (int i = 0; i < model.layers_size(); ++i) {
    const v1::LayerSpec& layer = model.layers(i);
    if (layer.combiner() != v1::ModelSpec::COMBINER_UNSPECIFIED && layer.type() != v1::LayerSpec::EMBEDDING) {
      return Invalid(absl::StrCat("model.layers[", i, "].combiner"), "applies to EMBEDDING layers only",
                     v1::ModelSpec::Combiner_Name(layer.combiner()));
    }
    if (layer.loss() != v1::LayerSpec::LOSS_UNSPECIFIED && layer.type() != v1::LayerSpec::LOSS) {
      return Invalid(absl::StrCat("model.layers[", i, "].loss"), "applies to the LOSS layer only",
                     v1::LayerSpec::Loss_Name(layer.loss()));
    }
  }
  return absl::OkStatus();
}

// A click model's scratch for a batch (or an evaluation's): every layer's
// values an example, times the examples, at most 2^28 (1 GiB of floats, as
// much again for their gradients). A preset kind counts as its graph.
absl::Status ValidateClickBatchValues(const v1::JobSpec& spec, const ModelLayout& layout) {
  const int64_t batch = ClickComputeBatch(spec);
  const int64_t per_example = ClickValuesPerExample(layout);
  const int64_t values = batch * per_example;
  if (values <= (int64_t{1} << 28)) return absl::OkStatus();
  const std::string kind = v1::ModelSpec::Kind_Name(spec.model().kind());
  // The evaluation's batch is the larger: a smaller step batch cannot help.
  const bool evaluation = batch == kClickEvalBatch && spec.data().batch_size() < kClickEvalBatch;
  return Invalid(
      layout.graph ? "model.layers" : "model",
      absl::StrCat(
          layout.graph ? "take " : absl::StrCat("(", kind, ") takes "), values, " values for a batch of ",
          batch,
          evaluation
              ? absl::StrCat(" (an evaluation's: test examples are scored ", kClickEvalBatch, " at a time)")
              : "",
          " (its examples times every layer's values an example", layout.graph ? "" : ", as its layer graph",
          "), more than 2^28: use ",
          evaluation
              ? (layout.graph ? "smaller layers" : "a smaller embeddingDim, hiddenSizes or fewer fields")
              : (layout.graph ? "a smaller batch or layers"
                              : "a smaller batch, embeddingDim, hiddenSizes or fewer fields")),
      absl::StrCat(per_example, " values an example"));
}

// What a click graph claims beyond its shape: a dense tensor (the job's
// steps and SSP's bound are kept on the dense path), and a bounded scratch
// (every layer's values and gradients for a batch, or for an evaluation's).
absl::Status ValidateClickGraphClaims(const v1::JobSpec& spec, const ModelLayout& layout) {
  if (layout.tensors.empty()) {
    return Invalid(
        "model.layers",
        "need a dense tensor (a LINEAR layer, or an ADD with bias: true): a job's steps and SSP's bound "
        "are kept on its dense tensors",
        layout.tables.empty() ? "a graph without parameters" : "a graph of tables only");
  }
  return ValidateClickBatchValues(spec, layout);
}

absl::Status ValidateClickShape(const v1::ModelSpec& model) {
  const std::string kind = v1::ModelSpec::Kind_Name(model.kind());
  if (model.kind() == v1::ModelSpec::GRAPH) return ValidateGraphShape(model);
  if (model.layers_size() > 0) {
    return Invalid("model.layers", absl::StrCat("apply to GRAPH only, not ", kind), absl::StrCat(model.layers_size(), " layers"));
  }
  if (model.kind() == v1::ModelSpec::LOGISTIC_REGRESSION) {
    if (model.embedding_dim() != 0) {
      return Invalid("model.embeddingDim", "applies to FM, WIDE_AND_DEEP, DEEPFM and DLRM only",
                     absl::StrCat(model.embedding_dim()));
    }
  } else {
    RETURN_IF_ERROR(CheckRange("model.embeddingDim", model.embedding_dim(), 1, 1024));
  }
  if (HasHidden(model.kind())) {
    if (model.hidden_sizes_size() < 1 || model.hidden_sizes_size() > 16) {
      return Invalid("model.hiddenSizes", absl::StrCat("must list 1 to 16 layer sizes for ", kind),
                     absl::StrCat(model.hidden_sizes_size(), " sizes"));
    }
    for (int i = 0; i < model.hidden_sizes_size(); ++i) {
      RETURN_IF_ERROR(CheckRange(absl::StrCat("model.hiddenSizes[", i, "]"), model.hidden_sizes(i), 1, 65536));
    }
  } else if (model.hidden_sizes_size() > 0) {
    return Invalid("model.hiddenSizes",
                   absl::StrCat("must be empty for ", kind, " (use WIDE_AND_DEEP, DEEPFM or DLRM)"),
                   absl::StrCat(model.hidden_sizes_size(), " sizes"));
  }
  if (!HasHidden(model.kind()) && model.activation() != v1::ACTIVATION_UNSPECIFIED) {
    return Invalid("model.activation", "applies to models with hidden layers only",
                   v1::Activation_Name(model.activation()));
  }
  if (model.kind() != v1::ModelSpec::DLRM && model.bottom_sizes_size() > 0) {
    return Invalid("model.bottomSizes", absl::StrCat("applies to DLRM only, not ", kind),
                   absl::StrCat(model.bottom_sizes_size(), " sizes"));
  }
  if (model.bottom_sizes_size() > 16) {
    return Invalid("model.bottomSizes", "must list at most 16 layer sizes",
                   absl::StrCat(model.bottom_sizes_size(), " sizes"));
  }
  for (int i = 0; i < model.bottom_sizes_size(); ++i) {
    RETURN_IF_ERROR(CheckRange(absl::StrCat("model.bottomSizes[", i, "]"), model.bottom_sizes(i), 1, 65536));
  }
  return absl::OkStatus();
}

absl::Status ValidateSparseOptimizer(const std::string& field, const v1::SparseOptimizerSpec& opt) {
  if (opt.lr() != 0) RETURN_IF_ERROR(CheckFloat(field + ".lr", opt.lr(), 0, 1000, true, false));
  const bool adagrad = opt.kind() == v1::SparseOptimizerSpec::ADAGRAD ||
                       opt.kind() == v1::SparseOptimizerSpec::KIND_UNSPECIFIED;
  const bool adam = opt.kind() == v1::SparseOptimizerSpec::ADAM;
  const bool ftrl = opt.kind() == v1::SparseOptimizerSpec::FTRL;
  if (opt.has_epsilon()) {
    if (!adagrad && !adam) return Invalid(field + ".epsilon", "applies to ADAGRAD and ADAM only", "a value");
    RETURN_IF_ERROR(CheckFloat(field + ".epsilon", opt.epsilon(), 0, 1, false, false));
  }
  if (opt.initial_accumulator() != 0) {
    if (!adagrad) return Invalid(field + ".initialAccumulator", "applies to ADAGRAD only", "a value");
    RETURN_IF_ERROR(CheckFloat(field + ".initialAccumulator", opt.initial_accumulator(), 0, 1e6, false, false));
  }
  if (opt.has_epsilon() && opt.epsilon() == 0 && !(adagrad && opt.initial_accumulator() > 0)) {
    return Invalid(
        field + ".epsilon",
        "must be > 0 (or, for ADAGRAD, initialAccumulator > 0): a zero gradient would divide 0 by 0", "0");
  }
  for (const auto& [name, has, value] : {std::tuple<const char*, bool, float>{"beta1", opt.has_beta1(), opt.beta1()},
                                         {"beta2", opt.has_beta2(), opt.beta2()}}) {
    if (!has) continue;
    if (!adam) return Invalid(absl::StrCat(field, ".", name), "applies to ADAM only", "a value");
    RETURN_IF_ERROR(CheckFloat(absl::StrCat(field, ".", name), value, 0, 1, false, true));
  }
  for (const auto& [name, set, value] : {std::tuple<const char*, bool, float>{"l1", opt.l1() != 0, opt.l1()},
                                         {"l2", opt.l2() != 0, opt.l2()},
                                         {"beta", opt.has_beta(), opt.beta()}}) {
    if (!set) continue;
    if (!ftrl) return Invalid(absl::StrCat(field, ".", name), "applies to FTRL only", "a value");
    RETURN_IF_ERROR(CheckFloat(absl::StrCat(field, ".", name), value, 0, 1e6, false, false));
  }
  return absl::OkStatus();
}

absl::Status ValidateTables(const v1::JobSpec& spec) {
  const ModelLayout layout = LayoutFor(spec, 0, 0);
  if (layout.graph) {
    const absl::Status graph = kernels::ValidateGraphConfig(layout.graph_config);
    if (!graph.ok()) return absl::InvalidArgumentError(absl::StrCat("job spec: model.layers: ", graph.message()));
    RETURN_IF_ERROR(ValidateClickGraphClaims(spec, layout));
  }
  std::set<std::string> names;
  std::string known;  // in the model's order
  for (const kernels::CtrTableInfo& table : layout.tables) {
    names.insert(table.name);
    absl::StrAppend(&known, known.empty() ? "" : ", ", table.name);
  }
  std::set<std::string> seen;
  for (int i = 0; i < spec.model().tables_size(); ++i) {
    const v1::TableSpec& table = spec.model().tables(i);
    const std::string field = absl::StrCat("model.tables[", i, "]");
    if (names.count(table.name()) == 0) {
      return Invalid(field + ".name", absl::StrCat("must name a table of the model (", known, ")"),
                     Quote(table.name()));
    }
    if (!seen.insert(table.name()).second) return Invalid(field + ".name", "names a table twice", Quote(table.name()));
    RETURN_IF_ERROR(ValidateSparseOptimizer(field + ".optimizer", table.optimizer()));
    if (table.has_init_scale()) RETURN_IF_ERROR(CheckFloat(field + ".initScale", table.init_scale(), 0, 10, false, false));
    // As the servers set the table up (server/parameter_service_sparse.cc).
    const float init_scale =
        table.has_init_scale() ? table.init_scale() : DefaultTableInitScale(table.name());
    if (table.optimizer().kind() == v1::SparseOptimizerSpec::FTRL && init_scale > 0) {
      return Invalid(
          field + ".initScale",
          "must be 0 with FTRL (its weights follow from its accumulators, so rows start at zero): set "
          "initScale: 0",
          table.has_init_scale()
              ? absl::StrCat(table.init_scale())
              : absl::StrCat("unset: table ", table.name(), " starts uniform in +-", init_scale));
    }
    RETURN_IF_ERROR(CheckRange(field + ".admitAfter", table.admit_after(), 0, 1000000));
    RETURN_IF_ERROR(CheckRange<int64_t>(field + ".expireAfter", table.expire_after(), 0, 1000000000));
    RETURN_IF_ERROR(CheckRange(field + ".buckets", table.buckets(), 0, kMaxTableBuckets));
    if (!v1::TableSpec::Consistency_IsValid(table.consistency())) {
      return Invalid(field + ".consistency", "must be SYNC or ASYNC", absl::StrCat(table.consistency()));
    }
    if (table.consistency() == v1::TableSpec::SYNC && spec.mode() != v1::BSP) {
      return Invalid(field + ".consistency",
                     "SYNC applies to BSP jobs only (ASP and SSP jobs apply every push as it arrives)",
                     absl::StrCat("SYNC in an ", v1::Mode_Name(spec.mode()), " job"));
    }
  }
  if (layout.graph) return absl::OkStatus();
  RETURN_IF_ERROR(kernels::ValidateCtrModelConfig(layout.ctr));
  // A preset kind runs as its layer graph on a GPU worker, and its scratch
  // is counted as that graph's: the graph's bounds (a weight at most 2^28
  // floats) hold for it too, else its shapes, and so its memory, are unknown.
  if (absl::Status graph = kernels::ValidateGraphConfig(kernels::CtrModelAsGraph(layout.ctr)); !graph.ok()) {
    return Invalid(
        "model",
        absl::StrCat("(", v1::ModelSpec::Kind_Name(spec.model().kind()), ") as its layer graph: ",
                     graph.message(), ": use a smaller embeddingDim, model.hiddenSizes or fewer fields"),
        absl::StrCat("embeddingDim ", layout.ctr.embedding_dim, ", hiddenSizes [",
                     absl::StrJoin(spec.model().hidden_sizes(), ", "), "], ", layout.ctr.num_fields,
                     " fields and ", layout.ctr.num_dense, " dense features"));
  }
  return ValidateClickBatchValues(spec, layout);
}

absl::Status ValidateSyntheticClickData(const v1::DataSpec& data) {
  if (!data.path().empty()) return Invalid("data.path", "applies to FASHION_MNIST, LIBSVM and CSV data", Quote(data.path()));
  const v1::SyntheticCtrSpec& ctr = data.synthetic_ctr();
  RETURN_IF_ERROR(
      CheckRange<int64_t>("data.syntheticCtr.examples", ctr.examples(), 1, kMaxSyntheticCtrExamples));
  RETURN_IF_ERROR(CheckRange("data.syntheticCtr.fields", ctr.fields(), 0, kMaxSyntheticCtrFields));
  RETURN_IF_ERROR(CheckRange<int64_t>("data.syntheticCtr.vocabulary", ctr.vocabulary(), 0, 1000000000));
  RETURN_IF_ERROR(CheckFloat("data.syntheticCtr.zipfExponent", ctr.zipf_exponent(), 0, 10, false, false));
  RETURN_IF_ERROR(CheckRange("data.syntheticCtr.dense", ctr.dense(), 0, kMaxSyntheticCtrDense));
  RETURN_IF_ERROR(CheckRange("data.syntheticCtr.fmDim", ctr.fm_dim(), 0, kMaxSyntheticCtrFmDim));
  RETURN_IF_ERROR(CheckFloat("data.syntheticCtr.weightScale", ctr.weight_scale(), 0, 10, false, false));
  RETURN_IF_ERROR(CheckFloat("data.syntheticCtr.fmScale", ctr.fm_scale(), 0, 10, false, false));
  if (ctr.has_bias()) RETURN_IF_ERROR(CheckFloat("data.syntheticCtr.bias", ctr.bias(), -20, 20, false, false));
  return absl::OkStatus();
}

absl::Status ValidateFileClickData(const v1::DataSpec& data) {
  const std::string kind = v1::DataSpec::Dataset_Name(data.dataset());
  if (data.has_synthetic_ctr()) return Invalid("data.syntheticCtr", "applies to SYNTHETIC_CTR data only", kind);
  RETURN_IF_ERROR(ValidateDataPath("data.path", data.path()));
  if (!data.test_path().empty()) RETURN_IF_ERROR(ValidateDataPath("data.testPath", data.test_path()));
  if (data.dataset() == v1::DataSpec::LIBSVM) {
    return CheckRange("data.libsvm.fields", data.libsvm().fields(), 0, kMaxLibsvmFields);
  }
  const v1::CsvSpec& csv = data.csv();
  RETURN_IF_ERROR(CheckRange("data.csv.columns", csv.columns_size(), 1, 4096));
  int labels = 0;
  for (int c : csv.columns()) labels += c == v1::CsvSpec::LABEL ? 1 : 0;
  if (labels != 1) return Invalid("data.csv.columns", "must have exactly one LABEL column", absl::StrCat(labels));
  // One printable character that no number holds (so "1.5e-3" stays one
  // value), a space or a tab.
  const std::string& delimiter = csv.delimiter();
  const auto c = delimiter.empty() ? ',' : delimiter[0];
  if (delimiter.size() > 1 || (c != '\t' && (c < 0x20 || c > 0x7e)) || c == '"' || absl::ascii_isalnum(c) ||
      c == '.' || c == '+' || c == '-') {
    return Invalid(
        "data.csv.delimiter",
        "must be one printable character other than a quote, a letter, a digit, '.', '+' or '-' (or a "
        "space or a tab)",
        Quote(delimiter));
  }
  if (ClickFields(data) == 0 && ClickDense(data) == 0) {
    return Invalid("data.csv.columns", "must have a DENSE or CATEGORICAL column", "none");
  }
  return absl::OkStatus();
}

absl::Status ValidateClickData(const v1::DataSpec& data) {
  if (data.synthetic_examples() || data.synthetic_features() || data.synthetic_classes()) {
    return Invalid("data.synthetic*", "apply to SYNTHETIC data only (SYNTHETIC_CTR takes data.syntheticCtr)",
                   "a value");
  }
  // Each format's own settings on another click dataset.
  const std::string kind = v1::DataSpec::Dataset_Name(data.dataset());
  if (data.has_csv() && data.dataset() != v1::DataSpec::CSV) {
    return Invalid("data.csv", "applies to CSV data only", kind);
  }
  if (data.has_libsvm() && data.dataset() != v1::DataSpec::LIBSVM) {
    return Invalid("data.libsvm", "applies to LIBSVM data only", kind);
  }
  switch (data.dataset()) {
    case v1::DataSpec::SYNTHETIC_CTR:
      if (!data.test_path().empty() || data.on_bad_record() != v1::DataSpec::ON_BAD_RECORD_UNSPECIFIED) {
        return Invalid(
            "data", "testPath and onBadRecord apply to LIBSVM and CSV data (the synthetic test set is made)",
            "SYNTHETIC_CTR");
      }
      return ValidateSyntheticClickData(data);
    case v1::DataSpec::LIBSVM:
    case v1::DataSpec::CSV:
      return ValidateFileClickData(data);
    default:
      return Invalid("data.dataset",
                     "must be SYNTHETIC_CTR, LIBSVM or CSV for a click model (a GRAPH also takes "
                     "FASHION_MNIST and SYNTHETIC)",
                     kind);
  }
}

// What a job with sparse tables cannot use yet: refused by name rather than
// run without it.
// Whether the data spec sets what only click data takes.
bool HasClickDataSettings(const v1::DataSpec& data) {
  return data.has_synthetic_ctr() || data.has_csv() || data.has_libsvm() || !data.test_path().empty() ||
         data.on_bad_record() != v1::DataSpec::ON_BAD_RECORD_UNSPECIFIED;
}

// Dense data (FASHION_MNIST, SYNTHETIC) that sets what only click data takes.
absl::Status RefuseClickDataSettings(const v1::DataSpec& data) {
  if (!HasClickDataSettings(data)) return absl::OkStatus();
  return Invalid("data",
                 "syntheticCtr, csv, libsvm, testPath and onBadRecord apply to click data (SYNTHETIC_CTR, "
                 "LIBSVM, CSV): remove them from this job",
                 v1::DataSpec::Dataset_Name(data.dataset()));
}

absl::Status RefuseClickData(const v1::DataSpec& data) {
  if (IsDenseData(data)) RETURN_IF_ERROR(RefuseClickDataSettings(data));
  if (data.dataset() == v1::DataSpec::SYNTHETIC_CTR || data.dataset() == v1::DataSpec::LIBSVM ||
      data.dataset() == v1::DataSpec::CSV || HasClickDataSettings(data)) {
    return Invalid(
        "data",
        "SYNTHETIC_CTR, LIBSVM and CSV are click data (with syntheticCtr, csv, libsvm, testPath, "
        "onBadRecord): use a click model (LOGISTIC_REGRESSION, FM, WIDE_AND_DEEP, DEEPFM, DLRM, GRAPH)",
        v1::DataSpec::Dataset_Name(data.dataset()));
  }
  return absl::OkStatus();
}

// A GRAPH over dense data (FASHION_MNIST, SYNTHETIC) that is not an MLP:
// the data has features, no categorical fields, and no click-data settings.
absl::Status ValidateDenseDataGraph(const v1::JobSpec& spec) {
  const v1::DataSpec& data = spec.data();
  RETURN_IF_ERROR(RefuseClickDataSettings(data));
  if (spec.model().tables_size() > 0) {
    return Invalid("model.tables", "apply to EMBEDDING layers, which read click data's fields",
                   absl::StrCat(spec.model().tables_size(), " tables"));
  }
  for (int i = 0; i < spec.model().layers_size(); ++i) {
    if (spec.model().layers(i).type() == v1::LayerSpec::EMBEDDING) {
      return Invalid(absl::StrCat("model.layers[", i, "]"),
                     absl::StrCat("EMBEDDING reads categorical fields, which ",
                                  v1::DataSpec::Dataset_Name(spec.data().dataset()),
                                  " has none of (click data: SYNTHETIC_CTR, LIBSVM, CSV)"),
                     Quote(spec.model().layers(i).name()));
    }
  }
  return absl::OkStatus();
}

// Its loss scores the data's classes: SOFTMAX_CROSS_ENTROPY over as many
// outputs. The graph is valid.
absl::Status ValidateDenseDataGraphLoss(const v1::JobSpec& spec) {
  const ModelLayout layout = LayoutFor(spec, 0, 0);
  const v1::DataSpec& data = spec.data();
  const int32_t classes =
      data.dataset() == v1::DataSpec::FASHION_MNIST ? kFashionMnistClasses : data.synthetic_classes();
  const int32_t width = kernels::GraphOutputWidth(layout.graph_config);
  const kernels::LossKind loss = kernels::GraphLossOf(layout.graph_config);
  if (loss != kernels::LossKind::kSoftmaxCrossEntropy || width != classes) {
    const char* name = loss == kernels::LossKind::kSoftmaxCrossEntropy ? "SOFTMAX_CROSS_ENTROPY"
                       : loss == kernels::LossKind::kMeanSquaredError  ? "MEAN_SQUARED_ERROR"
                                                                       : "SIGMOID_CROSS_ENTROPY";
    return Invalid(
        "model.layers",
        absl::StrCat("over ", v1::DataSpec::Dataset_Name(data.dataset()),
                     " a GRAPH ends in a SOFTMAX_CROSS_ENTROPY loss over the data's ", classes, " classes"),
        absl::StrCat(name, " over ", width, width == 1 ? " output" : " outputs"));
  }
  return absl::OkStatus();
}

absl::Status ValidateClickLimits(const v1::JobSpec& spec) {
  if (spec.local_sgd().steps() > 1) {
    return Invalid("localSgd.steps", "applies to the MLP path only (kinds MLP, SOFTMAX_REGRESSION, and GRAPHs of an MLP's shape; not to click models or other graphs)",
                   absl::StrCat(spec.local_sgd().steps()));
  }
  if (spec.precision() != v1::FP32) {
    return Invalid("precision", "must be FP32 for a click model or a GRAPH that is not an MLP (their layers compute in float32, on the CPU or a GPU)",
                   v1::Precision_Name(spec.precision()));
  }
  if (spec.wire_format() != v1::WIRE_FP32 || spec.compression().kind() != v1::CompressionSpec::NONE) {
    return Invalid("wireFormat", "must be WIRE_FP32 without compression for a click model or a GRAPH that is not an MLP",
                   v1::WireFormat_Name(spec.wire_format()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateDenseGraph(const v1::JobSpec& spec) {
  RETURN_IF_ERROR(ValidateGraphShape(spec.model()));
  const v1::DataSpec& data = spec.data();
  const bool mnist = data.dataset() == v1::DataSpec::FASHION_MNIST;
  kernels::GraphConfig graph;
  graph.num_dense = mnist ? kFashionMnistFeatures : data.synthetic_features();
  graph.layers = GraphLayersOf(spec.model());
  absl::Status valid = kernels::ValidateGraphConfig(graph);
  if (valid.ok()) {
    std::vector<int> hidden;
    kernels::Activation activation;
    std::vector<std::string> names;
    valid = kernels::GraphAsMlp(graph.layers, mnist ? kFashionMnistClasses : data.synthetic_classes(),
                                &hidden, &activation, &names);
  }
  if (valid.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("job spec: model.layers: ", valid.message()));
}

// The preset kinds that pair vectors (FM and DeepFM the fields' embeddings,
// DLRM those and the bottom MLP's output) need two to pair; over fewer their
// interaction would be zero and the job train a lesser model unsaid.
absl::Status ValidateClickPairs(const v1::JobSpec& spec) {
  const v1::ModelSpec::Kind kind = spec.model().kind();
  if (kind != v1::ModelSpec::FM && kind != v1::ModelSpec::DEEPFM && kind != v1::ModelSpec::DLRM) {
    return absl::OkStatus();
  }
  const int32_t fields = ClickFields(spec.data());
  const int32_t vectors = fields + (kind == v1::ModelSpec::DLRM && ClickDense(spec.data()) > 0 ? 1 : 0);
  const auto pairs_of = [](int64_t n) { return n * (n - 1) / 2; };
  if (kind == v1::ModelSpec::DLRM && pairs_of(vectors) > kernels::kMaxDotInteractionPairs) {
    int64_t most = vectors;
    while (pairs_of(most) > kernels::kMaxDotInteractionPairs) --most;
    return Invalid(
        "model.kind",
        absl::StrCat("DLRM's MLP reads the dot product of every pair of its ", vectors,
                     " vectors (the fields' embeddings, and the dense features' bottom MLP output): ",
                     pairs_of(vectors), " pairs, more than ", kernels::kMaxDotInteractionPairs,
                     "; use fewer fields (", most, " vectors at most) or DEEPFM"),
        absl::StrCat("DLRM over ", fields, " fields"));
  }
  if (vectors >= 2) return absl::OkStatus();
  const std::string pairs = kind == v1::ModelSpec::DLRM
                                ? "pairs the fields' embeddings and the dense features' bottom MLP output"
                                : "pairs the embeddings of different fields";
  return Invalid(
      "model.kind",
      absl::StrCat(pairs,
                   ", so it needs data with at least 2 of them (LIBSVM data is one field: every "
                   "id of a line in one bag, unless data.libsvm.fields reads libffm lines, "
                   "field:id:value); use libffm or CSV data with a CATEGORICAL column per field, or "
                   "LOGISTIC_REGRESSION or WIDE_AND_DEEP"),
      absl::StrCat(v1::ModelSpec::Kind_Name(kind), " over ", fields, " field", fields == 1 ? "" : "s",
                   kind == v1::ModelSpec::DLRM ? " and no dense features" : ""));
}

absl::Status ValidateClickJob(const v1::JobSpec& spec) {
  RETURN_IF_ERROR(ValidateClickShape(spec.model()));
  const bool dense = spec.model().kind() == v1::ModelSpec::GRAPH && IsDenseData(spec.data());
  RETURN_IF_ERROR(dense ? ValidateDenseDataGraph(spec) : ValidateClickData(spec.data()));
  RETURN_IF_ERROR(ValidateClickPairs(spec));
  RETURN_IF_ERROR(ValidateTables(spec));
  if (dense) RETURN_IF_ERROR(ValidateDenseDataGraphLoss(spec));
  return ValidateClickLimits(spec);
}

absl::Status ValidateNotClick(const v1::JobSpec& spec) {
  const v1::ModelSpec& model = spec.model();
  if (model.embedding_dim() != 0) {
    return Invalid("model.embeddingDim", "applies to click models only", absl::StrCat(model.embedding_dim()));
  }
  if (model.combiner() != v1::ModelSpec::COMBINER_UNSPECIFIED) {
    return Invalid("model.combiner", "applies to click models only", v1::ModelSpec::Combiner_Name(model.combiner()));
  }
  if (model.tables_size() > 0) return Invalid("model.tables", "apply to click models only", "tables");
  if (model.layers_size() > 0 && model.kind() != v1::ModelSpec::GRAPH) {
    return Invalid("model.layers", "apply to GRAPH only", absl::StrCat(model.layers_size(), " layers"));
  }
  if (model.bottom_sizes_size() > 0) {
    return Invalid("model.bottomSizes", "applies to DLRM only", absl::StrCat(model.bottom_sizes_size(), " sizes"));
  }
  return RefuseClickData(spec.data());
}

}  // namespace fulcrum
