// Placement: pure functions over a job's shard map (no locks, no RPCs, no
// clock), which the JobManager applies when a job starts, a server fails, a
// short replica group gets a new backup, a server joins as a new shard, or
// such a handover is undone. Every change to a map bumps its version.
#ifndef FULCRUM_SCHEDULER_PLACEMENT_H_
#define FULCRUM_SCHEDULER_PLACEMENT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fulcrum/v1/scheduler_state.pb.h"
#include "fulcrum/v1/shard_map.pb.h"
#include "fulcrum/v1/parameter.pb.h"
#include "kernels/mlp.h"
#include "kernels/model_from_spec.h"

namespace fulcrum {

struct ServerRef {
  std::string id;
  std::string address;
};

// Stable across processes and platforms (unlike std::hash / absl::Hash).
uint64_t StableHash(const std::string& text);

// A job's first map: its tensors cut into chunks of `chunk_elems`, the
// chunks spread over `num_shards` shards (0: one per server) by rendezvous
// hashing, each shard led by one of `servers` and backed up by the next
// replicas - 1 that rendezvous hashing ranks for it. `servers` must hold at
// least max(1, replicas). Version `version`.
v1::ShardMap PlanShardMap(const std::vector<kernels::TensorInfo>& tensors, const std::vector<ServerRef>& servers,
                          int32_t num_shards, int replicas, int64_t chunk_elems, int64_t version);

// Adds the sparse tables of a click model to a new map: each table's keys in
// spec's model.tables[].buckets buckets (0: kDefaultBucketsPerShard a shard,
// at most kMaxTableBuckets), spread evenly over the map's shards.
// `saved` (may be null): the map of a checkpoint the job restores from, whose
// tables keep their bucket counts.
void AddTableLayouts(const std::vector<kernels::CtrTableInfo>& tables, const v1::JobSpec& spec, v1::ShardMap* map,
                     const v1::ShardMap* saved = nullptr);

// Adds `chunk` (its location and its tensor's initialization in `layout`) to
// the chunks `request` sets up on a server.
void AddChunkSetup(const v1::ChunkLocation& chunk, const ModelLayout& layout, v1::SetupJobRequest* request);

// Shards whose replicas hold state: those of the map's chunks and table
// buckets and, during a
// new shard's handover, the shards its chunks move from (the newcomer holds
// nothing until its copy is done).
std::set<int32_t> HoldingShards(const v1::ShardMap& map, const std::optional<v1::HandoverRecord>& handover);

// The map without server `server_id`: every shard it led is led by its first
// backup that is not `copying` (a backup still copying its state is never
// promoted), and it leaves every group it backed up. An empty shard it led
// is cleared. Returns the changes made, for the job's events; sets *lost to
// the first holding shard that had no other replica (the map is then left as
// it was).
std::vector<std::string> RemoveServer(v1::ShardMap* map, const std::string& server_id,
                                      const std::set<int32_t>& holding, const std::string& copying,
                                      std::optional<int32_t>* lost);

// The candidate rendezvous hashing ranks highest for shard `shard` among
// `candidates` that are not already in its group; none when none is left.
std::optional<ServerRef> ChooseBackup(const v1::ShardMap& map, int32_t shard,
                                      const std::vector<ServerRef>& candidates);

// `newcomer` joins shard `shard` as a backup. Returns the handover to run.
v1::HandoverRecord AddBackup(v1::ShardMap* map, int32_t shard, const ServerRef& newcomer);

// `newcomer` leads a new shard, taking the chunks rendezvous hashing moves to
// it (about 1/N of them). Returns the handover (which chunks moved from which
// shard).
v1::HandoverRecord AddShard(v1::ShardMap* map, const ServerRef& newcomer);

// Puts the map back as it was before `handover`: the moved chunks return to
// the shards they came from and the new shard goes, or the new backup leaves
// its group.
void UndoHandover(v1::ShardMap* map, const v1::HandoverRecord& handover);

// Whether `server_id` holds a role (primary or backup) in the map.
bool InMap(const v1::ShardMap& map, const std::string& server_id);

}  // namespace fulcrum

#endif  // FULCRUM_SCHEDULER_PLACEMENT_H_
