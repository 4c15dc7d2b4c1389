// libFuzzer: the libsvm (and libffm) and CSV readers of users' data files.
// The first byte picks the format (bit 2: a CSV header, or libffm lines of 3
// fields), the bad-record policy and a small line limit; the rest is
// the file's text. Properties: no crash; reading never fails under SKIP and
// fails only with INVALID_ARGUMENT under FAIL; the dataset stays consistent
// (one offset per field of each record, one weight per id, dense values per
// record, every label and weight finite); good and bad records add up to the
// lines with text (or too long); and reading the same text from a file in small blocks
// gives the same dataset, as does indexing that file (RecordIndex) and
// reading every record back.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "worker/ctr_data.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckConsistent(const fulcrum::SparseDataset& data) {
  const auto n = static_cast<size_t>(data.num_examples());
  Check(data.offsets.size() == n * static_cast<size_t>(data.num_fields) + 1);
  Check(data.offsets.front() == 0 && data.offsets.back() == static_cast<int64_t>(data.ids.size()));
  for (size_t i = 1; i < data.offsets.size(); ++i) Check(data.offsets[i] >= data.offsets[i - 1]);
  Check(data.weights.size() == data.ids.size());
  Check(data.dense.size() == n * static_cast<size_t>(data.num_dense));
  for (float label : data.labels) Check(std::isfinite(label));
  for (float weight : data.weights) Check(std::isfinite(weight));
  for (float x : data.dense) Check(std::isfinite(x));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  if (size < 1) return 0;
  const bool csv = (bytes[0] & 1) != 0;
  const bool fail = (bytes[0] & 2) != 0;
  const std::string text(reinterpret_cast<const char*>(bytes + 1), size - 1);
  fulcrum::LineLimits limits;
  limits.max_line_bytes = 16 + (bytes[0] >> 2) * 8;
  limits.max_ids_per_line = 8;
  limits.on_bad_record = fail ? fulcrum::BadRecordPolicy::kFail : fulcrum::BadRecordPolicy::kSkip;
  fulcrum::LibsvmFormat libsvm;
  libsvm.limits = limits;
  libsvm.fields = (bytes[0] & 4) != 0 ? 3 : 0;
  fulcrum::CsvFormat table;
  using C = fulcrum::CsvFormat::Column;
  table.columns = {C::kLabel, C::kDense, C::kCategorical, C::kIgnore, C::kCategorical};
  table.header = (bytes[0] & 4) != 0;
  table.limits = limits;
  fulcrum::SparseDataset parsed;
  fulcrum::ReadStats stats;
  const absl::Status status = csv ? fulcrum::ParseCsv(text, "fuzz", table, &parsed, &stats)
                                  : fulcrum::ParseLibsvm(text, "fuzz", libsvm, &parsed, &stats);
  if (!status.ok()) {
    Check(fail && status.code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  CheckConsistent(parsed);
  Check(stats.records == parsed.num_examples());
  Check(csv || parsed.num_fields == fulcrum::LibsvmFields(libsvm));
  int64_t lines_with_text = 0;
  bool first = true;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const bool header = first && csv && table.header;
    first = false;
    const bool too_long = static_cast<int64_t>(line.size()) > limits.max_line_bytes;  // bad, blank or not
    if (!header && (too_long || !absl::StripAsciiWhitespace(line).empty())) ++lines_with_text;
  }
  Check(stats.records + stats.bad <= lines_with_text);
  // The same text from a file, in blocks of 3 bytes.
  char name[] = "/tmp/ctr_data_fuzz_XXXXXX";
  const int fd = mkstemp(name);
  if (fd < 0) return 0;
  close(fd);
  std::ofstream(name, std::ios::binary) << text;
  fulcrum::SparseDataset streamed;
  fulcrum::ReadStats streamed_stats;
  const absl::Status read = csv ? fulcrum::ReadCsvFile(name, table, &streamed, &streamed_stats, 3)
                                : fulcrum::ReadLibsvmFile(name, libsvm, &streamed, &streamed_stats, 3);
  // And indexed (blocks of 5 bytes), then read back record by record.
  fulcrum::ReadStats index_stats;
  auto index = csv ? fulcrum::RecordIndex::BuildCsv({name}, table, &index_stats, 0, 5)
                   : fulcrum::RecordIndex::BuildLibsvm({name}, libsvm, &index_stats, 0, 5);
  fulcrum::SparseDataset indexed;
  if (index.ok()) {
    for (int64_t e = 0; e < (*index)->num_examples(); ++e) Check((*index)->Read(e, &indexed).ok());
  }
  std::remove(name);
  Check(read.ok());
  Check(index.ok() && index_stats.records == stats.records && index_stats.bad == stats.bad);
  Check(indexed.ids == parsed.ids && indexed.offsets == parsed.offsets && indexed.labels == parsed.labels &&
        indexed.dense == parsed.dense && indexed.weights == parsed.weights);
  Check(streamed.ids == parsed.ids && streamed.offsets == parsed.offsets && streamed.labels == parsed.labels &&
        streamed.dense == parsed.dense && streamed.weights == parsed.weights);
  Check(streamed_stats.bad == stats.bad && streamed_stats.first_bad.size() == stats.first_bad.size());
  for (size_t i = 0; i < stats.first_bad.size(); ++i) {  // the same but for the name
    Check(streamed_stats.first_bad[i] == std::string(name) + stats.first_bad[i].substr(4));
  }
  return 0;
}
