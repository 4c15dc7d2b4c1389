#include "common/table_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/table_spec.h"

namespace fulcrum {
namespace {

// The most pushes, admissions or expiries a table state may count (2^62:
// more than any job makes, with room to count on without overflow).
constexpr int64_t kMaxTableCounter = int64_t{1} << 62;

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
  // An i64 in [lowest, highest] (a step or counter that is not is no
  // table's: corrupt, and past it a step's arithmetic would overflow).
  absl::Status I64In(int64_t* v, int64_t lowest, int64_t highest, absl::string_view field) {
    if (absl::Status read = I64(v, field); !read.ok()) return read;
    if (*v < lowest || *v > highest)
      return Bad(absl::StrCat(field, " ", *v, " is outside [", lowest, ", ", highest, "]"));
    return absl::OkStatus();
  }
  absl::Status U8(uint8_t* v, absl::string_view field) {
    if (absl::Status need = Need(1, field); !need.ok()) return need;
    *v = static_cast<uint8_t>(bytes_[pos_]);
    pos_ += 1;
    return absl::OkStatus();
  }
  // The next n bytes as they are.
  absl::Status Raw(size_t n, absl::string_view* v, absl::string_view field) {
    if (absl::Status need = Need(n, field); !need.ok()) return need;
    *v = bytes_.substr(pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  absl::Status U32(uint32_t* v, absl::string_view field) {
    if (absl::Status need = Need(4, field); !need.ok()) return need;
    *v = absl::little_endian::Load32(bytes_.data() + pos_);
    pos_ += 4;
    return absl::OkStatus();
  }
  // n floats, as they are: a row a diverged model made non-finite (finite
  // gradients an optimizer's arithmetic overflowed) is the table's state,
  // which a copy and a checkpoint keep as the dense chunks do; workers
  // refuse the gradients it leads to, naming the divergence.
  absl::Status Floats(float* out, size_t n, absl::string_view field) {
    if (absl::Status need = Need(n * 4, field); !need.ok()) return need;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t bits = absl::little_endian::Load32(bytes_.data() + pos_ + i * 4);
      std::memcpy(out + i, &bits, sizeof(bits));
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

// A row as whole and incremental states hold it: its key, the flag of an
// incremental state's changed row when given, its step and its floats, the
// floats copied at once on a little-endian host (a capture writes every row
// of a table while it holds its pushes).
void PutRow(uint64_t key, std::optional<char> flag, int64_t last_step, absl::Span<const float> floats,
            std::string* out) {
  char head[17];
  size_t n = 0;
  absl::little_endian::Store64(head, key);
  n += 8;
  if (flag.has_value()) head[n++] = *flag;
  absl::little_endian::Store64(head + n, static_cast<uint64_t>(last_step));
  n += 8;
  out->append(head, n);
  if (absl::little_endian::IsLittleEndian()) {
    out->append(reinterpret_cast<const char*>(floats.data()), floats.size() * sizeof(float));
    return;
  }
  for (float value : floats) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    PutU32(bits, out);
  }
}

// An incremental state's base checkpoint, after its mark: DATA_LOSS unless
// positive.
absl::Status ReadDeltaBase(StateReader* in, int64_t* base) {
  if (absl::Status s = in->I64(base, "base checkpoint"); !s.ok()) return s;
  if (*base <= 0) return in->Bad(absl::StrCat("incremental on checkpoint ", *base, ", which cannot exist"));
  return absl::OkStatus();
}

// An incremental state's unchanged row: its key and flag 0, in one append.
void PutSameRow(uint64_t key, std::string* out) {
  char bytes[9];
  absl::little_endian::Store64(bytes, key);
  bytes[8] = '\0';
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
  PutRow(key, std::nullopt, last_step, floats, out);
}

void AppendTableStateCandidates(uint64_t candidates, std::string* out) { PutU64(candidates, out); }

void AppendTableStateCandidate(uint64_t key, int32_t count, int64_t last_step, std::string* out) {
  PutU64(key, out);
  PutU32(static_cast<uint32_t>(count), out);
  PutU64(static_cast<uint64_t>(last_step), out);
}

void AppendTableDeltaHeader(int64_t base_checkpoint_id, int32_t stride, const TableStateCounters& counters,
                            uint64_t rows, std::string* out) {
  PutU32(kTableDeltaMark, out);
  PutU64(static_cast<uint64_t>(base_checkpoint_id), out);
  AppendTableStateHeader(stride, counters, rows, out);
}

void AppendTableDeltaRow(uint64_t key, int64_t last_step, absl::Span<const float> floats, std::string* out) {
  PutRow(key, '\1', last_step, floats, out);
}

void AppendTableDeltaSame(uint64_t key, std::string* out) { PutSameRow(key, out); }

absl::StatusOr<int64_t> TableStateBase(absl::string_view bytes, const std::string& table) {
  StateReader in(bytes, table);
  uint32_t mark = 0;
  if (absl::Status s = in.U32(&mark, "row width"); !s.ok()) return s;
  if (mark != kTableDeltaMark) return 0;
  int64_t base = 0;
  if (absl::Status s = ReadDeltaBase(&in, &base); !s.ok()) return s;
  return base;
}

absl::StatusOr<std::string> ComposeTableState(absl::string_view base, absl::string_view delta,
                                              const std::string& table) {
  // The base's rows are of one size: row i lies at rows_at + i * (8 + row_bytes).
  StateReader b(base, table);
  uint32_t width = 0;
  if (absl::Status s = b.U32(&width, "base row width"); !s.ok()) return s;
  if (width == kTableDeltaMark) return b.Bad("the base is itself incremental");
  if (width == 0) return b.Bad("rows of 0 floats");
  const size_t row_bytes = 8 + static_cast<size_t>(width) * 4;  // step and floats
  for (int i = 0; i < 3; ++i) {
    int64_t counter = 0;
    if (absl::Status s = b.I64(&counter, "base counters"); !s.ok()) return s;
  }
  uint64_t base_rows = 0;
  if (absl::Status s = b.Count(&base_rows, 8 + row_bytes, "base rows"); !s.ok()) return s;
  absl::string_view rows_at;
  if (absl::Status s = b.Raw(static_cast<size_t>(base_rows) * (8 + row_bytes), &rows_at, "base rows"); !s.ok()) {
    return s;
  }
  uint64_t base_candidates = 0;
  absl::string_view skipped;
  if (absl::Status s = b.Count(&base_candidates, 20, "base filter counts"); !s.ok()) return s;
  if (absl::Status s = b.Raw(static_cast<size_t>(base_candidates) * 20, &skipped, "base filter counts"); !s.ok()) {
    return s;
  }
  if (absl::Status s = b.Finish(); !s.ok()) return s;
  auto base_key = [&](size_t i) { return absl::little_endian::Load64(rows_at.data() + i * (8 + row_bytes)); };
  // A row as in the base is most often at the same place there (rows move
  // only when others expire); the others are found by key, in a map built
  // the first time one is needed.
  absl::flat_hash_map<uint64_t, size_t> index_of;
  bool indexed = false;
  auto find_in_base = [&](size_t at, uint64_t key, size_t* i) -> absl::Status {
    if (at < base_rows && base_key(at) == key) {
      *i = at;
      return absl::OkStatus();
    }
    if (!indexed) {
      index_of.reserve(static_cast<size_t>(base_rows));
      for (size_t j = 0; j < base_rows; ++j) {
        if (!index_of.emplace(base_key(j), j).second) {
          return b.Bad(absl::StrCat("the base lists key ", base_key(j), " twice"));
        }
      }
      indexed = true;
    }
    auto it = index_of.find(key);
    if (it == index_of.end()) return absl::NotFoundError("");
    *i = it->second;
    return absl::OkStatus();
  };

  StateReader d(delta, table);
  uint32_t mark = 0, delta_width = 0;
  int64_t base_id = 0;
  if (absl::Status s = d.U32(&mark, "mark"); !s.ok()) return s;
  if (mark != kTableDeltaMark) return d.Bad("not an incremental state");
  if (absl::Status s = ReadDeltaBase(&d, &base_id); !s.ok()) return s;
  if (absl::Status s = d.U32(&delta_width, "row width"); !s.ok()) return s;
  if (delta_width != width) {
    return d.Bad(absl::StrCat("rows of ", delta_width, " floats on a base whose rows take ", width));
  }
  TableStateCounters counters;
  for (int64_t* counter : {&counters.pushes, &counters.admissions, &counters.expiries}) {
    if (absl::Status s = d.I64In(counter, 0, kMaxTableCounter, "counter"); !s.ok()) return s;
  }
  uint64_t rows = 0;
  if (absl::Status s = d.Count(&rows, 9, "rows"); !s.ok()) return s;
  // Each base row is taken at most once, and each changed row is in the
  // delta: the output is at most the two inputs' size. (A key both taken
  // from the base and written out is left to the reader of the whole state,
  // which refuses a key listed twice.)
  std::string out;
  out.reserve(std::min(base.size() + delta.size(), 36 + static_cast<size_t>(rows) * (8 + row_bytes)));
  AppendTableStateHeader(static_cast<int32_t>(width), counters, rows, &out);
  std::vector<bool> taken(static_cast<size_t>(base_rows), false);
  for (uint64_t i = 0; i < rows; ++i) {
    uint64_t key = 0;
    uint8_t changed = 0;
    absl::string_view row;
    if (absl::Status s = d.U64(&key, "row key"); !s.ok()) return s;
    if (absl::Status s = d.U8(&changed, "row flag"); !s.ok()) return s;
    if (changed == 1) {
      if (absl::Status s = d.Raw(row_bytes, &row, "row"); !s.ok()) return s;
    } else if (changed == 0) {
      size_t at = 0;
      if (absl::Status found = find_in_base(static_cast<size_t>(i), key, &at); !found.ok()) {
        if (absl::IsDataLoss(found)) return found;
        return d.Bad(absl::StrCat("the row of key ", key, " is said to be as in checkpoint ", base_id,
                                  ", which does not hold it"));
      }
      if (taken[at]) return d.Bad(absl::StrCat("key ", key, " is listed twice"));
      taken[at] = true;
      row = rows_at.substr(at * (8 + row_bytes) + 8, row_bytes);
    } else {
      return d.Bad(absl::StrCat("row flag ", int{changed}, " is neither 0 nor 1"));
    }
    PutU64(key, &out);
    out.append(row.data(), row.size());
  }
  uint64_t candidates = 0;
  absl::string_view counts;
  if (absl::Status s = d.Count(&candidates, 20, "filter counts"); !s.ok()) return s;
  if (absl::Status s = d.Raw(static_cast<size_t>(candidates) * 20, &counts, "filter counts"); !s.ok()) return s;
  if (absl::Status s = d.Finish(); !s.ok()) return s;
  AppendTableStateCandidates(candidates, &out);
  out.append(counts.data(), counts.size());
  return out;
}

absl::Status ParseTableState(absl::string_view bytes, const std::string& table, int32_t stride,
                             const TableStateVisitor& visit) {
  StateReader in(bytes, table);
  uint32_t width = 0;
  if (absl::Status s = in.U32(&width, "row width"); !s.ok()) return s;
  const bool incremental = width == kTableDeltaMark;
  if (incremental) {
    if (!visit.same) {
      return in.Bad("an incremental state, the changes since an earlier checkpoint (compose it on that one first)");
    }
    int64_t base = 0;
    if (absl::Status s = ReadDeltaBase(&in, &base); !s.ok()) return s;
    if (absl::Status s = in.U32(&width, "row width"); !s.ok()) return s;
  }
  if (stride < 1 || width != static_cast<uint32_t>(stride)) {
    return in.Bad(absl::StrCat("rows of ", width, " floats, this table's take ", stride,
                               " (another dim or optimizer?)"));
  }
  TableStateCounters counters;
  for (int64_t* counter : {&counters.pushes, &counters.admissions, &counters.expiries}) {
    if (absl::Status s = in.I64In(counter, 0, kMaxTableCounter, "counter"); !s.ok()) return s;
  }
  uint64_t rows = 0;
  if (absl::Status s = in.Count(&rows, incremental ? 9 : 16 + static_cast<size_t>(stride) * 4, "rows"); !s.ok()) {
    return s;
  }
  if (absl::Status s = visit.begin(rows, counters); !s.ok()) return s;
  std::vector<float> floats(static_cast<size_t>(stride));
  for (uint64_t i = 0; i < rows; ++i) {
    uint64_t key = 0;
    int64_t last_step = 0;
    if (absl::Status s = in.U64(&key, "row key"); !s.ok()) return s;
    if (incremental) {
      uint8_t changed = 0;
      if (absl::Status s = in.U8(&changed, "row flag"); !s.ok()) return s;
      if (changed == 0) {
        if (absl::Status s = visit.same(key); !s.ok()) return s;
        continue;
      }
      if (changed != 1) return in.Bad(absl::StrCat("row flag ", int{changed}, " is neither 0 nor 1"));
    }
    if (absl::Status s = in.I64In(&last_step, 0, kMaxSparseStep + 1, "row step"); !s.ok()) return s;
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
    if (absl::Status s = in.I64In(&last_step, 0, kMaxSparseStep + 1, "filter step"); !s.ok()) return s;
    if (visit.candidate) {
      if (absl::Status s = visit.candidate(key, static_cast<int32_t>(count), last_step); !s.ok()) return s;
    }
  }
  return in.Finish();
}

}  // namespace fulcrum
