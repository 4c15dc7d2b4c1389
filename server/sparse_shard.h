// The sparse tables of one job on one server. A table's keys hash into a
// fixed number of buckets (common/shard_map.h BucketOf), each bucket lives on
// one shard, and this server keeps a SparseTable for every bucket of the
// shards it holds. Pulls and pushes name keys; each key goes to its bucket.
// No gRPC here (server/parameter_service_sparse.cc is the edge).
//
// Consistency, per table:
//  - asynchronous (ASP and SSP jobs; ASYNC tables of a BSP job): a push is
//    applied when it arrives;
//  - synchronous (a BSP job's tables): a push is gathered until every data
//    partition's step is whole here (all its parts in), then the step's
//    gradients are summed per key in partition order (never arrival order),
//    divided by the partitions, and applied once, keys ascending; so a BSP
//    job is bit-for-bit the same whichever worker computes which partition.
//    A pull may name its step: the rows that step reads, also once the step
//    was applied (a re-run of a partition's step after a worker died reads
//    what the first run read).
// Pushes come per shard (a server may hold buckets of several: as primary of
// one and backup of another), numbered in parts per (partition, step,
// shard). Each part is applied at most once: a repeat of (partition, step,
// shard, part), or a push of an older step than the partition's last to
// that shard (synchronous: than the step being gathered), is acknowledged
// as a duplicate. So every replica of a shard, whoever forwards to it,
// applies the same pushes, and a worker that sends a step again after a
// failover numbers its parts as before.
#ifndef FULCRUM_SERVER_SPARSE_SHARD_H_
#define FULCRUM_SERVER_SPARSE_SHARD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/sync.h"
#include "server/chunk_snapshot.h"
#include "server/sparse_table.h"

namespace fulcrum {

// One table of a job: its settings and where its buckets live.
struct SparseTableSetup {
  SparseTableConfig config;              // memory_budget unused: the shard's budget counts
  std::vector<int32_t> bucket_shards;    // the shard of each bucket (the table's bucket count)
  bool synchronous = false;              // BSP: pushes gathered per step (see above)
};

// The rows one push names in one table: keys.size() x dim gradient floats.
struct SparseRows {
  int32_t table = 0;
  absl::Span<const uint64_t> keys;
  const float* grads = nullptr;
};

struct SparsePushArgs {
  int32_t partition = 0;
  int64_t step = 0;
  // The shard every key is in; -1: not said (allowed where this server
  // holds buckets of one shard only, which it then is).
  int32_t shard = -1;
  int32_t part = 0;  // which of the step's requests to this shard
  // How many requests the partition's step sends this shard, in [1,
  // kMaxPushParts] (synchronous tables: its step is whole here once all
  // parts of every shard holding buckets here are in); 0: not said
  // (refused when a table is synchronous).
  int32_t parts = 0;
  std::vector<SparseRows> tables;
};

enum class SparsePushOutcome { kApplied, kDuplicate };

// What a checkpoint's bucket captures may be incremental on: an earlier
// checkpoint of the job, and the buckets that may build on it here (the
// scheduler lists those whose every replica holds the committed copy of
// the base; SparseTable::AppendCheckpointState decides whether each still
// can).
struct IncrementalBase {
  int64_t checkpoint_id = 0;  // 0: none, every capture whole
  std::set<int32_t> chunks;   // bucket chunk ids (TableChunkId)
};

// What a table of the job holds on this server, summed over its buckets.
struct SparseTableStats {
  std::string name;
  int64_t rows = 0;
  int64_t bytes = 0;
  int64_t admissions = 0;
  int64_t expiries = 0;
};

// Thread-safe. Pulls run in parallel with each other and with pushes (but
// PullAtStep of a synchronous table, which waits for a push or a capture in
// progress); pushes run one at a time (a push is checked whole before any of
// it is applied).
class SparseShard {
 public:
  // Tables for the buckets of `held_shards`. INVALID_ARGUMENT for a table
  // config the tables refuse, more than kMaxTables tables, or a bucket shard
  // list that is empty or longer than kMaxTableBuckets. `num_partitions`:
  // the job's data partitions. `room` (null: no limit) says how many more
  // bytes the tables may take now (what the server's budget has left); a
  // push that would grow them by more is refused.
  // `aside` (null: its own) counts what restores and copies load, with
  // other shards built aside with it.
  static absl::StatusOr<std::unique_ptr<SparseShard>> Create(
      std::vector<SparseTableSetup> tables, const std::set<int32_t>& held_shards, int32_t num_partitions,
      std::function<int64_t()> room = nullptr, std::shared_ptr<std::atomic<int64_t>> aside = nullptr);

  // What the tables of `held_shards` take before any row (setups count it
  // against the server's budget).
  static int64_t EmptyBytes(const std::vector<SparseTableSetup>& tables, const std::set<int32_t>& held_shards);

  int32_t num_tables() const { return static_cast<int32_t>(tables_.size()); }
  // The width of table `table`'s rows (0 for a table that does not exist).
  int32_t dim(int32_t table) const;

  // Writes the rows of `keys` of table `table` to `out` (keys.size() x dim
  // floats, every one of them: a key without a row reads as its initial
  // values; `out` may be uninitialized memory). INVALID_ARGUMENT for an unknown table; ABORTED naming the key
  // and its bucket for a key whose bucket this server does not hold (the
  // caller's shard map is not this server's).
  absl::Status Pull(int32_t table, absl::Span<const uint64_t> keys, float* out) const;
  // Pull as partition steps of `step` read a synchronous table (an
  // asynchronous one reads as Pull): before that step's update, also once
  // it is applied (the keys it changed read as they were before it).
  // UNAVAILABLE when the step before it is not applied here yet; ABORTED
  // when `step` is older than the last applied (its rows are gone).
  absl::Status PullAtStep(int32_t table, absl::Span<const uint64_t> keys, int64_t step, float* out) const;

  // The checks of Push that need no state: a primary makes them before it
  // forwards a push to its backups (a bad push reaches no replica).
  absl::Status Validate(const SparsePushArgs& args) const;
  // Applies a push whole or not at all. INVALID_ARGUMENT for a bad
  // partition or table, a key listed twice in a table, a non-finite
  // gradient, no shard named where it must be; ABORTED for a key of a
  // bucket held elsewhere or of another shard than the push names;
  // RESOURCE_EXHAUSTED naming the table when the rows it would add do not
  // fit the budget; FAILED_PRECONDITION once frozen.
  absl::StatusOr<SparsePushOutcome> Push(const SparsePushArgs& args);

  // Checkpoints. Capture: every held bucket's state, taken at once between
  // pushes, by chunk id (TableChunkId); each snapshot's partition_steps say
  // from which step each partition must run again for its pushes to be in
  // (asynchronous: the step after the last one pushed to the bucket's shard
  // once every part of that step is in, else that step, whose parts may
  // still come; never below what the bucket was restored from; synchronous:
  // the step being gathered).
  std::vector<std::pair<int32_t, ChunkSnapshot>> Capture() const;
  // A checkpoint's capture in two halves, as the dense chunks take theirs
  // (server/parameter_store.h): ArmCapture before the dense chunks are
  // waited for, TakeCapture after. The synchronous tables are captured when
  // their applied steps reach `at_step` (0: now); ABORTED when they are past
  // it already. The asynchronous ones are captured by TakeCapture (after the
  // dense cut, so every push of the steps before it is in). `base`: what
  // each bucket's capture may be incremental on (each snapshot's table_base
  // says whether it is). TakeCapture:
  // DEADLINE_EXCEEDED when the synchronous tables did not reach the step by
  // `deadline`; ABORTED when another capture was armed since. Disarm drops
  // an armed capture.
  absl::Status ArmCapture(int64_t checkpoint_id, int64_t at_step, IncrementalBase base = {});
  absl::StatusOr<std::vector<std::pair<int32_t, ChunkSnapshot>>> TakeCapture(int64_t checkpoint_id,
                                                                            absl::Time deadline);
  void Disarm(int64_t checkpoint_id);
  // One held bucket's state, as Capture takes it. NOT_FOUND for a chunk id
  // that is no table bucket held here.
  absl::StatusOr<ChunkSnapshot> CaptureBucket(int32_t chunk_id) const;
  // The chunk ids of the buckets held here, ascending.
  std::vector<int32_t> chunk_ids() const;
  // Puts a captured bucket back into this (fresh) shard; its partition steps
  // (or, for a job restored onto another number of partitions, `repartitioned_at`
  // for every partition) become the floor of the next captures'. Pushes to
  // the bucket of a partition's step before its captured step are skipped
  // (their gradients are in its rows); from the captured step on they
  // apply. So a resumed asynchronous job applies every step once, except a
  // step caught with only some of its parts to a shard in: its parts apply
  // again (at least once, never lost).
  // INVALID_ARGUMENT for a chunk id not held here; the table's LoadState
  // errors; RESOURCE_EXHAUSTED naming the table when the rows do not fit the
  // budget's room. The snapshot's table state must be whole.
  absl::Status Restore(int32_t chunk_id, const ChunkSnapshot& snapshot,
                       std::optional<int64_t> repartitioned_at = std::nullopt);
  // A checkpoint stored as a chain (a whole state and incremental ones on
  // it) is restored link by link: Restore with the whole one (its snapshot's
  // positions those of the checkpoint restored), then ApplyRestoredChanges
  // with each later link's incremental state, oldest first
  // (SparseTable::ApplyChanges's errors; RESOURCE_EXHAUSTED past the
  // budget's room; the bucket emptied on error). Then MarkRestored with the
  // checkpoint's id when it is this job's, so that later checkpoints may be
  // incremental on it.
  absl::Status ApplyRestoredChanges(int32_t chunk_id, const std::string& changes);
  void MarkRestored(int32_t chunk_id, int64_t checkpoint_id);

  // Live copies to a new replica of a shard (a fresh server holding that
  // shard only). The source: CaptureBucket of each of the shard's buckets
  // and CaptureShardState of its bookkeeping (a serialized
  // v1::TableShardState: applied pushes per partition, the step being
  // gathered with the shard's rows, the last step's undo rows, expiry and
  // restore positions). Each capture's table_changes counts the changes of
  // the shard's rows here: a copy is consistent when it did not move from
  // the first capture to the last. NOT_FOUND for a shard not held here.
  absl::StatusOr<ChunkSnapshot> CaptureShardState(int32_t shard) const;
  // The copy: AdoptBucket for each bucket (its state replaces what the
  // bucket held; RESOURCE_EXHAUSTED naming the table past the budget's
  // room), then AdoptShardState, which applies the gathered step at once
  // if every part of it is in. FAILED_PRECONDITION unless this server holds
  // buckets of that one shard only; INVALID_ARGUMENT / DATA_LOSS for a
  // state that does not fit the job.
  absl::Status AdoptBucket(int32_t chunk_id, const std::string& table_state);
  absl::Status AdoptShardState(const std::string& state);
  // The held shards that hold buckets, ascending.
  const std::vector<int32_t>& bucket_shards() const { return bucket_shards_; }
  // The shard of a bucket's chunk id (-1: no bucket held here).
  int32_t ShardOfBucket(int32_t chunk_id) const;

  // Refuses pushes from now on (pulls still answer).
  void Freeze(const std::string& reason);

  // What restores and copies loaded into this shard stops counting in
  // `aside` (Create): the shard is added to the server's tables, whose
  // bytes count it from then on, or thrown away (the destructor does).
  void ReleaseAside();
  ~SparseShard();

  std::vector<SparseTableStats> Stats() const;
  // The tables' bytes, and what synchronous tables hold of the step being
  // gathered and of the step before (for re-runs' pulls).
  int64_t bytes() const;
  bool has_synchronous() const { return has_sync_; }
  bool has_asynchronous() const { return has_async_; }

 private:
  struct Table {
    SparseTableSetup setup;
    // By bucket; null for a bucket held elsewhere.
    std::vector<std::unique_ptr<SparseTable>> buckets;
  };
  SparseShard(std::vector<Table> tables, std::set<int32_t> held_shards, int32_t num_partitions,
              std::function<int64_t()> room, std::shared_ptr<std::atomic<int64_t>> aside);
  // The shards of `held` that hold buckets of `tables`, ascending.
  static std::vector<int32_t> BucketShardsOf(const std::vector<Table>& tables, const std::set<int32_t>& held);

  // The bucket table of `key`; ABORTED when it is not held here.
  absl::StatusOr<SparseTable*> BucketFor(const Table& table, uint64_t key) const;
  absl::Status CheckPushArgs(const SparsePushArgs& args) const;
  // The index in bucket_shards_ of the shard a push names (or implies).
  absl::StatusOr<size_t> SlotOf(int32_t named) const;
  // The bucket table of `key`, checked to be of `shard`; ABORTED when it
  // is not held here or is another shard's.
  absl::StatusOr<SparseTable*> BucketOfShard(const Table& table, uint64_t key, int32_t shard) const;
  // The held bucket of a table chunk id; null when there is none here.
  SparseTable* HeldBucket(int32_t chunk_id) const;
  // By slot, then partition: the step each partition runs again from in the
  // buckets of the slot's shard, for a capture now: the last step pushed
  // there, or the one after it once every part of it is in.
  std::vector<std::vector<int64_t>> CapturePositionsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  // Which checkpoint a capture is of (id 0: a live copy, not a checkpoint),
  // and what it may be incremental on.
  struct CaptureOf {
    int64_t checkpoint_id = 0;
    const IncrementalBase* base = nullptr;
  };
  // A held bucket's state as a checkpoint chunk: at its shard's positions,
  // never below what the bucket was restored from (asynchronous), or at the
  // step being gathered (synchronous).
  ChunkSnapshot SnapshotLocked(const Table& table, int32_t chunk_id, SparseTable& bucket,
                               const std::vector<std::vector<int64_t>>& positions, CaptureOf of) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  // Expires rows of tables with expire_after once the job's step passes the
  // next expiry point.
  // A quarter of the shortest expireAfter of the synchronous (or the
  // asynchronous) tables, at least 1; 0 when none of them expires rows.
  int64_t ExpiryPeriodLocked(bool synchronous) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  // Expires the asynchronous tables' rows once `now` reaches next_expiry_
  // (after a push).
  void MaybeExpireLocked(int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  // Expires the synchronous tables' rows at the boundary of `step`, just
  // applied, when `step` is a multiple of a quarter of their shortest
  // expireAfter: the same steps whichever partition pushed first and across
  // restores, never while a step is half gathered (pulls of the next step
  // read the same rows in every run). The dropped rows join undo_, so a
  // late pull of `step` reads them as they were. Returns the bytes added.
  int64_t ExpireSynchronousLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  // Synchronous tables, once every partition's step is whole: the step's
  // summed gradients, checked (finite, fitting the budget) but not applied;
  // then applied, which cannot fail.
  struct StepPiece {
    int32_t table;
    SparseTable* bucket;
    size_t begin, end;  // its keys in the table's keys
  };
  struct GatheredStep {
    std::vector<std::vector<uint64_t>> keys;  // by table: by bucket, then ascending
    std::vector<std::vector<float>> grads;    // by table: the mean gradient of each key
    std::vector<StepPiece> pieces;
  };
  absl::StatusOr<GatheredStep> SumGatheredStepLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  void ApplyGatheredStepLocked(GatheredStep step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  // The snapshots of the synchronous (or the asynchronous) tables' buckets now.
  void SnapshotTablesLocked(bool synchronous, CaptureOf of, std::vector<std::pair<int32_t, ChunkSnapshot>>* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);

  const std::vector<Table> tables_;
  const std::set<int32_t> held_shards_;
  // The held shards that hold buckets, ascending: the slots of the
  // per-shard bookkeeping below.
  const std::vector<int32_t> bucket_shards_;
  const int32_t num_partitions_;
  const std::function<int64_t()> room_;
  // What restores and copies added to shards built aside (shared by the
  // shards of a job's SparseTables): counted against the room.
  const std::shared_ptr<std::atomic<int64_t>> aside_;
  // What this shard added to aside_ and has not taken back.
  std::atomic<int64_t> aside_added_{0};
  void AddAside(int64_t bytes);
  void ReturnAside(int64_t bytes);  // at most what it added
  const bool has_sync_;   // some table is synchronous
  const bool has_async_;  // some table is asynchronous
  const bool holds_sync_;  // and this server holds buckets of one (else its checkpoints never wait for a step)

  mutable Mutex push_mu_;  // serializes pushes; guards the members below
  // By partition, then slot: the last step applied, which of its parts,
  // and how many parts the step sends the shard (0: not said).
  struct Applied {
    int64_t step = -1;
    std::set<int32_t> parts;
    int32_t expected = 0;
  };
  std::vector<std::vector<Applied>> applied_ ABSL_GUARDED_BY(push_mu_);
  // By partition: the step a restore says it runs again from.
  std::vector<int64_t> restored_ ABSL_GUARDED_BY(push_mu_);
  // By slot: how many times pushes, steps or expiries changed the shard's
  // buckets or bookkeeping (see CaptureShardState).
  std::vector<int64_t> changes_ ABSL_GUARDED_BY(push_mu_);
  // Loads a bucket's state (emptied first), counting its growth against the
  // room with aside_.
  absl::Status LoadBucketLocked(int32_t chunk_id, const std::string& table_state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  // Applies an incremental state to a loaded bucket, counting its growth
  // as LoadBucketLocked does (emptied on error).
  absl::Status ApplyBucketChangesLocked(int32_t chunk_id, const std::string& changes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  // By table, then bucket: per partition, the step from which a restored
  // bucket takes pushes again (the steps before are in its checkpointed
  // rows, replayed by a resumed job: skipped). Null: not restored, or
  // restored onto another number of partitions. Sized by the first restore.
  // The buckets of one capture's shard share their steps, so equal floors
  // are one vector (8192 buckets of 512 partitions: 32 KiB, not 32 MiB).
  using Floor = std::shared_ptr<const std::vector<int64_t>>;
  std::vector<std::vector<Floor>> floors_ ABSL_GUARDED_BY(push_mu_);
  struct FloorHash {
    using is_transparent = void;
    size_t operator()(absl::Span<const int64_t> steps) const;
    size_t operator()(const Floor& floor) const { return (*this)(*floor); }
  };
  struct FloorEq {
    using is_transparent = void;
    bool operator()(absl::Span<const int64_t> a, absl::Span<const int64_t> b) const { return a == b; }
    bool operator()(const Floor& a, const Floor& b) const { return *a == *b; }
    bool operator()(const Floor& a, absl::Span<const int64_t> b) const {
      return absl::Span<const int64_t>(*a) == b;
    }
    bool operator()(absl::Span<const int64_t> a, const Floor& b) const {
      return a == absl::Span<const int64_t>(*b);
    }
  };
  absl::flat_hash_set<Floor, FloorHash, FloorEq> distinct_floors_ ABSL_GUARDED_BY(push_mu_);
  // Sets a restored bucket's floor to `steps`, sharing an equal one.
  void SetFloorLocked(int32_t chunk_id, absl::Span<const int64_t> steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  // The bucket's floor, or nullptr.
  const std::vector<int64_t>* FloorOfLocked(int32_t table, int32_t bucket) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  int64_t now_ ABSL_GUARDED_BY(push_mu_) = 0;          // the highest step applied
  int64_t next_expiry_ ABSL_GUARDED_BY(push_mu_) = 0;  // the step to expire rows again at
  std::string frozen_reason_ ABSL_GUARDED_BY(push_mu_);

  // Synchronous tables. The step being gathered (every step before it is in
  // the rows), and by partition what it pushed of that step.
  int64_t sync_step_ ABSL_GUARDED_BY(push_mu_) = 0;
  struct Gathered {
    int32_t table;
    std::vector<uint64_t> keys;
    std::vector<float> grads;
  };
  struct ShardGather {
    int32_t parts = 0;  // 0: nothing of the step yet
    std::set<int32_t> seen;
  };
  struct PartitionGather {
    std::vector<ShardGather> shards;  // by slot
    int32_t whole_shards = 0;         // slots with every part in
    std::vector<Gathered> rows;
    int64_t bytes = 0;
  };
  std::vector<PartitionGather> gather_ ABSL_GUARDED_BY(push_mu_);
  int32_t whole_partitions_ ABSL_GUARDED_BY(push_mu_) = 0;
  // By table: the keys the step before sync_step_ changed (ascending) and
  // their rows as they were before it.
  struct Undo {
    std::vector<uint64_t> keys;
    std::vector<float> rows;
  };
  std::vector<Undo> undo_ ABSL_GUARDED_BY(push_mu_);
  int64_t undo_step_ ABSL_GUARDED_BY(push_mu_) = -1;  // the step undo_ is of (-1: none)
  // What gather_ and undo_ hold (read without the lock by bytes(), which
  // the room callback may call under it).
  std::atomic<int64_t> held_bytes_{0};
  // An armed checkpoint capture of the synchronous tables.
  struct Armed {
    int64_t checkpoint_id = 0;
    int64_t at_step = 0;
    IncrementalBase base;
    bool taken = false;
    std::vector<std::pair<int32_t, ChunkSnapshot>> snapshots;
  };
  std::optional<Armed> armed_ ABSL_GUARDED_BY(push_mu_);
  CondVar captured_cv_;
};

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_SPARSE_SHARD_H_
