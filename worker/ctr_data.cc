#include "worker/ctr_data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/counter_rng.h"
#include "common/param_init.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/sync.h"
#include "worker/data_file.h"

namespace fulcrum {
namespace {

// One record parsed, not yet appended (a bad record appends nothing).
struct Record {
  float label = 0;
  std::vector<float> dense;
  std::vector<std::vector<std::pair<uint64_t, float>>> fields;  // ids and weights by field
};

// What a line parser says: empty when the record is good.
using Why = std::string;
// What a parser says of a line that holds no record and is none (a libsvm
// line of a comment only, as scikit-learn's dump_svmlight_file writes):
// skipped as a blank line is, not counted as bad.
const char kNoRecord[] = "\x01no record";
using LineParser = std::function<Why(absl::string_view line, Record* record)>;

// A finite decimal number, with spaces around it allowed (a CSV's "1, 2").
// SimpleAtof (strtof) also reads hexadecimal ("0x10" as 16), which no other
// reader of such files does: refused.
bool ParseFloat(absl::string_view text, float* value) {
  return text.find_first_of("xX") == absl::string_view::npos &&
         absl::SimpleAtof(absl::StripAsciiWhitespace(text), value) && std::isfinite(*value);
}

std::string Shown(absl::string_view text) { return Quote(text.substr(0, 40)); }

// Feeds lines to `parse` and appends good records to `out`, applying the
// bad-record policy. Lines come through Line(); the driver counts them.
class RecordSink {
 public:
  // `header`: the first line names the columns and is not a record.
  RecordSink(absl::string_view name, const LineLimits& limits, int32_t num_dense, int32_t num_fields,
             LineParser parse, SparseDataset* out, ReadStats* stats, bool header = false)
      : name_(name), limits_(limits), num_dense_(num_dense), num_fields_(num_fields), parse_(std::move(parse)),
        out_(out), stats_(stats), header_(header) {}

  absl::Status Start() {
    if (out_->num_examples() == 0 && out_->ids.empty()) {
      out_->num_dense = num_dense_;
      out_->num_fields = num_fields_;
    }
    if (out_->num_dense != num_dense_ || out_->num_fields != num_fields_) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": records of ", num_dense_, " dense features and ",
                                                     num_fields_, " fields cannot join a dataset of ",
                                                     out_->num_dense, " and ", out_->num_fields));
    }
    return absl::OkStatus();
  }

  // Good records are not appended but their lines' starts pushed on
  // `starts` (RecordIndex), RESOURCE_EXHAUSTED once `starts` would take more
  // than `max_bytes` (0: no limit).
  void IndexInto(std::vector<int64_t>* starts, int64_t max_bytes) {
    starts_ = starts;
    max_index_bytes_ = max_bytes;
  }

  // A whole line (without its newline) starting at byte `start` of its text,
  // or the start of one that was longer than the limit (`too_long`).
  absl::Status Line(absl::string_view line, bool too_long, int64_t start) {
    ++line_number_;
    if (start == 0)
      absl::ConsumePrefix(&line, "\xEF\xBB\xBF");  // a UTF-8 byte order mark (Excel's "CSV UTF-8")
    if (header_) {
      header_ = false;
      return absl::OkStatus();
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (too_long) {
      return Bad(absl::StrCat("a line longer than ", limits_.max_line_bytes, " bytes"));
    }
    if (absl::StripAsciiWhitespace(line).empty()) return absl::OkStatus();
    Record record;
    record.fields.resize(static_cast<size_t>(num_fields_));
    if (Why why = parse_(line, &record); !why.empty()) return why == kNoRecord ? absl::OkStatus() : Bad(why);
    if (limits_.label_classes > 0 && !(record.label >= 0 && record.label < static_cast<float>(limits_.label_classes) &&
                                       record.label == std::floor(record.label))) {
      return Bad(absl::StrCat("label ", record.label, " is not a class number in [0, ", limits_.label_classes, ")"));
    }
    int64_t ids = 0;
    for (const auto& field : record.fields) ids += static_cast<int64_t>(field.size());
    if (ids > limits_.max_ids_per_line) {
      return Bad(absl::StrCat(ids, " feature ids, more than the ", limits_.max_ids_per_line, " a record may have"));
    }
    ++stats_->records;
    if (starts_ != nullptr) {
      if (max_index_bytes_ > 0 && starts_->size() == starts_->capacity()) {
        const auto most = static_cast<size_t>(max_index_bytes_) / sizeof(int64_t);
        if (starts_->size() >= most) {
          return absl::ResourceExhaustedError(absl::StrCat(name_, ":", line_number_, ": the index of ",
                                                           starts_->size() + 1, " records would take more than ",
                                                           max_index_bytes_, " bytes"));
        }
        starts_->reserve(std::min(most, std::max<size_t>(1024, 2 * starts_->size())));
      }
      starts_->push_back(start);
      return absl::OkStatus();
    }
    out_->labels.push_back(record.label);
    out_->dense.insert(out_->dense.end(), record.dense.begin(), record.dense.end());
    for (const auto& field : record.fields) {
      for (const auto& [id, weight] : field) {
        out_->ids.push_back(id);
        out_->weights.push_back(weight);
      }
      out_->offsets.push_back(static_cast<int64_t>(out_->ids.size()));
    }
    if (limits_.max_dataset_bytes > 0 && HeldBytes(*out_) > limits_.max_dataset_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(name_, ":", line_number_, ": the records read take more than ",
                                                       limits_.max_dataset_bytes, " bytes"));
    }
    return absl::OkStatus();
  }

  int64_t line_number() const { return line_number_; }

 private:
  absl::Status Bad(absl::string_view why) {
    std::string where = absl::StrCat(name_, ":", line_number_, ": ", why);
    if (limits_.on_bad_record == BadRecordPolicy::kFail) {
      return absl::InvalidArgumentError(absl::StrCat(where, " (onBadRecord: FAIL; SKIP counts and skips such records)"));
    }
    ++stats_->bad;
    if (stats_->first_bad.size() < 10) stats_->first_bad.push_back(std::move(where));
    return absl::OkStatus();
  }

  const absl::string_view name_;  // outlives the sink
  const LineLimits limits_;
  const int32_t num_dense_;
  const int32_t num_fields_;
  const LineParser parse_;
  SparseDataset* const out_;
  ReadStats* const stats_;
  bool header_;
  int64_t line_number_ = 0;
  std::vector<int64_t>* starts_ = nullptr;
  int64_t max_index_bytes_ = 0;
};

// Splits `text` into lines for `sink`; a line longer than the limit is
// passed as too long. The last line needs no newline.
absl::Status FeedText(absl::string_view text, int64_t max_line_bytes, RecordSink* sink) {
  int64_t start = 0;
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    absl::string_view line = text.substr(0, end);
    const bool too_long = static_cast<int64_t>(line.size()) > max_line_bytes;
    if (absl::Status status = sink->Line(too_long ? line.substr(0, 0) : line, too_long, start); !status.ok()) {
      return status;
    }
    const size_t consumed = std::min(end + 1, text.size());
    text.remove_prefix(consumed);
    start += static_cast<int64_t>(consumed);
  }
  return absl::OkStatus();
}

// The file's size and times, to see that it did not change while read
// (a file still being written would give a cut-off last record that may
// parse as a good one with another value).
struct FileStamp {
  int64_t size = 0, mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileStamp& other) const {
    return size == other.size && mtime_ns == other.mtime_ns && ctime_ns == other.ctime_ns;
  }
};
bool StampOf(int fd, FileStamp* stamp) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return false;
  stamp->size = static_cast<int64_t>(st.st_size);
  stamp->mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  stamp->ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  return true;
}

// Streams the file at `path` into `sink` in blocks: only the current block
// and a partial line of at most max_line_bytes are ever held.
// FAILED_PRECONDITION for a file that changed while it was read.
absl::Status FeedFile(const std::string& path, int64_t block_bytes, int64_t max_line_bytes, RecordSink* sink) {
  ASSIGN_OR_RETURN(const int fd, OpenDataFile(path, "data file"));
  const absl::Cleanup closed = [fd] { close(fd); };
  FileStamp before, after;
  const bool stamped = StampOf(fd, &before);
  auto unchanged = [&]() -> absl::Status {
    if (stamped && StampOf(fd, &after) && after == before) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("data file ", Quote(path), " changed while it was read (is it still being written?)"));
  };
  std::string block(static_cast<size_t>(std::max<int64_t>(block_bytes, 1)), '\0');
  std::string partial;     // the line the last block ended in
  bool skipping = false;   // inside a line already known to be too long
  int64_t block_start = 0, line_start = 0;  // file offsets
  for (size_t got = block.size(); got == block.size(); block_start += static_cast<int64_t>(block.size())) {
    got = 0;
    while (got < block.size()) {  // a whole block, or what is left of the file
      const ssize_t n = read(fd, block.data() + got, block.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::DataLossError(
            absl::StrCat("reading data file ", Quote(path), " failed: ", std::strerror(errno)));
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    absl::string_view rest(block.data(), got);
    while (!rest.empty()) {
      const size_t newline = rest.find('\n');
      const absl::string_view piece = rest.substr(0, std::min(newline, rest.size()));
      if (!skipping) {
        if (static_cast<int64_t>(partial.size() + piece.size()) > max_line_bytes) {
          skipping = true;
          partial.clear();
        } else {
          partial.append(piece.data(), piece.size());
        }
      }
      if (newline == absl::string_view::npos) break;  // the line goes on in the next block
      if (absl::Status status = sink->Line(partial, skipping, line_start); !status.ok()) {
        // A bad record of a file being written is the change, not the record.
        RETURN_IF_ERROR(unchanged());
        return status;
      }
      partial.clear();
      skipping = false;
      rest.remove_prefix(newline + 1);
      line_start = block_start + (rest.data() - block.data());
    }
  }
  RETURN_IF_ERROR(unchanged());
  if (!partial.empty() || skipping) return sink->Line(partial, skipping, line_start);
  return absl::OkStatus();
}

// A feature index: plain digits read here (false beyond uint64), anything
// else (a sign, leading zeros past 20 digits) by SimpleAtoi.
bool ParseIndex(absl::string_view text, uint64_t* id) {
  if (text.empty() || text.size() > 20) return absl::SimpleAtoi(text, id);
  uint64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return absl::SimpleAtoi(text, id);
    if (__builtin_mul_overflow(value, uint64_t{10}, &value) ||
        __builtin_add_overflow(value, static_cast<uint64_t>(c - '0'), &value)) {
      return false;
    }
  }
  *id = value;
  return true;
}

Why ParseLibsvmLine(absl::string_view line, bool nonnegative_values, int32_t fields, Record* record) {
  if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
    line = line.substr(0, hash);
    if (absl::StripAsciiWhitespace(line).empty()) return kNoRecord;  // a comment line
  }
  // Tokens are separated by spaces and tabs.
  size_t at = 0;
  const auto next = [line, &at]() {
    while (at < line.size() && (line[at] == ' ' || line[at] == '\t')) ++at;
    const size_t start = at;
    while (at < line.size() && line[at] != ' ' && line[at] != '\t') ++at;
    return line.substr(start, at - start);
  };
  const absl::string_view label = next();
  if (label.empty()) return "no label";
  if (!ParseFloat(label, &record->label))
    return absl::StrCat("label ", Shown(label), " is not a finite number");
  for (absl::string_view token = next(); !token.empty(); token = next()) {
    const absl::string_view whole = token;
    size_t field = 0;
    if (fields > 0 && !absl::StartsWith(token, "qid:")) {  // libffm: field:index:value
      const size_t colon = token.find(':');
      const absl::string_view name = token.substr(0, std::min(colon, token.size()));
      if (colon == absl::string_view::npos || token.find(':', colon + 1) == absl::string_view::npos) {
        return absl::StrCat("feature ", Shown(token), " is not field:index:value");
      }
      uint64_t f = 0;
      if (!ParseIndex(name, &f) || f >= static_cast<uint64_t>(fields)) {
        return absl::StrCat("field ", Shown(name), " of feature ", Shown(token),
                            " is not a field number in [0, ", fields, ")");
      }
      field = static_cast<size_t>(f);
      token.remove_prefix(colon + 1);
    }
    const size_t colon = token.find(':');
    if (colon == absl::string_view::npos) {
      return absl::StrCat("feature ", Shown(token), " is not index:value");
    }
    const absl::string_view index = token.substr(0, colon), value = token.substr(colon + 1);
    if (index == "qid") continue;
    uint64_t id = 0;
    float weight = 0;
    if (!ParseIndex(index, &id)) return absl::StrCat("feature index ", Shown(index), " is not a uint64");
    if (!ParseFloat(value, &weight)) {
      if (fields > 0) {
        return absl::StrCat("value ", Shown(value), " of feature ", Shown(whole), " (id ", id, " of field ",
                            field, ") is not a finite number");
      }
      return absl::StrCat("value ", Shown(value), " of feature ", id, " is not a finite number",
                          value.find(':') != absl::string_view::npos
                              ? " (a libffm line, field:id:value? set data.libsvm.fields to its fields)"
                              : "");
    }
    if (nonnegative_values && weight < 0) {
      return absl::StrCat("value ", weight, " of feature ", id, " is negative (values weigh the ids' rows)");
    }
    record->fields[field].emplace_back(id, weight);
  }
  return {};
}

// Splits a CSV line: fields may be double-quoted ("" is a quote inside).
bool SplitCsv(absl::string_view line, char delimiter, std::vector<std::string>* fields) {
  fields->clear();
  std::string field;
  bool quoted = false, was_quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c != '"') {
        field += c;
      } else if (i + 1 < line.size() && line[i + 1] == '"') {
        field += '"';
        ++i;
      } else {
        quoted = false;
      }
    } else if (c == '"' && field.empty() && !was_quoted) {
      quoted = was_quoted = true;
    } else if (c == delimiter) {
      fields->push_back(std::move(field));
      field.clear();
      was_quoted = false;
    } else {
      field += c;
    }
  }
  if (quoted) return false;
  fields->push_back(std::move(field));
  return true;
}

LineParser LibsvmParser(const LibsvmFormat& format) {
  return [nonnegative = format.nonnegative_values, fields = format.fields](absl::string_view line,
                                                                           Record* record) {
    return ParseLibsvmLine(line, nonnegative, fields, record);
  };
}

LineParser CsvParser(const CsvFormat& format) {
  return [format, fields = std::vector<std::string>()](absl::string_view line, Record* record) mutable -> Why {
    if (!SplitCsv(line, format.delimiter, &fields)) return "a quoted field does not end on its line";
    if (fields.size() != format.columns.size()) {
      return absl::StrCat(fields.size(), " columns where the column spec has ", format.columns.size());
    }
    int32_t field_index = 0;
    for (size_t c = 0; c < fields.size(); ++c) {
      const absl::string_view value = absl::StripAsciiWhitespace(fields[c]);
      switch (format.columns[c]) {
        case CsvFormat::Column::kIgnore:
          break;
        case CsvFormat::Column::kLabel:
          if (!ParseFloat(value, &record->label)) {
            return absl::StrCat("label ", Shown(value), " in column ", c + 1, " is not a finite number");
          }
          break;
        case CsvFormat::Column::kDense: {
          float x = 0;
          if (!value.empty() && !ParseFloat(value, &x)) {
            return absl::StrCat("dense value ", Shown(value), " in column ", c + 1, " is not a finite number");
          }
          record->dense.push_back(x);
          break;
        }
        case CsvFormat::Column::kCategorical:
          if (!value.empty()) record->fields[static_cast<size_t>(field_index)].emplace_back(CategoricalId(field_index, value), 1.0f);
          ++field_index;
          break;
      }
    }
    return {};
  };
}

int32_t CountColumns(const CsvFormat& format, CsvFormat::Column kind) {
  return static_cast<int32_t>(std::count(format.columns.begin(), format.columns.end(), kind));
}

}  // namespace

uint64_t CategoricalId(int32_t field, absl::string_view value) {
  uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a, then mixed with the field
  for (const char c : value) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ULL;
  }
  return SplitMix64(hash ^ SplitMix64(static_cast<uint64_t>(field) + 1));
}

absl::Status ValidateCsvFormat(const CsvFormat& format) {
  if (CountColumns(format, CsvFormat::Column::kLabel) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("the CSV column spec has ",
                                                   CountColumns(format, CsvFormat::Column::kLabel),
                                                   " label columns; it needs exactly one"));
  }
  return absl::OkStatus();
}

absl::Status ParseLibsvm(absl::string_view text, absl::string_view name, const LibsvmFormat& format,
                         SparseDataset* out, ReadStats* stats) {
  RecordSink sink(name, format.limits, 0, LibsvmFields(format), LibsvmParser(format), out, stats);
  if (absl::Status started = sink.Start(); !started.ok()) return started;
  return FeedText(text, format.limits.max_line_bytes, &sink);
}

absl::Status ReadLibsvmFile(const std::string& path, const LibsvmFormat& format, SparseDataset* out,
                            ReadStats* stats, int64_t block_bytes) {
  RecordSink sink(path, format.limits, 0, LibsvmFields(format), LibsvmParser(format), out, stats);
  if (absl::Status started = sink.Start(); !started.ok()) return started;
  return FeedFile(path, block_bytes, format.limits.max_line_bytes, &sink);
}

absl::Status ParseCsv(absl::string_view text, absl::string_view name, const CsvFormat& format, SparseDataset* out,
                      ReadStats* stats) {
  if (absl::Status valid = ValidateCsvFormat(format); !valid.ok()) return valid;
  RecordSink sink(name, format.limits, CountColumns(format, CsvFormat::Column::kDense),
                  CountColumns(format, CsvFormat::Column::kCategorical), CsvParser(format), out, stats, format.header);
  if (absl::Status started = sink.Start(); !started.ok()) return started;
  return FeedText(text, format.limits.max_line_bytes, &sink);
}

absl::Status ReadCsvFile(const std::string& path, const CsvFormat& format, SparseDataset* out, ReadStats* stats,
                         int64_t block_bytes) {
  if (absl::Status valid = ValidateCsvFormat(format); !valid.ok()) return valid;
  RecordSink sink(path, format.limits, CountColumns(format, CsvFormat::Column::kDense),
                  CountColumns(format, CsvFormat::Column::kCategorical), CsvParser(format), out, stats, format.header);
  if (absl::Status started = sink.Start(); !started.ok()) return started;
  return FeedFile(path, block_bytes, format.limits.max_line_bytes, &sink);
}

namespace {

std::string ChangedSinceIndexed(const std::string& path) {
  return absl::StrCat("data file ", Quote(path), " changed since it was indexed when the job started (a job's files ",
                      "must not change while it runs)");
}

}  // namespace

// The files' descriptors, opened as reads need them. At most kMaxOpen stay
// open; a read of another file opens it for that read.
class RecordIndex::Opened {
 public:
  explicit Opened(size_t files) : fds_(files, -1) {}
  ~Opened() {
    MutexLock lock(&mu_);
    for (const int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }
  Opened(const Opened&) = delete;
  Opened& operator=(const Opened&) = delete;

  // A descriptor of files[f]; *owned when the caller must close it.
  absl::StatusOr<int> Get(size_t f, const File& file, bool* owned) {
    int fd = -1;
    {
      MutexLock lock(&mu_);
      fd = fds_[f];
    }
    *owned = fd < 0;
    if (fd >= 0) return fd;
    absl::StatusOr<int> opened = OpenDataFile(file.path, "data file");
    if (!opened.ok()) {
      return absl::DataLossError(absl::StrCat(opened.status().message(),
                                              ": it cannot be read any more; it was ",
                                              "indexed when the job started"));
    }
    fd = *opened;
    // Kept open only once it is known to be the file indexed.
    if (const absl::Status same = Check(fd, file); !same.ok()) {
      close(fd);
      return same;
    }
    MutexLock lock(&mu_);
    if (fds_[f] < 0 && open_ < kMaxOpen) {
      fds_[f] = fd;
      ++open_;
      *owned = false;
    }
    return fd;
  }

  // DATA_LOSS unless `fd` is the file indexed, as it was: a file written in
  // place or replaced may hold other records at the same offsets.
  static absl::Status Check(int fd, const File& file) {
    struct stat now {};
    if (fstat(fd, &now) != 0 || !Same(now, file)) {
      return absl::DataLossError(absl::StrCat(ChangedSinceIndexed(file.path), ": its identity, size or times differ"));
    }
    return absl::OkStatus();
  }

  static bool Same(const struct stat& st, const File& file) {
    return st.st_size == file.size && MtimeNs(st) == file.mtime_ns && CtimeNs(st) == file.ctime_ns &&
           static_cast<uint64_t>(st.st_dev) == file.device && static_cast<uint64_t>(st.st_ino) == file.inode;
  }

  static int64_t CtimeNs(const struct stat& st) {
    return static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  }
  static int64_t MtimeNs(const struct stat& st) {
    return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  }

 private:
  static constexpr int kMaxOpen = 64;
  Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  int open_ ABSL_GUARDED_BY(mu_) = 0;
};

// How an index's records are read: the limits, whether each file starts
// with a header line, and their parser (made for each sink: the CSV one
// keeps scratch space).
struct RecordIndex::Format {
  LineLimits limits;
  bool header = false;
  std::function<LineParser()> parser;
};

RecordIndex::~RecordIndex() = default;

absl::StatusOr<std::unique_ptr<RecordIndex>> RecordIndex::BuildLibsvm(const std::vector<std::string>& files,
                                                                      const LibsvmFormat& format, ReadStats* stats,
                                                                      int64_t max_bytes, int64_t block_bytes) {
  std::unique_ptr<RecordIndex> index(new RecordIndex());
  index->format_ = std::make_unique<Format>(Format{format.limits, false, [format] { return LibsvmParser(format); }});
  index->num_fields_ = LibsvmFields(format);
  return Build(std::move(index), files, stats, max_bytes, block_bytes);
}

absl::StatusOr<std::unique_ptr<RecordIndex>> RecordIndex::BuildCsv(const std::vector<std::string>& files,
                                                                   const CsvFormat& format, ReadStats* stats,
                                                                   int64_t max_bytes, int64_t block_bytes) {
  RETURN_IF_ERROR(ValidateCsvFormat(format));
  std::unique_ptr<RecordIndex> index(new RecordIndex());
  index->format_ = std::make_unique<Format>(Format{format.limits, format.header, [format] { return CsvParser(format); }});
  index->num_dense_ = CountColumns(format, CsvFormat::Column::kDense);
  index->num_fields_ = CountColumns(format, CsvFormat::Column::kCategorical);
  return Build(std::move(index), files, stats, max_bytes, block_bytes);
}

absl::StatusOr<std::unique_ptr<RecordIndex>> RecordIndex::Build(std::unique_ptr<RecordIndex> index,
                                                                const std::vector<std::string>& files,
                                                                ReadStats* stats, int64_t max_bytes,
                                                                int64_t block_bytes) {
  const Format& format = *index->format_;
  for (const std::string& path : files) {
    File file{path};
    file.first = index->num_examples();
    struct stat before {};
    const bool known = stat(path.c_str(), &before) == 0;
    SparseDataset unused;
    RecordSink sink(path, format.limits, index->num_dense_, index->num_fields_, format.parser(), &unused, stats,
                    format.header);
    const int64_t files_bytes = index->bytes() - static_cast<int64_t>(index->starts_.capacity() * sizeof(int64_t));
    sink.IndexInto(&index->starts_, max_bytes > 0 ? std::max<int64_t>(1, max_bytes - files_bytes) : 0);
    RETURN_IF_ERROR(sink.Start());
    if (const absl::Status fed = FeedFile(path, block_bytes, format.limits.max_line_bytes, &sink); !fed.ok()) {
      if (!absl::IsResourceExhausted(fed)) return fed;
      return absl::ResourceExhaustedError(absl::StrCat(fed.message(), " (", max_bytes, " for the index in all)"));
    }
    file.size = before.st_size;
    file.mtime_ns = Opened::MtimeNs(before);
    file.ctime_ns = Opened::CtimeNs(before);
    file.device = static_cast<uint64_t>(before.st_dev);
    file.inode = static_cast<uint64_t>(before.st_ino);
    struct stat after {};
    if (!known || stat(path.c_str(), &after) != 0 || !Opened::Same(after, file)) {
      return absl::FailedPreconditionError(absl::StrCat("data file ", Quote(path), " changed while it was read"));
    }
    index->files_.push_back(std::move(file));
    if (max_bytes > 0 && index->bytes() > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("the index of ", index->num_examples(), " records of ",
                                                       index->files_.size(), " files takes ", index->bytes(),
                                                       " bytes, more than the ", max_bytes, " allowed, at ", path));
    }
  }
  index->starts_.shrink_to_fit();
  index->opened_ = std::make_unique<Opened>(index->files_.size());
  return index;
}

int64_t RecordIndex::bytes() const {
  int64_t bytes = static_cast<int64_t>(starts_.capacity() * sizeof(int64_t) + files_.capacity() * sizeof(File));
  for (const File& file : files_) bytes += static_cast<int64_t>(file.path.capacity());
  return bytes;
}

absl::Status RecordIndex::Read(const int64_t* records, size_t count, SparseDataset* out,
                               int64_t max_bytes) const {
  std::vector<size_t> checked;  // files checked in this call
  for (size_t i = 0; i < count; ++i) {
    RETURN_IF_ERROR(ReadOne(records[i], &checked, out));
    if (max_bytes > 0 && HeldBytes(*out) > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("the ", i + 1, " records read (the last record ",
                                                       records[i], ") take ", HeldBytes(*out),
                                                       " bytes, more than ", max_bytes));
    }
  }
  return absl::OkStatus();
}

absl::Status RecordIndex::ReadOne(int64_t e, std::vector<size_t>* checked, SparseDataset* out) const {
  if (e < 0 || e >= num_examples()) {
    return absl::OutOfRangeError(absl::StrCat("record ", e, " of an index of ", num_examples()));
  }
  const auto it = std::upper_bound(files_.begin(), files_.end(), e,
                                   [](int64_t record, const File& file) { return record < file.first; }) - 1;
  const File& file = *it;
  const int64_t next_file = it + 1 == files_.end() ? num_examples() : (it + 1)->first;
  const int64_t start = starts_[static_cast<size_t>(e)];
  // The line lies before the next record's start (bad or blank lines may
  // come between) and is at most max_line_bytes and its newline.
  const int64_t end = e + 1 < next_file ? starts_[static_cast<size_t>(e + 1)] : file.size;
  const int64_t length = std::max<int64_t>(0, std::min(end - start - 1, format_->limits.max_line_bytes) + 1);
  bool owned = false;
  const auto f = static_cast<size_t>(it - files_.begin());
  ASSIGN_OR_RETURN(const int fd, opened_->Get(f, file, &owned));
  std::string buffer(static_cast<size_t>(length), '\0');
  int64_t got = 0;
  int read_errno = 0;
  while (got < length) {
    const ssize_t n = pread(fd, buffer.data() + got, static_cast<size_t>(length - got), start + got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) read_errno = errno;
    if (n <= 0) break;
    got += n;
  }
  // Checked after the read (once a call for a file held open): a write
  // changes the file's time before its data shows.
  absl::Status same = absl::OkStatus();
  if (!owned && std::find(checked->begin(), checked->end(), f) == checked->end()) {
    same = Opened::Check(fd, file);
    if (same.ok()) checked->push_back(f);
  } else if (owned) {
    same = Opened::Check(fd, file);
  }
  if (owned) close(fd);
  RETURN_IF_ERROR(same);
  if (read_errno != 0) {
    return absl::DataLossError(absl::StrCat("reading data file ", Quote(file.path), " at byte ", start, " failed: ",
                                            std::strerror(read_errno)));
  }
  if (got < length) {
    return absl::DataLossError(absl::StrCat(ChangedSinceIndexed(file.path), ": it ends before the record indexed at ",
                                            "byte ", start));
  }
  absl::string_view line(buffer);
  line = line.substr(0, std::min(line.find('\n'), line.size()));
  return ParseLine(file, start, line, out);
}

absl::Status RecordIndex::ParseLine(const File& file, int64_t start, absl::string_view line,
                                    SparseDataset* out) const {
  LineLimits limits = format_->limits;
  limits.on_bad_record = BadRecordPolicy::kFail;
  limits.max_dataset_bytes = 0;
  ReadStats stats;
  RecordSink sink(file.path, limits, num_dense_, num_fields_, format_->parser(), out, &stats);
  RETURN_IF_ERROR(sink.Start());
  const absl::Status parsed = sink.Line(line, false, start);
  if (!parsed.ok() || stats.records != 1) {
    return absl::DataLossError(absl::StrCat(ChangedSinceIndexed(file.path), ": the record indexed at byte ", start,
                                            " is not there any more",
                                            parsed.ok() ? "" : absl::StrCat(" (", parsed.message(), ")")));
  }
  return absl::OkStatus();
}

namespace {

double Helper1(double x) {  // log1p(x) / x
  return std::fabs(x) > 1e-8 ? std::log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x));
}
double Helper2(double x) {  // expm1(x) / x
  return std::fabs(x) > 1e-8 ? std::expm1(x) / x : 1 + x * 0.5 * (1 + x * (1.0 / 3) * (1 + 0.25 * x));
}

// Random bits for (key, a, b): the same everywhere.
uint64_t Bits(uint64_t key, uint64_t a, uint64_t b = 0) { return SplitMix64(key ^ SplitMix64(a * 0x100000001b3ULL + b)); }

}  // namespace

ZipfSampler::ZipfSampler(int64_t n, double exponent) : n_(std::max<int64_t>(n, 1)), exponent_(exponent) {
  h_integral_x1_ = HIntegral(1.5) - 1;
  h_integral_n_ = HIntegral(static_cast<double>(n_) + 0.5);
  s_ = 2 - HIntegralInverse(HIntegral(2.5) - H(2));
}

double ZipfSampler::H(double x) const { return std::exp(-exponent_ * std::log(x)); }

double ZipfSampler::HIntegral(double x) const {
  const double log_x = std::log(x);
  return Helper2((1 - exponent_) * log_x) * log_x;
}

double ZipfSampler::HIntegralInverse(double x) const {
  double t = x * (1 - exponent_);
  if (t < -1) t = -1;
  return std::exp(Helper1(t) * x);
}

absl::Status ValidateSyntheticCtrSpec(const SyntheticCtrSpec& spec) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic CTR data: ", what));
  };
  if (spec.examples < 0 || spec.examples > int64_t{1000000000}) return bad("examples must be in [0, 10^9]");
  if (spec.fields < 1 || spec.fields > 1024) return bad("fields must be in [1, 1024]");
  if (spec.vocabulary < 1 || spec.vocabulary > int64_t{1000000000}) return bad("vocabulary must be in [1, 10^9]");
  if (!(spec.zipf_exponent > 0 && spec.zipf_exponent <= 10)) return bad("zipfExponent must be in (0, 10]");
  if (spec.dense < 0 || spec.dense > 4096) return bad("dense must be in [0, 4096]");
  if (spec.fm_dim < 0 || spec.fm_dim > 256) return bad("fmDim must be in [0, 256]");
  for (float x : {spec.weight_scale, spec.fm_scale}) {
    if (!std::isfinite(x) || x < 0) return bad("weight and FM scales must be finite and >= 0");
  }
  if (!std::isfinite(spec.bias)) return bad("bias must be finite");
  return absl::OkStatus();
}

SyntheticCtrGenerator::SyntheticCtrGenerator(const SyntheticCtrSpec& spec, int split)
    : spec_(spec),
      zipf_(spec.vocabulary, spec.zipf_exponent),
      model_(SplitMix64(spec.seed)),
      examples_(SplitMix64(model_ ^ SplitMix64(static_cast<uint64_t>(split) + 0x5eed))) {}

SyntheticCtrGenerator::IdCache::IdCache(const SyntheticCtrSpec& spec)
    : width_(1 + static_cast<size_t>(std::max(spec.fm_dim, 0))) {
  // At most 8 MiB of values, and 2^18 slots.
  const size_t slots = std::clamp<size_t>((size_t{8} << 20) / (width_ * sizeof(double)), 64, size_t{1} << 18);
  keys_.resize(slots);
  filled_.resize(slots);
  values_.resize(slots * width_);
}

const double* SyntheticCtrGenerator::IdValues(uint64_t id, IdCache* cache, double* scratch) const {
  double* values = scratch;
  if (cache != nullptr) {
    const size_t slot = SplitMix64(id) % cache->keys_.size();
    values = cache->values_.data() + slot * cache->width_;
    if (cache->filled_[slot] && cache->keys_[slot] == id) return values;
    cache->keys_[slot] = id;
    cache->filled_[slot] = true;
  }
  values[0] = spec_.weight_scale * CounterRng(SplitMix64(id ^ model_)).Normal();
  CounterRng latent(Bits(id, model_));  // the id's true latent vector
  for (int32_t d = 0; d < spec_.fm_dim; ++d) values[1 + d] = spec_.fm_scale * latent.Normal();
  return values;
}

void SyntheticCtrGenerator::Append(int64_t example, SparseDataset* out, std::vector<float>* truth,
                                   IdCache* cache) const {
  const size_t ids = out->ids.size(), dense = out->dense.size(), labels = out->labels.size();
  const auto fields = static_cast<size_t>(spec_.fields);
  out->ids.resize(ids + fields);
  out->weights.resize(ids + fields, 1.0f);
  for (size_t f = 1; f <= fields; ++f) out->offsets.push_back(static_cast<int64_t>(ids + f));
  out->dense.resize(dense + static_cast<size_t>(spec_.dense));
  out->labels.resize(labels + 1);
  float p = 0;
  Write(example, out->ids.data() + ids, out->dense.data() + dense, &out->labels[labels], &p, cache);
  if (truth != nullptr) truth->push_back(p);
}

void SyntheticCtrGenerator::Write(int64_t example, uint64_t* ids, float* dense, float* label, float* truth,
                                  IdCache* cache) const {
  CounterRng rng(Bits(examples_, static_cast<uint64_t>(example)));  // the example's own stream
  auto uniform = [&rng] { return 1 - rng.Uniform(); };              // [0, 1)
  double logit = spec_.bias;
  // Sum over pairs of fields of <v_f, v_g> = (|sum v|^2 - sum |v|^2) / 2.
  absl::InlinedVector<double, 64> latent_sum(static_cast<size_t>(spec_.fm_dim));
  absl::InlinedVector<double, 65> scratch(1 + static_cast<size_t>(spec_.fm_dim));
  double squares = 0;
  for (int32_t f = 0; f < spec_.fields; ++f) {
    const int64_t rank = zipf_.Sample(uniform);
    const uint64_t id = Bits(model_, static_cast<uint64_t>(f) + 1, static_cast<uint64_t>(rank));
    ids[f] = id;
    const double* values = IdValues(id, cache, scratch.data());
    logit += values[0];
    for (size_t d = 0; d < latent_sum.size(); ++d) {
      latent_sum[d] += values[1 + d];
      squares += values[1 + d] * values[1 + d];
    }
  }
  for (int32_t j = 0; j < spec_.dense; ++j) {
    const double x = rng.Normal();
    dense[j] = static_cast<float>(x);
    logit += spec_.weight_scale * CounterRng(Bits(model_, 0, static_cast<uint64_t>(j) + 1)).Normal() * x;
  }
  if (spec_.fm_dim > 0) {
    double total = 0;
    for (double v : latent_sum) total += v * v;
    logit += (total - squares) / 2;
  }
  const double p = 1 / (1 + std::exp(-logit));
  *label = uniform() < p ? 1.0f : 0.0f;
  if (truth != nullptr) *truth = static_cast<float>(p);
}

void ShrinkToFit(SparseDataset* data) {
  data->labels.shrink_to_fit();
  data->dense.shrink_to_fit();
  data->ids.shrink_to_fit();
  data->weights.shrink_to_fit();
  data->offsets.shrink_to_fit();
}

SparseDataset MakeSyntheticCtr(const SyntheticCtrSpec& spec, int split, int64_t first, int64_t count,
                               std::vector<float>* truth, int threads) {
  SparseDataset data;
  data.num_dense = spec.dense;
  data.num_fields = spec.fields;
  if (truth != nullptr) truth->clear();
  if (count <= 0) return data;
  const SyntheticCtrGenerator generator(spec, split);
  constexpr int64_t kPerThread = 65536;  // fewer examples than this a thread are not worth one
  if (threads <= 0)
    threads = static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 16));
  const auto parts = static_cast<int>(std::clamp<int64_t>(count / kPerThread, 1, threads));
  // Every example has spec.fields ids (of weight 1) and spec.dense values:
  // the whole set is laid out at once, and each part writes its examples
  // in place (never a second copy of them).
  const auto fields = static_cast<size_t>(spec.fields);
  data.labels.resize(static_cast<size_t>(count));
  data.dense.resize(static_cast<size_t>(count) * static_cast<size_t>(spec.dense));
  data.ids.resize(static_cast<size_t>(count) * fields);
  data.weights.assign(data.ids.size(), 1.0f);
  data.offsets.resize(data.ids.size() + 1);
  for (size_t k = 0; k < data.offsets.size(); ++k) data.offsets[k] = static_cast<int64_t>(k);
  if (truth != nullptr) truth->resize(static_cast<size_t>(count));
  // Part i makes examples [first + count * i / parts, first + count * (i + 1) / parts).
  auto make = [&](int i) {
    SyntheticCtrGenerator::IdCache cache(spec);
    for (int64_t e = count * i / parts; e < count * (i + 1) / parts; ++e) {
      const auto at = static_cast<size_t>(e);
      generator.Write(first + e, data.ids.data() + at * fields,
                      data.dense.data() + at * static_cast<size_t>(spec.dense), &data.labels[at],
                      truth != nullptr ? &(*truth)[at] : nullptr, &cache);
    }
  };
  std::vector<std::thread> workers;
  for (int i = 1; i < parts; ++i) workers.emplace_back(make, i);
  make(0);
  for (std::thread& worker : workers) worker.join();
  return data;
}

absl::StatusOr<std::string> ClickRecordText(const SparseDataset& data, int64_t example,
                                            ClickTextFormat format) {
  const bool csv = format == ClickTextFormat::kCsv;
  if (!csv && data.num_dense > 0) {
    return absl::InvalidArgumentError(absl::StrCat(format == ClickTextFormat::kLibffm ? "libffm" : "libsvm",
                                                   " holds no dense features; this data has ", data.num_dense,
                                                   " (write CSV)"));
  }
  const auto e = static_cast<size_t>(example);
  std::string line = absl::StrFormat("%.9g", data.labels[e]);
  for (size_t d = 0; d < static_cast<size_t>(data.num_dense); ++d) {
    absl::StrAppendFormat(&line, ",%.9g", data.dense[e * static_cast<size_t>(data.num_dense) + d]);
  }
  for (size_t f = 0; f < static_cast<size_t>(data.num_fields); ++f) {
    const size_t bag = e * static_cast<size_t>(data.num_fields) + f;
    const auto begin = static_cast<size_t>(data.offsets[bag]),
               end = static_cast<size_t>(data.offsets[bag + 1]);
    if (csv && end - begin > 1) {
      return absl::InvalidArgumentError(absl::StrCat("example ", example, " field ", f, " has ", end - begin,
                                                     " ids; a CSV column holds one"));
    }
    if (csv) line += ',';
    for (size_t i = begin; i < end; ++i) {
      if (csv && data.weights[i] != 1.0f) {
        return absl::InvalidArgumentError(absl::StrCat("example ", example, " field ", f,
                                                       " has an id of weight ", data.weights[i],
                                                       "; a CSV column holds an id of weight 1"));
      }
      if (csv) {
        absl::StrAppend(&line, data.ids[i]);
      } else if (format == ClickTextFormat::kLibffm) {
        absl::StrAppendFormat(&line, " %u:%u:%.9g", f, data.ids[i], data.weights[i]);
      } else {
        absl::StrAppendFormat(&line, " %u:%.9g", data.ids[i], data.weights[i]);
      }
    }
  }
  line += '\n';
  return line;
}

double Auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  // NaNs rank above every number and equal to each other (an order the sort
  // can keep: a < b alone is none with NaNs, whose runs never ended).
  auto below = [](float a, float b) { return std::isnan(b) ? !std::isnan(a) : a < b; };
  auto same = [](float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return below(scores[a], scores[b]); });
  double positives = 0, negatives = 0, rank_sum = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i + 1;  // a run of equal scores shares the mean rank
    while (j < order.size() && same(scores[order[j]], scores[order[i]])) ++j;
    const double mean_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] > 0.5f) {
        positives += 1;
        rank_sum += mean_rank;
      } else {
        negatives += 1;
      }
    }
    i = j;
  }
  if (positives == 0 || negatives == 0) return 0.5;
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

}  // namespace fulcrum
