// A sparse embedding table as a parameter server holds it: uint64 keys to
// rows of `dim` floats with per-row optimizer state. Rows are created when a
// key is first pushed (after `admit_after` sightings with a frequency
// filter), start from a per-key deterministic initializer (so every server
// that ever holds a key starts it from the same values), and are dropped when
// not pushed for `expire_after` steps. Keys without a row read as their
// initial values. No gRPC here.
//
// Storage is an open-addressing index (linear probing; 32-bit entries of a
// row number and 6 bits of the key's hash) over rows kept in blocks of 256
// KiB, each row its key, the step it was last pushed, its values and its
// optimizer state, side by side, and beside each block the generation of
// each row (what changed since a checkpoint): about 8 + 8 + 4 + 5 bytes of
// overhead a row beside its values and state. The first block starts at 16
// rows and doubles (its rows move) until it is whole, so a small bucket
// takes what its rows take; after it, rows never move as the table grows.
#ifndef FULCRUM_SERVER_SPARSE_TABLE_H_
#define FULCRUM_SERVER_SPARSE_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/param_init.h"
#include "common/sync.h"

namespace fulcrum {

enum class SparseOptimizerKind { kSgd, kAdagrad, kFtrl, kAdam };

// The per-row rules (g: the row's summed gradient of one push):
//   SGD:     w -= lr * g                                   (PyTorch SGD, sparse)
//   Adagrad: s += g*g; w -= lr * (g / (sqrt(s) + eps))     (PyTorch Adagrad, sparse)
//   FTRL:    FTRL-proximal (McMahan et al. 2013) per coordinate, alpha = lr:
//            sigma = (sqrt(n + g*g) - sqrt(n)) / lr; z += g - sigma * w; n += g*g;
//            w = |z| <= l1 ? 0 : -(z - sign(z) * l1) / ((beta + sqrt(n)) / lr + l2)
//   Adam:    lazy (PyTorch SparseAdam): only the pushed rows' moments move;
//            the table counts its pushes as the bias-correction step t:
//            dm = (g - m) * (1 - b1); m += dm; v += (g*g - v) * (1 - b2);
//            w -= (lr * sqrt(1 - b2^t) / (1 - b1^t)) * (m / (sqrt(v) + eps)),
//            the step size computed in double and rounded once
struct SparseOptimizerConfig {
  SparseOptimizerKind kind = SparseOptimizerKind::kSgd;
  float lr = 0.01f;
  float epsilon = 1e-10f;           // Adagrad, Adam
  float initial_accumulator = 0;    // Adagrad
  float beta1 = 0.9f, beta2 = 0.999f;  // Adam
  float l1 = 0, l2 = 0, beta = 1;   // FTRL
};

// Float state arrays a row carries beside its values (Adagrad: s; FTRL: z, n;
// Adam: m, v).
int SparseStateSlots(SparseOptimizerKind kind);

struct SparseTableConfig {
  std::string name;
  int32_t dim = 0;
  SparseOptimizerConfig optimizer;
  InitKind init = InitKind::kZeros;  // FTRL: zeros only (its weights follow from z and n)
  float init_scale = 0;
  uint64_t seed = 0;
  // Which table of the job (the initializer's stream).
  uint32_t table_index = 0;
  // Frequency filter: a key gets a row at its admit_after-th push (0 or 1:
  // at its first); the gradients of the pushes before are dropped.
  int32_t admit_after = 0;
  // Rows not pushed for this many steps are dropped by Expire (0: never).
  int64_t expire_after = 0;
  // What rows, index and filter counts may take together (0: no limit).
  int64_t memory_budget = 0;
};

// INVALID_ARGUMENT naming the table and the field for a config the table
// cannot run: dim outside [1, 65536], a negative or non-finite
// hyperparameter, betas outside [0, 1), FTRL with a non-zero initializer.
absl::Status ValidateSparseTableConfig(const SparseTableConfig& config);

class SparseTable {
 public:
  // Rows one table holds on one server at most (row numbers take 26 bits of
  // an index entry).
  static constexpr int64_t kMaxRows = (int64_t{1} << 26) - 2;

  static absl::StatusOr<std::unique_ptr<SparseTable>> Create(SparseTableConfig config);
  // What bytes() says of a table without rows.
  static int64_t EmptyBytes();

  // Writes the rows of `keys` to out (keys.size() x dim floats, in order):
  // the stored row, or the key's initial values for a key without one.
  void Pull(absl::Span<const uint64_t> keys, float* out) const;

  // Applies one push at `step`: grads holds keys.size() x dim floats, one
  // summed gradient row per key. All or nothing: INVALID_ARGUMENT for a key
  // listed twice or a non-finite gradient (naming the key and element), and
  // RESOURCE_EXHAUSTED naming the table when the rows it would create do not
  // fit the memory budget.
  absl::Status Push(int64_t step, absl::Span<const uint64_t> keys, const float* grads);
  // The check of Push without the push: the bytes (as bytes() counts them)
  // the table would hold after Push(keys, grads), or the error Push would
  // return now.
  absl::StatusOr<int64_t> BytesAfterPush(absl::Span<const uint64_t> keys, const float* grads) const;

  // Push in parts, for a caller that serializes its pushes to this table
  // (server/sparse_shard.cc) and checks a push whole before applying any of
  // it. CheckPush: the push's own faults (non-finite gradients, a key listed
  // twice). BytesAfterCheckedPush: BytesAfterPush after CheckPush passed.
  // BytesAfterAtMost: what bytes() could be at most after a push of
  // `keys` new keys (every one a row or a filter count), without looking at
  // them. PushChecked: Push after CheckPush passed (the row limit is still
  // checked).
  absl::Status CheckPush(absl::Span<const uint64_t> keys, const float* grads) const;
  absl::StatusOr<int64_t> BytesAfterCheckedPush(absl::Span<const uint64_t> keys) const;
  int64_t BytesAfterAtMost(size_t keys) const;
  absl::Status PushChecked(int64_t step, absl::Span<const uint64_t> keys, const float* grads);

  // Drops the rows last pushed before `now` - expire_after (nothing when
  // expire_after is 0) and filter counts of keys not seen since; returns the
  // rows dropped. With `keys` and `values`, appends each dropped row's key
  // and its dim values (as Pull read them).
  int64_t Expire(int64_t now, std::vector<uint64_t>* keys = nullptr, std::vector<float>* values = nullptr);

  // The table's whole state as bytes (checkpoints): every row's key, last
  // pushed step, values and optimizer state, the frequency filter's counts
  // and the counters, laid out as common/table_state.h says.
  void AppendState(std::string* out) const;
  // AppendState as checkpoint `checkpoint_id` of the job (> 0) takes it:
  // only what changed since checkpoint `base` (> 0), as an incremental
  // state (common/table_state.h), when `base_is_stored_here` (the caller
  // knows the committed copy of `base` is what this table captured or was
  // loaded from then) and the table took or loaded `base` as one of its last
  // kMaxCheckpointMarks checkpoints and loaded or cleared nothing since,
  // and the changes take fewer bytes than the whole state would (not when
  // nearly every row changed); otherwise the whole state. Returns the base
  // of what it wrote (0: whole). Remembers the checkpoint as a base for the next ones. Rows are
  // read under the shared lock (pulls go on); a push that lands meanwhile is
  // in the next checkpoint's changes whether or not this one saw it.
  int64_t AppendCheckpointState(int64_t checkpoint_id, int64_t base, bool base_is_stored_here, std::string* out);
  // Says that the table holds what checkpoint `checkpoint_id` of the job
  // holds (it was just loaded from it), so later checkpoints may be
  // incremental on it.
  void MarkCheckpoint(int64_t checkpoint_id);
  static constexpr size_t kMaxCheckpointMarks = 8;

  // Puts AppendState's bytes back into this table, which must be empty
  // (FAILED_PRECONDITION otherwise). DATA_LOSS naming the table for bytes
  // that are truncated or trailing, of another row width, with a key twice,
  // a non-finite float or more than kMaxRows rows; RESOURCE_EXHAUSTED when
  // they do not fit the memory budget. On error the table stays empty.
  absl::Status LoadState(absl::string_view bytes);

  // Turns what this table holds, the state of the checkpoint an
  // incremental state `changes` is on (common/table_state.h), into the state
  // `changes` says: rows it does not list are dropped, changed ones take
  // their values, filter counts and counters are replaced. Checked whole
  // before anything changes: DATA_LOSS naming the table for bytes that are
  // malformed, a key listed twice, a row said to be unchanged that the
  // table does not hold; RESOURCE_EXHAUSTED when the result does not fit
  // the memory budget. Later checkpoints are incremental on none before.
  absl::Status ApplyChanges(absl::string_view changes);

  // Drops every row, filter count and counter.
  void Clear();

  // Calls `row(key, values)` for every row, in no particular order.
  void ForEachRow(const std::function<void(uint64_t key, absl::Span<const float> values)>& row) const;

  const SparseTableConfig& config() const { return config_; }
  int64_t rows() const;
  // Bytes held for rows, index and filter counts.
  int64_t bytes() const;
  // A row's values and optimizer state, the bytes that must be kept at least.
  int64_t raw_row_bytes() const { return static_cast<int64_t>(stride_) * 4; }
  int64_t admissions() const;
  int64_t expiries() const;
  // The most index slots a lookup of a held key passes before its own:
  // short (a few) for any keys, since the index hashes keys with a seed of
  // its own, drawn when the table is made (keys chosen to share one probe
  // sequence would make every lookup walk them all).
  int64_t LongestProbe() const;

 private:
  explicit SparseTable(SparseTableConfig config);

  // Row r: its header and floats (values, then the state slots).
  struct RowHeader {
    uint64_t key;
    int64_t last_step;
  };
  char* RowAt(uint32_t r) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The capture generation in which row r last changed (see gens_).
  uint32_t& GenAt(uint32_t r) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  static float* Floats(char* row) { return reinterpret_cast<float*>(row + sizeof(RowHeader)); }
  static RowHeader* Header(char* row) { return reinterpret_cast<RowHeader*>(row); }
  // The index slot holding `key` (whose IndexHash is `hash`), or the
  // empty slot where it would go.
  size_t Probe(uint64_t key) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  size_t Probe(uint64_t key, uint64_t hash) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Row number of `key` (-1: none).
  int64_t Find(uint64_t key) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int64_t Find(uint64_t key, uint64_t hash) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Looking keys up one after another, at random places in memory: the
  // memory is asked early for what the lookups of the keys ahead will read,
  // so that the latencies overlap instead of adding up. Begin with
  // StartLookups, then call NextLookup(keys, i, ...) before looking up
  // keys[i], for i = 0, 1, ... in order: it returns keys[i]'s hash. Each
  // key is hashed once.
  static constexpr size_t kLookAhead = 16;
  struct Lookups {
    uint64_t hashes[kLookAhead];  // of keys[i], ..., keys[i + kLookAhead - 1], by i % kLookAhead
    size_t row_prefix;            // the bytes of a row the lookups read
    bool gens;                    // whether they write its generation
  };
  void StartLookups(absl::Span<const uint64_t> keys, size_t row_prefix, bool gens, Lookups* lookups) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint64_t NextLookup(absl::Span<const uint64_t> keys, size_t i, Lookups* lookups) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint32_t AddRow(uint64_t key, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveRow(uint32_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void GrowIndex() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // LoadState's parse into this (empty) table, leaving it partly filled on error.
  absl::Status LoadStateLocked(absl::string_view bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Back to no rows, no filter counts, no counters.
  void ClearLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The key's initial values and state into a row's floats.
  void InitRow(uint64_t key, float* row) const;
  void InitValues(uint64_t key, float* values) const;
  void Apply(float* row, const float* g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the rows and filter counts the push adds fit the table.
  absl::Status CheckRoomLocked(absl::Span<const uint64_t> keys) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // What a push of `keys` adds: rows (keys admitted now) and filter counts.
  struct Growth {
    int64_t rows = 0;
    int64_t candidates = 0;
  };
  Growth GrowthLocked(absl::Span<const uint64_t> keys) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int64_t BytesAfterLocked(const Growth& growth) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // What `rows` rows, an index of `index_slots` and a filter-count map of
  // `candidate_slots` take.
  int64_t BytesFor(int64_t rows, size_t index_slots, size_t candidate_slots) const;
  size_t rows_per_block_ = 1;  // a power of two
  int block_shift_ = 0;
  // The rows blocks of `rows` rows hold: a first block grows by doubling
  // (from kFirstBlockRows), the others are whole.
  size_t CapacityFor(int64_t rows) const;
  // Makes the first block hold at least `rows` rows (moving its rows).
  void GrowFirstBlock(size_t rows) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t BytesLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const SparseTableConfig config_;
  const int slots_;      // optimizer state arrays
  const int stride_;     // floats a row: dim * (1 + slots_)
  const size_t row_bytes_;
  const uint64_t init_key_;  // the initializer's stream for this table
  // The index's hash of a key: SplitMix64 of the key and a random seed of
  // this table's (the same keys lie elsewhere in every table and process).
  uint64_t IndexHash(uint64_t key) const { return SplitMix64(key ^ index_seed_); }
  const uint64_t index_seed_;

  mutable Mutex mu_;
  // rows_per_block_ rows each, but the first: first_block_rows_ (a power
  // of two, growing as rows come; 0 with no block).
  std::vector<std::unique_ptr<char[]>> blocks_ ABSL_GUARDED_BY(mu_);
  size_t first_block_rows_ ABSL_GUARDED_BY(mu_) = 0;
  // Beside each block, the generation of each of its rows: the value of
  // generation_ when the row was last pushed (or created); 0 for rows as
  // loaded. A checkpoint capture records generation_ and then advances it,
  // so the rows changed since that capture are those of a later generation.
  std::vector<std::unique_ptr<uint32_t[]>> gens_ ABSL_GUARDED_BY(mu_);
  uint32_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  // The last checkpoints captured or loaded, each with its generation.
  struct Mark {
    int64_t checkpoint_id;
    uint32_t generation;
  };
  std::vector<Mark> marks_ ABSL_GUARDED_BY(mu_);
  void AppendStateLocked(std::string* out) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The filter counts, as whole and incremental states end with them.
  void AppendCandidatesLocked(std::string* out) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Records checkpoint `checkpoint_id` at the current generation.
  void MarkLocked(int64_t checkpoint_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t rows_ ABSL_GUARDED_BY(mu_) = 0;
  // Row number + 1 by slot (0: empty); a power of two, at most 3/4 full.
  std::vector<uint32_t> index_ ABSL_GUARDED_BY(mu_);
  // Frequency filter: pushes seen of keys without a row, and the step of the last.
  struct Sightings {
    int32_t count;
    int64_t last_step;
  };
  absl::flat_hash_map<uint64_t, Sightings> candidates_ ABSL_GUARDED_BY(mu_);
  int64_t pushes_ ABSL_GUARDED_BY(mu_) = 0;  // Adam's bias-correction step
  int64_t admissions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t expiries_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_SPARSE_TABLE_H_
