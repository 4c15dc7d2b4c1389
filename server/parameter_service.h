// gRPC edge of the parameter server: fulcrum.v1.ParameterService over a
// ParameterStore. Translates messages and statuses; holds no training logic.
#ifndef FULCRUM_SERVER_PARAMETER_SERVICE_H_
#define FULCRUM_SERVER_PARAMETER_SERVICE_H_

#include <grpcpp/generic/generic_stub.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "common/call_watch.h"
#include "common/metrics.h"
#include "common/payload_wire.h"
#include "common/sync.h"
#include "common/thread_pool.h"
#include "fulcrum/v1/parameter.grpc.pb.h"
#include "server/buffer_pool.h"
#include "server/checkpoint_store.h"
#include "server/held_pulls.h"
#include "server/parameter_store.h"
#include "server/replication.h"
#include "server/table_gauges.h"

namespace fulcrum {

// The largest pull answer a server builds (below the 8 MiB message limit).
constexpr int64_t kMaxPullBytes = 7 << 20;
// A table bucket's state travels in slices of at most this many bytes
// (ReadCheckpoint, CopyChunk).
constexpr size_t kTableStateSlice = size_t{4} << 20;

// Answers chunk `chunk_id` of `snapshot` with the slice of its table state
// at `offset` (at most kTableStateSlice bytes) and the whole state's size;
// OUT_OF_RANGE, naming `what` (the chunk, the bucket), for an offset outside
// the state. Whether that slice is the last.
absl::StatusOr<bool> AnswerTableStateSlice(const ChunkSnapshot& snapshot, int32_t chunk_id, int64_t offset,
                                           const char* what, v1::ChunkState* response);

// Translates the job spec's optimizer and schedule into the store's configs.
JobShardConfig ToJobShardConfig(const v1::SetupJobRequest& request);

// The job's sparse tables as the shard map lays them out and the spec sets
// them up (server/parameter_service_sparse.cc).
std::vector<SparseTableSetup> TableSetupsOf(const v1::JobSpec& spec, const v1::ShardMap& map);
// A step a push or pull of the job names (`what`: "push", "sparse pull",
// ...): in [0, its total steps] (SetupJob's; 0: not said, then only >= 0).
// A step past the job's end would be kept as its partition's last,
// turning every later push of the partition into a silent duplicate.
absl::Status CheckJobStep(const std::string& job_id, const JobShard& shard, int64_t step, const char* what);

// The roles a shard map gives `server_id`, per shard it is a replica of.
// chunk id -> shard in a shard map.
std::map<int32_t, int32_t> ChunkShards(const v1::ShardMap& map);
std::map<int32_t, JobShard::ShardRole> RolesFor(const v1::ShardMap& map, const std::string& server_id);

// ReplicaPeers over gRPC: a channel per peer address, kept for the
// process's life (a cluster has a handful of servers).
class GrpcReplicaPeers final : public ReplicaPeers {
 public:
  std::unique_ptr<Forward> Replicate(const std::string& address, Method method, grpc::ByteBuffer request,
                                     absl::Duration timeout) override;
  absl::StatusOr<v1::ChunkState> CopyChunk(const std::string& address, const v1::CopyChunkRequest& request,
                                           absl::Duration timeout) override;
  v1::ParameterService::Stub* Stub(const std::string& address) { return At(address).stub.get(); }

 private:
  struct Peer {
    std::unique_ptr<v1::ParameterService::Stub> stub;
    std::unique_ptr<grpc::GenericStub> raw;  // for forwards of received bytes
  };
  Peer& At(const std::string& address);

  Mutex mu_;  // guards peers_
  std::map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);  // entries are never removed
};

// The data RPCs handle their messages as bytes (common/payload_wire.h), so
// tensor payloads are never copied into or out of protobuf messages:
// - Pull is served with gRPC's callback API: a pull that must wait for a
//   step is held (server/held_pulls.h) without occupying a thread; the
//   values read from the chunks go to gRPC as they are.
// - Push and Replicate run on gRPC's sync threads (a primary waits there for
//   its backups) as "streamed unary" methods of raw bytes (the same calls on
//   the wire): each gradient is decoded once, from the received slices into
//   a pooled buffer, validated and applied from there, and a primary forwards
//   the received payload slices themselves to its backups. SparsePush and
//   SparseReplicate likewise.
// - SparsePull is served with gRPC's callback API too, answered on the
//   callback thread; a pull of a step (BSP) may wait for the shard's push
//   lock, which a step's apply or a capture of whole buckets holds for long,
//   so it is answered from a pool of this service's own threads instead.
class ParameterServiceImpl final
    : public v1::ParameterService::WithRawCallbackMethod_SparsePull<
          v1::ParameterService::WithRawCallbackMethod_Pull<v1::ParameterService::Service>> {
 public:
  // `store` and `metrics` must outlive the service. `lease_valid` says
  // whether this server still holds its membership lease; without it the
  // server takes no writes (fencing a primary cut off from the scheduler).
  // `checkpoints` (may be null: the server then takes no checkpoints) is
  // where checkpoints are written, in the background, and read from.
  ParameterServiceImpl(ParameterStore* store, MetricsEndpoint* metrics,
                       std::function<bool()> lease_valid = nullptr, CheckpointStore* checkpoints = nullptr);
  ~ParameterServiceImpl() override;

  grpc::Status SetupJob(grpc::ServerContext* context, const v1::SetupJobRequest* request,
                        v1::SetupJobResponse* response) override;
  grpc::Status DropJob(grpc::ServerContext* context, const v1::DropJobRequest* request,
                       v1::DropJobResponse* response) override;
  // A Push (`from_worker`) or Replicate without gRPC: `request` holds a
  // serialized PushRequest.
  absl::Status HandlePush(const grpc::ByteBuffer& request, bool from_worker, v1::PushResponse* response);
  // One chunk's outcome of a push in its answer and the metrics.
  void CountOutcome(PushOutcome outcome, v1::PushResponse* response);
  // A push of LAMB norms (PushRequest.lamb_norms), after HandlePush's fencing.
  absl::Status HandleLambNorms(JobShard& shard, const v1::PushRequest& header, const PayloadReader& chunks,
                               bool from_worker, v1::PushResponse* response);
  // Request: a PullRequest; response: a PullResponse.
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  // The caller's hold on a pull that may be waiting: Cancel() (from any
  // thread, before or after the pull is held) ends it CANCELLED soon.
  class PullHandle {
   public:
    PullHandle() = default;
    PullHandle(const PullHandle&) = delete;
    PullHandle& operator=(const PullHandle&) = delete;
    // Gives back the bytes the pull held in its service's count: its caller
    // (gRPC, once done with the call) drops the handle with the answer.
    ~PullHandle();
    void Cancel();

   private:
    friend class ParameterServiceImpl;
    // Counts `bytes` more against the pull's service (ReservePull).
    absl::Status Reserve(ParameterServiceImpl* service, int64_t bytes, const char* what);
    std::atomic<int64_t>* counted_ = nullptr;  // set by the first Reserve
    std::atomic<int64_t> reserved_{0};
    // The pull to cancel once it is held; Detach lets go of it once it is
    // answered (it holds its job's shard, which may be dropped meanwhile).
    void Attach(std::shared_ptr<HeldPull> pull, HeldPulls* held);
    void Detach();
    Mutex mu_;
    std::shared_ptr<HeldPull> pull_ ABSL_GUARDED_BY(mu_);
    HeldPulls* held_ ABSL_GUARDED_BY(mu_) = nullptr;
    bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  };
  // A Pull of raw bytes (`request`: a serialized PullRequest), as gRPC's
  // Pull serves it and as an in-process caller makes it: `done` runs once,
  // on this thread or on a HeldPulls thread, with the status and, when OK,
  // the serialized PullResponse. The pull waits at most until `deadline`
  // (capped at two minutes from now) and until `handle` is cancelled. The
  // request's bytes and the answer's own (not lent) are counted against
  // kMaxPullBytesInFlight until `handle` is dropped.
  void HandlePull(const grpc::ByteBuffer& request, absl::Time deadline, const std::shared_ptr<PullHandle>& handle,
                  std::function<void(const absl::Status&, grpc::ByteBuffer)> done);
  // A Pull without gRPC: checks it, answers it at once (calling `finish` and
  // returning nullptr) when its chunks are there, else returns the pull to
  // hold (see HeldPulls); an error (not passed to `finish`) when refused.
  // `response` must outlive `finish`. With `lent`, float32 values are not
  // copied into the response: lent[i] gets chunk i's values as a slice over
  // the chunk's own memory (an empty slice where the chunk's data holds them).
  absl::StatusOr<std::shared_ptr<HeldPull>> StartPull(const v1::PullRequest& request, v1::PullResponse* response,
                                                       absl::Time deadline,
                                                       std::function<void(const absl::Status&)> finish,
                                                       std::vector<grpc::Slice>* lent = nullptr);
  grpc::Status Reconfigure(grpc::ServerContext* context, const v1::ReconfigureRequest* request,
                           v1::ReconfigureResponse* response) override;
  grpc::Status CopyChunk(grpc::ServerContext* context, const v1::CopyChunkRequest* request,
                         v1::ChunkState* response) override;
  // Checkpoints (server/parameter_service_checkpoint.cc).
  grpc::Status Checkpoint(grpc::ServerContext* context, const v1::CheckpointRequest* request,
                          v1::CheckpointResponse* response) override;
  grpc::Status ReadCheckpoint(grpc::ServerContext* context, const v1::ReadCheckpointRequest* request,
                              v1::ChunkState* response) override;
  grpc::Status DeleteCheckpoint(grpc::ServerContext* context, const v1::DeleteCheckpointRequest* request,
                                v1::DeleteCheckpointResponse* response) override;
  // Sparse tables (server/parameter_service_sparse.cc), served as raw
  // bytes: a SparsePullRequest's answer is a SparsePullResponse whose rows
  // go out from where the table wrote them.
  absl::Status HandleSparsePull(const grpc::ByteBuffer& request, grpc::ByteBuffer* response);
  // gRPC's SparsePull: answered on gRPC's callback thread, or, for a pull of
  // a step (which may wait for the shard's push lock), from
  // sparse_step_pulls_.
  grpc::ServerUnaryReactor* SparsePull(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  // The bytes pulls in flight hold (each request and its parsed copy, and
  // its answer's own bytes, until gRPC is done with the call; with the old
  // chunk values that float32 answers still send, JobShardConfig::
  // orphaned_values), and the most they may: a pull past it is answered
  // RESOURCE_EXHAUSTED "server busy" (kServerBusy; workers send it again),
  // so callers that send many pulls and read their answers slowly, or
  // never, cannot make the server hold more. A sparse pull takes at most
  // 23 MiB (an 8 MiB request twice, a 7 MiB answer); a dense pull's request
  // counts 8 bytes more a chunk id, and a held one keeps its request until
  // it is answered.
  static constexpr int64_t kMaxPullBytesInFlight = int64_t{1} << 30;
  void set_max_pull_bytes_in_flight(int64_t bytes) { max_pull_bytes_in_flight_ = bytes; }
  // How long the request of a Push, Replicate, SparsePush or
  // SparseReplicate may take to come once its call started (it holds a
  // gRPC thread meanwhile): CallWatch::kDefaultWait unless set.
  void set_request_wait(absl::Duration wait) { request_watch_.set_wait(wait); }
  int64_t requests_cancelled() const { return request_watch_.cancelled(); }
  int64_t pull_bytes_in_flight() const { return pull_bytes_in_flight_.load() + orphaned_values_->load(); }
  // A SparsePushRequest, its gradients read where they arrived: a
  // SparsePush (`from_worker`: this server must lead the request's shard,
  // and forwards the bytes as they came to the shard's backups before
  // applying them) or a SparseReplicate (this server must be a backup of
  // the shard).
  absl::Status HandleSparsePush(const grpc::ByteBuffer& request, bool from_worker,
                                v1::SparsePushResponse* response);
  // CopyChunk of a table bucket: a live capture served in slices.
  absl::Status CopyTableBucket(const v1::CopyChunkRequest& request, v1::ChunkState* response);

 private:
  // Push, Replicate, SparsePush and SparseReplicate on gRPC's threads: the
  // request's bytes read, `handle` answers them (or fails), the answer sent
  // with the status.
  using RawStream = grpc::ServerUnaryStreamer<grpc::ByteBuffer, grpc::ByteBuffer>;
  // A request that has not come within request_watch_'s wait (30 s) is
  // cancelled, so that its thread is free.
  grpc::Status ServeRaw(grpc::ServerContext* context, RawStream* stream, const char* method,
                        absl::FunctionRef<absl::Status(const grpc::ByteBuffer&, grpc::ByteBuffer*)> handle);
  // A parsed SparsePullRequest answered (HandleSparsePull after its parse).
  absl::Status AnswerSparsePull(const v1::SparsePullRequest& request, grpc::ByteBuffer* response);
  // Adds `bytes` to pull_bytes_in_flight_, or RESOURCE_EXHAUSTED "server
  // busy" (nothing added) when that, with orphaned_values_, would pass
  // max_pull_bytes_in_flight_; `what` names them.
  absl::Status ReservePull(int64_t bytes, const char* what);
  // SetupJob of a job's fresh (or checkpointed) state; of chunks copied from
  // other replicas (`sources`: chunk id -> where to copy it from).
  // `config`: the request's (ConfigFor), converted once.
  absl::Status SetupFresh(const v1::SetupJobRequest& request, JobShardConfig config);
  absl::Status SetupCopies(const v1::SetupJobRequest& request, JobShardConfig config,
                           const std::map<int32_t, std::string>& sources);
  // ToJobShardConfig plus this server's metrics hooks.
  JobShardConfig ConfigFor(const v1::SetupJobRequest& request);
  // A job starting from a checkpoint: each chunk's state, read from this
  // server's store or from a server that wrote it, checksum verified.
  absl::Status RestoreChunks(JobShard* shard, const v1::RestoreSource& restore);
  // One stored chunk as it is (a table bucket possibly incremental) of
  // checkpoint `checkpoint_id` of the restore's job.
  absl::StatusOr<ChunkSnapshot> ReadCheckpointChunk(const v1::RestoreSource& restore, int64_t checkpoint_id,
                                                    const v1::CheckpointChunk& chunk);

  grpc::Status Finish(const char* method, const absl::Status& status, int64_t received,
                      int64_t sent);
  // The checks a pull passes before it is served or held.
  absl::Status CheckPull(const JobShard& shard, const v1::PullRequest& request) const;

  ParameterStore* store_;
  MetricsEndpoint* metrics_;
  std::unique_ptr<HeldPulls> held_pulls_;
  // SparsePulls of a step: they may wait for a shard's push lock, which
  // must not hold gRPC's few callback threads.
  std::unique_ptr<ThreadPool> sparse_step_pulls_;
  CallWatch request_watch_{"its request to come"};
  std::atomic<int64_t> pull_bytes_in_flight_{0};
  std::atomic<int64_t> max_pull_bytes_in_flight_{kMaxPullBytesInFlight};
  const std::shared_ptr<std::atomic<int64_t>> orphaned_values_ = std::make_shared<std::atomic<int64_t>>(0);
  // Pushes and replications hold it shared from their checks to their apply;
  // Reconfigure holds it exclusively, so no push straddles a role change
  // (a new backup then copies a state no push can change unseen).
  Mutex writes_mu_;
  GrpcReplicaPeers peers_;
  std::unique_ptr<Replicator> replicator_;  // fencing, forwards to backups, copies from replicas
  FloatBufferPool gradients_;  // decoded pushes
  prometheus::Counter* updates_applied_;
  prometheus::Counter* duplicates_;
  prometheus::Gauge* jobs_;
  CheckpointStore* checkpoints_;
  std::unique_ptr<CheckpointWriter> writer_;  // with checkpoints_
  // The last chunk ReadCheckpoint served in slices (a table bucket bigger
  // than one answer), so that its later slices are not read and verified
  // again each.
  struct SlicedChunk {
    std::string job_id;
    int64_t checkpoint_id = 0;
    int32_t chunk_id = -1;
    uint32_t checksum = 0;
    std::shared_ptr<const ChunkSnapshot> snapshot;
  };
  Mutex sliced_mu_;
  SlicedChunk sliced_ ABSL_GUARDED_BY(sliced_mu_);
  // Table buckets CopyChunk captured live and is serving in slices (each
  // bigger than one answer), oldest first: at most kKeptCaptures, of at most
  // kKeptCaptureBytes together and within what the memory budget has left,
  // each dropped after its last slice or kKeptCaptureTime. At most
  // kCapturesAtOnce captures are being taken at once.
  struct LiveCapture {
    std::string job_id;
    int32_t chunk_id = -1;
    uint64_t id = 0;
    absl::Time taken;
    std::shared_ptr<const ChunkSnapshot> snapshot;
  };
  static constexpr size_t kKeptCaptures = 4;
  static constexpr int64_t kKeptCaptureBytes = int64_t{256} << 20;
  static constexpr absl::Duration kKeptCaptureTime = absl::Seconds(60);
  static constexpr int kCapturesAtOnce = 2;
  // Keeps `capture` for its later slices, making room by dropping older
  // ones; RESOURCE_EXHAUSTED when it cannot fit.
  absl::Status KeepCaptureLocked(LiveCapture capture) ABSL_EXCLUSIVE_LOCKS_REQUIRED(captures_mu_);
  Mutex captures_mu_;
  std::vector<LiveCapture> captures_ ABSL_GUARDED_BY(captures_mu_);
  uint64_t next_capture_ ABSL_GUARDED_BY(captures_mu_) = 1;
  int captures_in_progress_ ABSL_GUARDED_BY(captures_mu_) = 0;
  prometheus::Histogram* optimizer_seconds_;
  prometheus::Counter* checkpoint_bytes_;
  std::unique_ptr<TableGauges> table_gauges_;
  prometheus::Counter* sparse_keys_pulled_;
  prometheus::Counter* sparse_keys_pushed_;
  prometheus::Histogram* checkpoint_seconds_;
};

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_PARAMETER_SERVICE_H_
