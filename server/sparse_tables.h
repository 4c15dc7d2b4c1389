// The sparse tables of one job on one server: a SparseShard for each shard
// whose buckets this server holds (as its primary or as a backup). Shards are
// independent: each gathers and applies its own synchronous steps, counts
// its own pushes, expires its own rows, so a server holding two shards is
// two replicas side by side, and a shard copied here from another replica
// while the job runs (AddShard) joins the others without touching them.
// Requests name their shard (pushes) or are split by it (pulls).
#ifndef FULCRUM_SERVER_SPARSE_TABLES_H_
#define FULCRUM_SERVER_SPARSE_TABLES_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/sync.h"
#include "server/sparse_shard.h"

namespace fulcrum {

// Thread-safe.
class SparseTables {
 public:
  // SparseShard::Create's checks and errors, for each shard of
  // `held_shards` that holds buckets.
  static absl::StatusOr<std::unique_ptr<SparseTables>> Create(std::vector<SparseTableSetup> tables,
                                                              const std::set<int32_t>& held_shards,
                                                              int32_t num_partitions,
                                                              std::function<int64_t()> room = nullptr);

  int32_t num_tables() const { return static_cast<int32_t>(tables_.size()); }
  int32_t dim(int32_t table) const;
  bool has_synchronous() const { return has_sync_; }
  bool has_asynchronous() const { return has_async_; }

  // Whether this server holds shard `shard`'s tables now.
  bool Holds(int32_t shard) const;
  // The one shard whose buckets this server holds (a push that names none
  // is of it); INVALID_ARGUMENT when it holds several or none.
  absl::StatusOr<int32_t> OnlyShard() const;

  // As SparseShard's, keys split by shard: ABORTED naming the key for a key
  // of a shard not held here.
  absl::Status Pull(int32_t table, absl::Span<const uint64_t> keys, float* out) const;
  absl::Status PullAtStep(int32_t table, absl::Span<const uint64_t> keys, int64_t step, float* out) const;
  // To the push's shard (args.shard, which must be set): UNAVAILABLE when
  // this server does not hold it now (the caller has checked the role).
  absl::Status Validate(const SparsePushArgs& args) const;
  absl::StatusOr<SparsePushOutcome> Push(const SparsePushArgs& args);

  // Checkpoints: every held shard's (see SparseShard), or with `shards`
  // those of them only (the caller arms and takes the same ones).
  std::vector<std::pair<int32_t, ChunkSnapshot>> Capture() const;
  absl::Status ArmCapture(int64_t checkpoint_id, int64_t at_step, const IncrementalBase& base = {},
                          const std::set<int32_t>* shards = nullptr);
  absl::StatusOr<std::vector<std::pair<int32_t, ChunkSnapshot>>> TakeCapture(
      int64_t checkpoint_id, absl::Time deadline, const std::set<int32_t>* shards = nullptr);
  void Disarm(int64_t checkpoint_id);
  absl::StatusOr<ChunkSnapshot> CaptureBucket(int32_t chunk_id) const;
  absl::StatusOr<ChunkSnapshot> CaptureShardState(int32_t shard) const;
  std::vector<int32_t> chunk_ids() const;
  absl::Status Restore(int32_t chunk_id, const ChunkSnapshot& snapshot,
                       std::optional<int64_t> repartitioned_at = std::nullopt);
  // SparseShard's, on the shard holding the bucket (INVALID_ARGUMENT for
  // none).
  absl::Status ApplyRestoredChanges(int32_t chunk_id, const std::string& changes);
  void MarkRestored(int32_t chunk_id, int64_t checkpoint_id);

  // A shard copied from another replica: NewShard makes it empty, aside
  // (to be filled by SparseShard::AdoptBucket and AdoptShardState), AddShard
  // puts it beside the others. FAILED_PRECONDITION for a shard held already
  // or one holding no bucket.
  absl::StatusOr<std::unique_ptr<SparseShard>> NewShard(int32_t shard) const;
  // Whether any bucket of the job's tables is on `shard`.
  bool HasBuckets(int32_t shard) const;
  absl::Status AddShard(int32_t shard, std::unique_ptr<SparseShard> tables);
  // The shards restored aside are installed (their rows count in the
  // store's bytes from now on, no longer beside them).
  void Installed();
  // Takes out the shards not in `keep` (those this server was taken out of:
  // they miss the shard's pushes from then on, so a later return copies
  // them again). Returns them, for the caller to freeze (for a request
  // still holding one: Freeze waits for a push in progress) and free
  // outside its locks.
  std::vector<std::shared_ptr<SparseShard>> DropShardsExcept(const std::set<int32_t>& keep);
  // Takes out the shards in `drop` (stale copies), likewise.
  std::vector<std::shared_ptr<SparseShard>> DropShards(const std::set<int32_t>& drop);

  void Freeze(const std::string& reason);
  std::vector<SparseTableStats> Stats() const;
  int64_t bytes() const;

 private:
  SparseTables(std::vector<SparseTableSetup> tables, int32_t num_partitions, std::function<int64_t()> room);
  // The shard of a key of table `table`, and the held SparseShard of a shard
  // (null when not held).
  int32_t ShardOfKey(int32_t table, uint64_t key) const;
  std::shared_ptr<SparseShard> Find(int32_t shard) const;
  // Every held shard's, or those of `shards` (null: every one).
  std::vector<std::shared_ptr<SparseShard>> All(const std::set<int32_t>* shards = nullptr) const;
  // Why a push to a shard not held here is refused: INVALID_ARGUMENT for a
  // shard of no bucket, UNAVAILABLE (retry) for one being copied here.
  absl::Status NotHeld(int32_t shard) const;
  // Pull or PullAtStep over the keys' shards.
  absl::Status PullSplit(int32_t table, absl::Span<const uint64_t> keys, float* out,
                         const std::function<absl::Status(SparseShard&, absl::Span<const uint64_t>, float*)>& pull) const;

  const std::vector<SparseTableSetup> tables_;
  const int32_t num_partitions_;
  const std::function<int64_t()> room_;
  const bool has_sync_;
  const bool has_async_;
  // What shards built aside (restored or copied) hold before they are
  // counted in bytes(): their room is the budget's less this.
  std::shared_ptr<std::atomic<int64_t>> aside_ = std::make_shared<std::atomic<int64_t>>(0);
  mutable Mutex mu_;  // guards shards_ (the SparseShards lock themselves)
  // Shared: a request still holding one that is dropped finishes with it.
  std::map<int32_t, std::shared_ptr<SparseShard>> shards_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_SPARSE_TABLES_H_
