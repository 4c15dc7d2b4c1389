#include "worker/ctr_trainer.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/data_partition.h"
#include "common/finite.h"
#include "common/logging.h"
#include "common/memory_budget.h"
#include "common/param_init.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/table_spec.h"
#include "kernels/ctr_model.h"
#include "kernels/model_from_spec.h"
#include "worker/dataset.h"
#include "worker/parameter_client.h"
#include "worker/sparse_client.h"
#include "worker/work_ahead.h"

namespace fulcrum {
namespace {

// Why a step's gradients or an evaluation's outputs are not finite.
constexpr char kDivergedOrTooLarge[] =
    "the model diverged (a smaller optimizer.lr or a table's lr may help) or the data holds values too large "
    "for float32 (a libsvm value weighs its id's row)";

constexpr absl::Duration kRpcTimeout = absl::Seconds(10);
constexpr absl::Duration kWaitSlice = absl::Seconds(1);
constexpr absl::Duration kReportEvery = absl::Milliseconds(500);
constexpr int kMaxFailures = 60;
constexpr size_t kMaxStepLosses = 8192;

// A batch of click examples as the model reads it: ids bagged per example
// and field, offsets relative to the batch.
struct Batch {
  std::vector<float> labels;
  std::vector<float> dense;
  std::vector<int64_t> offsets = {0};
  std::vector<uint64_t> ids;
  std::vector<float> weights;
  int32_t size() const { return static_cast<int32_t>(labels.size()); }
};

// Examples [first, first + count) of a held dataset.
Batch Slice(const SparseDataset& data, int64_t first, int64_t count) {
  Batch batch;
  const int64_t fields = data.num_fields;
  const int64_t begin = data.offsets[static_cast<size_t>(first * fields)];
  const int64_t end = data.offsets[static_cast<size_t>((first + count) * fields)];
  batch.labels.assign(data.labels.begin() + first, data.labels.begin() + first + count);
  batch.dense.assign(data.dense.begin() + first * data.num_dense, data.dense.begin() + (first + count) * data.num_dense);
  batch.ids.assign(data.ids.begin() + begin, data.ids.begin() + end);
  batch.weights.assign(data.weights.begin() + begin, data.weights.begin() + end);
  batch.offsets.clear();
  for (int64_t k = first * fields; k <= (first + count) * fields; ++k) {
    batch.offsets.push_back(data.offsets[static_cast<size_t>(k)] - begin);
  }
  return batch;
}

// Appends example `e` of `data` to the batch.
void AppendExample(const SparseDataset& data, int64_t e, Batch* batch) {
  const auto u = static_cast<size_t>(e);
  batch->labels.push_back(data.labels[u]);
  batch->dense.insert(batch->dense.end(), data.dense.begin() + e * data.num_dense,
                      data.dense.begin() + (e + 1) * data.num_dense);
  for (int32_t f = 0; f < data.num_fields; ++f) {
    const size_t bag = u * static_cast<size_t>(data.num_fields) + static_cast<size_t>(f);
    for (int64_t j = data.offsets[bag]; j < data.offsets[bag + 1]; ++j) {
      batch->ids.push_back(data.ids[static_cast<size_t>(j)]);
      batch->weights.push_back(data.weights[static_cast<size_t>(j)]);
    }
    batch->offsets.push_back(static_cast<int64_t>(batch->ids.size()));
  }
}

// A batch's distinct keys of one table, and each id's index among them (-1
// for an id of a field the table does not read).
struct Bags {
  std::vector<uint64_t> keys;
  std::vector<int32_t> rows;
};

// Per table, the bags of the fields it reads (`reads[t][f]`); tables that
// read the same fields share one computation.
std::vector<Bags> BagsOf(const Batch& batch, const std::vector<std::vector<bool>>& reads) {
  std::vector<Bags> tables;
  for (size_t t = 0; t < reads.size(); ++t) {
    const auto same = std::find(reads.begin(), reads.begin() + static_cast<std::ptrdiff_t>(t), reads[t]);
    if (same != reads.begin() + static_cast<std::ptrdiff_t>(t)) {
      tables.push_back(tables[static_cast<size_t>(same - reads.begin())]);
      continue;
    }
    Bags& bags = tables.emplace_back();
    absl::flat_hash_map<uint64_t, int32_t> index;
    index.reserve(batch.ids.size());
    bags.rows.assign(batch.ids.size(), -1);
    const size_t fields = reads[t].size();
    for (size_t bag = 0; bag + 1 < batch.offsets.size(); ++bag) {
      if (!reads[t][bag % fields]) continue;
      for (int64_t j = batch.offsets[bag]; j < batch.offsets[bag + 1]; ++j) {
        const uint64_t id = batch.ids[static_cast<size_t>(j)];
        auto [it, fresh] = index.try_emplace(id, static_cast<int32_t>(bags.keys.size()));
        if (fresh) bags.keys.push_back(id);
        bags.rows[static_cast<size_t>(j)] = it->second;
      }
    }
  }
  return tables;
}

// Per table of the layout, per field: whether the table reads its ids.
std::vector<std::vector<bool>> TableReads(const ModelLayout& layout) {
  const int32_t fields = layout.graph ? layout.graph_config.num_fields : layout.ctr.num_fields;
  std::vector<std::vector<bool>> reads;
  for (const std::vector<int32_t>& table : layout.table_fields) {
    std::vector<bool>& read = reads.emplace_back(static_cast<size_t>(std::max(0, fields)), false);
    for (int32_t f : table) read[static_cast<size_t>(f)] = true;
  }
  return reads;
}

uint64_t Gcd(uint64_t a, uint64_t b) {
  while (b != 0) a = std::exchange(b, a % b);
  return a;
}

}  // namespace

AffineOrder::AffineOrder(uint64_t seed, int64_t epoch, int64_t n) : n_(std::max<int64_t>(1, n)) {
  if (n_ == 1) return;
  const uint64_t r = SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(epoch) + 0x243f6a8885a308d3ULL));
  const auto n64 = static_cast<uint64_t>(n_);
  a_ = 1 + r % (n64 - 1);
  while (Gcd(a_, n64) != 1) a_ = a_ % (n64 - 1) + 1;
  b_ = SplitMix64(r) % n64;
}

int64_t AffineOrder::operator[](int64_t i) const {
  const unsigned __int128 x = static_cast<unsigned __int128>(a_) * static_cast<uint64_t>(i) + b_;
  return static_cast<int64_t>(x % static_cast<uint64_t>(n_));
}

SyntheticCtrSpec SyntheticCtrOf(const v1::JobSpec& spec) {
  const v1::SyntheticCtrSpec& ctr = spec.data().synthetic_ctr();
  SyntheticCtrSpec out;
  out.seed = spec.seed();
  out.examples = ctr.examples();
  if (ctr.fields() > 0) out.fields = ctr.fields();
  if (ctr.vocabulary() > 0) out.vocabulary = ctr.vocabulary();
  if (ctr.zipf_exponent() > 0) out.zipf_exponent = ctr.zipf_exponent();
  out.dense = ctr.dense();
  if (ctr.weight_scale() > 0) out.weight_scale = ctr.weight_scale();
  if (ctr.has_bias()) out.bias = ctr.bias();
  out.fm_dim = ctr.fm_dim();
  if (ctr.fm_scale() > 0) out.fm_scale = ctr.fm_scale();
  return out;
}

namespace {

absl::StatusOr<std::shared_ptr<const SparseDataset>> LoadSyntheticTestSet(const v1::JobSpec& spec,
                                                                          int64_t memory_budget) {
  const SyntheticCtrSpec data = SyntheticCtrOf(spec);
  RETURN_IF_ERROR(ValidateSyntheticCtrSpec(data));
  const int64_t examples = SyntheticCtrTestExamples(data.examples);
  const int64_t bytes = examples * SyntheticCtrExampleBytes(data.fields, data.dense);
  if (memory_budget > 0 && bytes > memory_budget) {
    return absl::ResourceExhaustedError(absl::StrCat("the click test set of ", examples, " examples takes ",
                                                     FormatBytes(bytes), ", beyond this worker's memory budget of ",
                                                     FormatBytes(memory_budget)));
  }
  std::vector<float> truth;
  auto test = std::make_shared<const SparseDataset>(MakeSyntheticCtr(data, /*split=*/1, 0, examples, &truth));
  FLOG(INFO) << "synthetic click test set: " << examples << " examples, click rate "
             << std::accumulate(test->labels.begin(), test->labels.end(), 0.0) / static_cast<double>(examples)
             << ", best reachable AUC (the true probabilities') " << Auc(truth, test->labels);
  return test;
}

CsvFormat CsvFormatOf(const v1::DataSpec& data, const LineLimits& limits) {
  CsvFormat format;
  for (int column : data.csv().columns()) {
    switch (column) {
      case v1::CsvSpec::LABEL: format.columns.push_back(CsvFormat::Column::kLabel); break;
      case v1::CsvSpec::DENSE: format.columns.push_back(CsvFormat::Column::kDense); break;
      case v1::CsvSpec::CATEGORICAL: format.columns.push_back(CsvFormat::Column::kCategorical); break;
      default: format.columns.push_back(CsvFormat::Column::kIgnore); break;
    }
  }
  if (!data.csv().delimiter().empty()) format.delimiter = data.csv().delimiter()[0];
  format.header = data.csv().header();
  format.limits = limits;
  return format;
}

// The files `pattern` names, each under one of `roots`.
absl::StatusOr<std::vector<std::string>> FilesOf(const std::string& pattern, const std::vector<std::string>& roots) {
  // The folder the pattern starts from first: the expansion's errors would
  // name folders outside the roots.
  const std::string fixed = pattern.substr(0, pattern.find_first_of("*?["));
  const size_t slash = fixed.rfind('/');
  if (absl::Status under =
          CheckUnderRoots(slash == std::string::npos ? "/" : fixed.substr(0, slash + 1), roots);
      !under.ok()) {
    return absl::Status(under.code(), absl::StrCat("data file ", Quote(pattern), ": ", under.message()));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> files, ExpandPath(pattern));
  for (const std::string& file : files) RETURN_IF_ERROR(CheckUnderRoots(file, roots));
  return files;
}

// How a job takes its files' labels: as clicks (> 0 is 1, else 0: the
// preset kinds and graphs with sigmoid cross-entropy), as class numbers in
// [0, classes) (softmax; another label is a bad record), or as they are
// (squared error).
struct Labels {
  bool clicks = true;
  int32_t classes = 0;
};

Labels LabelsOf(const ModelLayout& layout) {
  if (!layout.graph) return {};
  const kernels::GraphConfig& graph = layout.graph_config;
  switch (kernels::GraphLossOf(graph)) {
    case kernels::LossKind::kSoftmaxCrossEntropy: return {false, kernels::GraphOutputWidth(graph)};
    case kernels::LossKind::kMeanSquaredError: return {false, 0};
    default: return {};
  }
}

LineLimits LimitsOf(const v1::DataSpec& spec, const Labels& labels) {
  LineLimits limits;
  limits.on_bad_record = spec.on_bad_record() == v1::DataSpec::FAIL ? BadRecordPolicy::kFail : BadRecordPolicy::kSkip;
  limits.label_classes = labels.classes;
  return limits;
}

// libsvm values weigh the ids' rows: a negative one is a bad record.
LibsvmFormat LibsvmFormatOf(const v1::DataSpec& spec, const Labels& labels) {
  LibsvmFormat format{LimitsOf(spec, labels)};
  format.nonnegative_values = true;
  format.fields = spec.libsvm().fields();
  return format;
}

void LogRead(const std::string& pattern, size_t files, int64_t records, const ReadStats& stats, const char* how) {
  FLOG(INFO) << pattern << ": " << files << " files, " << records << " records " << how << ", " << stats.bad
             << " bad records skipped"
             << (stats.first_bad.empty() ? "" : absl::StrCat(" (first: ", stats.first_bad[0], ")"));
}

// Adds a read's bad records to what the worker reports.
void CountBad(const ReadStats& stats, ClickData* counts) {
  counts->bad_records += stats.bad;
  if (counts->first_bad_record.empty() && !stats.first_bad.empty())
    counts->first_bad_record = stats.first_bad.front();
}

// Files without one good record: how many were bad, and the first's reason
// (the job's reason, where the worker's log has the rest).
absl::Status NoGoodRecord(const std::string& pattern, size_t files, const ReadStats& stats) {
  return absl::InvalidArgumentError(
      absl::StrCat(pattern, ": no good record in ", files, files == 1 ? " file" : " files",
                   stats.bad > 0 && !stats.first_bad.empty()
                       ? absl::StrCat(" (", stats.bad, " bad, the first ", stats.first_bad.front(), ")")
                       : std::string()));
}

// Indexes the training files `pattern` names (RecordIndex: 8 bytes a
// record are held, the records are read again as steps need them).
absl::StatusOr<std::shared_ptr<const RecordIndex>> IndexFiles(const v1::DataSpec& spec,
                                                              const std::string& pattern,
                                                              const std::vector<std::string>& roots,
                                                              int64_t memory_budget, const Labels& labels,
                                                              ClickData* counts) {
  ASSIGN_OR_RETURN(const std::vector<std::string> files, FilesOf(pattern, roots));
  ReadStats stats;
  absl::StatusOr<std::unique_ptr<RecordIndex>> index =
      spec.dataset() == v1::DataSpec::LIBSVM
          ? RecordIndex::BuildLibsvm(files, LibsvmFormatOf(spec, labels), &stats, memory_budget)
          : RecordIndex::BuildCsv(files, CsvFormatOf(spec, LimitsOf(spec, labels)), &stats, memory_budget);
  if (!index.ok()) {
    if (!absl::IsResourceExhausted(index.status())) return index.status();
    return absl::ResourceExhaustedError(absl::StrCat("the click data of ", pattern, ": ", index.status().message(),
                                                     " (this worker's memory budget)"));
  }
  LogRead(pattern, files.size(), (*index)->num_examples(), stats, "indexed");
  if ((*index)->num_examples() == 0) return NoGoodRecord(pattern, files.size(), stats);
  CountBad(stats, counts);
  return std::shared_ptr<const RecordIndex>(std::move(*index));
}

// Reads every file `pattern` names into one dataset (the test set).
absl::StatusOr<std::shared_ptr<const SparseDataset>> LoadFiles(const v1::DataSpec& spec,
                                                               const std::string& pattern,
                                                               const std::vector<std::string>& roots,
                                                               int64_t memory_budget, const Labels& labels,
                                                               ClickData* counts) {
  ASSIGN_OR_RETURN(const std::vector<std::string> files, FilesOf(pattern, roots));
  auto data = std::make_shared<SparseDataset>();
  ReadStats stats;
  LineLimits limits = LimitsOf(spec, labels);
  limits.max_dataset_bytes = memory_budget;
  for (const std::string& file : files) {
    absl::Status read;
    if (spec.dataset() == v1::DataSpec::LIBSVM) {
      LibsvmFormat format = LibsvmFormatOf(spec, labels);
      format.limits = limits;
      read = ReadLibsvmFile(file, format, data.get(), &stats);
    } else {
      read = ReadCsvFile(file, CsvFormatOf(spec, limits), data.get(), &stats);
    }
    if (absl::IsResourceExhausted(read)) {
      return absl::ResourceExhaustedError(absl::StrCat("the click data of ", pattern, " takes more than ",
                                                       FormatBytes(memory_budget), " of this worker's memory budget at ",
                                                       file));
    }
    RETURN_IF_ERROR(read);
  }
  if (labels.clicks) {
    for (float& label : data->labels) label = label > 0 ? 1.0f : 0.0f;
  }
  LogRead(pattern, files.size(), data->num_examples(), stats, "read");
  if (data->num_examples() == 0) return NoGoodRecord(pattern, files.size(), stats);
  CountBad(stats, counts);
  ShrinkToFit(data.get());  // held for the job: what HeldBytes counts of it is its records alone
  return std::shared_ptr<const SparseDataset>(std::move(data));
}

// The training examples: the files' records, held or indexed, else the
// synthetic data's.
int64_t TrainExamples(const SparseDataset* held, const RecordIndex* indexed, const SyntheticCtrSpec& synthetic) {
  if (held != nullptr) return held->num_examples();
  if (indexed != nullptr) return indexed->num_examples();
  return synthetic.examples;
}

// The first folder glob could not read, and why (glob's error callback takes
// no context; a worker expands one pattern at a time on a thread).
thread_local std::string glob_failed_path;
thread_local int glob_failed_errno = 0;

int NoteGlobError(const char* path, int error) {
  if (glob_failed_errno == 0) {
    glob_failed_path = path;
    glob_failed_errno = error;
  }
  return 0;  // go on: a folder that does not exist is no match, one that cannot be read fails below
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandPath(const std::string& pattern) {
  constexpr size_t kMaxFiles = 100000;
  glob_failed_path.clear();
  glob_failed_errno = 0;
  glob_t matches{};
  const int rc = glob(pattern.c_str(), 0, NoteGlobError, &matches);
  std::vector<std::string> files;
  if (rc == 0) {
    for (size_t i = 0; i < matches.gl_pathc && files.size() <= kMaxFiles; ++i) files.emplace_back(matches.gl_pathv[i]);
  }
  globfree(&matches);
  const int error = glob_failed_errno;
  if (error != 0 && error != ENOENT && error != ENOTDIR) {
    return absl::FailedPreconditionError(absl::StrCat("cannot list ", pattern, ": cannot read ",
                                                      glob_failed_path, ": ", std::strerror(error)));
  }
  // A file whose name holds a pattern's characters ([, *, ?) and that
  // the pattern matches nothing else for is named as it is (as a shell
  // leaves a pattern that matches nothing).
  if (struct stat entry{}; rc == GLOB_NOMATCH && stat(pattern.c_str(), &entry) == 0)
    return std::vector{pattern};
  if (rc == GLOB_NOMATCH || (rc == 0 && files.empty())) {
    return absl::NotFoundError(absl::StrCat(
        "no file matches ", pattern,
        error != 0 ? absl::StrCat(" (", glob_failed_path, ": ", std::strerror(error), ")") : std::string()));
  }
  if (rc != 0) return absl::FailedPreconditionError(absl::StrCat("cannot list ", pattern, " (glob error ", rc, ")"));
  if (files.size() > kMaxFiles) {
    return absl::InvalidArgumentError(absl::StrCat(pattern, " names more than ", kMaxFiles, " files"));
  }
  std::sort(files.begin(), files.end());
  return files;
}

namespace {

absl::StatusOr<ClickData> LoadClickDataOf(const v1::JobSpec& spec, const std::vector<std::string>& roots,
                                          int64_t memory_budget) {
  const v1::DataSpec& data = spec.data();
  ClickData loaded;
  if (IsDenseData(data)) {
    // A GRAPH that is not an MLP over FASHION_MNIST or SYNTHETIC: the
    // features as dense ones, the class numbers as labels.
    ASSIGN_OR_RETURN(Dataset train, LoadDenseSplit(data, spec.seed(), /*train=*/true, roots, memory_budget));
    if (train.num_features != ClickDense(data)) {  // the graph's DENSE_INPUT was laid out for that many
      return absl::FailedPreconditionError(absl::StrCat(data.path(), ": the images have ", train.num_features,
                                                        " pixels; FASHION_MNIST's have ", ClickDense(data)));
    }
    const int64_t left = memory_budget > 0 ? std::max<int64_t>(1, memory_budget - DatasetBytes(train)) : 0;
    ASSIGN_OR_RETURN(Dataset test, LoadDenseSplit(data, spec.seed(), /*train=*/false, roots, left));
    loaded.train = std::make_shared<const SparseDataset>(AsDenseFeatures(std::move(train)));
    loaded.test = std::make_shared<const SparseDataset>(AsDenseFeatures(std::move(test)));
    return loaded;
  }
  if (data.dataset() == v1::DataSpec::SYNTHETIC_CTR) {
    ASSIGN_OR_RETURN(loaded.test, LoadSyntheticTestSet(spec, memory_budget));
    return loaded;
  }
  const Labels labels = LabelsOf(LayoutFor(spec, 0, 0));
  // The training records are held whole while they take at most half the
  // budget (a step then copies its examples); beyond, they are indexed and
  // read as steps need them (files bigger than memory).
  absl::StatusOr<std::shared_ptr<const SparseDataset>> held =
      LoadFiles(data, data.path(), roots, memory_budget > 0 ? std::max<int64_t>(1, memory_budget / 2) : 0,
                labels, &loaded);
  if (held.ok()) {
    loaded.train = *std::move(held);
  } else if (absl::IsResourceExhausted(held.status())) {
    FLOG(INFO) << data.path() << ": the training records take more than half this worker's memory budget ("
               << FormatBytes(memory_budget / 2) << "); indexing the files, records are read as steps need them";
    ASSIGN_OR_RETURN(loaded.train_index,
                     IndexFiles(data, data.path(), roots, memory_budget, labels, &loaded));
  } else {
    return held.status();
  }
  if (!data.test_path().empty()) {
    const int64_t used = loaded.train != nullptr ? HeldBytes(*loaded.train) : loaded.train_index->bytes();
    const int64_t left = memory_budget > 0 ? std::max<int64_t>(1, memory_budget - used) : 0;
    ASSIGN_OR_RETURN(loaded.test, LoadFiles(data, data.test_path(), roots, left, labels, &loaded));
  }
  return loaded;
}

}  // namespace

absl::StatusOr<ClickData> LoadClickData(const v1::JobSpec& spec, const std::vector<std::string>& roots,
                                        int64_t memory_budget) {
  ASSIGN_OR_RETURN(ClickData loaded, LoadClickDataOf(spec, roots, memory_budget));
  loaded.memory_budget = memory_budget;
  if (loaded.train != nullptr) loaded.held_bytes += HeldBytes(*loaded.train);
  if (loaded.train_index != nullptr) loaded.held_bytes += loaded.train_index->bytes();
  if (loaded.test != nullptr) loaded.held_bytes += HeldBytes(*loaded.test);
  return loaded;
}

SparseDataset AsDenseFeatures(Dataset dataset) {
  SparseDataset out;
  out.num_dense = dataset.num_features;
  out.labels.assign(dataset.labels.begin(), dataset.labels.end());
  out.dense = std::move(dataset.features);
  return out;
}

v1::WorkReport ClickReadyReport(const v1::JobSpec& spec, const ClickData& data) {
  v1::WorkReport report;
  report.set_kind(v1::WorkReport::READY);
  report.set_train_examples(TrainExamples(data.train.get(), data.train_index.get(), SyntheticCtrOf(spec)));
  report.set_test_examples(data.test != nullptr ? data.test->num_examples() : 0);
  report.set_bad_records(data.bad_records);
  report.set_first_bad_record(data.first_bad_record);
  report.set_features(ClickFields(spec.data()) + ClickDense(spec.data()));
  const v1::DataSpec& d = spec.data();
  report.set_classes(d.dataset() == v1::DataSpec::FASHION_MNIST ? kFashionMnistClasses
                     : d.dataset() == v1::DataSpec::SYNTHETIC   ? d.synthetic_classes()
                                                                 : 2);
  return report;
}

namespace {

// A preset kind on `compute` (a device's backend): as its graph. Null
// without a backend, or (not expected of a valid kind) when the kind has
// no graph: then CtrModel computes it on the host.
std::unique_ptr<kernels::PresetAsGraph> PresetOn(const ModelLayout& layout, kernels::Backend* compute) {
  if (layout.graph || compute == nullptr) return nullptr;
  auto preset = std::make_unique<kernels::PresetAsGraph>(layout.ctr, compute);
  if (preset->status().ok()) return preset;
  FLOG(WARNING) << "the preset kind has no graph for backend " << compute->Name() << " ("
                << preset->status().message() << "); it computes on the host";
  return nullptr;
}

class ClickRun {
 public:
  ClickRun(const std::string& worker_id, const TrainerHooks& hooks, ParameterTransport* transport,
           const v1::Assignment& assignment, ClickData data, kernels::Backend* compute)
      : hooks_(hooks),
        transport_(transport),
        job_id_(assignment.job_id()),
        writer_id_(WriterId(worker_id)),
        spec_(assignment.spec()),
        synthetic_(SyntheticCtrOf(spec_)),
        synthetic_train_(synthetic_, /*split=*/0),
        synthetic_ids_(synthetic_),
        train_(std::move(data.train)),
        train_index_(std::move(data.train_index)),
        test_(std::move(data.test)),
        examples_(TrainExamples(train_.get(), train_index_.get(), synthetic_)),
        batch_(static_cast<int>(StepBatchSize(spec_))),
        partitioning_(examples_, batch_, assignment.num_partitions()),
        steps_per_epoch_(assignment.steps_per_epoch()),
        total_steps_(assignment.total_steps()),
        layout_(LayoutFor(spec_, 0, 0)),
        model_(layout_.ctr),
        graph_(layout_.graph ? std::make_unique<kernels::GraphModel>(layout_.graph_config, compute)
                             : nullptr),
        preset_on_backend_(PresetOn(layout_, compute)),
        table_reads_(TableReads(layout_)),
        binary_labels_(LabelsOf(layout_).clicks),
        loss_(layout_.graph ? kernels::GraphLossOf(layout_.graph_config)
                            : kernels::LossKind::kSigmoidCrossEntropy),
        output_width_(layout_.graph ? kernels::GraphOutputWidth(layout_.graph_config) : 1),
        bsp_(spec_.mode() == v1::BSP || spec_.mode() == v1::MODE_UNSPECIFIED),
        memory_budget_(data.memory_budget),
        row_room_(data.memory_budget > 0 ? std::max<int64_t>(1, data.memory_budget - data.held_bytes) : 0) {
    UseMap(assignment.shard_map());
  }

  absl::Status Run();

 private:
  int64_t NumFields() const { return layout_.graph ? layout_.graph_config.num_fields : layout_.ctr.num_fields; }
  int64_t NumDense() const { return layout_.graph ? layout_.graph_config.num_dense : layout_.ctr.num_dense; }
  void UseMap(const v1::ShardMap& map) {
    auto superseded = [this, version = map.version()] {
      if (hooks_.expect_change) hooks_.expect_change();
      return hooks_.latest_assignment().shard_map().version() > version;
    };
    // The daemon cancels the old clients' requests when a newer map comes:
    // it lets go of them before they go.
    if (hooks_.watch_client) hooks_.watch_client(nullptr, job_id_);
    client_ = std::make_unique<ParameterClient>(map, job_id_, writer_id_, superseded, v1::WIRE_FP32, transport_);
    client_->set_lamb(spec_.optimizer().kind() == v1::OptimizerSpec::LAMB);
    sparse_ = std::make_unique<SparseClient>(map, job_id_, writer_id_, transport_);
    client_->set_also_supersede([sparse = sparse_.get()] { sparse->Supersede(); });
    // In a BSP job a table is synchronous unless its spec says ASYNC (as the
    // servers read it: server/parameter_service_sparse.cc TableSetupsOf).
    bool synchronous = false;
    for (const v1::TableLayout& table : map.tables()) {
      bool async = false;
      for (const v1::TableSpec& named : spec_.model().tables()) {
        async |= named.name() == table.name() && named.consistency() == v1::TableSpec::ASYNC;
      }
      synchronous |= bsp_ && !async;
    }
    sparse_->set_synchronous(synchronous);
    if (params_.empty()) {
      // Once: a new map (a failover) keeps the tensors and the values
      // params_ hold, which a BSP step computed after it may still read
      // (a partition taken over once a pull slice ran out).
      params_ = client_->MakeBuffers();
      pulled_ = client_->MakeBuffers();
      grads_ = client_->MakeBuffers();
    }
    if (hooks_.watch_client) hooks_.watch_client(client_.get(), job_id_);
  }
  // Makes partition `partition`'s batch of `step` and its example audit.
  absl::StatusOr<Batch> MakeBatch(int32_t partition, int64_t step, ExampleAudit* audit) const;
  // Pulls the rows of the bags' keys of every table, as steps of `step`
  // read them (BSP; the latest rows otherwise).
  absl::Status PullRows(const std::vector<std::vector<uint64_t>>& keys, int64_t step,
                        std::vector<std::vector<float>>* rows) {
    return bsp_ ? sparse_->PullAtStep(keys, rows, step, kRpcTimeout) : sparse_->Pull(keys, rows, kRpcTimeout);
  }
  // The bytes the rows of `keys` and their gradients take, and whether they
  // fit what the worker's budget leaves beside its data (records of many
  // distinct ids under wide tables: nothing else bounds them).
  int64_t RowBytes(const std::vector<std::vector<uint64_t>>& keys) const {
    int64_t bytes = 0;
    for (size_t t = 0; t < keys.size(); ++t) {
      bytes += static_cast<int64_t>(keys[t].size()) * sparse_->dim(static_cast<int>(t)) *
               static_cast<int64_t>(sizeof(float)) * 2;
    }
    return bytes;
  }
  bool RowsFit(int64_t bytes) const { return row_room_ == 0 || bytes <= row_room_; }
  // RESOURCE_EXHAUSTED naming `what` (a step's batch, a test example) and
  // its ids, whose rows do not fit, and `remedy`.
  absl::Status RowsBeyondRoom(const std::string& what, const std::vector<std::vector<uint64_t>>& keys,
                              int64_t bytes, const std::string& remedy) const {
    int64_t ids = 0;
    for (const auto& table : keys) ids += static_cast<int64_t>(table.size());
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " has ", ids, " distinct ids, whose rows and their gradients take ",
                     FormatBytes(bytes), ", more than the ", FormatBytes(row_room_),
                     " this worker's memory budget of ", FormatBytes(memory_budget_),
                     " leaves beside its data (", FormatBytes(memory_budget_ - row_room_), "): ", remedy));
  }
  static std::vector<std::vector<uint64_t>> KeysOf(const std::vector<Bags>& bags) {
    std::vector<std::vector<uint64_t>> keys;
    for (const Bags& table : bags) keys.push_back(table.keys);
    return keys;
  }
  kernels::GraphBatch ModelBatch(const Batch& batch, const std::vector<Bags>& bags) const;
  kernels::CtrParams ModelParams(const std::vector<std::vector<float>>& rows) const;
  // The model's pass over `in` with these rows: forward and backward when
  // `grads`, else forward only; `outputs` gets output_width_ per example.
  absl::Status RunModel(const kernels::GraphBatch& in, const std::vector<std::vector<float>>& rows,
                        const kernels::CtrGrads* grads, kernels::CtrStats* stats, float* outputs);
  // The step's gradients into grads_ and row_grads_: at once, or with
  // gradient accumulation as data.batchSize micro-batches one after the
  // other, each adding its share of the mean.
  absl::Status ComputeGradients(const Batch& batch, const std::vector<Bags>& bags, kernels::CtrStats* stats);
  // InvalidArgument naming the first table or tensor whose gradient in
  // row_grads_ or grads_ holds an infinity or a NaN.
  absl::Status CheckGradientsFinite(int32_t partition, int64_t step, const kernels::CtrStats& stats) const;
  // One partition step: pull, compute, push. DEADLINE_EXCEEDED (SSP): too
  // far ahead of the slowest partition for now.
  // `then`: the (partition, step) likely next, whose batch is made meanwhile.
  using Next = std::optional<std::pair<int32_t, int64_t>>;
  absl::Status Step(int32_t partition, int64_t step, Next then);
  // A step with the dense tensors in params_: pull the rows, compute, push
  // the rows' gradients, then the dense ones (in BSP a step's dense update
  // completes only after every partition's rows were pushed, so a pull of
  // the next step finds the tables' step applied).
  absl::Status ComputeAndPush(int32_t partition, int64_t step, absl::Time start, Next then);
  // ASP and SSP: each partition at its own pace. BSP: every owned partition
  // computes the step the servers are at, from one pull.
  absl::Status RunAsync();
  absl::Status RunBsp();
  // BSP: computes and pushes the owned partitions of `step` not in *pushed.
  absl::Status PushOwned(const v1::Assignment& assignment, int64_t step, std::set<int32_t>* pushed);
  // `pull`: pull the dense tensors first (else params_ hold the step's).
  absl::Status EvaluateAndReport(int64_t step, bool pull = true);
  void MaybeReportProgress(int64_t step, bool force, const std::map<int32_t, int64_t>& positions);
  void ReportDone(const std::vector<int32_t>& partitions);
  bool EvaluatesAt(int64_t step) const {
    const int64_t every = spec_.data().eval_every_steps();
    return step > 0 && (step % steps_per_epoch_ == 0 || step == total_steps_ || (every > 0 && step % every == 0));
  }
  absl::Status Recover(const absl::Status& error);

  const TrainerHooks& hooks_;
  ParameterTransport* const transport_;
  const std::string job_id_;
  const std::string writer_id_;
  const v1::JobSpec spec_;
  const SyntheticCtrSpec synthetic_;
  const SyntheticCtrGenerator synthetic_train_;  // its training examples
  // What MakeBatch made of the ids it met (only ahead_'s thread runs it).
  mutable SyntheticCtrGenerator::IdCache synthetic_ids_;
  // Users' files, held or indexed; both null: synthetic, made per step.
  const std::shared_ptr<const SparseDataset> train_;
  const std::shared_ptr<const RecordIndex> train_index_;
  const std::shared_ptr<const SparseDataset> test_;   // null: no evaluation
  const int64_t examples_;
  const int batch_;
  const DataPartitioning partitioning_;
  const int64_t steps_per_epoch_;
  const int64_t total_steps_;
  const ModelLayout layout_;
  kernels::CtrModel model_;                                    // the preset kinds on the host
  std::unique_ptr<kernels::GraphModel> graph_;                 // GRAPH (on the host or a backend)
  std::unique_ptr<kernels::PresetAsGraph> preset_on_backend_;  // the preset kinds on a device
  const std::vector<std::vector<bool>> table_reads_;  // per table, per field: whether it reads the field's ids
  const bool binary_labels_;
  const kernels::LossKind loss_;
  const int output_width_;  // the model's outputs per example
  const bool bsp_;
  const int64_t memory_budget_;  // the worker's (0: none)
  const int64_t row_room_;       // the bytes a step's rows and their gradients may take (0: no bound)
  std::unique_ptr<ParameterClient> client_;
  std::unique_ptr<SparseClient> sparse_;
  std::vector<std::vector<float>> params_, grads_;
  std::vector<std::vector<float>> pulled_;  // BSP: where pulls land before they are known to be whole
  std::vector<std::vector<float>> rows_, row_grads_;
  // Gradient accumulation: one micro-batch's rows, gradients, offsets and
  // ids (micro_row_of_: each id's row among the micro-batch's; micro_ids_:
  // each of those rows' row in the step; local_of_: the reverse, -1 between
  // micro-batches).
  std::vector<std::vector<float>> micro_grads_, micro_rows_, micro_row_grads_;
  std::vector<int64_t> micro_offsets_;
  std::vector<std::vector<int32_t>> micro_row_of_, micro_ids_, local_of_;  // per table
  int64_t seq_ = 0;
  int failures_ = 0;
  int64_t max_staleness_seen_ = 0;
  kernels::CtrStats window_;
  int64_t window_steps_ = 0;
  double window_step_seconds_ = 0;
  absl::Time window_start_ = absl::Now();
  double last_loss_ = 0, last_samples_per_second_ = 0, last_step_seconds_ = 0;
  std::vector<v1::StepLoss> step_losses_;
  // Makes the next step's batch meanwhile (MakeBatch). Last: its thread
  // stops before the members MakeBatch reads go.
  const std::unique_ptr<WorkAhead<Batch>> ahead_ =
      std::make_unique<WorkAhead<Batch>>([this](int32_t partition, int64_t step, ExampleAudit* audit) {
        return MakeBatch(partition, step, audit);
      });
};

absl::StatusOr<Batch> ClickRun::MakeBatch(int32_t partition, int64_t step, ExampleAudit* audit) const {
  const int64_t epoch = partitioning_.EpochOf(step);
  const AffineOrder order(spec_.data().shuffle_seed(), epoch, examples_);
  const int64_t first = partitioning_.FirstRow(step, partition);
  Batch batch;
  // Indexed files and synthetic data: the batch's records, read or made at once.
  SparseDataset records;
  if (train_index_ != nullptr) {
    std::vector<int64_t> examples(static_cast<size_t>(batch_));
    for (int64_t i = 0; i < batch_; ++i) examples[static_cast<size_t>(i)] = order[first + i];
    // What the budget leaves beside the data bounds a step's records too
    // (lines of many ids: the spec's fields do not say how many).
    if (absl::Status read = train_index_->Read(examples.data(), examples.size(), &records, row_room_);
        !read.ok()) {
      if (!absl::IsResourceExhausted(read)) return read;
      return absl::ResourceExhaustedError(
          absl::StrCat("step ", step, " of partition ", partition, ": its batch of ", batch_,
                       " examples: ", read.message(), ", what this worker's memory budget of ",
                       FormatBytes(memory_budget_), " leaves beside its data: lower ",
                       "data.batchSize or data.gradientAccumulation, or raise the workers' --memory-budget"));
    }
    if (binary_labels_) {
      for (float& label : records.labels) label = label > 0 ? 1.0f : 0.0f;
    }
  } else if (train_ == nullptr) {
    records.num_dense = synthetic_.dense;
    records.num_fields = synthetic_.fields;
    for (int64_t i = 0; i < batch_; ++i)
      synthetic_train_.Append(order[first + i], &records, nullptr, &synthetic_ids_);
  }
  for (int64_t i = 0; i < batch_; ++i) {
    const int64_t example = order[first + i];
    if (train_ != nullptr) {
      AppendExample(*train_, example, &batch);
    } else {
      AppendExample(records, i, &batch);
    }
    audit->digest += ExampleDigest(epoch, example);
  }
  audit->examples = batch_;
  return batch;
}

kernels::GraphBatch ClickRun::ModelBatch(const Batch& batch, const std::vector<Bags>& bags) const {
  kernels::GraphBatch in;
  in.batch = batch.size();
  in.labels = batch.labels.data();
  in.dense = batch.dense.empty() ? nullptr : batch.dense.data();
  in.offsets = batch.offsets.data();
  in.weights = batch.weights.empty() ? nullptr : batch.weights.data();
  for (const Bags& table : bags) {
    in.rows.push_back(table.rows.empty() ? nullptr : table.rows.data());
    in.unique_rows.push_back(static_cast<int32_t>(table.keys.size()));
  }
  return in;
}

absl::Status ClickRun::RunModel(const kernels::GraphBatch& in, const std::vector<std::vector<float>>& rows,
                                const kernels::CtrGrads* grads, kernels::CtrStats* stats, float* outputs) {
  const kernels::CtrParams params = ModelParams(rows);
  if (preset_on_backend_ != nullptr) {
    return grads != nullptr ? preset_on_backend_->ForwardBackward(in, params, *grads, stats, outputs)
                            : preset_on_backend_->Forward(in, params, stats, outputs);
  }
  if (graph_ != nullptr) {
    return grads != nullptr ? graph_->ForwardBackward(in, params, *grads, stats, outputs)
                            : graph_->Forward(in, params, stats, outputs);
  }
  // The preset kinds' tables all read every field: one row index serves them.
  kernels::CtrBatch ctr;
  ctr.batch = in.batch;
  ctr.labels = in.labels;
  ctr.dense = in.dense;
  ctr.offsets = in.offsets;
  ctr.weights = in.weights;
  ctr.rows = in.rows.empty() ? nullptr : in.rows[0];
  ctr.unique_rows = in.unique_rows.empty() ? 0 : in.unique_rows[0];
  return grads != nullptr ? model_.ForwardBackward(ctr, params, *grads, stats, outputs)
                          : model_.Forward(ctr, params, stats, outputs);
}

kernels::CtrParams ClickRun::ModelParams(const std::vector<std::vector<float>>& rows) const {
  kernels::CtrParams params;
  for (const auto& tensor : params_) params.dense.push_back(tensor.data());
  for (const auto& table : rows) params.tables.push_back(table.data());
  return params;
}

namespace {

// to[i] += scale * from[i] over every tensor.
void AddScaled(const std::vector<std::vector<float>>& from, float scale, std::vector<std::vector<float>>* to) {
  for (size_t t = 0; t < from.size(); ++t) {
    float* out = (*to)[t].data();
    const float* in = from[t].data();
    for (size_t i = 0; i < from[t].size(); ++i) out[i] += scale * in[i];
  }
}

kernels::CtrGrads GradsOf(std::vector<std::vector<float>>* dense, std::vector<std::vector<float>>* tables) {
  kernels::CtrGrads grads;
  for (auto& tensor : *dense) grads.dense.push_back(tensor.data());
  for (auto& table : *tables) grads.tables.push_back(table.data());
  return grads;
}

}  // namespace

absl::Status ClickRun::CheckGradientsFinite(int32_t partition, int64_t step,
                                            const kernels::CtrStats& stats) const {
  std::string where;
  for (size_t t = 0; t < row_grads_.size() && where.empty(); ++t) {
    const int64_t i = FirstNonFinite(row_grads_[t].data(), static_cast<int64_t>(row_grads_[t].size()));
    if (i >= 0) {
      where = absl::StrCat("table ", sparse_->table_name(static_cast<int>(t)), " (", row_grads_[t][i],
                           " in the gradient of one of its rows)");
    }
  }
  for (size_t t = 0; t < grads_.size() && where.empty(); ++t) {
    const int64_t i = FirstNonFinite(grads_[t].data(), static_cast<int64_t>(grads_[t].size()));
    if (i >= 0) {
      where = absl::StrCat("tensor ", client_->tensor_name(static_cast<int>(t)), " (", grads_[t][i],
                           " at element ", i, ")");
    }
  }
  if (where.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("step ", step, " of partition ", partition, " has a non-finite gradient in ", where,
                   "; it was not pushed (loss ", stats.loss_sum / std::max<int64_t>(1, stats.count),
                   "): ", kDivergedOrTooLarge));
}

absl::Status ClickRun::ComputeGradients(const Batch& batch, const std::vector<Bags>& bags,
                                        kernels::CtrStats* stats) {
  row_grads_.resize(rows_.size());
  for (size_t t = 0; t < rows_.size(); ++t) row_grads_[t].resize(rows_[t].size());
  const kernels::GraphBatch whole = ModelBatch(batch, bags);
  const int micro = spec_.data().batch_size();
  if (whole.batch <= micro) {
    const kernels::CtrGrads grads = GradsOf(&grads_, &row_grads_);
    return RunModel(whole, rows_, &grads, stats, nullptr);
  }
  // Gradient accumulation. Each micro-batch computes over its own rows only
  // (gathered per table from the step's, its ids renumbered), so a step
  // costs what its micro-batches do; their gradients are added back at the
  // step's rows.
  for (auto& tensor : grads_) std::fill(tensor.begin(), tensor.end(), 0.0f);
  for (auto& table : row_grads_) std::fill(table.begin(), table.end(), 0.0f);
  micro_grads_.resize(grads_.size());
  for (size_t t = 0; t < grads_.size(); ++t) micro_grads_[t].resize(grads_[t].size());
  const size_t tables = rows_.size();
  micro_rows_.resize(tables);
  micro_row_grads_.resize(tables);
  micro_row_of_.resize(tables);
  micro_ids_.resize(tables);
  local_of_.resize(tables);
  std::vector<size_t> dims;  // each table's floats a row
  for (size_t t = 0; t < tables; ++t) {
    local_of_[t].assign(static_cast<size_t>(whole.unique_rows[t]), -1);
    dims.push_back(whole.unique_rows[t] > 0 ? rows_[t].size() / static_cast<size_t>(whole.unique_rows[t]) : 0);
  }
  const int64_t fields = NumFields(), dense = NumDense();
  // Every micro-batch has `micro` examples: each adds its mean times micro / batch.
  const float share = static_cast<float>(micro) / static_cast<float>(whole.batch);
  for (int first = 0; first < whole.batch; first += micro) {
    kernels::GraphBatch part = whole;
    part.batch = micro;
    part.labels = whole.labels + first;
    if (whole.dense != nullptr) part.dense = whole.dense + first * dense;
    for (auto& ids : micro_ids_) ids.clear();  // per table: the step's row of each of this micro-batch's rows
    if (whole.offsets != nullptr) {
      // The micro-batch's bags, their offsets starting over at 0 and their
      // ids numbered by first appearance.
      const int64_t* offsets = whole.offsets + first * fields;
      micro_offsets_.resize(static_cast<size_t>(micro * fields + 1));
      for (size_t i = 0; i < micro_offsets_.size(); ++i) micro_offsets_[i] = offsets[i] - offsets[0];
      part.offsets = micro_offsets_.data();
      if (whole.weights != nullptr) part.weights = whole.weights + offsets[0];
      const int64_t ids = offsets[micro * fields] - offsets[0];
      for (size_t t = 0; t < tables; ++t) {
        micro_row_of_[t].resize(static_cast<size_t>(ids));
        for (int64_t i = 0; i < ids; ++i) {
          const int32_t row = whole.rows[t][offsets[0] + i];
          if (row < 0) {  // a field this table does not read
            micro_row_of_[t][static_cast<size_t>(i)] = -1;
            continue;
          }
          int32_t& local = local_of_[t][static_cast<size_t>(row)];
          if (local < 0) {
            local = static_cast<int32_t>(micro_ids_[t].size());
            micro_ids_[t].push_back(row);
          }
          micro_row_of_[t][static_cast<size_t>(i)] = local;
        }
        part.rows[t] = ids > 0 ? micro_row_of_[t].data() : nullptr;
      }
    }
    for (size_t t = 0; t < tables; ++t) {
      const size_t dim = dims[t];
      part.unique_rows[t] = static_cast<int32_t>(micro_ids_[t].size());
      micro_rows_[t].resize(micro_ids_[t].size() * dim);
      micro_row_grads_[t].resize(micro_ids_[t].size() * dim);
      for (size_t i = 0; i < micro_ids_[t].size(); ++i) {
        std::copy_n(rows_[t].begin() + static_cast<std::ptrdiff_t>(micro_ids_[t][i] * dim), dim,
                    micro_rows_[t].begin() + static_cast<std::ptrdiff_t>(i * dim));
      }
    }
    const kernels::CtrGrads grads = GradsOf(&micro_grads_, &micro_row_grads_);
    RETURN_IF_ERROR(RunModel(part, micro_rows_, &grads, stats, nullptr));
    AddScaled(micro_grads_, share, &grads_);
    for (size_t t = 0; t < tables; ++t) {
      const size_t dim = dims[t];
      for (size_t i = 0; i < micro_ids_[t].size(); ++i) {
        float* out = row_grads_[t].data() + micro_ids_[t][i] * dim;
        const float* in = micro_row_grads_[t].data() + i * dim;
        for (size_t d = 0; d < dim; ++d) out[d] += share * in[d];
      }
      for (int32_t row : micro_ids_[t]) local_of_[t][static_cast<size_t>(row)] = -1;
    }
  }
  return absl::OkStatus();
}

absl::Status ClickRun::Step(int32_t partition, int64_t step, Next then) {
  const absl::Time start = absl::Now();
  if (spec_.mode() == v1::SSP) {
    ParameterClient::Versions versions;
    RETURN_IF_ERROR(client_->Pull(0, kWaitSlice, &params_, &versions, step - spec_.staleness()));
    max_staleness_seen_ = std::max(max_staleness_seen_, step - versions.clock);
    if (hooks_.observe_staleness) hooks_.observe_staleness(step - versions.clock);
  } else {
    RETURN_IF_ERROR(client_->Pull(0, kRpcTimeout, &params_));
  }
  return ComputeAndPush(partition, step, start, then);
}

absl::Status ClickRun::ComputeAndPush(int32_t partition, int64_t step, absl::Time start, Next then) {
  ExampleAudit audit;
  ASSIGN_OR_RETURN(const Batch batch, ahead_->Take(partition, step, &audit));
  if (then.has_value()) ahead_->Start(then->first, then->second);
  const std::vector<Bags> bags = BagsOf(batch, table_reads_);
  const std::vector<std::vector<uint64_t>> keys = KeysOf(bags);  // every table's, for the pull and the push
  if (const int64_t bytes = RowBytes(keys); !RowsFit(bytes)) {
    return RowsBeyondRoom(absl::StrCat("step ", step, " of partition ", partition, ": its batch"), keys,
                          bytes, "lower data.batchSize, or raise the workers' --memory-budget");
  }
  RETURN_IF_ERROR(PullRows(keys, step, &rows_));
  const absl::Time compute_start = absl::Now();
  kernels::CtrStats stats;
  RETURN_IF_ERROR(ComputeGradients(batch, bags, &stats));
  if (hooks_.observe_compute) {
    const kernels::Backend* compute = graph_ != nullptr               ? graph_->backend()
                                      : preset_on_backend_ != nullptr ? preset_on_backend_->graph().backend()
                                                                      : nullptr;
    hooks_.observe_compute(absl::ToDoubleSeconds(absl::Now() - compute_start),
                           compute != nullptr ? compute->MemoryInUse() : 0);
  }
  const bool die_mid_push = ExitMidPushNow();
  // A gradient that is not finite is not pushed (the servers would refuse
  // it): the job fails naming the table or tensor, and nothing of the step
  // reaches the servers.
  RETURN_IF_ERROR(CheckGradientsFinite(partition, step, stats));
  RETURN_IF_ERROR(sparse_->Push(partition, step, keys, row_grads_, kRpcTimeout));
  if (die_mid_push) {  // SetExitMidPush's fault
    FLOG(ERROR) << "--exit-mid-push: killing this process between the rows' push and the dense one";
    raise(SIGKILL);
  }
  RETURN_IF_ERROR(client_->Push(++seq_, partition, step, grads_, kRpcTimeout, audit.examples, audit.digest));
  window_.loss_sum += stats.loss_sum;
  window_.count += stats.count;
  if (step_losses_.size() >= kMaxStepLosses) step_losses_.erase(step_losses_.begin());
  v1::StepLoss& loss = step_losses_.emplace_back();
  loss.set_step(step);
  loss.set_partition(partition);
  loss.set_loss(static_cast<float>(stats.loss_sum / std::max<int64_t>(1, stats.count)));
  ++window_steps_;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  window_step_seconds_ += seconds;
  if (hooks_.observe_step) hooks_.observe_step(seconds, batch_);
  return absl::OkStatus();
}

absl::Status ClickRun::EvaluateAndReport(int64_t step, bool pull) {
  if (pull) RETURN_IF_ERROR(client_->Pull(0, kRpcTimeout, &params_));
  std::vector<float> scores, labels;
  kernels::CtrStats stats;
  int64_t correct = 0;
  // Batches of kClickEvalBatch examples, fewer where their rows would not
  // fit the worker's budget (halved until they do: one example at least).
  int64_t most = kClickEvalBatch;
  for (int64_t first = 0, count = 0; first < test_->num_examples(); first += count) {
    count = std::min<int64_t>(most, test_->num_examples() - first);
    const Batch batch = Slice(*test_, first, count);
    const std::vector<Bags> bags = BagsOf(batch, table_reads_);
    const std::vector<std::vector<uint64_t>> keys = KeysOf(bags);
    if (const int64_t bytes = RowBytes(keys); !RowsFit(bytes)) {
      if (count == 1) {
        return RowsBeyondRoom(
            absl::StrCat("evaluation at step ", step, ": test example ", first), keys, bytes,
            "raise the workers' --memory-budget, or leave the example out of data.testPath");
      }
      most = count / 2;
      count = 0;  // this slice again, smaller
      continue;
    }
    std::vector<std::vector<float>> rows;
    RETURN_IF_ERROR(PullRows(keys, step, &rows));
    std::vector<float> outputs(static_cast<size_t>(count * output_width_));
    RETURN_IF_ERROR(RunModel(ModelBatch(batch, bags), rows, nullptr, &stats, outputs.data()));
    if (const int64_t bad = FirstNonFinite(outputs.data(), static_cast<int64_t>(outputs.size())); bad >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "evaluation at step ", step, ": the model's output for test example ", first + bad / output_width_,
          " is ", outputs[static_cast<size_t>(bad)], ": ", kDivergedOrTooLarge));
    }
    for (int64_t i = 0; i < count; ++i) {
      const float label = batch.labels[static_cast<size_t>(i)];
      if (loss_ == kernels::LossKind::kSoftmaxCrossEntropy) {
        const auto row = outputs.begin() + i * output_width_;
        correct += std::max_element(row, row + output_width_) - row == static_cast<std::ptrdiff_t>(label);
      } else {
        correct += (outputs[static_cast<size_t>(i)] > 0) == (label > 0.5f);
      }
    }
    if (loss_ == kernels::LossKind::kSigmoidCrossEntropy) scores.insert(scores.end(), outputs.begin(), outputs.end());
    labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
  }
  v1::WorkReport report;
  report.set_kind(v1::WorkReport::EVAL);
  report.set_step(step);
  report.set_epoch(static_cast<int32_t>((step + steps_per_epoch_ - 1) / steps_per_epoch_));
  // A regression (squared error) has no accuracy: -1, as before any evaluation.
  report.set_test_accuracy(loss_ == kernels::LossKind::kMeanSquaredError
                               ? -1.0
                               : static_cast<double>(correct) / std::max<int64_t>(1, stats.count));
  report.set_test_loss(stats.loss_sum / std::max<int64_t>(1, stats.count));
  if (loss_ == kernels::LossKind::kSigmoidCrossEntropy) {
    report.set_test_auc(Auc(scores, labels));  // logits rank as the probabilities do
  }
  hooks_.report(report);
  return absl::OkStatus();
}

void ClickRun::MaybeReportProgress(int64_t step, bool force, const std::map<int32_t, int64_t>& positions) {
  const absl::Duration elapsed = absl::Now() - window_start_;
  if (!force && elapsed < kReportEvery) return;
  v1::WorkReport report;
  report.set_kind(v1::WorkReport::PROGRESS);
  report.set_step(step);
  const int64_t epoch = partitioning_.EpochOf(std::max<int64_t>(0, step - 1));
  report.set_epoch(static_cast<int32_t>(std::min<int64_t>(spec_.data().epochs(), epoch + 1)));
  if (window_.count > 0) {  // an empty window repeats the last figures
    last_loss_ = window_.loss_sum / static_cast<double>(window_.count);
    last_samples_per_second_ = static_cast<double>(window_steps_) * batch_ /
                               std::max(1e-9, absl::ToDoubleSeconds(elapsed));
  }
  if (window_steps_ > 0) last_step_seconds_ = window_step_seconds_ / static_cast<double>(window_steps_);
  report.set_loss(last_loss_);
  report.set_samples_per_second(last_samples_per_second_);
  report.set_step_seconds(last_step_seconds_);
  report.set_max_staleness_seen(max_staleness_seen_);
  for (v1::StepLoss& loss : step_losses_) *report.add_step_losses() = std::move(loss);
  step_losses_.clear();
  for (const auto& [partition, position] : positions) {
    report.add_partitions(partition);
    report.add_partition_steps(position);
  }
  hooks_.report(report);
  window_ = kernels::CtrStats();
  window_steps_ = 0;
  window_step_seconds_ = 0;
  window_start_ = absl::Now();
}

void ClickRun::ReportDone(const std::vector<int32_t>& partitions) {
  v1::WorkReport report;
  report.set_kind(v1::WorkReport::DONE);
  for (int32_t p : partitions) report.add_partitions(p);
  hooks_.report(report);
}

absl::Status ClickRun::Recover(const absl::Status& error) {
  if (!absl::IsAborted(error) && !absl::IsUnavailable(error) && !absl::IsDeadlineExceeded(error) &&
      !absl::IsNotFound(error)) {
    return error;
  }
  if (++failures_ > kMaxFailures) return error;
  if (hooks_.expect_change) hooks_.expect_change();
  v1::Assignment assignment = hooks_.latest_assignment();
  if (assignment.shard_map().version() <= client_->map_version()) {
    assignment = hooks_.wait_for_change(assignment.membership_epoch(), absl::Seconds(1));
  }
  if (hooks_.should_stop()) return absl::CancelledError("assignment withdrawn");
  if (assignment.shard_map().version() > client_->map_version()) {
    FLOG(INFO) << "job " << job_id_ << ": shard map version " << assignment.shard_map().version()
               << " after: " << error.message();
    UseMap(assignment.shard_map());
  }
  return absl::OkStatus();
}

absl::Status ClickRun::Run() {
  // A worker reading fewer examples than a step's would divide by zero.
  RETURN_IF_ERROR(partitioning_.CheckStepsPerEpoch(steps_per_epoch_));
  return bsp_ ? RunBsp() : RunAsync();
}

absl::Status ClickRun::PushOwned(const v1::Assignment& assignment, int64_t step, std::set<int32_t>* pushed) {
  std::vector<int32_t> owned(assignment.partitions().begin(), assignment.partitions().end());
  std::sort(owned.begin(), owned.end());
  for (size_t i = 0; i < owned.size(); ++i) {
    const int32_t p = owned[i];
    if (pushed->count(p) > 0) continue;
    // Next: the following owned partition, or the first at the next step.
    Next then;
    if (i + 1 < owned.size()) {
      then = std::make_pair(owned[i + 1], step);
    } else if (step + 1 < total_steps_) {
      then = std::make_pair(owned.front(), step + 1);
    }
    RETURN_IF_ERROR(ComputeAndPush(p, step, absl::Now(), then));
    pushed->insert(p);
  }
  return absl::OkStatus();
}

// BSP, as TrainingRun::RunBsp (worker/trainer.cc): the step to compute is
// the version the servers are at, so a worker joins or takes a partition
// over at any step; a partition's step is applied once whoever sends it and
// is the same whoever computes it (the tables' rows come as the step reads
// them, even from a re-run after the step was applied).
absl::Status ClickRun::RunBsp() {
  int64_t next = 0;           // the version to wait for
  int64_t have_version = -1;  // the version params_ hold
  int64_t evaluated = 0;
  std::set<int32_t> pushed;   // partitions pushed for have_version
  // A version some chunks were seen waiting at while others had passed it
  // (-1: none), and whether the next pull asks for exactly `next`.
  int64_t split_at = -1;
  bool exact = false;
  v1::Assignment assignment = hooks_.latest_assignment();
  while (true) {
    if (hooks_.should_stop()) return absl::CancelledError("assignment withdrawn");
    ParameterClient::Versions versions;
    absl::Status pulled = client_->Pull(next, kWaitSlice, &pulled_, &versions, /*min_clock=*/0, exact);
    if (exact && absl::IsFailedPrecondition(pulled)) {  // the step completed meanwhile
      exact = false;
      next = next + 1;
      continue;
    }
    exact = false;
    if (absl::IsDeadlineExceeded(pulled)) {
      // The step waits for a partition nobody sent: compute the ones this
      // worker owns now (taken over from a worker that died).
      assignment = hooks_.latest_assignment();
      if (assignment.shard_map().version() > client_->map_version()) {
        RETURN_IF_ERROR(Recover(pulled));
        continue;
      }
      if (split_at > have_version) {  // a push half sent by a worker that died: compute its step
        next = split_at;
        exact = true;
        split_at = -1;
        continue;
      }
      if (have_version < 0) continue;
      if (absl::Status pushes = PushOwned(assignment, have_version, &pushed); !pushes.ok()) {
        RETURN_IF_ERROR(Recover(pushes));
      }
      continue;
    }
    if (!pulled.ok()) {
      RETURN_IF_ERROR(Recover(pulled));
      continue;
    }
    failures_ = 0;
    if (versions.min != versions.max) {  // caught mid-update: wait for every chunk
      if (versions.min > have_version) split_at = versions.min;
      next = versions.max;
      continue;
    }
    split_at = -1;
    const int64_t version = versions.min;
    params_.swap(pulled_);
    if (version != have_version) pushed.clear();
    have_version = version;
    assignment = hooks_.latest_assignment();
    const bool evaluator = std::count(assignment.partitions().begin(), assignment.partitions().end(),
                                      assignment.eval_partition()) > 0;
    if (evaluator && test_ != nullptr && EvaluatesAt(version) && evaluated < version) {
      // Its pulls of rows meet the same server changes as a step's.
      if (absl::Status status = EvaluateAndReport(version, /*pull=*/false); !status.ok()) {
        RETURN_IF_ERROR(Recover(status));
        next = version;
        continue;
      }
      evaluated = version;
    }
    if (version >= total_steps_) break;
    if (absl::Status pushes = PushOwned(assignment, version, &pushed); !pushes.ok()) {
      RETURN_IF_ERROR(Recover(pushes));  // pull this step again and send what is missing
      next = version;
      continue;
    }
    std::map<int32_t, int64_t> positions;
    for (int32_t p : assignment.partitions()) positions[p] = version + 1;
    MaybeReportProgress(version + 1, (version + 1) % steps_per_epoch_ == 0, positions);
    next = version + 1;
  }
  // Done: report the partitions owned now, and keep serving the job until it
  // ends, in case a partition (and its final evaluation) moves here.
  std::set<int32_t> reported;
  while (!hooks_.should_stop()) {
    std::map<int32_t, int64_t> positions;
    std::vector<int32_t> fresh;
    bool evaluate = false;
    for (int32_t p : assignment.partitions()) {
      positions[p] = total_steps_;
      if (!reported.insert(p).second) continue;
      fresh.push_back(p);
      evaluate |= p == assignment.eval_partition() && test_ != nullptr && evaluated < total_steps_;
    }
    if (!fresh.empty()) {
      MaybeReportProgress(total_steps_, /*force=*/true, positions);
      if (evaluate) {
        if (absl::Status status = EvaluateAndReport(total_steps_); !status.ok()) {
          RETURN_IF_ERROR(Recover(status));
          for (int32_t p : fresh) reported.erase(p);  // evaluate and report them again
          assignment = hooks_.latest_assignment();
          continue;
        }
        evaluated = total_steps_;
      }
      ReportDone(fresh);
    }
    assignment = hooks_.wait_for_change(assignment.membership_epoch(), absl::Milliseconds(500));
  }
  return absl::CancelledError("assignment withdrawn");
}

absl::Status ClickRun::RunAsync() {
  std::map<int32_t, int64_t> positions;
  std::set<int32_t> reported_done;
  int64_t eval_due = -1;  // an evaluation to run (again, after a server change), -1: none
  v1::Assignment assignment = hooks_.latest_assignment();
  while (!hooks_.should_stop()) {
    if (eval_due >= 0) {
      if (absl::Status status = EvaluateAndReport(eval_due); !status.ok()) {
        RETURN_IF_ERROR(Recover(status));
        assignment = hooks_.latest_assignment();
        continue;
      }
      eval_due = -1;
    }
    positions = PartitionPositions(assignment, positions);
    const int32_t next = FurthestBehind(positions, total_steps_);
    if (next < 0) {  // every owned partition is through: report, then wait for the job's end
      std::vector<int32_t> fresh;
      for (const auto& [p, position] : positions) {
        if (reported_done.insert(p).second) fresh.push_back(p);
      }
      if (!fresh.empty()) {
        MaybeReportProgress(total_steps_, /*force=*/true, positions);
        if (positions.count(assignment.eval_partition()) > 0 && test_ != nullptr) {
          if (absl::Status status = EvaluateAndReport(total_steps_); !status.ok()) {
            RETURN_IF_ERROR(Recover(status));
            for (int32_t p : fresh) reported_done.erase(p);  // evaluate and report them again
            assignment = hooks_.latest_assignment();
            continue;
          }
        }
        ReportDone(fresh);
      }
      assignment = hooks_.wait_for_change(assignment.membership_epoch(), absl::Milliseconds(500));
      continue;
    }
    const int64_t step = positions[next];
    std::map<int32_t, int64_t> after = positions;
    after[next] = step + 1;
    const int32_t guess = FurthestBehind(after, total_steps_);
    const absl::Status status =
        Step(next, step, guess >= 0 ? Next(std::make_pair(guess, after[guess])) : Next());
    if (spec_.mode() == v1::SSP && absl::IsDeadlineExceeded(status)) {  // too far ahead: wait again
      assignment = hooks_.latest_assignment();
      if (assignment.shard_map().version() > client_->map_version()) RETURN_IF_ERROR(Recover(status));
      continue;
    }
    if (!status.ok()) {
      RETURN_IF_ERROR(Recover(status));
      assignment = hooks_.latest_assignment();
      continue;
    }
    failures_ = 0;
    positions[next] = step + 1;
    if (next == assignment.eval_partition() && test_ != nullptr && EvaluatesAt(step + 1) && step + 1 < total_steps_) {
      eval_due = step + 1;  // next, at the loop's top, where a server change is recovered from
    }
    MaybeReportProgress(step + 1, false, positions);
    assignment = hooks_.latest_assignment();
  }
  return absl::CancelledError("assignment withdrawn");
}

}  // namespace

absl::Status RunClickJob(const std::string& worker_id, const TrainerHooks& hooks,
                         ParameterTransport* transport, const v1::Assignment& assignment, ClickData data,
                         kernels::Backend* compute) {
  const ModelLayout layout = LayoutFor(assignment.spec(), 0, 0);
  RETURN_IF_ERROR(layout.graph ? kernels::ValidateGraphConfig(layout.graph_config)
                               : kernels::ValidateCtrModelConfig(layout.ctr));
  const int32_t model_fields = layout.graph ? layout.graph_config.num_fields : layout.ctr.num_fields;
  const int32_t model_dense = layout.graph ? layout.graph_config.num_dense : layout.ctr.num_dense;
  const auto check = [&](int32_t fields, int32_t dense) {
    if (fields == model_fields && dense == model_dense) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("the click data has ", fields, " fields and ", dense,
                                                      " dense features; the model reads ", model_fields, " and ",
                                                      model_dense));
  };
  if (data.train != nullptr) RETURN_IF_ERROR(check(data.train->num_fields, data.train->num_dense));
  if (data.train_index != nullptr) {
    RETURN_IF_ERROR(check(data.train_index->num_fields(), data.train_index->num_dense()));
  }
  if (data.test != nullptr) RETURN_IF_ERROR(check(data.test->num_fields, data.test->num_dense));
  FLOG(INFO) << "job " << assignment.job_id() << ": the click model computes "
             << (compute != nullptr ? absl::StrCat("on backend ", compute->Name())
                                    : std::string("on the host"));
  ClickRun run(worker_id, hooks, transport, assignment, std::move(data), compute);
  const absl::Status status = run.Run();
  if (hooks.watch_client) hooks.watch_client(nullptr, "");
  return status;
}

}  // namespace fulcrum
