// Users' own CTR-style data: libsvm text and CSV with a column spec, read as
// a stream of lines (a file is never held whole; a line longer than the
// limit is a bad record, skipped without being buffered). Every record
// becomes a label, dense features and, per categorical field, a bag of
// uint64 feature ids (the keys of the sparse tables) with weights.
//
// Bad records (a bad number, a wrong column count, a line too long, a
// truncated token) are counted and skipped, or fail the read with the file
// and line, as the job's onBadRecord says.
#ifndef FULCRUM_WORKER_CTR_DATA_H_
#define FULCRUM_WORKER_CTR_DATA_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fulcrum {

struct SparseDataset {
  int32_t num_dense = 0;
  int32_t num_fields = 0;        // categorical fields (libsvm: one)
  std::vector<float> labels;     // one per example, as the file gives it
  std::vector<float> dense;      // examples x num_dense, row-major
  std::vector<uint64_t> ids;     // every field's ids of every example, in order
  std::vector<float> weights;    // one per id (libsvm: its value; CSV: 1)
  // examples x num_fields + 1: field f of example e holds
  // ids[offsets[e * num_fields + f], offsets[e * num_fields + f + 1]).
  std::vector<int64_t> offsets = {0};

  int64_t num_examples() const { return static_cast<int64_t>(labels.size()); }
};

enum class BadRecordPolicy { kSkip, kFail };

struct ReadStats {
  int64_t records = 0;  // good ones, appended
  int64_t bad = 0;      // skipped
  std::vector<std::string> first_bad;  // "file:line: why" of the first ten
};

struct LineLimits {
  int64_t max_line_bytes = int64_t{1} << 20;
  int32_t max_ids_per_line = 1 << 16;
  BadRecordPolicy on_bad_record = BadRecordPolicy::kSkip;
  // The most bytes the dataset read into may take (HeldBytes; 0: no
  // limit): the read stops with RESOURCE_EXHAUSTED at the record past it.
  int64_t max_dataset_bytes = 0;
  // > 0: a label must be a class number in [0, label_classes) (a softmax
  // model's); another is a bad record.
  int32_t label_classes = 0;
};

// Bytes `data`'s records take: a label, the dense values, and per id its
// key, weight and offset. What a dataset holds once its read is over
// (ShrinkToFit); while read, its vectors grow ahead of their records, by up
// to as much again.
inline int64_t HeldBytes(const SparseDataset& data) {
  return static_cast<int64_t>(data.labels.size() * 4 + data.dense.size() * 4 + data.ids.size() * 12 +
                              data.offsets.size() * 8);
}

// Frees the room `data`'s vectors grew ahead of their records, so that it
// takes HeldBytes.
void ShrinkToFit(SparseDataset* data);

// libsvm / svmlight: "label index:value index:value ..." (a "qid:n" token is
// ignored, "#" starts a comment). Each index is a uint64 feature id of the
// one field, its value the id's weight. With `fields` > 0 the lines are
// libffm's, "label field:index:value ...": each id goes to the bag of its
// field, in [0, fields) (another field is a bad record).
struct LibsvmFormat {
  LineLimits limits;
  // A negative value is a bad record (values weigh the ids' rows).
  bool nonnegative_values = false;
  int32_t fields = 0;  // 0: libsvm, one field; > 0: libffm with that many
};

// The fields a LibsvmFormat's records have.
inline int32_t LibsvmFields(const LibsvmFormat& format) { return std::max(format.fields, 1); }

// CSV: one kind per column. Categorical values are hashed, with their field,
// into feature ids (the same on every machine); an empty one is a missing
// value (no id); an empty dense value is 0.
struct CsvFormat {
  enum class Column { kIgnore, kLabel, kDense, kCategorical };
  std::vector<Column> columns;  // exactly one kLabel
  char delimiter = ',';
  bool header = false;          // the first line of each file names the columns
  LineLimits limits;
};

// INVALID_ARGUMENT for a CSV column spec without exactly one label column.
absl::Status ValidateCsvFormat(const CsvFormat& format);

// The feature id of categorical `value` in field `field`.
uint64_t CategoricalId(int32_t field, absl::string_view value);

// Appends the records of the file at `path` to `out` (whose num_dense and
// num_fields must match the format's, or be those of an empty dataset),
// reading `block_bytes` at a time. Errors: NOT_FOUND / FAILED_PRECONDITION
// for a file that cannot be read, INVALID_ARGUMENT "path:line: why" for the
// first bad record under kFail.
absl::Status ReadLibsvmFile(const std::string& path, const LibsvmFormat& format, SparseDataset* out,
                            ReadStats* stats, int64_t block_bytes = int64_t{4} << 20);
absl::Status ReadCsvFile(const std::string& path, const CsvFormat& format, SparseDataset* out, ReadStats* stats,
                         int64_t block_bytes = int64_t{4} << 20);

// The same for text already in memory, named `name` in messages.
absl::Status ParseLibsvm(absl::string_view text, absl::string_view name, const LibsvmFormat& format,
                         SparseDataset* out, ReadStats* stats);
absl::Status ParseCsv(absl::string_view text, absl::string_view name, const CsvFormat& format, SparseDataset* out,
                      ReadStats* stats);

// A training set of users' files held as an index instead of whole, so that
// files bigger than memory train: Build reads every file once as a stream,
// checks each record as the readers above do (bad ones counted and skipped,
// or failing the build with file and line), and keeps only where each good
// record starts, 8 bytes a record. Read reads and parses one record again
// when a step needs it (one pread of its line; the page cache keeps hot
// files in memory). A file that no longer holds what was indexed fails the
// read with DATA_LOSS naming it; it never yields another record. Read is
// safe from several threads.
class RecordIndex {
 public:
  // Errors as the readers' above; RESOURCE_EXHAUSTED once the index would
  // take more than `max_bytes` (0: no limit).
  static absl::StatusOr<std::unique_ptr<RecordIndex>> BuildLibsvm(const std::vector<std::string>& files,
                                                                  const LibsvmFormat& format, ReadStats* stats,
                                                                  int64_t max_bytes = 0,
                                                                  int64_t block_bytes = int64_t{4} << 20);
  static absl::StatusOr<std::unique_ptr<RecordIndex>> BuildCsv(const std::vector<std::string>& files,
                                                               const CsvFormat& format, ReadStats* stats,
                                                               int64_t max_bytes = 0,
                                                               int64_t block_bytes = int64_t{4} << 20);
  ~RecordIndex();
  RecordIndex(const RecordIndex&) = delete;
  RecordIndex& operator=(const RecordIndex&) = delete;

  int64_t num_examples() const { return static_cast<int64_t>(starts_.size()); }
  int32_t num_dense() const { return num_dense_; }
  int32_t num_fields() const { return num_fields_; }
  // What the index holds in memory.
  int64_t bytes() const;
  // Appends record `e` (in [0, num_examples())) to `out`, whose num_dense
  // and num_fields must be this index's (or those of an empty dataset).
  absl::Status Read(int64_t e, SparseDataset* out) const { return Read(&e, 1, out); }
  // Appends records records[0..count) in order: a step's batch. Each file
  // read is checked once a call (its size and time). `max_bytes` > 0: once
  // *out takes more (HeldBytes), RESOURCE_EXHAUSTED naming the record and
  // the bytes (a line holds at most 65536 ids: a step of long lines could
  // otherwise take any memory).
  absl::Status Read(const int64_t* records, size_t count, SparseDataset* out, int64_t max_bytes = 0) const;

 private:
  // A file as indexed: its identity, size and times tell whether it changed.
  struct File {
    std::string path;
    int64_t size = 0;
    int64_t mtime_ns = 0;
    int64_t ctime_ns = 0;  // also set by renames and utimensat
    uint64_t device = 0, inode = 0;
    int64_t first = 0;  // its first record's number
  };
  class Opened;
  RecordIndex() = default;
  static absl::StatusOr<std::unique_ptr<RecordIndex>> Build(std::unique_ptr<RecordIndex> index,
                                                            const std::vector<std::string>& files, ReadStats* stats,
                                                            int64_t max_bytes, int64_t block_bytes);
  absl::Status ReadOne(int64_t e, std::vector<size_t>* checked, SparseDataset* out) const;
  absl::Status ParseLine(const File& file, int64_t start, absl::string_view line, SparseDataset* out) const;

  struct Format;  // how its records are read (limits, header, parser)
  std::unique_ptr<const Format> format_;
  int32_t num_dense_ = 0;
  int32_t num_fields_ = 0;
  std::vector<File> files_;
  std::vector<int64_t> starts_;  // byte offset of each record in its file
  std::unique_ptr<Opened> opened_;
};

// What a worker holds of a click job's data: the test set, and for users'
// files (LIBSVM, CSV) the training set, whole (`train`) or as an index
// (`train_index`, when held whole it would take too much memory). Synthetic
// training examples are made as steps need them: both are null. Labels are
// read as 0 or 1 (> 0 is a click).
struct ClickData {
  std::shared_ptr<const SparseDataset> train;
  std::shared_ptr<const RecordIndex> train_index;
  std::shared_ptr<const SparseDataset> test;
  // Records of the files skipped as bad (data.onBadRecord: SKIP), training
  // and test together, and "file:line: why" of the first.
  int64_t bad_records = 0;
  std::string first_bad_record;
  // The worker's memory budget (0: none) and what the data above takes of
  // it: a step's rows and their gradients may take the rest.
  int64_t memory_budget = 0;
  int64_t held_bytes = 0;
};

// Zipf-distributed ranks in [1, n], P(k) proportional to k^-exponent
// (exponent > 0), by rejection-inversion (Hörmann and Derflinger 1996): a few
// operations a sample whatever n (up to 10^8 and more), no tables.
class ZipfSampler {
 public:
  ZipfSampler(int64_t n, double exponent);
  // A rank from `uniform()`, which returns doubles in [0, 1).
  template <typename Uniform>
  int64_t Sample(Uniform&& uniform) const {
    while (true) {
      const double u = h_integral_n_ + uniform() * (h_integral_x1_ - h_integral_n_);
      const double x = HIntegralInverse(u);
      const auto k = static_cast<int64_t>(std::min<double>(std::max<double>(x + 0.5, 1), static_cast<double>(n_)));
      if (static_cast<double>(k) - x <= s_ || u >= HIntegral(static_cast<double>(k) + 0.5) - H(static_cast<double>(k))) {
        return k;
      }
    }
  }

 private:
  double H(double x) const;
  double HIntegral(double x) const;
  double HIntegralInverse(double x) const;

  int64_t n_;
  double exponent_;
  double h_integral_x1_, h_integral_n_, s_;
};

// Seeded synthetic CTR data with a known model behind it: each example has
// `fields` categorical features, one id each, drawn per field from a Zipf
// distribution over `vocabulary` ids, and `dense` N(0, 1) features. Its
// click probability is sigmoid(bias + sum of the ids' true weights (N(0,
// weight_scale)) + the dense features' true weights + optionally an FM
// term, the dot products of the ids' true latent vectors of `fm_dim`
// N(0, fm_scale) values between every pair of fields), and its label a draw
// from it. Everything is a function of (seed, split, example index): any
// worker makes any example the same way.
struct SyntheticCtrSpec {
  uint64_t seed = 1;
  int64_t examples = 0;
  int32_t fields = 8;
  int64_t vocabulary = 100000;  // ids per field, in [1, 10^9]
  double zipf_exponent = 1.05;
  int32_t dense = 0;
  float weight_scale = 0.5f;
  float bias = -1.5f;  // about a 20% click rate
  int32_t fm_dim = 0;
  float fm_scale = 0.3f;
};

// INVALID_ARGUMENT naming the field for a spec outside its bounds.
absl::Status ValidateSyntheticCtrSpec(const SyntheticCtrSpec& spec);

// The examples of one split (0: train, 1: test) of a spec, one at a time,
// in any order: a worker makes each step's batch with one. Thread-safe.
class SyntheticCtrGenerator {
 public:
  // What Append computes of an id (its true weight and latent vector) for
  // the ids met last (up to 2^18 of them in 8 MiB, direct-mapped): Zipf-drawn
  // ids repeat, and these values take most of an example's time. Values are the same with or without
  // one. One per thread; made for one spec.
  class IdCache {
   public:
    explicit IdCache(const SyntheticCtrSpec& spec);

   private:
    friend class SyntheticCtrGenerator;
    size_t width_;                // 1 + fm_dim values a slot
    std::vector<uint64_t> keys_;  // by slot: its id, when filled
    std::vector<bool> filled_;
    std::vector<double> values_;  // by slot: the weight term, then the latent vector
  };

  SyntheticCtrGenerator(const SyntheticCtrSpec& spec, int split);
  // Appends example `example` to `out` (made for this spec: its num_dense
  // and num_fields are the spec's), and its true click probability to
  // *truth when given.
  void Append(int64_t example, SparseDataset* out, std::vector<float>* truth = nullptr,
              IdCache* cache = nullptr) const;
  // As Append, into place: the example's spec.fields ids (their weights 1),
  // spec.dense values, label and (truth non-null) true probability.
  void Write(int64_t example, uint64_t* ids, float* dense, float* label, float* truth, IdCache* cache) const;

 private:
  // The id's weight term and latent vector (1 + fm_dim values), from the
  // cache or made (and kept there).
  const double* IdValues(uint64_t id, IdCache* cache, double* scratch) const;

  SyntheticCtrSpec spec_;
  ZipfSampler zipf_;
  uint64_t model_;     // the true model's stream
  uint64_t examples_;  // the split's examples' stream
};

// Examples [first, first + count) of `split` (0: train, 1: test), with
// their true click probabilities in *truth when given (replacing what it
// held). Large counts are made on up to `threads` threads (0: one per
// core, at most 16), the same examples whatever the count, each written in
// place: the set takes its own bytes only, never a copy beside them.
SparseDataset MakeSyntheticCtr(const SyntheticCtrSpec& spec, int split, int64_t first, int64_t count,
                               std::vector<float>* truth = nullptr, int threads = 0);

// Example `example` of `data` as one line of a file the readers above take,
// ending in a newline: libsvm "label id:weight ..." (every field's ids;
// INVALID_ARGUMENT for data with dense features, which libsvm cannot hold),
// libffm "label field:id:weight ..." (the same, each id with its field,
// read by a LibsvmFormat of num_fields fields), or CSV "label,dense...,id..."
// (one column a field; a field without ids is an empty value, one with
// more, or with an id whose weight is not 1, is INVALID_ARGUMENT), read by a
// CsvFormat of a LABEL, num_dense DENSE and num_fields CATEGORICAL columns.
// Numbers are written so that they read back the same.
enum class ClickTextFormat { kLibsvm, kLibffm, kCsv };
absl::StatusOr<std::string> ClickRecordText(const SparseDataset& data, int64_t example,
                                            ClickTextFormat format);

// The area under the ROC curve of `scores` for binary `labels` (> 0.5 is
// positive), ties counted half; 0.5 when either class is absent. NaN
// scores rank above every number, tied with each other.
double Auc(const std::vector<float>& scores, const std::vector<float>& labels);

}  // namespace fulcrum

#endif  // FULCRUM_WORKER_CTR_DATA_H_
