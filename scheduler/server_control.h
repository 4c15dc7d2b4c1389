// How the scheduler reaches parameter servers (scheduler/services.cc
// implements it over gRPC; tests fake it).
#ifndef FULCRUM_SCHEDULER_SERVER_CONTROL_H_
#define FULCRUM_SCHEDULER_SERVER_CONTROL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fulcrum/v1/parameter.pb.h"
#include "fulcrum/v1/shard_map.pb.h"

namespace fulcrum {

// How the scheduler reaches parameter servers. Implementations must be
// thread-safe; they are never called with the manager's lock held.
class ServerControl {
 public:
  virtual ~ServerControl() = default;
  virtual absl::Status SetupJob(const std::string& address, const v1::SetupJobRequest& request) = 0;
  // keep_parameters: the job succeeded; keep its parameters readable.
  // map_version: the job's shard-map version when the drop was decided; the
  // server keeps a copy set up at a newer one (0: drop any).
  virtual absl::Status DropJob(const std::string& address, const std::string& job_id,
                               const std::string& reason, bool keep_parameters, int64_t map_version) = 0;
  // Gives a server the shard map after a failover.
  virtual absl::Status Reconfigure(const std::string& address, const std::string& job_id,
                                   const v1::ShardMap& map) = 0;
  // Tells a server that the chunk moves of `map` are committed: it frees the
  // chunks it holds of shards it has no role in (ReconfigureRequest.
  // moves_committed). Best effort: a server that misses it keeps them.
  virtual absl::Status FreeMovedChunks(const std::string& /*address*/, const std::string& /*job_id*/,
                                       const v1::ShardMap& /*map*/) {
    return absl::OkStatus();
  }
  // Checkpoints: cut (and write) the server's chunks of a job; returns once
  // durable. See fulcrum.v1.CheckpointRequest.
  virtual absl::StatusOr<v1::CheckpointResponse> Checkpoint(const std::string& address,
                                                            const v1::CheckpointRequest& request) = 0;
  // checkpoint_id 0: every checkpoint of the job.
  virtual absl::Status DeleteCheckpoint(const std::string& address, const std::string& job_id,
                                        int64_t checkpoint_id) = 0;
  // Cancels the calls in flight (the scheduler is stopping).
  virtual void CancelAll() {}
  // The server at `address` lost its lease (killed, paused, cut off): its
  // calls in flight are cut short and new ones fail at once, UNAVAILABLE,
  // until MarkAlive (it registers again), so that no call waits out its
  // deadline on a process that may never answer.
  virtual void MarkDead(const std::string& /*address*/) {}
  virtual void MarkAlive(const std::string& /*address*/) {}
};

}  // namespace fulcrum

#endif  // FULCRUM_SCHEDULER_SERVER_CONTROL_H_
