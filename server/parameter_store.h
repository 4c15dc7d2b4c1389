// The parameter server's core: the chunks of every job this server holds,
// their optimizer state, BSP aggregation and push deduplication. No gRPC here;
// server/parameter_service.cc translates the wire protocol onto this.
#ifndef FULCRUM_SERVER_PARAMETER_STORE_H_
#define FULCRUM_SERVER_PARAMETER_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/param_init.h"
#include "common/sync.h"
#include "fulcrum/v1/job.pb.h"
#include "fulcrum/v1/parameter.pb.h"
#include "server/chunk_snapshot.h"
#include "server/lr_schedule.h"
#include "server/optimizer.h"
#include "server/sparse_shard.h"
#include "server/sparse_tables.h"

namespace fulcrum {

// Bounds on what a SetupJob may ask for (the scheduler cuts chunks of at most
// 4 MiB, --chunk-bytes, so that one chunk always fits a message, and has at
// most 1024 data partitions).
constexpr int64_t kMaxChunkElements = int64_t{1} << 20;
constexpr int32_t kMaxPartitions = 1024;

struct ChunkConfig {
  int32_t chunk_id = 0;
  int32_t shard = 0;
  int32_t tensor = 0;
  int64_t offset = 0;
  int64_t length = 0;
  InitKind init = InitKind::kZeros;
  float init_scale = 0;
};

struct JobShardConfig {
  std::string job_id;
  std::string server_id;  // this server's member id (replication roles)
  OptimizerConfig optimizer;
  float lr = 0;
  LrScheduleConfig schedule;
  bool synchronous = true;  // BSP; false = ASP
  int32_t num_partitions = 1;  // BSP: one gradient per partition and step
  uint64_t seed = 0;
  std::vector<ChunkConfig> chunks;
  // Sparse tables: every table of the job, and the shards whose buckets
  // this server holds; how many more bytes they may take now (null: no
  // limit; see SparseShard::Create).
  std::vector<SparseTableSetup> tables;
  std::set<int32_t> table_shards;
  std::function<int64_t()> tables_room;
  // Called with the seconds each optimizer apply took (metrics); may be empty.
  std::function<void(double)> observe_apply;
  // Called (under the chunk's lock: it must not block) whenever a chunk's
  // values change or the job is dropped or frozen: held pulls re-check.
  std::function<void()> on_change;
  // The bytes of values the chunks let go of while pull answers still send
  // them (ValuesLease): memory no chunk counts, which the server bounds with
  // the answers it has in flight. Null: not counted.
  std::shared_ptr<std::atomic<int64_t>> orphaned_values;
};

struct PushArgs {
  std::string worker_id;
  int32_t partition = 0;
  int64_t seq = 0;
  int64_t step = 0;
  int32_t chunk_id = 0;
  absl::string_view gradient;  // little-endian values in `format`
  v1::WireFormat format = v1::WIRE_FP32;
  // The gradient already decoded (the chunk's length of floats; `gradient`
  // is then unused), when the caller decoded it: Validate checks these
  // values, and Push, given values Validate accepted, decodes nothing.
  const float* values = nullptr;
  // The training examples behind the gradient: how many, and the sum of
  // their ExampleDigest values (audits that each example counts once).
  int64_t examples = 0;
  uint64_t examples_digest = 0;
};

enum class PushOutcome { kApplied, kBuffered, kDuplicate };

// A chunk's values, shared with the pull answers that send them.
struct ChunkValues {
  ChunkValues() = default;
  ChunkValues(const ChunkValues&) = delete;
  ChunkValues& operator=(const ChunkValues&) = delete;
  ~ChunkValues();

  std::vector<float> data;
  std::atomic<int> leases{0};  // ValuesLeases alive: no one writes `data` meanwhile
  // Set when the chunk let go of these values while answers still sent
  // them: the server's count of such bytes (JobShardConfig::orphaned_values),
  // which holds `orphaned_bytes` of theirs until the last answer drops them.
  std::shared_ptr<std::atomic<int64_t>> orphaned;
  int64_t orphaned_bytes = 0;
};

// A chunk's values as a read found them, lent without a copy (to a pull
// answer that sends them from there): while any lease on them lives, the
// chunk writes its next values into other memory. Movable; may outlive the
// chunk.
class ValuesLease {
 public:
  ValuesLease() = default;
  ValuesLease(ValuesLease&& other) noexcept : values_(std::move(other.values_)) {}
  ValuesLease& operator=(ValuesLease&& other) noexcept;
  ValuesLease(const ValuesLease&) = delete;
  ValuesLease& operator=(const ValuesLease&) = delete;
  ~ValuesLease() { Return(); }

  bool empty() const { return values_ == nullptr; }
  const char* bytes() const { return reinterpret_cast<const char*>(values_->data.data()); }
  size_t size() const { return values_->data.size() * sizeof(float); }

 private:
  friend class Chunk;
  explicit ValuesLease(std::shared_ptr<ChunkValues> values);
  void Return();

  std::shared_ptr<ChunkValues> values_;
};

// One chunk of a dense tensor with its optimizer state. Thread-safe.
class Chunk {
 public:
  Chunk(const ChunkConfig& config, const JobShardConfig& job);
  ~Chunk();
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;

  // Checks a gradient without applying it (size, finite values; that the
  // chunk takes it now).
  absl::Status Validate(const PushArgs& args) const;
  // Applies (ASP) or buffers (BSP) a gradient. Errors: INVALID_ARGUMENT for a
  // wrong size, non-finite values or a bad partition; FAILED_PRECONDITION for a BSP
  // push ahead of the chunk's version; ABORTED once the job is dropped here.
  absl::StatusOr<PushOutcome> Push(const PushArgs& args);

  // Copies the values once at least `min_version` updates are applied and
  // (SSP) every data partition has at least `min_clock` steps in, reporting
  // the version and the slowest partition's clock. DEADLINE_EXCEEDED at
  // `deadline`; ABORTED if the job is dropped here meanwhile; CANCELLED,
  // within 50 ms, once `cancelled` (optional: the caller gave up) says so.
  // `data` gets the values encoded in `format`.
  absl::Status Pull(int64_t min_version, int64_t min_clock, absl::Time deadline, std::string* data,
                    int64_t* version, int64_t* clock = nullptr, v1::WireFormat format = v1::WIRE_FP32,
                    const std::function<bool()>& cancelled = nullptr);

  // Non-blocking halves of Pull: whether a pull with these bounds would
  // return now (also true once dropped or frozen), and the read itself
  // (ABORTED if the job was dropped here). With `exact_version` >= 0 (BSP)
  // Read returns the values at exactly that version: the current ones, or
  // the ones before the last step for a chunk one step past it;
  // FAILED_PRECONDITION for a chunk behind it or further on.
  // With a `lease` and float32 asked for on a little-endian host (the
  // values' own bytes), the values are lent there instead of copied into
  // `data`.
  bool Ready(int64_t min_version, int64_t min_clock) const;
  absl::Status Read(v1::WireFormat format, std::string* data, int64_t* version, int64_t* clock,
                    int64_t exact_version = -1, ValuesLease* lease = nullptr) const;

  // LAMB (BSP): once every partition's gradient of step `version()` is in,
  // the chunk computes its squared norms of the step (LambBlockNorms) and
  // waits for its tensor's sums. LambReady: whether LambPartialOf(step)
  // answers now (the chunk waits at `step`, is past it, the job is dropped
  // or frozen, or it does not run LAMB). LambPartialOf: the norms of `step`
  // while it waits at it or once it applied it; `settled` when two or more
  // steps past, or one step past without its norms (restored from a
  // checkpoint cut there, which cut every chunk at once); *version gets the
  // chunk's version. FAILED_PRECONDITION for a chunk that is not LAMB or
  // has not every partition's gradient of `step`; ABORTED once dropped.
  bool LambReady(int64_t step) const;
  absl::Status LambPartialOf(int64_t step, v1::LambPartial* partial, int64_t* version) const;
  // Applies LAMB step `step` with its tensor's squared norms: kApplied, or
  // kDuplicate for a chunk past it. FAILED_PRECONDITION while the step is
  // not whole here (or the chunk is behind it); INVALID_ARGUMENT for norms
  // that are negative or not finite; errors of a dropped or frozen job as Push.
  absl::StatusOr<PushOutcome> ApplyLambNorms(int64_t step, const LambNorms& tensor);

  ChunkSnapshot Snapshot() const;
  // Replaces this replica's state. INVALID_ARGUMENT if the shapes differ.
  absl::Status Restore(const ChunkSnapshot& snapshot);
  // Takes a checkpoint's state, possibly from a job with another number of
  // data partitions (`repartition`): then the per-partition state (BSP
  // buffers, ASP/SSP steps) starts over at `partition_step` and the update
  // count becomes `version`.
  absl::Status RestoreCheckpoint(ChunkSnapshot snapshot, bool repartition, int64_t version,
                                 int64_t partition_step);

  // Checkpoints. Arms a snapshot for `checkpoint_id` taken, under the chunk's
  // lock, at the moment its version reaches `at_version` (at once for 0, or
  // if it is there already): the cut is exact and training never waits.
  // ABORTED if the chunk is already past `at_version`.
  absl::Status ArmCapture(int64_t checkpoint_id, int64_t at_version);
  // Waits for the armed snapshot and disarms it. DEADLINE_EXCEEDED at
  // `deadline`, ABORTED if the job is dropped, NOT_FOUND if not armed.
  absl::StatusOr<ChunkSnapshot> TakeCapture(int64_t checkpoint_id, absl::Time deadline);
  void Disarm(int64_t checkpoint_id);

  void Drop(const std::string& reason);
  // Refuses further pushes (FAILED_PRECONDITION) but keeps serving pulls.
  void Freeze(const std::string& reason);
  int64_t version() const;
  int64_t length() const { return config_.length; }
  int32_t tensor() const { return config_.tensor; }

 private:
  absl::Status CheckPush(const PushArgs& args) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `lamb`: the tensor's norms of a LAMB step (null for the other optimizers).
  void ApplyLocked(const float* grad, int64_t lr_step, const LambNorms* lamb = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BSP: the mean of the partitions' gradients, in partition order, into scratch_.
  void SumPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BSP: values_ becomes previous_ and the step applies to a copy.
  void KeepPreviousLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BSP: applies the whole step summed in scratch_ (`lamb`: its tensor's
  // norms) and empties the partitions' buffers.
  void ApplyStepLocked(const LambNorms* lamb) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NotLambError() const;
  bool lamb() const { return job_.synchronous && job_.optimizer.kind == OptimizerKind::kLamb; }
  // The values to update in place: values_ itself, or a copy of them in
  // their place when a pull answer still sends them.
  float* WritableValuesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeCompleteStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t MinClockLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DroppedError() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ChunkSnapshot SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ReadyLocked(int64_t min_version, int64_t min_clock) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CaptureLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Capture {
    int64_t at_version = 0;
    bool taken = false;
    ChunkSnapshot snapshot;
  };

  const ChunkConfig config_;
  const JobShardConfig& job_;
  mutable Mutex mu_;  // guards everything below
  CondVar updated_;
  // Never null; written only while no lease is on it (WritableValuesLocked).
  std::shared_ptr<ChunkValues> values_ ABSL_GUARDED_BY(mu_);
  // BSP: values_ before the last step (null before the first one). A worker
  // that must compute step version_ - 1 for chunks still waiting for it
  // (another worker died with its push half sent) reads them here.
  std::shared_ptr<ChunkValues> previous_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<float>> state_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  // BSP: the gradients of the current step by partition (empty = not yet arrived).
  std::vector<std::vector<float>> pending_ ABSL_GUARDED_BY(mu_);
  int32_t pending_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<float> scratch_ ABSL_GUARDED_BY(mu_);
  // LAMB: the step is whole (pending_ keeps its gradients, scratch_ their
  // mean) and waits for its tensor's norms; this chunk's norms of it; and
  // those of the last step applied.
  bool lamb_waiting_ ABSL_GUARDED_BY(mu_) = false;
  LambNorms lamb_partial_ ABSL_GUARDED_BY(mu_);
  LambLastNorms lamb_last_ ABSL_GUARDED_BY(mu_);
  // Highest sequence number accepted per worker (retry deduplication).
  absl::flat_hash_map<std::string, int64_t> watermarks_ ABSL_GUARDED_BY(mu_);
  // ASP and SSP: steps applied per partition (a partition's step is applied
  // once, whichever worker computes it); SSP pulls wait on their minimum.
  std::vector<int64_t> partition_steps_ ABSL_GUARDED_BY(mu_);
  // Examples behind every gradient accepted (each partition step counts once).
  int64_t examples_seen_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t examples_digest_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, Capture> captures_ ABSL_GUARDED_BY(mu_);  // by checkpoint id
  std::string dropped_reason_ ABSL_GUARDED_BY(mu_);
  std::string frozen_reason_ ABSL_GUARDED_BY(mu_);
};

// All chunks of one job held by this server.
class JobShard {
 public:
  // RESOURCE_EXHAUSTED when allocating the chunks fails.
  static absl::StatusOr<std::unique_ptr<JobShard>> Create(JobShardConfig config);

  // The memory one chunk of `job` takes at most: values, optimizer state and
  // (BSP) a gradient buffer per data partition, a sum buffer and the
  // previous step's values; and the bookkeeping beside them (the Chunk, each
  // array's header), so that a setup of many tiny chunks counts what it
  // really takes: a setup message of a few MiB never claims 100x that.
  static int64_t ChunkBytes(int64_t length, const JobShardConfig& job);
  // The arrays alone: what a chunk's state takes in one message (CopyChunk,
  // a checkpoint's record).
  static int64_t ChunkStateBytes(int64_t length, const JobShardConfig& job);
  // ... and all chunks of `config`, with the job's own bookkeeping.
  static int64_t ConfigBytes(const JobShardConfig& config);
  // What the job held now takes (by ChunkBytes, the tables' bytes and the
  // job's own bookkeeping).
  int64_t bytes() const;
  // The bookkeeping counted per chunk beside its arrays, per array, and per
  // job (generous: each bounds what it stands for; 100,000 one-float ASP
  // chunks measured 1.2 KiB each in the process's resident memory).
  static constexpr int64_t kChunkFixedBytes = 1536;
  static constexpr int64_t kArrayFixedBytes = 64;
  static constexpr int64_t kJobFixedBytes = 16 << 10;

  absl::StatusOr<PushOutcome> Push(const PushArgs& args);
  absl::Status Validate(const PushArgs& args);
  absl::StatusOr<ChunkSnapshot> Snapshot(int32_t chunk_id) const;
  absl::Status Restore(int32_t chunk_id, const ChunkSnapshot& snapshot);
  std::vector<int32_t> chunk_ids() const;
  // Marks chunks whose state is about to be copied in: until AdoptChunks
  // takes them they are unavailable (a primary's forwards and any read are
  // refused), so no write lands in a state the copy then overwrites.
  void BeginCopy(const std::vector<int32_t>& chunk_ids);
  // Takes chunks copied from another replica (re-replication, a chunk moving
  // to a new shard): each one is created if absent, and given the snapshot's
  // state. `chunks` and `snapshots` correspond.
  absl::Status AdoptChunks(const std::vector<ChunkConfig>& chunks, const std::vector<ChunkSnapshot>& snapshots);
  absl::Status Pull(int32_t chunk_id, int64_t min_version, int64_t min_clock, absl::Time deadline,
                    std::string* data, int64_t* version, int64_t* clock = nullptr,
                    v1::WireFormat format = v1::WIRE_FP32, const std::function<bool()>& cancelled = nullptr);
  // The tensor a chunk held here is of; Find's errors for one not held.
  absl::StatusOr<int32_t> ChunkTensor(int32_t chunk_id) const;
  // Chunk::LambReady (true for a chunk not held: the answer says why),
  // LambPartialOf and ApplyLambNorms of a chunk held here.
  bool LambReady(int32_t chunk_id, int64_t step) const;
  absl::Status LambPartialOf(int32_t chunk_id, int64_t step, v1::LambPartial* partial, int64_t* version) const;
  absl::StatusOr<PushOutcome> ApplyLambNorms(int32_t chunk_id, int64_t step, const LambNorms& tensor);
  // The length of `chunk_id` (0 for a chunk not held).
  int64_t ChunkLength(int32_t chunk_id) const;
  // Chunk::Ready / Chunk::Read of `chunk_id` (Ready is true, and Read
  // NOT_FOUND, for a chunk this server does not hold).
  bool Ready(int32_t chunk_id, int64_t min_version, int64_t min_clock) const;
  absl::Status Read(int32_t chunk_id, v1::WireFormat format, std::string* data, int64_t* version,
                    int64_t* clock, int64_t exact_version = -1, ValuesLease* lease = nullptr) const;
  // Snapshots every chunk for a checkpoint at `at_version` (see
  // Chunk::ArmCapture), and the sparse tables' buckets (SparseShard::
  // ArmCapture): all are armed before any is waited for, so each is cut at
  // the same step. On error nothing stays armed. `base`: what the buckets'
  // captures may be incremental on. Only what this server has a part in
  // under the map it holds: a chunk moved to another shard, or a table shard
  // this server was taken out of, stays here as it was and would never
  // reach a synchronous cut.
  absl::StatusOr<std::vector<std::pair<int32_t, ChunkSnapshot>>> CaptureAll(int64_t checkpoint_id,
                                                                            int64_t at_version,
                                                                            absl::Time deadline,
                                                                            const IncrementalBase& base = {});
  // The lowest and highest version over the chunks (0, 0 with none).
  std::pair<int64_t, int64_t> VersionRange() const;
  // Puts checkpointed state into chunk `chunk_id` (see Chunk::RestoreCheckpoint).
  absl::Status RestoreCheckpoint(int32_t chunk_id, ChunkSnapshot snapshot, bool repartition, int64_t version,
                                 int64_t partition_step);
  void Drop(const std::string& reason);
  void Freeze(const std::string& reason);
  const JobShardConfig& config() const { return config_; }
  // ASP/SSP primaries hold it from forwarding a push to their backups until
  // they have applied it, so every replica applies pushes in one order and
  // replicas stay bit-identical (BSP sums in partition order anyway).
  Mutex& replication_order() { return replication_order_; }
  // The same for the pushes of asynchronous sparse tables.
  Mutex& sparse_replication_order() { return sparse_replication_order_; }
  // The job's sparse tables on this server (null when the job has none).
  SparseTables* sparse() const { return sparse_.get(); }
  // Held by a copy into this job (Replicator::AdoptCopies) from its first
  // fetch to its Configure: a second copy of the same setup (one retried
  // past its deadline) waits, then finds the tables held, where the two
  // would otherwise add and drop each other's.
  Mutex& adopt_mu() { return adopt_mu_; }

  // Replication roles, per shard of the job, under a shard-map version.
  struct ShardRole {
    bool primary = false;
    std::vector<std::string> backup_addresses;  // the primary's backups
  };
  // Takes the roles of shard-map `version` and (if not empty) its chunk ->
  // shard assignment: a chunk moved to a shard this server does not hold is
  // refused from then on, and the tables of a shard it no longer holds are
  // dropped (they would miss its pushes; a return copies them again).
  // FAILED_PRECONDITION (nothing changed) for a version older than the one
  // held.
  absl::Status Configure(int64_t version, std::map<int32_t, ShardRole> roles,
                         std::map<int32_t, int32_t> chunk_shards = {});
  int64_t map_version() const;
  // The role of the shard holding `chunk_id`; NOT_FOUND for an unknown chunk.
  absl::StatusOr<ShardRole> RoleOf(int32_t chunk_id) const;
  // RoleOf for the chunks of one request, looked up together: each chunk's
  // shard (in the order of `chunk_ids`) and the role of each of those
  // shards. RoleOf's error for the first chunk that has no role here.
  struct ChunkRoles {
    std::vector<int32_t> shard_of;
    std::map<int32_t, ShardRole> roles;
  };
  absl::StatusOr<ChunkRoles> RolesOf(absl::Span<const int32_t> chunk_ids) const;
  // The role of shard `shard`; ABORTED when this server does not hold it in
  // the map it has (a server never configured holds every shard as primary).
  absl::StatusOr<ShardRole> RoleOfShard(int32_t shard) const;
  // Drops the tables of the shards this server has no role in under the map
  // it holds (Configure does, for the shards a new map takes it out of).
  void DropTablesWithoutRole();
  // Frees the chunks of the shards this server has no role in under the
  // map it holds, if that is `map_version` (the map whose moves the caller
  // knows are committed) and no copy into the job runs (it waits for one),
  // and returns the bytes they took (by ChunkBytes). Only once the moves
  // that took them away are committed: until then a handover may be undone
  // and the chunks go back to this server's shard as they are (Configure
  // keeps them). A later map that gives this server such a chunk again
  // comes with a copy of it. A freed chunk's requests answer ABORTED,
  // naming its shard.
  int64_t FreeChunksWithoutRole(int64_t map_version);
  // Drops the tables of `shards` whatever the roles (stale copies: see
  // SetupJobRequest.joined_shard); `why` goes into the log.
  void DropTables(const std::set<int32_t>& shards, const std::string& why);

 private:
  explicit JobShard(JobShardConfig config);
  static absl::StatusOr<std::unique_ptr<JobShard>> CreateChunks(JobShardConfig config);
  absl::StatusOr<std::shared_ptr<Chunk>> Find(int32_t chunk_id) const;
  // The shards this server has a role in under the map it holds; nullopt
  // before the first Configure (a lone replica holds every shard).
  std::optional<std::set<int32_t>> ShardsWithARoleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(roles_mu_);
  // Freezes shards taken out of the tables and logs it (`why`: what they were).
  void FreezeDropped(const std::vector<std::shared_ptr<SparseShard>>& dropped, const std::string& why);

  const JobShardConfig config_;
  std::unique_ptr<SparseTables> sparse_;  // set by Create, then constant
  Mutex replication_order_;
  Mutex sparse_replication_order_;
  Mutex adopt_mu_ ABSL_ACQUIRED_BEFORE(chunks_mu_, roles_mu_);
  // Guards chunks_. A chunk is removed only once it moved to a shard this
  // server has no role in, for good (FreeChunksWithoutRole); requests hold
  // the chunks they use, so its memory goes with the last of them.
  mutable Mutex chunks_mu_ ABSL_ACQUIRED_BEFORE(roles_mu_);
  std::map<int32_t, std::shared_ptr<Chunk>> chunks_ ABSL_GUARDED_BY(chunks_mu_);  // in id order
  // The same chunks by id for Find, which every chunk of every push and
  // pull goes through several times (a tree walk cost a fine-cut job's
  // server a fifth of its time).
  absl::flat_hash_map<int32_t, std::shared_ptr<Chunk>> index_ ABSL_GUARDED_BY(chunks_mu_);
  std::set<int32_t> copying_ ABSL_GUARDED_BY(chunks_mu_);  // see BeginCopy
  mutable Mutex roles_mu_;                      // guards the roles below
  absl::flat_hash_map<int32_t, int32_t> shard_of_ ABSL_GUARDED_BY(roles_mu_);  // chunk id -> shard
  int64_t map_version_ ABSL_GUARDED_BY(roles_mu_) = 0;
  std::map<int32_t, ShardRole> roles_ ABSL_GUARDED_BY(roles_mu_);
  // Set by the first Configure: from then on a shard missing from roles_ is
  // one this server does not hold (it was taken out of the group).
  bool configured_ ABSL_GUARDED_BY(roles_mu_) = false;
};

// The jobs on this server. Thread-safe.
class ParameterStore {
 public:
  // `memory_budget`: the bytes all jobs' chunks may take together (0: no limit).
  explicit ParameterStore(int64_t memory_budget = 0) : memory_budget_(memory_budget) {}

  // OK when `more_bytes` fit next to what the other jobs hold (job `job_id`'s
  // own state is counted unless `replacing` it); RESOURCE_EXHAUSTED naming
  // the numbers otherwise.
  absl::Status CheckFits(const std::string& job_id, int64_t more_bytes, bool replacing) const;
  int64_t memory_budget() const { return memory_budget_; }
  // The bytes all jobs' chunks take now, with what transient holds (below)
  // keep.
  int64_t bytes() const;

  // Memory a job's work holds for a while beside its parameters (a
  // checkpoint's captured state, encoded records and database batch),
  // counted in bytes() until the hold is dropped.
  class TransientHold {
   public:
    TransientHold(ParameterStore* store, int64_t bytes) : store_(store), bytes_(bytes) {}
    ~TransientHold() { store_->transient_ -= bytes_; }
    TransientHold(const TransientHold&) = delete;
    TransientHold& operator=(const TransientHold&) = delete;

   private:
    ParameterStore* const store_;
    const int64_t bytes_;
  };
  // Holds `bytes` when they fit the budget next to everything held now;
  // RESOURCE_EXHAUSTED naming `what` and the numbers otherwise.
  absl::StatusOr<std::unique_ptr<TransientHold>> HoldTransient(int64_t bytes, const std::string& what);

  // Sets the job up with fresh (initialized) chunks, replacing any state of
  // it this server had (a setup the scheduler redoes after a restart).
  absl::Status SetupJob(JobShardConfig config);
  // Puts a job set up elsewhere (e.g. copied from a primary) in place,
  // replacing any state this server still had of it (which is stale).
  void Install(std::unique_ptr<JobShard> shard);
  // Install, unless the job is held here already: a second copy of the same
  // setup (one the scheduler retried past its deadline) installed its own
  // meanwhile, which has taken writes since. UNAVAILABLE, and `shard` is
  // thrown away.
  absl::Status InstallCopy(std::unique_ptr<JobShard> shard);
  // Drops the job's state; waiting pulls return ABORTED with `reason`.
  // With keep_parameters the state stays readable but takes no more pushes.
  // `map_version` > 0: only a copy configured at that shard-map version or
  // an older one is dropped (false: a newer copy stays).
  bool DropJob(const std::string& job_id, const std::string& reason, bool keep_parameters = false,
               int64_t map_version = 0);
  // NOT_FOUND (naming the job) when this server holds nothing of it.
  absl::StatusOr<std::shared_ptr<JobShard>> Find(const std::string& job_id) const;
  size_t num_jobs() const;
  std::vector<std::string> JobIds() const;
  // Each held job's bytes() (its chunks and tables; the transient holds
  // are nobody's).
  std::map<std::string, int64_t> JobBytes() const;

 private:
  // bytes(), under mu_.
  int64_t BytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t memory_budget_;
  mutable Mutex mu_;  // guards jobs_
  std::map<std::string, std::shared_ptr<JobShard>> jobs_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> transient_{0};  // what TransientHolds keep (added under mu_)
};

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_PARAMETER_STORE_H_
