// Takes checkpoints: one consistent cut of a job's parameters, optimizer
// state, update counts, dedup watermarks and data positions.
//  - BSP: a step boundary S. Every server is asked for its chunks' versions,
//    S is picked a little ahead of the highest, and every replica snapshots
//    each chunk at the moment it reaches version S (in memory, under the
//    chunk's lock, so training never waits); a chunk already past S aborts
//    the attempt, which is retried further ahead.
//  - ASP/SSP: each chunk is snapshotted as it is when the request arrives;
//    the cut is the per-chunk versions and per-partition step counts, and
//    each data partition resumes at the lowest step any chunk has of it
//    (chunks that already hold a later step refuse its replay as a
//    duplicate, so no update is applied twice).
// Servers write their snapshots to RocksDB in the background and answer once
// durable. Only when every server has answered is the manifest (chunks,
// versions, checksums, holders) committed to the scheduler's own store; an
// attempt without a committed manifest is never used and its data is deleted.
//
// The coordinator has its own thread and lock (guarding only its queue). It
// knows nothing of jobs: it asks the JobManager for a task's plan when it
// starts and hands it the outcome, through Hooks, and holds no lock of its
// own across either call or across the servers' calls.
#ifndef FULCRUM_SCHEDULER_CHECKPOINT_COORDINATOR_H_
#define FULCRUM_SCHEDULER_CHECKPOINT_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/kv_store.h"
#include "common/sync.h"
#include "fulcrum/v1/scheduler_state.pb.h"
#include "scheduler/server_control.h"

namespace fulcrum {

struct CheckpointTask {
  std::string job_id;
  int64_t id = 0;
};

// What a checkpoint needs of its job, read when it starts.
struct CheckpointPlan {
  std::map<std::string, std::string> servers;  // every replica holding chunks: id -> address
  // Without chunks yet: the job, its map, the servers' addresses, the number
  // of partitions, the global batch, progress, spec and the info so far.
  v1::CheckpointManifest manifest;
  bool synchronous = false;  // BSP: a cut at one step
  int64_t total_steps = 0;
  // The committed checkpoint the tables' buckets may be stored
  // incrementally on (none: every bucket whole).
  std::optional<v1::CheckpointManifest> base;
};

// A committed checkpoint that retention let go.
struct ExpiredCheckpoint {
  int64_t id = 0;
  std::map<std::string, std::string> holders;  // server id -> address
};

// The largest manifest a checkpoint may store its tables incrementally on.
// An incremental manifest nests its bases' entries (AssembleManifest), so it
// is about its base's size plus its own entries: past this the next
// checkpoint is whole, and no manifest grows past a message (a job of 16
// tables of 4096 buckets chaining 64 checkpoints would otherwise reach
// about 150 MB).
constexpr size_t kMaxChainedManifestBytes = 2 << 20;

// Whether the next checkpoint of a job with sparse tables stores them as
// their changes since `latest` (its latest complete checkpoint): while the
// chain is shorter than `full_every` and latest's manifest at most
// kMaxChainedManifestBytes.
bool ChainsOnto(const v1::CheckpointManifest& latest, int full_every);

// The key of a committed checkpoint's manifest in the scheduler's store.
std::string CheckpointManifestKey(const std::string& job_id, int64_t id);

// The manifest of a cut from the servers' answers (pure): the primary's copy
// of each chunk is the checkpoint's, replicas with the same checksum are
// further holders; the step and each partition's resume position. A bucket
// stored incrementally on `base` gets base's entry of it (and base's
// holders' addresses), and the manifest's info its base and chain. INTERNAL
// when a primary's answer lacks one of its chunks, or names a base that is
// not `base` or has no such bucket.
absl::Status AssembleManifest(bool synchronous, int64_t cut,
                              const std::map<std::string, v1::CheckpointResponse>& responses,
                              v1::CheckpointManifest* manifest, const v1::CheckpointManifest* base = nullptr);

// The servers' CheckpointRequest.base_chunks: the buckets that may be
// stored incrementally on `base`, those whose every replica in the map
// `now` holds the committed copy of it (a replica that does not would store
// the bucket whole, and a copy that differs from the primary's is not one
// more holder of the new checkpoint).
std::map<std::string, std::vector<int32_t>> BaseChunksByServer(const v1::CheckpointManifest& base,
                                                               const v1::ShardMap& now);

class CheckpointCoordinator {
 public:
  struct Hooks {
    // The plan of a task about to be taken, or why it cannot be now (the
    // job stopped training, a server is joining it).
    std::function<absl::StatusOr<CheckpointPlan>(const CheckpointTask&)> plan;
    // The outcome: OK with the committed manifest; OUT_OF_RANGE when the job
    // was too near its end; else the failure. Returns the job's committed
    // checkpoints that retention now lets go (their data is deleted).
    std::function<std::vector<ExpiredCheckpoint>(const CheckpointTask&, const absl::Status&,
                                                 const v1::CheckpointManifest&, absl::Duration took)>
        finish;
  };

  // `servers` and `store` (may be null) must outlive the coordinator.
  CheckpointCoordinator(ServerControl* servers, KvStore* store, Hooks hooks);
  ~CheckpointCoordinator();  // calls Stop()

  void Start();
  // Returns once the checkpoint in progress ends (ServerControl::CancelAll
  // first, to cut its calls short); queued ones are not taken.
  void Stop();
  void Enqueue(CheckpointTask task);
  // Takes the queued checkpoints on the calling thread (tests).
  void RunQueued();
  // Deletes a checkpoint's data from `holders`.
  void DeleteEverywhere(const std::map<std::string, std::string>& holders, const std::string& job_id, int64_t id);

 private:
  void Loop();
  bool Next(CheckpointTask* task, bool wait);
  void Take(const CheckpointTask& task);
  // Calls Checkpoint on every server at once (each call blocks until its cut
  // is durable; all must be armed before the job passes the cut).
  // `base_chunks` (may be null): each server's CheckpointRequest.base_chunks.
  absl::Status CheckpointAll(const std::map<std::string, std::string>& servers, const v1::CheckpointRequest& request,
                             std::map<std::string, v1::CheckpointResponse>* responses,
                             const std::map<std::string, std::vector<int32_t>>* base_chunks = nullptr);

  ServerControl* const servers_;
  KvStore* const store_;
  const Hooks hooks_;
  Mutex mu_;
  std::deque<CheckpointTask> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace fulcrum

#endif  // FULCRUM_SCHEDULER_CHECKPOINT_COORDINATOR_H_
