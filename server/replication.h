// Replication between parameter servers, apart from gRPC: the fencing of
// writes (membership lease, shard map version, each chunk's role), the
// forwarding of a primary's pushes to its backups, and the copying of chunks
// from other replicas when a server becomes a new backup or takes over a
// moved shard. ParameterServiceImpl translates RPCs into these calls; the
// unit tests drive them with fake peers, without sockets.
#ifndef FULCRUM_SERVER_REPLICATION_H_
#define FULCRUM_SERVER_REPLICATION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/payload_wire.h"
#include "common/sync.h"
#include "fulcrum/v1/parameter.pb.h"
#include "server/parameter_store.h"

namespace prometheus {
class Counter;
class Histogram;
}  // namespace prometheus

namespace fulcrum {

// ChunkSnapshot <-> ChunkState (raw little-endian float32 payloads).
void ToChunkState(const ChunkSnapshot& snapshot, int32_t chunk_id, v1::ChunkState* state);
absl::StatusOr<ChunkSnapshot> FromChunkState(const v1::ChunkState& state);

// How a server reaches the other replicas of its chunks.
class ReplicaPeers {
 public:
  // One Replicate call in flight.
  class Forward {
   public:
    virtual ~Forward() = default;
    // Makes it end soon with CANCELLED (if it has not ended). Thread-safe.
    virtual void Cancel() = 0;
    // Waits for its outcome (once).
    virtual absl::Status Wait() = 0;
  };

  // Replicate carries a PushRequest's bytes, SparseReplicate a
  // SparsePushRequest's.
  enum class Method { kReplicate, kSparseReplicate };

  virtual ~ReplicaPeers() = default;
  // Starts sending `request` to the server at `address` as `method`.
  virtual std::unique_ptr<Forward> Replicate(const std::string& address, Method method, grpc::ByteBuffer request,
                                             absl::Duration timeout) = 0;
  // The state of a chunk as the server at `address` holds it (CopyChunk).
  virtual absl::StatusOr<v1::ChunkState> CopyChunk(const std::string& address, const v1::CopyChunkRequest& request,
                                                   absl::Duration timeout) = 0;
};

class Replicator {
 public:
  struct Options {
    // Whether this server still holds its membership lease; without it no
    // write is taken (a primary cut off from the scheduler). Null: always.
    std::function<bool()> lease_valid;
    prometheus::Counter* refused = nullptr;                 // writes refused by fencing (optional)
    prometheus::Histogram* replication_seconds = nullptr;   // time a push waits for its backups (optional)
    absl::Duration forward_timeout = absl::Seconds(10);
    absl::Duration copy_timeout = absl::Seconds(30);
  };

  // `peers` must outlive the replicator.
  Replicator(ReplicaPeers* peers, Options options);

  // Fencing of a write to `shard`: a worker's push (`as_primary`) or a
  // primary's replication of one. UNAVAILABLE without the lease or when the
  // request's shard map is newer than this server's (retry); ABORTED for an
  // older map, or a chunk this server is not primary (backup) of in it (the
  // sender refreshes its map); INVALID_ARGUMENT for a chunk listed twice;
  // NOT_FOUND for a chunk not held here.
  absl::Status CheckWrite(const JobShard& shard, const v1::PushRequest& header, const PayloadReader& chunks,
                          bool as_primary) const;

  // Sends each backup the chunks of a push it replicates, as the received
  // bytes (the payload slices are shared, not copied), and waits for all.
  // OK when every backup has them; ABORTED when one is at a newer shard map
  // (it fences this primary: the worker refreshes its map); RESOURCE_EXHAUSTED
  // kServerBusy when every backup that failed refused it as busy; else
  // UNAVAILABLE (retried: every replica deduplicates).
  absl::Status Forward(const JobShard& shard, const v1::PushRequest& header, const PayloadReader& chunks);

  // The same for the sparse tables: fencing of a SparsePush to shard
  // `shard_id` (the lease, the request's map version against the server's,
  // this server's role in the shard), and the forward of an accepted one to
  // the shard's backups (the whole request: every key is in the shard).
  // A backup's RESOURCE_EXHAUSTED (its tables full) comes back as such; a
  // busy backup's as kServerBusy, as Forward answers.
  absl::Status CheckSparseWrite(const JobShard& shard, const std::string& job_id, int64_t map_version,
                                int32_t shard_id, bool as_primary) const;
  // `request`: the SparsePushRequest's bytes as they came (every backup's
  // message shares them).
  absl::Status ForwardSparse(const JobShard& shard, int32_t shard_id, const std::string& job_id,
                             const grpc::ByteBuffer& request);

  // Cancels the forwards of `job_id` in flight (a role change must not wait
  // for a backup that stopped); their pushes fail and are retried.
  void CancelForwards(const std::string& job_id);

  // The state of the chunks of `config` from their replicas: the server
  // `sources` names for a chunk, else `default_source`. UNAVAILABLE naming
  // the chunk and the server when one cannot be copied.
  absl::StatusOr<std::vector<ChunkSnapshot>> FetchChunks(const JobShardConfig& config,
                                                         const std::string& default_source,
                                                         const std::map<int32_t, std::string>& sources);

  // Takes chunks copied from other replicas into what `store` holds of the
  // job (other shards stay), or into a fresh job state installed once whole.
  // Chunks already held are unavailable while they are copied, so no write
  // lands in a state the copy then overwrites. `roles` and `chunk_shards`
  // are this server's in the shard map of `map_version`. The tables of
  // `joined_shard` (SetupJobRequest.joined_shard) are copied again if held.
  absl::Status AdoptCopies(ParameterStore* store, JobShardConfig config, int64_t map_version,
                           std::map<int32_t, JobShard::ShardRole> roles,
                           std::map<int32_t, int32_t> chunk_shards, const std::string& default_source,
                           const std::map<int32_t, std::string>& sources,
                           std::optional<int32_t> joined_shard = std::nullopt);

 private:
  void Refused() const;
  // Copies the tables of shard `shard` from `address` into `dest` (empty,
  // aside): the source's bookkeeping (CopyChunkRequest.table_shard), each
  // bucket, the bookkeeping again, at most kCopyAttempts times until the
  // source did not change in between. UNAVAILABLE when it kept changing.
  static constexpr int kCopyAttempts = 5;
  absl::Status CopyTables(SparseShard* dest, const std::string& job_id, int32_t shard, const std::string& address);
  // The tables of each of `shards` that `tables` does not hold yet, copied
  // from `address` and added (a server taken out of a shard's group drops
  // its tables, JobShard::Configure, so those held are up to date).
  // UNAVAILABLE (retry) or RESOURCE_EXHAUSTED naming the shard.
  absl::Status AdoptTables(SparseTables* tables, const std::set<int32_t>& shards, const std::string& job_id,
                           const std::string& address);
  // CopyChunk of `request` slice by slice (ReadSlicedChunk).
  absl::StatusOr<v1::ChunkState> CopySliced(const std::string& address, v1::CopyChunkRequest request);
  // The lease and map-version checks every write passes.
  absl::Status CheckFence(const std::string& job_id, int64_t request_version, int64_t held) const;
  // Sends every message at once, waits for all, and reduces the outcomes.
  absl::Status SendAll(const std::string& job_id, ReplicaPeers::Method method,
                       std::map<std::string, grpc::ByteBuffer> messages);

  ReplicaPeers* const peers_;
  const Options options_;
  Mutex mu_;  // guards in_flight_
  std::multimap<std::string, ReplicaPeers::Forward*> in_flight_ ABSL_GUARDED_BY(mu_);  // job id ->
};

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_REPLICATION_H_
