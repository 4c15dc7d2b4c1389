// gRPC edges of the scheduler: JobService (public), ClusterService (internal)
// and the gRPC implementation of ServerControl. They only translate; the
// logic is in JobManager.
#ifndef FULCRUM_SCHEDULER_SERVICES_H_
#define FULCRUM_SCHEDULER_SERVICES_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/call_watch.h"
#include "common/sync.h"
#include "fulcrum/v1/cluster.grpc.pb.h"
#include "fulcrum/v1/job.grpc.pb.h"
#include "fulcrum/v1/parameter.grpc.pb.h"
#include "scheduler/job_manager.h"

namespace fulcrum {

class JobServiceImpl final : public v1::JobService::Service {
 public:
  // Calls that hold a thread while they wait (WatchJob for the job's life,
  // CheckpointJob until the checkpoint is written) run at most this many at
  // once; past it they are refused with RESOURCE_EXHAUSTED, so a flood of
  // them cannot take every thread the process can make.
  static constexpr int kDefaultMaxWaitingCalls = 256;

  // Calls are counted and timed by the server's interceptor (grpc_server_*).
  explicit JobServiceImpl(JobManager* manager, int max_waiting_calls = kDefaultMaxWaitingCalls);
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*, v1::SubmitJobResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::JobStatus*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*, v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*, v1::JobStatus*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*,
                        grpc::ServerWriter<v1::JobStatus>*) override;
  grpc::Status CheckpointJob(grpc::ServerContext*, const v1::CheckpointJobRequest*, v1::CheckpointInfo*) override;
  grpc::Status GetCheckpoint(grpc::ServerContext*, const v1::GetCheckpointRequest*,
                             v1::CheckpointManifest*) override;

  // How long a WatchJob update may take to be sent (a watcher that does
  // not read its stream holds a thread and a waiting place meanwhile):
  // CallWatch::kDefaultAnswerWait unless set. Past it the watch is
  // cancelled.
  void set_write_wait(absl::Duration wait) { write_watch_.set_wait(wait); }
  int64_t writes_cancelled() const { return write_watch_.cancelled(); }

 private:
  // A place among the waiting calls, given back when it goes out of scope;
  // empty (false) when all are taken.
  class WaitingCall {
   public:
    explicit WaitingCall(JobServiceImpl* service);
    ~WaitingCall();
    WaitingCall(const WaitingCall&) = delete;
    WaitingCall& operator=(const WaitingCall&) = delete;
    explicit operator bool() const { return admitted_; }

   private:
    JobServiceImpl* service_;
    bool admitted_;
  };
  grpc::Status TooManyWaiting(const char* what) const;

  JobManager* manager_;
  const int max_waiting_calls_;
  std::atomic<int> waiting_calls_{0};
  CallWatch write_watch_{"its watcher to read an update", CallWatch::kDefaultAnswerWait};
};

class ClusterServiceImpl final : public v1::ClusterService::Service {
 public:
  explicit ClusterServiceImpl(JobManager* manager);
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest*, v1::RegisterResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*, v1::HeartbeatResponse*) override;
  grpc::Status ReportWork(grpc::ServerContext*, const v1::WorkReport*, v1::WorkReportResponse*) override;
  grpc::Status ListMembers(grpc::ServerContext*, const v1::ListMembersRequest*, v1::ListMembersResponse*) override;
  grpc::Status Leave(grpc::ServerContext*, const v1::LeaveRequest*, v1::LeaveResponse*) override;

 private:
  JobManager* manager_;
};

// Reaches parameter servers over gRPC, one cached channel per address.
class GrpcServerControl final : public ServerControl {
 public:
  absl::Status SetupJob(const std::string& address, const v1::SetupJobRequest& request) override;
  absl::Status DropJob(const std::string& address, const std::string& job_id,
                       const std::string& reason, bool keep_parameters, int64_t map_version) override;
  absl::Status Reconfigure(const std::string& address, const std::string& job_id, const v1::ShardMap& map) override;
  absl::Status FreeMovedChunks(const std::string& address, const std::string& job_id,
                               const v1::ShardMap& map) override;
  absl::StatusOr<v1::CheckpointResponse> Checkpoint(const std::string& address,
                                                    const v1::CheckpointRequest& request) override;
  absl::Status DeleteCheckpoint(const std::string& address, const std::string& job_id,
                                int64_t checkpoint_id) override;
  void CancelAll() override;
  void MarkDead(const std::string& address) override;
  void MarkAlive(const std::string& address) override;

  // The addresses MarkDead names and no MarkAlive followed are kept, at most
  // this many (the oldest forgotten first): a pod restarted advertises a new
  // IP, so addresses that never come back pile up in a long-lived scheduler.
  static constexpr size_t kMaxDeadAddresses = 1024;
  // The channels held: one per address called and not forgotten since.
  size_t channels() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether calls to `address` fail at once (it lost its lease).
  bool dead(const std::string& address) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Reconfigure, or with `moves_committed` FreeMovedChunks: the map to the server (retried while
  // UNAVAILABLE, three times).
  absl::Status SendMap(const std::string& address, const std::string& job_id, const v1::ShardMap& map,
                       bool moves_committed);
  std::shared_ptr<v1::ParameterService::Stub> StubLocked(const std::string& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One call with a deadline of `seconds`; CancelAll cancels it. Refused
  // as busy (gRPC's threads all taken on the server, before the method
  // ran), it is sent again after a busy backoff within that deadline, and
  // is UNAVAILABLE once the deadline comes (a server away for now).
  template <typename Request, typename Response>
  absl::Status Call(const std::string& address,
                    grpc::Status (v1::ParameterService::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response, double seconds);
  mutable Mutex mu_;
  // A call holds its stub while MarkDead drops it from here.
  std::map<std::string, std::shared_ptr<v1::ParameterService::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  // Calls CancelAll and MarkDead cancel, with their servers' addresses.
  std::map<grpc::ClientContext*, std::string> in_flight_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> cut_ ABSL_GUARDED_BY(mu_);  // cancelled by MarkDead
  std::set<std::string> dead_ ABSL_GUARDED_BY(mu_);          // addresses MarkDead named
  std::deque<std::string> dead_order_ ABSL_GUARDED_BY(mu_);  // dead_, oldest first
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace fulcrum

#endif  // FULCRUM_SCHEDULER_SERVICES_H_
