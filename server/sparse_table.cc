#include "server/sparse_table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/finite.h"
#include "common/repeated_key.h"
#include "common/table_spec.h"
#include "common/table_state.h"
#include "common/vector_clones.h"
#include "server/optimizer.h"

namespace fulcrum {
namespace {

constexpr size_t kBlockBytes = size_t{256} << 10;
// The first block starts this small and doubles up to a whole block, so a
// bucket of a few rows takes a few rows' bytes, not a whole block (a table
// of 4096 buckets of ten rows each took 256 KiB a bucket).
constexpr size_t kFirstBlockRows = 16;
constexpr size_t kMinIndexSlots = 16;
// The most cache lines of a row a lookup asks for ahead (1 KiB: a row of 64
// floats with two optimizer slots).
constexpr size_t kPrefetchLines = 16;

// An index entry: the row number + 1 in the low 26 bits (0: empty), the top
// 6 bits of the key's hash above them, so that a probe passes most other
// keys without reading their rows.
constexpr int kRowBits = 26;
constexpr uint32_t kRowMask = (uint32_t{1} << kRowBits) - 1;

size_t Home(uint64_t hash, size_t mask) { return static_cast<size_t>(hash) & mask; }
uint32_t Tag(uint64_t hash) { return static_cast<uint32_t>(hash >> 58) << kRowBits; }
uint32_t Entry(uint64_t hash, uint32_t row) { return Tag(hash) | (row + 1); }
uint32_t RowOf(uint32_t entry) { return (entry & kRowMask) - 1; }

// Whether x lies in the cyclic interval (a, b].
bool Between(size_t a, size_t x, size_t b) { return a <= b ? (a < x && x <= b) : (a < x || x <= b); }

// A seed for each table's index: the process's, mixed with a count of the
// tables made (thousands of buckets each read no random device).
uint64_t RandomSeed() {
  static std::atomic<uint64_t> tables{0};
  return SplitMix64(ProcessHashSeed() ^ SplitMix64(tables.fetch_add(1, std::memory_order_relaxed)));
}

// Index slots for `rows` rows at most 3/4 full.
size_t SlotsFor(int64_t rows, size_t at_least) {
  size_t slots = std::max(at_least, kMinIndexSlots);
  while (static_cast<int64_t>(slots / 4 * 3) < rows) slots *= 2;
  return slots;
}

// The slots of a filter-count map of `capacity` slots once it holds `size`
// keys: absl's hash tables fill to 7/8, then grow to 2 * capacity + 1 (so a
// push may double what the map takes, not add its keys' share).
size_t CandidateSlotsFor(size_t size, size_t capacity) {
  if (size == 0) return capacity;
  size_t slots = std::max<size_t>(capacity, 1);
  while (size > slots - slots / 8) slots = slots * 2 + 1;
  return slots;
}

absl::Status Bad(const SparseTableConfig& config, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("table ", config.name, ": ", what));
}

}  // namespace

int SparseStateSlots(SparseOptimizerKind kind) {
  switch (kind) {
    case SparseOptimizerKind::kSgd:
      return 0;
    case SparseOptimizerKind::kAdagrad:
      return 1;
    case SparseOptimizerKind::kFtrl:
    case SparseOptimizerKind::kAdam:
      return 2;
  }
  return 0;
}

absl::Status ValidateSparseTableConfig(const SparseTableConfig& config) {
  if (config.dim < 1 || config.dim > 65536) return Bad(config, absl::StrCat("dim ", config.dim, " is outside [1, 65536]"));
  const SparseOptimizerConfig& o = config.optimizer;
  for (const auto& [name, value] : {std::pair<const char*, float>{"lr", o.lr},
                                    {"epsilon", o.epsilon},
                                    {"initialAccumulator", o.initial_accumulator},
                                    {"l1", o.l1},
                                    {"l2", o.l2},
                                    {"beta", o.beta},
                                    {"initScale", config.init_scale}}) {
    if (!std::isfinite(value) || value < 0) return Bad(config, absl::StrCat(name, " ", value, " must be finite and >= 0"));
  }
  if (!(o.lr > 0)) return Bad(config, "lr must be > 0");
  const bool divides = o.kind == SparseOptimizerKind::kAdam ||
                       (o.kind == SparseOptimizerKind::kAdagrad && !(o.initial_accumulator > 0));
  if (divides && o.epsilon == 0) {
    return Bad(config,
               "epsilon must be > 0 (or, for Adagrad, initialAccumulator > 0): a zero gradient would divide "
               "0 by 0");
  }
  for (const auto& [name, value] : {std::pair<const char*, float>{"beta1", o.beta1}, {"beta2", o.beta2}}) {
    if (!(value >= 0 && value < 1)) return Bad(config, absl::StrCat(name, " ", value, " is outside [0, 1)"));
  }
  if (o.kind == SparseOptimizerKind::kFtrl && config.init != InitKind::kZeros) {
    return Bad(config, "FTRL starts every row at zero (its weights follow from z and n): use a zeros initializer");
  }
  if (config.admit_after < 0) return Bad(config, absl::StrCat("admitAfter ", config.admit_after, " is negative"));
  if (config.expire_after < 0 || config.expire_after > kMaxSparseStep) {
    return Bad(config,
               absl::StrCat("expireAfter ", config.expire_after, " is outside [0, ", kMaxSparseStep, "]"));
  }
  if (config.memory_budget < 0) return Bad(config, "the memory budget is negative");
  return absl::OkStatus();
}

int64_t SparseTable::EmptyBytes() { return static_cast<int64_t>(kMinIndexSlots * sizeof(uint32_t)); }

absl::StatusOr<std::unique_ptr<SparseTable>> SparseTable::Create(SparseTableConfig config) {
  if (absl::Status valid = ValidateSparseTableConfig(config); !valid.ok()) return valid;
  return std::unique_ptr<SparseTable>(new SparseTable(std::move(config)));
}

SparseTable::SparseTable(SparseTableConfig config)
    : config_(std::move(config)),
      slots_(SparseStateSlots(config_.optimizer.kind)),
      stride_(config_.dim * (1 + slots_)),
      // Headers stay 8-byte aligned: rows are a multiple of 8 bytes.
      row_bytes_((sizeof(RowHeader) + static_cast<size_t>(stride_) * sizeof(float) + 7) / 8 * 8),
      init_key_(SplitMix64(SplitMix64(config_.seed) ^ ((uint64_t{config_.table_index} << 32) | 0x5ab1eU))),
      index_seed_(RandomSeed()) {
  // A power of two, so that a row's block and place are a shift and a mask.
  while ((rows_per_block_ << 1) * row_bytes_ <= kBlockBytes) {
    rows_per_block_ <<= 1;
    ++block_shift_;
  }
  MutexLock lock(&mu_);
  index_.assign(kMinIndexSlots, 0);
}

char* SparseTable::RowAt(uint32_t r) const {
  return blocks_[r >> block_shift_].get() + (r & (rows_per_block_ - 1)) * row_bytes_;
}

uint32_t& SparseTable::GenAt(uint32_t r) const { return gens_[r >> block_shift_][r & (rows_per_block_ - 1)]; }

size_t SparseTable::Probe(uint64_t key) const { return Probe(key, IndexHash(key)); }

size_t SparseTable::Probe(uint64_t key, uint64_t hash) const {
  const uint32_t tag = Tag(hash);
  const size_t mask = index_.size() - 1;
  size_t slot = Home(hash, mask);
  for (uint32_t entry; (entry = index_[slot]) != 0; slot = (slot + 1) & mask) {
    if ((entry & ~kRowMask) == tag && Header(RowAt(RowOf(entry)))->key == key) break;
  }
  return slot;
}

int64_t SparseTable::Find(uint64_t key) const { return Find(key, IndexHash(key)); }

int64_t SparseTable::Find(uint64_t key, uint64_t hash) const {
  const uint32_t entry = index_[Probe(key, hash)];
  return entry == 0 ? -1 : static_cast<int64_t>(RowOf(entry));
}

void SparseTable::GrowIndex() {
  std::vector<uint32_t> old = std::move(index_);
  index_.assign(old.size() * 2, 0);
  const size_t mask = index_.size() - 1;
  for (uint32_t entry : old) {
    if (entry == 0) continue;
    size_t slot = Home(IndexHash(Header(RowAt(RowOf(entry)))->key), mask);
    while (index_[slot] != 0) slot = (slot + 1) & mask;
    index_[slot] = entry;
  }
}

size_t SparseTable::CapacityFor(int64_t rows) const {
  if (rows <= 0) return 0;
  const auto wanted = static_cast<size_t>(rows);
  if (wanted > rows_per_block_) return (wanted + rows_per_block_ - 1) / rows_per_block_ * rows_per_block_;
  size_t first = std::min(kFirstBlockRows, rows_per_block_);
  while (first < wanted) first <<= 1;
  return first;
}

void SparseTable::GrowFirstBlock(size_t rows) {
  const size_t capacity = CapacityFor(static_cast<int64_t>(rows));
  auto block = std::make_unique<char[]>(capacity * row_bytes_);
  auto gens = std::make_unique<uint32_t[]>(capacity);
  if (!blocks_.empty()) {
    const size_t held = std::min<size_t>(rows_, first_block_rows_);
    std::memcpy(block.get(), blocks_[0].get(), held * row_bytes_);
    std::memcpy(gens.get(), gens_[0].get(), held * sizeof(uint32_t));
    blocks_[0] = std::move(block);
    gens_[0] = std::move(gens);
  } else {
    blocks_.push_back(std::move(block));
    gens_.push_back(std::move(gens));
  }
  first_block_rows_ = capacity;
}

uint32_t SparseTable::AddRow(uint64_t key, int64_t step) {
  if (static_cast<size_t>(rows_) + 1 > index_.size() / 4 * 3) GrowIndex();
  const uint32_t r = rows_++;
  if (r < rows_per_block_) {
    if (r >= first_block_rows_) GrowFirstBlock(static_cast<size_t>(r) + 1);  // moves the rows of block 0
  } else if ((r >> block_shift_) >= blocks_.size()) {
    blocks_.push_back(std::make_unique<char[]>(rows_per_block_ * row_bytes_));
    gens_.push_back(std::make_unique<uint32_t[]>(rows_per_block_));
  }
  GenAt(r) = generation_;
  char* row = RowAt(r);
  Header(row)->key = key;
  Header(row)->last_step = step;
  InitRow(key, Floats(row));
  index_[Probe(key)] = Entry(IndexHash(key), r);
  return r;
}

void SparseTable::RemoveRow(uint32_t r) {
  // Out of the index, shifting back the entries that probed past its slot.
  const size_t mask = index_.size() - 1;
  size_t hole = Probe(Header(RowAt(r))->key);
  index_[hole] = 0;
  for (size_t j = (hole + 1) & mask; index_[j] != 0; j = (j + 1) & mask) {
    const size_t home = Home(IndexHash(Header(RowAt(RowOf(index_[j])))->key), mask);
    if (!Between(hole, home, j)) {
      index_[hole] = index_[j];
      index_[j] = 0;
      hole = j;
    }
  }
  // The last row moves into its place.
  const uint32_t last = rows_ - 1;
  if (r != last) {
    std::memcpy(RowAt(r), RowAt(last), row_bytes_);
    GenAt(r) = GenAt(last);
    const uint64_t key = Header(RowAt(r))->key;
    index_[Probe(key)] = Entry(IndexHash(key), r);
  }
  --rows_;
  if (rows_ == 0 || ((rows_ - 1) >> block_shift_) + 1 < blocks_.size()) {
    blocks_.pop_back();
    gens_.pop_back();
    if (blocks_.empty()) first_block_rows_ = 0;
  }
}

void SparseTable::InitValues(uint64_t key, float* values) const {
  if (config_.init == InitKind::kZeros) {
    std::fill(values, values + config_.dim, 0.0f);
    return;
  }
  // A counter-based stream per (seed, table, key): the same on any server.
  const uint64_t row_key = SplitMix64(init_key_ ^ SplitMix64(key));
  for (int32_t j = 0; j < config_.dim; ++j) {
    values[j] = config_.init_scale * (2.0f * BitsToUnitFloat(SplitMix64(row_key + static_cast<uint64_t>(j))) - 1.0f);
  }
}

void SparseTable::InitRow(uint64_t key, float* row) const {
  InitValues(key, row);
  const float state = config_.optimizer.kind == SparseOptimizerKind::kAdagrad ? config_.optimizer.initial_accumulator
                                                                              : 0.0f;
  std::fill(row + config_.dim, row + stride_, state);
}

namespace {

// The per-row update rules, written to vectorize (sparse_table.cc compiles
// with -fno-math-errno and no FMA contraction, in AVX2 and baseline clones):
// each element's arithmetic as written, so the results are the scalar
// loops' whatever the CPU.
FULCRUM_VECTOR_CLONES void SgdRow(float lr, int32_t dim, const float* __restrict g, float* __restrict w) {
  for (int32_t j = 0; j < dim; ++j) w[j] -= lr * g[j];
}

FULCRUM_VECTOR_CLONES void AdagradRow(float lr, float epsilon, int32_t dim, const float* __restrict g,
                                      float* __restrict w, float* __restrict s) {
  for (int32_t j = 0; j < dim; ++j) {
    s[j] += g[j] * g[j];
    w[j] -= lr * (g[j] / (std::sqrt(s[j]) + epsilon));
  }
}

FULCRUM_VECTOR_CLONES void FtrlRow(float lr, float l1, float l2, float beta, int32_t dim, const float* __restrict g,
                                   float* __restrict w, float* __restrict z, float* __restrict n) {
  for (int32_t j = 0; j < dim; ++j) {
    const float n_new = n[j] + g[j] * g[j];
    const float sigma = (std::sqrt(n_new) - std::sqrt(n[j])) / lr;
    z[j] += g[j] - sigma * w[j];
    n[j] = n_new;
    w[j] = std::fabs(z[j]) <= l1 ? 0.0f : -(z[j] - std::copysign(l1, z[j])) / ((beta + std::sqrt(n_new)) / lr + l2);
  }
}

FULCRUM_VECTOR_CLONES void AdamRow(float one_minus_beta1, float one_minus_beta2, float epsilon, float step_size, int32_t dim,
                                   const float* __restrict g, float* __restrict w, float* __restrict m,
                                   float* __restrict v) {
  for (int32_t j = 0; j < dim; ++j) {
    m[j] += (g[j] - m[j]) * one_minus_beta1;
    v[j] += (g[j] * g[j] - v[j]) * one_minus_beta2;
    w[j] -= step_size * (m[j] / (std::sqrt(v[j]) + epsilon));
  }
}

}  // namespace

void SparseTable::Apply(float* row, const float* g) {
  const SparseOptimizerConfig& o = config_.optimizer;
  const int32_t dim = config_.dim;
  switch (o.kind) {
    case SparseOptimizerKind::kSgd:
      SgdRow(o.lr, dim, g, row);
      return;
    case SparseOptimizerKind::kAdagrad:
      AdagradRow(o.lr, o.epsilon, dim, g, row, row + dim);
      return;
    case SparseOptimizerKind::kFtrl:
      FtrlRow(o.lr, o.l1, o.l2, o.beta, dim, g, row, row + dim, row + 2 * dim);
      return;
    case SparseOptimizerKind::kAdam: {
      // The step size in double, rounded once, as PyTorch's Python side
      // computes it (and the dense Adam here).
      const double t = static_cast<double>(pushes_);
      const double bias1 = 1.0 - std::pow(static_cast<double>(o.beta1), t);
      const double bias2 = 1.0 - std::pow(static_cast<double>(o.beta2), t);
      const auto step_size = static_cast<float>(static_cast<double>(o.lr) * std::sqrt(bias2) / bias1);
      AdamRow(1.0f - o.beta1, 1.0f - o.beta2, o.epsilon, step_size, dim, g, row, row + dim, row + 2 * dim);
      return;
    }
  }
}

int64_t SparseTable::BytesFor(int64_t rows, size_t index_slots, size_t candidate_slots) const {
  // A flat_hash_map keeps a control byte beside every slot.
  const int64_t candidate_bytes = static_cast<int64_t>(candidate_slots) *
                                  static_cast<int64_t>(sizeof(std::pair<const uint64_t, Sightings>) + 1);
  return static_cast<int64_t>(CapacityFor(rows) * (row_bytes_ + sizeof(uint32_t))) +
         static_cast<int64_t>(index_slots * sizeof(uint32_t)) + candidate_bytes;
}

int64_t SparseTable::BytesLocked() const {
  const size_t capacity = blocks_.empty() ? 0 : first_block_rows_ + (blocks_.size() - 1) * rows_per_block_;
  return static_cast<int64_t>(capacity * (row_bytes_ + sizeof(uint32_t)) + index_.size() * sizeof(uint32_t) +
                              candidates_.capacity() * (sizeof(std::pair<const uint64_t, Sightings>) + 1));
}

void SparseTable::StartLookups(absl::Span<const uint64_t> keys, size_t row_prefix, bool gens,
                               Lookups* lookups) const {
  lookups->row_prefix = row_prefix;
  lookups->gens = gens;
  const size_t mask = index_.size() - 1;
  for (size_t k = 0; k < std::min(kLookAhead, keys.size()); ++k) {
    lookups->hashes[k] = IndexHash(keys[k]);
    __builtin_prefetch(&index_[Home(lookups->hashes[k], mask)]);
  }
}

uint64_t SparseTable::NextLookup(absl::Span<const uint64_t> keys, size_t i, Lookups* lookups) const {
  // The key kLookAhead / 2 on: its index slot, asked for earlier, is in the
  // cache by now; ask for the row it names (when its tag is the key's).
  // The index may have grown since: the slot is read at the current size.
  const size_t mask = index_.size() - 1;
  if (i + kLookAhead / 2 < keys.size()) {
    const uint64_t hash = lookups->hashes[(i + kLookAhead / 2) % kLookAhead];
    const uint32_t entry = index_[Home(hash, mask)];
    if (entry != 0 && (entry & ~kRowMask) == Tag(hash)) {
      // At most kPrefetchLines lines: the hardware's own prefetcher streams
      // the rest of a long row (dim in the thousands) after them.
      const char* row = RowAt(RowOf(entry));
      const size_t bytes = std::min(lookups->row_prefix, kPrefetchLines * 64);
      for (size_t line = 0; line < bytes; line += 64) __builtin_prefetch(row + line);
      __builtin_prefetch(row + bytes - 1);
      if (lookups->gens) __builtin_prefetch(&GenAt(RowOf(entry)));
    }
  }
  // keys[i]'s hash leaves the ring for that of the key kLookAhead on.
  const uint64_t hash = lookups->hashes[i % kLookAhead];
  if (i + kLookAhead < keys.size()) {
    const uint64_t ahead = IndexHash(keys[i + kLookAhead]);
    lookups->hashes[i % kLookAhead] = ahead;
    __builtin_prefetch(&index_[Home(ahead, mask)]);
  }
  return hash;
}

void SparseTable::Pull(absl::Span<const uint64_t> keys, float* out) const {
  ReaderMutexLock lock(&mu_);
  const size_t value_bytes = static_cast<size_t>(config_.dim) * sizeof(float);
  Lookups lookups;
  StartLookups(keys, sizeof(RowHeader) + value_bytes, /*gens=*/false, &lookups);
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t hash = NextLookup(keys, i, &lookups);
    float* values = out + i * static_cast<size_t>(config_.dim);
    const int64_t r = Find(keys[i], hash);
    if (r < 0) {
      InitValues(keys[i], values);
    } else {
      std::memcpy(values, Floats(RowAt(static_cast<uint32_t>(r))), value_bytes);
    }
  }
}

absl::Status SparseTable::CheckPush(absl::Span<const uint64_t> keys, const float* grads) const {
  const auto dim = static_cast<int64_t>(config_.dim);
  const int64_t bad = FirstNonFinite(grads, static_cast<int64_t>(keys.size()) * dim);
  if (bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("push to table ", config_.name, " has a non-finite gradient (",
                                                   grads[bad], ") for key ", keys[static_cast<size_t>(bad / dim)],
                                                   " at element ", bad % dim));
  }
  if (const int64_t repeated = FirstRepeatedKey(keys); repeated >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("push to table ", config_.name, " lists key ",
                                                   keys[static_cast<size_t>(repeated)],
                                                   " more than once (sum a key's gradients into one row)"));
  }
  return absl::OkStatus();
}

SparseTable::Growth SparseTable::GrowthLocked(absl::Span<const uint64_t> keys) const {
  // Rows for the keys admitted now, filter counts for the others.
  const int32_t admit_after = std::max(1, config_.admit_after);
  Growth growth;
  for (uint64_t key : keys) {
    if (Find(key) >= 0) continue;
    auto it = candidates_.find(key);
    const int32_t count = it == candidates_.end() ? 0 : it->second.count;
    if (count + 1 >= admit_after) {
      ++growth.rows;
    } else if (it == candidates_.end()) {
      ++growth.candidates;
    }
  }
  return growth;
}

int64_t SparseTable::BytesAfterLocked(const Growth& growth) const {
  if (growth.rows + growth.candidates == 0) return BytesLocked();
  const int64_t rows = rows_ + growth.rows;
  // At least what it takes now: rows removed leave the first block as large.
  return std::max(BytesLocked(),
                  BytesFor(rows, SlotsFor(rows, index_.size()),
                           CandidateSlotsFor(candidates_.size() + static_cast<size_t>(growth.candidates),
                                             candidates_.capacity())));
}

absl::Status SparseTable::CheckRoomLocked(absl::Span<const uint64_t> keys) const {
  // Counted only when the push might not fit.
  if (config_.memory_budget <= 0 && rows_ + static_cast<int64_t>(keys.size()) <= kMaxRows) return absl::OkStatus();
  const Growth growth = GrowthLocked(keys);
  if (rows_ + growth.rows > kMaxRows) {
    return absl::ResourceExhaustedError(absl::StrCat("table ", config_.name, " is full: it holds ", rows_,
                                                     " rows and this push would add ", growth.rows,
                                                     "; a server holds at most ", kMaxRows,
                                                     " rows of a table (add servers)"));
  }
  if (config_.memory_budget <= 0 || growth.rows + growth.candidates == 0) return absl::OkStatus();
  const int64_t needed = BytesAfterLocked(growth);
  if (needed <= config_.memory_budget) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "table ", config_.name, " is full: ", rows_, " rows and ", candidates_.size(), " filtered keys take ",
      BytesLocked(), " bytes; this push's ", growth.rows, " new rows would need ", needed, ", beyond its budget of ",
      config_.memory_budget, " bytes"));
}

absl::StatusOr<int64_t> SparseTable::BytesAfterPush(absl::Span<const uint64_t> keys, const float* grads) const {
  if (absl::Status checked = CheckPush(keys, grads); !checked.ok()) return checked;
  return BytesAfterCheckedPush(keys);
}

absl::StatusOr<int64_t> SparseTable::BytesAfterCheckedPush(absl::Span<const uint64_t> keys) const {
  ReaderMutexLock lock(&mu_);
  if (absl::Status room = CheckRoomLocked(keys); !room.ok()) return room;
  return BytesAfterLocked(GrowthLocked(keys));
}

int64_t SparseTable::BytesAfterAtMost(size_t keys) const {
  ReaderMutexLock lock(&mu_);
  const int64_t rows = rows_ + static_cast<int64_t>(keys);
  return std::max(BytesLocked(),
                  BytesFor(rows, SlotsFor(rows, index_.size()),
                           CandidateSlotsFor(candidates_.size() + keys, candidates_.capacity())));
}

absl::Status SparseTable::Push(int64_t step, absl::Span<const uint64_t> keys, const float* grads) {
  if (absl::Status checked = CheckPush(keys, grads); !checked.ok()) return checked;
  return PushChecked(step, keys, grads);
}

absl::Status SparseTable::PushChecked(int64_t step, absl::Span<const uint64_t> keys, const float* grads) {
  MutexLock lock(&mu_);
  if (absl::Status room = CheckRoomLocked(keys); !room.ok()) return room;  // all or nothing
  const int32_t admit_after = std::max(1, config_.admit_after);
  ++pushes_;
  Lookups lookups;
  StartLookups(keys, row_bytes_, /*gens=*/true, &lookups);
  for (size_t i = 0; i < keys.size(); ++i) {
    int64_t r = Find(keys[i], NextLookup(keys, i, &lookups));
    if (r < 0) {
      auto it = candidates_.find(keys[i]);
      const int32_t count = (it == candidates_.end() ? 0 : it->second.count) + 1;
      if (count < admit_after) {  // filtered: counted, its gradient dropped
        candidates_[keys[i]] = Sightings{count, step};
        continue;
      }
      if (it != candidates_.end()) candidates_.erase(it);
      r = AddRow(keys[i], step);
      ++admissions_;
    }
    char* row = RowAt(static_cast<uint32_t>(r));
    Header(row)->last_step = step;
    GenAt(static_cast<uint32_t>(r)) = generation_;
    Apply(Floats(row), grads + static_cast<int64_t>(i) * config_.dim);
  }
  return absl::OkStatus();
}

int64_t SparseTable::Expire(int64_t now, std::vector<uint64_t>* keys, std::vector<float>* values) {
  if (config_.expire_after <= 0) return 0;
  const int64_t oldest = now - config_.expire_after;
  MutexLock lock(&mu_);
  int64_t dropped = 0;
  // From the end: the last row, moved into a dropped one's place, is already checked.
  for (uint32_t r = rows_; r-- > 0;) {
    if (Header(RowAt(r))->last_step < oldest) {
      if (keys != nullptr) {
        keys->push_back(Header(RowAt(r))->key);
        const float* row = Floats(RowAt(r));
        values->insert(values->end(), row, row + config_.dim);
      }
      RemoveRow(r);
      ++dropped;
    }
  }
  absl::erase_if(candidates_, [oldest](const auto& entry) { return entry.second.last_step < oldest; });
  expiries_ += dropped;
  return dropped;
}

void SparseTable::AppendState(std::string* out) const {
  ReaderMutexLock lock(&mu_);
  AppendStateLocked(out);
}

void SparseTable::AppendCandidatesLocked(std::string* out) const {
  // In key order: the map's own order differs from process to process
  // (Abseil seeds its hash per process), and replicas of a bucket must write
  // the same bytes, or the checkpoint's manifest lists only the primary as
  // holding it (checksums differ): no backup to restore from, and no base
  // for the next checkpoint's changes.
  std::vector<std::pair<uint64_t, Sightings>> sorted(candidates_.begin(), candidates_.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  AppendTableStateCandidates(sorted.size(), out);
  for (const auto& [key, sightings] : sorted)
    AppendTableStateCandidate(key, sightings.count, sightings.last_step, out);
}

void SparseTable::AppendStateLocked(std::string* out) const {
  out->reserve(out->size() + 40 + static_cast<size_t>(rows_) * (16 + static_cast<size_t>(stride_) * 4) +
               candidates_.size() * 20);
  AppendTableStateHeader(stride_, TableStateCounters{pushes_, admissions_, expiries_}, rows_, out);
  for (uint32_t r = 0; r < rows_; ++r) {
    char* row = RowAt(r);
    AppendTableStateRow(Header(row)->key, Header(row)->last_step,
                        absl::Span<const float>(Floats(row), static_cast<size_t>(stride_)), out);
  }
  AppendCandidatesLocked(out);
}

void SparseTable::MarkLocked(int64_t checkpoint_id) {
  auto it = std::find_if(marks_.begin(), marks_.end(),
                         [&](const Mark& mark) { return mark.checkpoint_id == checkpoint_id; });
  if (it != marks_.end()) marks_.erase(it);  // taken again: the new capture counts
  if (marks_.size() == kMaxCheckpointMarks) marks_.erase(marks_.begin());
  marks_.push_back(Mark{checkpoint_id, generation_});
  ++generation_;
}

void SparseTable::MarkCheckpoint(int64_t checkpoint_id) {
  MutexLock lock(&mu_);
  MarkLocked(checkpoint_id);
}

int64_t SparseTable::AppendCheckpointState(int64_t checkpoint_id, int64_t base, bool base_is_stored_here,
                                           std::string* out) {
  // First the mark (exclusive, brief): rows that change from here on are of
  // a later generation than this checkpoint's.
  std::optional<uint32_t> since;
  {
    MutexLock lock(&mu_);
    for (const Mark& m : marks_) {
      if (base > 0 && base_is_stored_here && m.checkpoint_id == base) since = m.generation;
    }
    MarkLocked(checkpoint_id);
  }
  ReaderMutexLock lock(&mu_);
  if (!since.has_value()) {
    AppendStateLocked(out);
    return 0;
  }
  size_t changed = 0;
  for (uint32_t r = 0; r < rows_; ++r) changed += GenAt(r) > *since ? 1 : 0;
  // Changes that would take no fewer bytes than the whole state (nearly
  // every row changed) are stored whole: no larger, and a chain that ends
  // here is one state to load.
  const size_t row_floats = static_cast<size_t>(stride_) * sizeof(float);
  const size_t whole_bytes = 36 + static_cast<size_t>(rows_) * (16 + row_floats);
  const size_t delta_bytes = 48 + static_cast<size_t>(rows_) * 9 + changed * (8 + row_floats);
  if (delta_bytes >= whole_bytes) {
    AppendStateLocked(out);
    return 0;
  }
  out->reserve(out->size() + delta_bytes + candidates_.size() * 20);
  AppendTableDeltaHeader(base, stride_, TableStateCounters{pushes_, admissions_, expiries_}, rows_, out);
  for (uint32_t r = 0; r < rows_; ++r) {
    char* row = RowAt(r);
    if (GenAt(r) > *since) {
      AppendTableDeltaRow(Header(row)->key, Header(row)->last_step,
                          absl::Span<const float>(Floats(row), static_cast<size_t>(stride_)), out);
    } else {
      AppendTableDeltaSame(Header(row)->key, out);
    }
  }
  AppendCandidatesLocked(out);
  return base;
}

absl::Status SparseTable::LoadState(absl::string_view bytes) {
  MutexLock lock(&mu_);
  if (rows_ != 0 || !candidates_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("table ", config_.name, " already holds rows"));
  }
  absl::Status loaded = LoadStateLocked(bytes);
  if (!loaded.ok()) ClearLocked();
  return loaded;
}

absl::Status SparseTable::LoadStateLocked(absl::string_view bytes) {
  marks_.clear();  // what it held is gone: no capture of it is a base any longer
  auto bad = [this](const std::string& what) {
    return absl::DataLossError(absl::StrCat("table ", config_.name, " state: ", what));
  };
  TableStateVisitor visit;
  visit.begin = [&](uint64_t rows, const TableStateCounters& counters) {
    mu_.AssertHeld();
    if (rows > static_cast<uint64_t>(kMaxRows)) return bad(absl::StrCat(rows, " rows, more than ", kMaxRows));
    if (config_.memory_budget > 0 &&
        BytesFor(static_cast<int64_t>(rows), SlotsFor(static_cast<int64_t>(rows), kMinIndexSlots), 0) >
            config_.memory_budget) {
      return absl::ResourceExhaustedError(absl::StrCat("table ", config_.name, ": ", rows,
                                                       " rows do not fit its memory budget of ",
                                                       config_.memory_budget, " bytes"));
    }
    pushes_ = counters.pushes;
    admissions_ = counters.admissions;
    expiries_ = counters.expiries;
    return absl::OkStatus();
  };
  // (The callbacks run within this call, under mu_.)
  visit.row = [&](uint64_t key, int64_t last_step, absl::Span<const float> floats) {
    mu_.AssertHeld();
    if (Find(key) >= 0) return bad(absl::StrCat("key ", key, " is listed twice"));
    const uint32_t r = AddRow(key, last_step);
    std::memcpy(Floats(RowAt(r)), floats.data(), floats.size() * sizeof(float));
    GenAt(r) = 0;  // as loaded: older than any capture
    return absl::OkStatus();
  };
  visit.candidate = [&](uint64_t key, int32_t count, int64_t last_step) {
    mu_.AssertHeld();
    if (count < 1 || count >= std::max(1, config_.admit_after)) {
      return bad(absl::StrCat("filter key ", key, " has ", count, " sightings; a count lies in [1, admitAfter ",
                              config_.admit_after, ")"));
    }
    if (Find(key) >= 0 || !candidates_.emplace(key, Sightings{count, last_step}).second) {
      return bad(absl::StrCat("filter key ", key, " is listed twice or also has a row"));
    }
    return absl::OkStatus();
  };
  return ParseTableState(bytes, config_.name, stride_, visit);
}

absl::Status SparseTable::ApplyChanges(absl::string_view changes) {
  MutexLock lock(&mu_);
  auto bad = [this](const std::string& what) {
    return absl::DataLossError(absl::StrCat("table ", config_.name, " changes: ", what));
  };
  absl::StatusOr<int64_t> base = TableStateBase(changes, config_.name);
  if (!base.ok()) return base.status();
  if (*base == 0) return bad("a whole state, not the changes since a checkpoint");
  // First the whole of it is checked against what the table holds.
  absl::flat_hash_set<uint64_t> listed, filtered;
  uint64_t rows = 0;
  TableStateVisitor check;
  check.begin = [&](uint64_t n, const TableStateCounters&) {
    if (n > static_cast<uint64_t>(kMaxRows)) return bad(absl::StrCat(n, " rows, more than ", kMaxRows));
    rows = n;
    listed.reserve(static_cast<size_t>(n));
    return absl::OkStatus();
  };
  // (The callbacks run within ParseTableState, under mu_.)
  check.same = [&](uint64_t key) {
    mu_.AssertHeld();
    if (!listed.insert(key).second) return bad(absl::StrCat("key ", key, " is listed twice"));
    if (Find(key) < 0) return bad(absl::StrCat("the row of key ", key, " is said to be unchanged; the table has none"));
    return absl::OkStatus();
  };
  check.row = [&](uint64_t key, int64_t, absl::Span<const float>) {
    if (!listed.insert(key).second) return bad(absl::StrCat("key ", key, " is listed twice"));
    return absl::OkStatus();
  };
  check.candidate = [&](uint64_t key, int32_t count, int64_t) {
    if (count < 1 || count >= std::max(1, config_.admit_after)) {
      return bad(absl::StrCat("filter key ", key, " has ", count, " sightings; a count lies in [1, admitAfter ",
                              config_.admit_after, ")"));
    }
    if (listed.count(key) > 0 || !filtered.insert(key).second) {
      return bad(absl::StrCat("filter key ", key, " is listed twice or also has a row"));
    }
    return absl::OkStatus();
  };
  if (absl::Status checked = ParseTableState(changes, config_.name, stride_, check); !checked.ok()) return checked;
  if (config_.memory_budget > 0) {
    const int64_t needed =
        BytesFor(static_cast<int64_t>(rows), SlotsFor(static_cast<int64_t>(rows), index_.size()),
                 CandidateSlotsFor(filtered.size(), 0));
    if (needed > config_.memory_budget) {
      return absl::ResourceExhaustedError(absl::StrCat("table ", config_.name, ": ", rows,
                                                       " rows do not fit its memory budget of ",
                                                       config_.memory_budget, " bytes"));
    }
  }
  // Then applied: rows not listed go (from the end, as Expire), the
  // changed ones are written, the filter counts replaced.
  for (uint32_t r = rows_; r-- > 0;) {
    if (listed.count(Header(RowAt(r))->key) == 0) RemoveRow(r);
  }
  candidates_ = {};
  TableStateVisitor apply;
  apply.begin = [&](uint64_t, const TableStateCounters& counters) {
    mu_.AssertHeld();
    pushes_ = counters.pushes;
    admissions_ = counters.admissions;
    expiries_ = counters.expiries;
    return absl::OkStatus();
  };
  apply.same = [](uint64_t) { return absl::OkStatus(); };
  apply.row = [&](uint64_t key, int64_t last_step, absl::Span<const float> floats) {
    mu_.AssertHeld();
    int64_t r = Find(key);
    if (r < 0) r = AddRow(key, last_step);
    char* row = RowAt(static_cast<uint32_t>(r));
    Header(row)->last_step = last_step;
    std::memcpy(Floats(row), floats.data(), floats.size() * sizeof(float));
    GenAt(static_cast<uint32_t>(r)) = 0;
    return absl::OkStatus();
  };
  apply.candidate = [&](uint64_t key, int32_t count, int64_t last_step) {
    mu_.AssertHeld();
    candidates_.emplace(key, Sightings{count, last_step});
    return absl::OkStatus();
  };
  marks_.clear();
  return ParseTableState(changes, config_.name, stride_, apply);  // checked above: cannot fail
}

void SparseTable::Clear() {
  MutexLock lock(&mu_);
  ClearLocked();
}

void SparseTable::ClearLocked() {
  blocks_.clear();
  gens_.clear();
  first_block_rows_ = 0;
  marks_.clear();
  rows_ = 0;
  index_.assign(kMinIndexSlots, 0);
  candidates_ = {};
  pushes_ = 0;
  admissions_ = 0;
  expiries_ = 0;
}

void SparseTable::ForEachRow(const std::function<void(uint64_t key, absl::Span<const float> values)>& row) const {
  ReaderMutexLock lock(&mu_);
  for (uint32_t r = 0; r < rows_; ++r) {
    char* at = RowAt(r);
    row(Header(at)->key, absl::Span<const float>(Floats(at), static_cast<size_t>(config_.dim)));
  }
}

int64_t SparseTable::rows() const {
  ReaderMutexLock lock(&mu_);
  return rows_;
}

int64_t SparseTable::bytes() const {
  ReaderMutexLock lock(&mu_);
  return BytesLocked();
}

int64_t SparseTable::admissions() const {
  ReaderMutexLock lock(&mu_);
  return admissions_;
}

int64_t SparseTable::LongestProbe() const {
  ReaderMutexLock lock(&mu_);
  const size_t mask = index_.size() - 1;
  size_t longest = 0;
  for (uint32_t r = 0; r < rows_; ++r) {
    const uint64_t key = Header(RowAt(r))->key;
    longest = std::max(longest, (Probe(key) - Home(IndexHash(key), mask)) & mask);
  }
  return static_cast<int64_t>(longest);
}

int64_t SparseTable::expiries() const {
  ReaderMutexLock lock(&mu_);
  return expiries_;
}

}  // namespace fulcrum
