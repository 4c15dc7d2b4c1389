// A worker's view of a job's sparse tables. A key's row lives on the
// replicas of the shard of its bucket (ShardMap.tables, common/shard_map.h
// BucketOf); requests go to the shard's primary. Pull and Push split every
// table's keys by shard, sorted by bucket (the order servers read them in
// without copying), into requests whose keys and rows stay below
// kMaxRequestBytes, and send them all at once.
#ifndef FULCRUM_WORKER_SPARSE_CLIENT_H_
#define FULCRUM_WORKER_SPARSE_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "fulcrum/v1/shard_map.pb.h"
#include "worker/parameter_transport.h"

namespace fulcrum {

class SparseClient {
 public:
  // Key and row bytes per request (a push's keys and gradients; a pull's
  // keys, and its answer's rows): far below gRPC's 8 MiB message limit
  // (kMaxMessageBytes) and the servers' 7 MiB answer limit whatever a
  // table's dim.
  static constexpr int64_t kMaxRequestBytes = 3 << 20;

  // `transport` (not owned; it outlives the client), or gRPC when nullptr.
  SparseClient(const v1::ShardMap& map, std::string job_id, std::string worker_id,
               ParameterTransport* transport = nullptr);

  int num_tables() const { return map_.tables_size(); }
  int32_t dim(int table) const { return map_.tables(table).dim(); }
  const std::string& table_name(int table) const { return map_.tables(table).name(); }
  int64_t map_version() const { return map_.version(); }

  // keys[t]: distinct keys of table t, in any order (one vector per table of
  // the map). (*rows)[t] gets keys[t].size() x dim(t) floats, key by key.
  // The first failed request's error (naming the server); the others are
  // waited for. `rows` may hold part of the rows on error.
  absl::Status Pull(const std::vector<std::vector<uint64_t>>& keys, std::vector<std::vector<float>>* rows,
                    absl::Duration timeout);
  // Pull as data partition steps of `step` read the rows (a BSP job's
  // synchronous tables answer them as they were before that step's update).
  absl::Status PullAtStep(const std::vector<std::vector<uint64_t>>& keys, std::vector<std::vector<float>>* rows,
                          int64_t step, absl::Duration timeout);

  // A BSP job's synchronous tables: every push sends each shard that holds
  // buckets at least one request (empty if need be), so each replica knows
  // when a partition's step is whole. Off by default.
  void set_synchronous(bool synchronous) { synchronous_ = synchronous; }

  // Pushes each key's summed gradient (grads[t]: keys[t].size() x dim(t)) as
  // data partition `partition`'s step `step`: every server applies its part
  // once (a repeat is acknowledged as a duplicate).
  absl::Status Push(int32_t partition, int64_t step, const std::vector<std::vector<uint64_t>>& keys,
                    const std::vector<std::vector<float>>& grads, absl::Duration timeout);

  // A newer shard map is out (a failover) or the job ended: the requests in
  // flight are cancelled at once, and they and later ones answer ABORTED,
  // instead of waiting out their deadline on a server that may be paused.
  void Supersede();

 private:
  // One request: a shard, its primary's address and, per table, the
  // positions of its keys.
  struct Request {
    std::string address;
    int32_t shard = 0;
    std::vector<std::vector<uint32_t>> positions;  // by table
  };
  // `every_shard`: one request at least for each shard holding buckets.
  std::vector<Request> Plan(const std::vector<std::vector<uint64_t>>& keys, bool every_shard) const;
  absl::Status PullRows(const std::vector<std::vector<uint64_t>>& keys, std::vector<std::vector<float>>* rows,
                        std::optional<int64_t> step, absl::Duration timeout);
  // Sends every request; `answer(i, bytes)` takes request i's answer. A
  // request a server refuses as busy (IsServerBusy: its sparse pulls in
  // flight at their bound, ParameterServiceImpl::kMaxPullBytesInFlight, or
  // gRPC's threads all taken there, or at a backup) is sent again, alone
  // with the others refused, after a backoff, until `timeout` (a push too:
  // every replica applies a (partition, step, shard, part) once).
  absl::Status Send(ParameterTransport::Method method, const std::vector<Request>& requests,
                    std::vector<grpc::ByteBuffer> messages, absl::Duration timeout,
                    const std::function<absl::Status(size_t, const grpc::ByteBuffer&)>& answer);
  // One round of Send: the requests `which` names; those refused as busy go
  // to *busy, other errors to the result.
  absl::Status SendRound(ParameterTransport::Method method, const std::vector<Request>& requests,
                         const std::vector<grpc::ByteBuffer>& messages, const std::vector<size_t>& which,
                         absl::Time deadline,
                         const std::function<absl::Status(size_t, const grpc::ByteBuffer&)>& answer,
                         std::vector<size_t>* busy, absl::Status* busy_error);

  const v1::ShardMap map_;
  const std::string job_id_;
  const std::string worker_id_;
  std::unique_ptr<ParameterTransport> own_transport_;  // gRPC, when none was given
  ParameterTransport* const transport_;
  bool synchronous_ = false;
  CallSet calls_;  // in flight
};

}  // namespace fulcrum

#endif  // FULCRUM_WORKER_SPARSE_CLIENT_H_
