// Checkpoints of the chunks a parameter server holds, checksummed, in a
// KvStore (RocksDB under the server's --data-dir). No gRPC here.
//
// Key layout (ids zero-padded so that key order is numeric order):
//   ckpt/<job_id>/<checkpoint id, 20 digits>/<chunk id, 10 digits> -> chunk record
//   ckpt-index/<job_id>/<checkpoint id, 20 digits>                 -> index record
// The index lists the checkpoint's chunks (id, checksum, record size); it is
// written and deleted in the same atomic KvStore::Write as the chunk records,
// so List, Chunks and Delete never have to read chunk data.
//
// Record (all integers little-endian):
//   u32 magic   "FCKP" for a chunk record, "FCKI" for an index record
//   u32 format version (1)
//   u32 crc32 (zlib) of the payload -- the chunk's `checksum`
//   u64 payload size in bytes
//   payload
// Chunk payload (EncodeChunkSnapshot), format version 1:
//   i64 version, i64 examples_seen, u64 examples_digest,
//   floats values,
//   u64 slot count, then floats per optimizer-state slot,
//   u64 partition count, then floats per pending gradient (count 0 = not in),
//   u64 watermark count, then per watermark: u64 size, worker id bytes, i64 seq,
//   the partition steps: u64 count, then i64 per step; or, as written now
//   (count's top bit set), i64 base (the lowest step), u8 width w in {0, 1,
//   2, 4, 8}, then per step its distance from base in w bytes (w 0: every
//   step is base), so the steps of a BSP capture over 1024 partitions take
//   17 bytes, not 8 KiB;
//   and for a table bucket only: u64 size, its SparseTable state bytes;
// where "floats" is u64 count followed by count float32 values. Unlike the
// ChunkState proto, a record has no 2 GiB limit.
#ifndef FULCRUM_SERVER_CHECKPOINT_STORE_H_
#define FULCRUM_SERVER_CHECKPOINT_STORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/kv_store.h"
#include "server/parameter_store.h"
#include "common/sync.h"

namespace fulcrum {

// The checkpoints of every job on one server. Thread-safe: reads run
// concurrently; Write, Delete and DeleteJob are serialized with each other.
//
// Errors: INVALID_ARGUMENT for a job id that is empty or holds '/', or a
// negative checkpoint or chunk id; NOT_FOUND naming job, checkpoint (and
// chunk) when absent; DATA_LOSS naming job, checkpoint (and chunk) when a
// stored record does not verify; the KvStore's own code (UNAVAILABLE from
// RocksDB, e.g. a full disk) when it fails, with nothing changed.
class CheckpointStore {
 public:
  // `kv` is not owned and must outlive the store.
  explicit CheckpointStore(KvStore* kv);

  struct ChunkRecordInfo {
    int32_t chunk_id = 0;
    uint32_t checksum = 0;  // crc32 of the payload, as stored in the record
    int64_t bytes = 0;      // size of the whole record
  };

  // Writes every chunk of checkpoint `checkpoint_id` of the job in one atomic,
  // synced KvStore::Write: afterwards the checkpoint is all there or (on
  // error) as it was. Rewriting a checkpoint id replaces it whole (chunks it
  // held that `chunks` lacks are deleted), so a retried write is harmless.
  // All records are in memory at once. Returns each chunk's checksum and
  // record size, in the order of `chunks`. INVALID_ARGUMENT for a chunk id
  // given twice.
  // Each chunk's memory is let go once it is encoded.
  absl::StatusOr<std::vector<ChunkRecordInfo>> Write(const std::string& job_id, int64_t checkpoint_id,
                                                     std::vector<std::pair<int32_t, ChunkSnapshot>> chunks);

  // One chunk of a checkpoint, verified. DATA_LOSS also when
  // `expected_checksum` is not 0 and differs from the stored checksum.
  absl::StatusOr<ChunkSnapshot> Read(const std::string& job_id, int64_t checkpoint_id, int32_t chunk_id,
                                     uint32_t expected_checksum = 0);
  // The stored record of one chunk (e.g. to copy it to another server), after
  // verifying its checksum; the receiver checks it with VerifyChunkRecord.
  absl::StatusOr<std::string> ReadRaw(const std::string& job_id, int64_t checkpoint_id, int32_t chunk_id);

  // Deletes the checkpoint with all its chunks; OK when it is not there.
  absl::Status Delete(const std::string& job_id, int64_t checkpoint_id);
  // Deletes every checkpoint of the job; OK when there is none.
  absl::Status DeleteJob(const std::string& job_id);

  // The job's checkpoint ids, ascending (empty when none).
  absl::StatusOr<std::vector<int64_t>> List(const std::string& job_id);
  // The chunk ids of one checkpoint, ascending. NOT_FOUND when the checkpoint
  // is absent.
  absl::StatusOr<std::vector<int32_t>> Chunks(const std::string& job_id, int64_t checkpoint_id);

 private:
  // The verified record of one chunk and its checksum.
  absl::StatusOr<std::string> ReadRecord(const std::string& job_id, int64_t checkpoint_id, int32_t chunk_id,
                                         uint32_t* checksum);
  absl::StatusOr<std::vector<ChunkRecordInfo>> ReadIndex(const std::string& job_id, int64_t checkpoint_id);
  // The keys of the chunks stored for a checkpoint: from its index, or (index
  // absent or damaged) from a scan of its chunk keys.
  absl::StatusOr<std::vector<std::string>> StoredChunkKeys(const std::string& job_id, int64_t checkpoint_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutate_mu_);

  KvStore* const kv_;
  // Serializes the mutations, each of which reads the stored chunk keys of a
  // checkpoint before it writes; guards the consistency of the key space.
  Mutex mutate_mu_;
};

// Background checkpoint writes on one owned thread, in Enqueue order.
// Thread-safe. Call Stop (or destroy the writer) before the store goes away.
class CheckpointWriter {
 public:
  using Done = std::function<void(absl::StatusOr<std::vector<CheckpointStore::ChunkRecordInfo>>)>;

  // `store` is not owned. Starts the thread.
  explicit CheckpointWriter(CheckpointStore* store);
  // Stop().
  ~CheckpointWriter();

  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Returns at once; the thread later runs CheckpointStore::Write and calls
  // `done` with its result (on the writer thread, no lock held; `done` may
  // Enqueue but must not call Stop). After Stop has begun, `done` is called
  // at once on the caller's thread with FAILED_PRECONDITION.
  void Enqueue(std::string job_id, int64_t checkpoint_id,
               std::vector<std::pair<int32_t, ChunkSnapshot>> chunks, Done done);

  // Finishes every write already queued (calling its `done`), then joins the
  // thread. Idempotent; the clean SIGTERM path.
  void Stop();

 private:
  struct Task {
    std::string job_id;
    int64_t checkpoint_id = 0;
    std::vector<std::pair<int32_t, ChunkSnapshot>> chunks;
    Done done;
  };

  void Loop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CheckpointStore* const store_;
  Mutex mu_;  // guards queue_ and stopping_
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Mutex join_mu_;  // guards thread_ (joined once); never held with mu_
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
};

// The chunk payload described above. Decode returns DATA_LOSS for truncated,
// trailing or inconsistent bytes; it never allocates more than the input
// could hold.
std::string EncodeChunkSnapshot(const ChunkSnapshot& snapshot);
absl::StatusOr<ChunkSnapshot> DecodeChunkSnapshot(absl::string_view payload);

// A whole chunk record (header + payload) and its checksum.
std::string EncodeChunkRecord(const ChunkSnapshot& snapshot, uint32_t* checksum);
// Checks a chunk record's header and checksum (not the payload's structure);
// returns the checksum. DATA_LOSS saying what does not verify.
absl::StatusOr<uint32_t> VerifyChunkRecord(absl::string_view record);
// VerifyChunkRecord, then DecodeChunkSnapshot of its payload.
absl::StatusOr<ChunkSnapshot> DecodeChunkRecord(absl::string_view record);

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_CHECKPOINT_STORE_H_
