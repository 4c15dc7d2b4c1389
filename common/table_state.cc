#include "common/table_state.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"

namespace fulcrum {
namespace {

// Reads the bytes front to back; every failure is DATA_LOSS naming the
// table, the field and the offset.
class StateReader {
 public:
  StateReader(absl::string_view bytes, const std::string& table) : bytes_(bytes), table_(table) {}

  absl::Status U64(uint64_t* v, absl::string_view field) {
    if (absl::Status need = Need(8, field); !need.ok()) return need;
    *v = absl::little_endian::Load64(bytes_.data() + pos_);
    pos_ += 8;
    return absl::OkStatus();
  }
  absl::Status I64(int64_t* v, absl::string_view field) {
    uint64_t u = 0;
    if (absl::Status read = U64(&u, field); !read.ok()) return read;
    *v = static_cast<int64_t>(u);
    return absl::OkStatus();
  }
  absl::Status U32(uint32_t* v, absl::string_view field) {
    if (absl::Status need = Need(4, field); !need.ok()) return need;
    *v = absl::little_endian::Load32(bytes_.data() + pos_);
    pos_ += 4;
    return absl::OkStatus();
  }
  // n floats, each finite.
  absl::Status Floats(float* out, size_t n, absl::string_view field) {
    if (absl::Status need = Need(n * 4, field); !need.ok()) return need;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t bits = absl::little_endian::Load32(bytes_.data() + pos_ + i * 4);
      std::memcpy(out + i, &bits, sizeof(bits));
      if (!std::isfinite(out[i])) return Bad(absl::StrCat(field, " holds a non-finite value"));
    }
    pos_ += n * 4;
    return absl::OkStatus();
  }
  // A count of items of `item_bytes` each, checked against the bytes left.
  absl::Status Count(uint64_t* n, size_t item_bytes, absl::string_view field) {
    if (absl::Status read = U64(n, field); !read.ok()) return read;
    if (*n > left() / item_bytes) {
      return Bad(absl::StrCat("truncated: ", field, " claims ", *n, " entries but only ", left(), " bytes follow"));
    }
    return absl::OkStatus();
  }
  absl::Status Finish() const {
    return left() == 0 ? absl::OkStatus() : Bad(absl::StrCat(left(), " unexpected bytes after the end"));
  }
  absl::Status Bad(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("table ", table_, " state: ", what, " (at offset ", pos_, ")"));
  }

 private:
  size_t left() const { return bytes_.size() - pos_; }
  absl::Status Need(size_t n, absl::string_view field) const {
    return left() >= n ? absl::OkStatus() : Bad(absl::StrCat("truncated reading ", field));
  }

  absl::string_view bytes_;
  const std::string& table_;
  size_t pos_ = 0;
};

void PutU64(uint64_t v, std::string* out) {
  char bytes[8];
  absl::little_endian::Store64(bytes, v);
  out->append(bytes, sizeof(bytes));
}

void PutU32(uint32_t v, std::string* out) {
  char bytes[4];
  absl::little_endian::Store32(bytes, v);
  out->append(bytes, sizeof(bytes));
}

}  // namespace

void AppendTableStateHeader(int32_t stride, const TableStateCounters& counters, uint64_t rows, std::string* out) {
  PutU32(static_cast<uint32_t>(stride), out);
  PutU64(static_cast<uint64_t>(counters.pushes), out);
  PutU64(static_cast<uint64_t>(counters.admissions), out);
  PutU64(static_cast<uint64_t>(counters.expiries), out);
  PutU64(rows, out);
}

void AppendTableStateRow(uint64_t key, int64_t last_step, absl::Span<const float> floats, std::string* out) {
  PutU64(key, out);
  PutU64(static_cast<uint64_t>(last_step), out);
  for (float value : floats) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    PutU32(bits, out);
  }
}

void AppendTableStateCandidates(uint64_t candidates, std::string* out) { PutU64(candidates, out); }

void AppendTableStateCandidate(uint64_t key, int32_t count, int64_t last_step, std::string* out) {
  PutU64(key, out);
  PutU32(static_cast<uint32_t>(count), out);
  PutU64(static_cast<uint64_t>(last_step), out);
}

absl::Status ParseTableState(absl::string_view bytes, const std::string& table, int32_t stride,
                             const TableStateVisitor& visit) {
  StateReader in(bytes, table);
  uint32_t width = 0;
  if (absl::Status s = in.U32(&width, "row width"); !s.ok()) return s;
  if (stride < 1 || width != static_cast<uint32_t>(stride)) {
    return in.Bad(absl::StrCat("rows of ", width, " floats, this table's take ", stride,
                               " (another dim or optimizer?)"));
  }
  TableStateCounters counters;
  for (int64_t* counter : {&counters.pushes, &counters.admissions, &counters.expiries}) {
    if (absl::Status s = in.I64(counter, "counters"); !s.ok()) return s;
  }
  uint64_t rows = 0;
  if (absl::Status s = in.Count(&rows, 16 + static_cast<size_t>(stride) * 4, "rows"); !s.ok()) return s;
  if (absl::Status s = visit.begin(rows, counters); !s.ok()) return s;
  std::vector<float> floats(static_cast<size_t>(stride));
  for (uint64_t i = 0; i < rows; ++i) {
    uint64_t key = 0;
    int64_t last_step = 0;
    if (absl::Status s = in.U64(&key, "row key"); !s.ok()) return s;
    if (absl::Status s = in.I64(&last_step, "row step"); !s.ok()) return s;
    if (absl::Status s = in.Floats(floats.data(), floats.size(), "row"); !s.ok()) return s;
    if (absl::Status s = visit.row(key, last_step, floats); !s.ok()) return s;
  }
  uint64_t candidates = 0;
  if (absl::Status s = in.Count(&candidates, 20, "filter counts"); !s.ok()) return s;
  for (uint64_t i = 0; i < candidates; ++i) {
    uint64_t key = 0;
    uint32_t count = 0;
    int64_t last_step = 0;
    if (absl::Status s = in.U64(&key, "filter key"); !s.ok()) return s;
    if (absl::Status s = in.U32(&count, "filter count"); !s.ok()) return s;
    if (absl::Status s = in.I64(&last_step, "filter step"); !s.ok()) return s;
    if (visit.candidate) {
      if (absl::Status s = visit.candidate(key, static_cast<int32_t>(count), last_step); !s.ok()) return s;
    }
  }
  return in.Finish();
}

}  // namespace fulcrum
