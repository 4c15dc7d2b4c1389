// Writes Fulcrum's synthetic click data to a file, so that a reference
// implementation (bench/torch_ctr_reference.py) trains on exactly the
// examples a click job sees, or as libsvm, libffm or CSV files to try the
// file datasets on. Usage:
//   fulcrum-ctr-data-dump --out=FILE --examples=N --fields=F --vocabulary=V
//                         --dense=D --fm_dim=K --fm_scale=S --seed=SEED
//   fulcrum-ctr-data-dump --out=FILE --spec=JOB.yaml --start=START.safetensors
//   fulcrum-ctr-data-dump --format=libsvm|libffm|csv --out=FOLDER --files=N ...
// With --format=libsvm, libffm or csv, FOLDER gets train-0 to train-(N-1)
// and test (.libsvm, .libffm or .csv), the training examples dealt over the
// N files in order: libsvm lines "label id:1 ..." (the fields' ids; no dense
// features, so --dense must be 0), libffm lines "label field:id:1 ..." (the
// same with each id's field: data.libsvm.fields reads them), CSV lines
// "label,dense...,id..." (examples/ctr-csv.yaml reads them). The best AUC
// reachable on the test set (the true click probabilities') is printed.
// Format (little-endian): int64 train, int64 test, int32 fields, int32
// dense; then train and test examples, each: float label, float truth (the
// true click probability), D floats, F uint64 ids.
//
// With --spec (a job spec as `fulcrum submit -f` reads it, dataset
// SYNTHETIC_CTR) the data is that job's, and --start writes, in the format of
// `fulcrum export`, where the job starts: every dense tensor's initial values
// (its name, as the layout names it), each table's initial rows for every id
// of the data (`table.NAME.ids`, `table.NAME.rows`), and `order` (U64,
// steps x global batch): the training examples of each step, partition after
// partition, as the job's workers read them. Its metadata holds the spec
// (`spec`, JSON after the scheduler's defaults). A reference that starts from
// these values and reads this order computes the job's steps.
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/safetensors.h"
#include "client/spec_file.h"
#include "common/data_partition.h"
#include "common/param_init.h"
#include "common/process.h"
#include "common/sync.h"
#include "common/table_spec.h"
#include "kernels/model_from_spec.h"
#include "scheduler/job_spec.h"
#include "server/sparse_table.h"
#include "worker/ctr_data.h"
#include "worker/ctr_trainer.h"

ABSL_FLAG(std::string, out, "",
          "file to write (--format=libsvm, libffm or csv: the folder to write the files in)");
ABSL_FLAG(std::string, format, "binary", "binary (for the PyTorch reference), libsvm, libffm or csv");
ABSL_FLAG(int32_t, files, 4, "--format=libsvm, libffm or csv: training files, in [1, 1000]");
ABSL_FLAG(std::string, spec, "", "a job spec (YAML or JSON) whose synthetic click data to write");
ABSL_FLAG(std::string, start, "", "with --spec: the safetensors file of the job's initial values and order");
ABSL_FLAG(int64_t, examples, 50000, "training examples (the test set is a fifth of it)");
ABSL_FLAG(int32_t, fields, 4, "categorical fields");
ABSL_FLAG(int64_t, vocabulary, 100, "ids per field");
ABSL_FLAG(int32_t, dense, 2, "dense features");
ABSL_FLAG(int32_t, fm_dim, 2, "the true model's latent width");
ABSL_FLAG(double, fm_scale, 0.5, "the latent values' standard deviation");
ABSL_FLAG(uint64_t, seed, 5, "the job's seed");

namespace fulcrum {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "fulcrum-ctr-data-dump: %s\n", status.ToString().c_str());
  return 2;
}

// The dense tensors' initial values, as the servers fill their chunks.
void AddDenseStart(const v1::JobSpec& spec, const ModelLayout& layout, std::vector<SafetensorsTensor>* out) {
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    const kernels::TensorInfo& info = layout.tensors[t];
    std::vector<float> values(info.size);
    FillInit(info.init, info.init_scale, spec.seed(), static_cast<uint32_t>(t), 0, info.size, values.data());
    out->emplace_back(info.name, info.shape, std::move(values));
  }
}

// Each table's initial rows of `ids`, as a server's table answers a pull of
// keys it has no row of.
absl::Status AddTableStart(const v1::JobSpec& spec, const ModelLayout& layout, const std::vector<uint64_t>& ids,
                           std::vector<SafetensorsTensor>* out) {
  for (size_t t = 0; t < layout.tables.size(); ++t) {
    const kernels::CtrTableInfo& info = layout.tables[t];
    SparseTableConfig config;
    config.name = info.name;
    config.dim = info.dim;
    float scale = DefaultTableInitScale(info.name);
    for (const v1::TableSpec& table : spec.model().tables()) {
      if (table.name() == info.name && table.has_init_scale()) scale = table.init_scale();
    }
    config.init = scale > 0 ? InitKind::kUniform : InitKind::kZeros;
    config.init_scale = scale;
    config.seed = spec.seed();
    config.table_index = static_cast<uint32_t>(t);
    absl::StatusOr<std::unique_ptr<SparseTable>> table = SparseTable::Create(config);
    if (!table.ok()) return table.status();
    std::vector<float> rows(ids.size() * static_cast<size_t>(info.dim));
    (*table)->Pull(ids, rows.data());
    out->push_back(SafetensorsTensor::Ids(absl::StrCat("table.", info.name, ".ids"),
                                          {static_cast<int64_t>(ids.size())}, ids));
    out->emplace_back(absl::StrCat("table.", info.name, ".rows"),
                      std::vector<int64_t>{static_cast<int64_t>(ids.size()), info.dim}, std::move(rows));
  }
  return absl::OkStatus();
}

// The examples of every step, partition after partition (ClickRun::MakeBatch).
SafetensorsTensor Order(const v1::JobSpec& spec, int64_t examples) {
  const DataPartitioning partitioning = DataPartitioning::For(spec, examples);
  const int64_t steps = partitioning.TotalSteps(spec.data().epochs(), spec.data().max_steps());
  const int64_t batch = partitioning.batch_size();
  std::vector<uint64_t> order;
  order.reserve(static_cast<size_t>(steps * partitioning.global_batch()));
  for (int64_t step = 0; step < steps; ++step) {
    const AffineOrder epoch(spec.data().shuffle_seed(), partitioning.EpochOf(step), examples);
    for (int32_t p = 0; p < partitioning.num_partitions(); ++p) {
      const int64_t first = partitioning.FirstRow(step, static_cast<int32_t>(p));
      for (int64_t i = 0; i < batch; ++i) order.push_back(static_cast<uint64_t>(epoch[first + i]));
    }
  }
  return SafetensorsTensor::Ids("order", {steps, partitioning.global_batch()}, std::move(order));
}

// --format=libsvm, libffm or csv: the training examples dealt over `files`
// files in order, and the test set, in the folder `folder` (made if missing).
absl::Status WriteTextFiles(const SyntheticCtrSpec& data, const std::string& format,
                            const std::string& folder, int32_t files) {
  if (files < 1 || files > 1000) return absl::InvalidArgumentError("--files must be in [1, 1000]");
  const bool csv = format == "csv";
  if (!csv && data.dense != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--format=", format, " holds no dense features and this data has ", data.dense,
        ": make them 0 (--dense=0, or data.syntheticCtr.dense: 0 in the --spec file), or use --format=csv"));
  }
  const ClickTextFormat text = csv                  ? ClickTextFormat::kCsv
                               : format == "libffm" ? ClickTextFormat::kLibffm
                                                    : ClickTextFormat::kLibsvm;
  std::error_code made;
  std::filesystem::create_directories(folder, made);
  if (made) return absl::FailedPreconditionError(absl::StrCat("cannot make ", folder, ": ", made.message()));
  const std::string extension = "." + format;
  const int64_t test_examples = SyntheticCtrTestExamples(data.examples);
  for (int split = 0; split < 2; ++split) {
    const int64_t count = split == 0 ? data.examples : test_examples;
    const int32_t parts = split == 0 ? files : 1;
    std::vector<float> truth;
    const SparseDataset examples = MakeSyntheticCtr(data, split, 0, count, &truth);
    for (int32_t part = 0; part < parts; ++part) {
      const std::string path = absl::StrCat(
          folder, "/", split == 0 ? absl::StrCat("train-", part) : std::string("test"), extension);
      FILE* out = std::fopen(path.c_str(), "w");
      if (out == nullptr)
        return absl::FailedPreconditionError(absl::StrCat(path, ": ", std::strerror(errno)));
      const int64_t begin = count * part / parts, end = count * (part + 1) / parts;
      bool wrote = true;
      absl::Status made = absl::OkStatus();
      for (int64_t e = begin; e < end && wrote && made.ok(); ++e) {
        absl::StatusOr<std::string> line = ClickRecordText(examples, e, text);
        made = line.status();
        wrote = !line.ok() || std::fwrite(line->data(), 1, line->size(), out) == line->size();
      }
      if (!made.ok()) {
        std::fclose(out);
        return made;
      }
      if (std::fclose(out) != 0 || !wrote) {
        return absl::DataLossError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
      }
    }
    if (split == 1) {
      std::printf(
          "wrote %s/train-{0..%d}%s (%lld examples) and test%s (%lld); best reachable test AUC (the true "
          "click probabilities') %.4f\n",
          folder.c_str(), files - 1, extension.c_str(), static_cast<long long>(data.examples),
          extension.c_str(), static_cast<long long>(count), Auc(truth, examples.labels));
    }
  }
  return absl::OkStatus();
}

// The flags that say what data to make, which --spec says instead.
constexpr const char* kDataFlags[] = {"examples", "fields",   "vocabulary", "dense",
                                      "fm_dim",   "fm_scale", "seed"};

// The flags' data within the bounds a job spec's data.syntheticCtr has.
absl::Status CheckDataFlags(const SyntheticCtrSpec& data) {
  auto outside = [](const char* flag, int64_t value, int64_t low, int64_t high) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be in [", low, ", ", high, "] (got ",
                                                   value, "), as a job's data.syntheticCtr"));
  };
  if (data.examples < 1 || data.examples > kMaxSyntheticCtrExamples) {
    return outside("examples", data.examples, 1, kMaxSyntheticCtrExamples);
  }
  if (data.fields < 1 || data.fields > kMaxSyntheticCtrFields) {
    return outside("fields", data.fields, 1, kMaxSyntheticCtrFields);
  }
  if (data.dense < 0 || data.dense > kMaxSyntheticCtrDense)
    return outside("dense", data.dense, 0, kMaxSyntheticCtrDense);
  if (data.fm_dim < 0 || data.fm_dim > kMaxSyntheticCtrFmDim) {
    return outside("fm_dim", data.fm_dim, 0, kMaxSyntheticCtrFmDim);
  }
  return ValidateSyntheticCtrSpec(data);
}

int Main(const std::set<std::string>* given) {
  SyntheticCtrSpec data;
  v1::JobSpec spec;
  if (absl::GetFlag(FLAGS_out).empty()) {
    return Fail(
        absl::InvalidArgumentError("--out is required: the file to write (--format=binary) or the folder "
                                   "(--format=libsvm, libffm or csv); see --help"));
  }
  const bool from_spec = !absl::GetFlag(FLAGS_spec).empty();
  for (const char* flag : kDataFlags) {
    if (from_spec && given->count(flag) > 0) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " does not go with --spec: the spec's data.syntheticCtr and seed say what data")));
    }
  }
  if (from_spec) {
    absl::StatusOr<v1::JobSpec> read = ReadJobSpecFile(absl::GetFlag(FLAGS_spec));
    if (!read.ok()) return Fail(read.status());
    spec = *std::move(read);
    ApplyJobSpecDefaults(&spec);
    if (absl::Status valid = ValidateJobSpec(spec); !valid.ok()) return Fail(valid);
    if (spec.data().dataset() != v1::DataSpec::SYNTHETIC_CTR) {
      return Fail(absl::InvalidArgumentError("--spec: data.dataset must be SYNTHETIC_CTR"));
    }
    data = SyntheticCtrOf(spec);
  } else {
    if (!absl::GetFlag(FLAGS_start).empty()) return Fail(absl::InvalidArgumentError("--start needs --spec"));
    data.seed = absl::GetFlag(FLAGS_seed);
    data.examples = absl::GetFlag(FLAGS_examples);
    data.fields = absl::GetFlag(FLAGS_fields);
    data.vocabulary = absl::GetFlag(FLAGS_vocabulary);
    data.dense = absl::GetFlag(FLAGS_dense);
    data.fm_dim = absl::GetFlag(FLAGS_fm_dim);
    data.fm_scale = static_cast<float>(absl::GetFlag(FLAGS_fm_scale));
    if (absl::Status valid = CheckDataFlags(data); !valid.ok()) return Fail(valid);
  }
  if (absl::Status valid = ValidateSyntheticCtrSpec(data); !valid.ok()) return Fail(valid);
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format == "libsvm" || format == "libffm" || format == "csv") {
    if (!absl::GetFlag(FLAGS_start).empty())
      return Fail(absl::InvalidArgumentError("--start needs --format=binary"));
    if (absl::Status written =
            WriteTextFiles(data, format, absl::GetFlag(FLAGS_out), absl::GetFlag(FLAGS_files));
        !written.ok()) {
      return Fail(written);
    }
    return 0;
  }
  if (format != "binary")
    return Fail(absl::InvalidArgumentError("--format must be binary, libsvm, libffm or csv"));
  FILE* out = std::fopen(absl::GetFlag(FLAGS_out).c_str(), "wb");
  if (out == nullptr) {
    std::perror("--out");
    return 2;
  }
  // The test set as the job's evaluating worker makes it.
  const int64_t counts[2] = {data.examples, SyntheticCtrTestExamples(data.examples)};
  const int32_t shape[2] = {data.fields, data.dense};
  std::fwrite(counts, sizeof(counts), 1, out);
  std::fwrite(shape, sizeof(shape), 1, out);
  std::set<uint64_t> ids;
  for (int split = 0; split < 2; ++split) {
    std::vector<float> truth;
    const SparseDataset examples = MakeSyntheticCtr(data, split, 0, counts[split], &truth);
    for (int64_t e = 0; e < counts[split]; ++e) {
      std::fwrite(&examples.labels[e], sizeof(float), 1, out);
      std::fwrite(&truth[e], sizeof(float), 1, out);
      std::fwrite(examples.dense.data() + e * data.dense, sizeof(float), data.dense, out);
      std::fwrite(examples.ids.data() + e * data.fields, sizeof(uint64_t), data.fields, out);
    }
    ids.insert(examples.ids.begin(), examples.ids.end());
  }
  if (std::fclose(out) != 0) return 1;
  if (absl::GetFlag(FLAGS_start).empty()) return 0;
  const ModelLayout layout = LayoutFor(spec, 0, 0);
  std::vector<SafetensorsTensor> start;
  AddDenseStart(spec, layout, &start);
  if (absl::Status tables = AddTableStart(spec, layout, std::vector<uint64_t>(ids.begin(), ids.end()), &start);
      !tables.ok()) {
    return Fail(tables);
  }
  start.push_back(Order(spec, data.examples));
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(spec, &json, options).ok()) {
    return Fail(absl::InternalError("the spec does not print as JSON"));
  }
  if (absl::Status written = WriteSafetensorsFile(absl::GetFlag(FLAGS_start), start, {{"spec", json}});
      !written.ok()) {
    return Fail(written);
  }
  return 0;
}

}  // namespace
}  // namespace fulcrum

int main(int argc, char** argv) {
  fulcrum::SetMutexDeadlockDetection(false);  // as every daemon (common/sync.h)
  fulcrum::ParseFlags(
      argc, argv,
      "writes Fulcrum's synthetic click data: a binary file for the PyTorch reference, or libsvm, "
      "libffm or CSV files to train on.\n"
      "  fulcrum-ctr-data-dump --out=FILE [--examples=N --fields=F --vocabulary=V --dense=D "
      "--fm_dim=K --fm_scale=S --seed=SEED]\n"
      "  fulcrum-ctr-data-dump --out=FILE --spec=JOB.yaml [--start=START.safetensors]\n"
      "  fulcrum-ctr-data-dump --format=libsvm|libffm|csv --out=FOLDER [--files=N] [the data flags]");
  std::set<std::string> given;  // the flags on the command line
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) == 0) given.insert(arg.substr(2, arg.find('=') - 2));
  }
  return fulcrum::Main(&given);
}
