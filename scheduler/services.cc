#include "scheduler/services.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/sync.h"

namespace fulcrum {

JobServiceImpl::JobServiceImpl(JobManager* manager, int max_waiting_calls)
    : manager_(manager), max_waiting_calls_(max_waiting_calls) {}

JobServiceImpl::WaitingCall::WaitingCall(JobServiceImpl* service)
    : service_(service), admitted_(service->waiting_calls_.fetch_add(1) < service->max_waiting_calls_) {
  if (!admitted_) service_->waiting_calls_.fetch_sub(1);
}

JobServiceImpl::WaitingCall::~WaitingCall() {
  if (admitted_) service_->waiting_calls_.fetch_sub(1);
}

grpc::Status JobServiceImpl::TooManyWaiting(const char* what) const {
  return grpc::Status(
      grpc::StatusCode::RESOURCE_EXHAUSTED,
      absl::StrCat(what, ": the scheduler serves at most ", max_waiting_calls_,
                   " watches and checkpoint waits at once, and all are taken; retry later, or poll "
                   "with GetJob"));
}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* /*context*/, const v1::SubmitJobRequest* request,
                                       v1::SubmitJobResponse* response) {
  auto status = manager_->Submit(request->spec(), request->resume_from());
  if (!status.ok()) return ToGrpcStatus(status.status());
  response->set_job_id(status->job_id());
  *response->mutable_status() = std::move(*status);
  return ToGrpcStatus(absl::OkStatus());
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* /*context*/, const v1::GetJobRequest* request,
                                    v1::JobStatus* response) {
  auto status = manager_->Get(request->job_id());
  if (status.ok()) *response = std::move(*status);
  return ToGrpcStatus(status.status());
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* /*context*/, const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  auto page = manager_->ListPage(*request);
  if (page.ok()) *response = std::move(*page);
  return ToGrpcStatus(page.status());
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* /*context*/, const v1::CancelJobRequest* request,
                                       v1::JobStatus* response) {
  auto status = manager_->Cancel(request->job_id());
  if (status.ok()) *response = std::move(*status);
  return ToGrpcStatus(status.status());
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::JobStatus>* writer) {
  const WaitingCall place(this);
  if (!place) return TooManyWaiting("WatchJob");
  int64_t version = -1;
  while (!context->IsCancelled()) {
    int64_t seen = version;
    auto status = manager_->WaitForChange(request->job_id(), &version, absl::Milliseconds(500));
    if (!status.ok()) return ToGrpcStatus(status.status());
    if (version == seen) continue;  // timed out: only check for cancellation
    bool written = false;
    {
      const CallWatch::Scope sending(&write_watch_, context);
      written = writer->Write(*status);
    }
    if (!written) break;  // client went away, or did not read within the wait
    v1::JobState state = status->state();
    if (state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED) break;
  }
  return ToGrpcStatus(absl::OkStatus());
}

grpc::Status JobServiceImpl::CheckpointJob(grpc::ServerContext* context, const v1::CheckpointJobRequest* request,
                                           v1::CheckpointInfo* response) {
  // Waits for the checkpoint, within the client's deadline (10 minutes at most).
  const WaitingCall place(this);
  if (!place) return TooManyWaiting("CheckpointJob");
  absl::Duration timeout = absl::Minutes(10);
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    timeout = std::min(timeout, absl::FromChrono(context->deadline()) - absl::Now());
  }
  auto info = manager_->CheckpointNow(request->job_id(), timeout);
  if (info.ok()) *response = std::move(*info);
  return ToGrpcStatus(info.status());
}

grpc::Status JobServiceImpl::GetCheckpoint(grpc::ServerContext* /*context*/, const v1::GetCheckpointRequest* request,
                                           v1::CheckpointManifest* response) {
  auto manifest = manager_->GetCheckpoint(request->job_id(), request->checkpoint_id());
  if (manifest.ok()) *response = std::move(*manifest);
  return ToGrpcStatus(manifest.status());
}

ClusterServiceImpl::ClusterServiceImpl(JobManager* manager) : manager_(manager) {}

grpc::Status ClusterServiceImpl::Register(grpc::ServerContext* /*context*/, const v1::RegisterRequest* request,
                                          v1::RegisterResponse* response) {
  auto result = manager_->Register(*request);
  if (result.ok()) *response = std::move(*result);
  return ToGrpcStatus(result.status());
}

grpc::Status ClusterServiceImpl::Heartbeat(grpc::ServerContext* /*context*/, const v1::HeartbeatRequest* request,
                                           v1::HeartbeatResponse* response) {
  auto result = manager_->Heartbeat(*request);
  if (result.ok()) *response = std::move(*result);
  return ToGrpcStatus(result.status());
}

grpc::Status ClusterServiceImpl::ReportWork(grpc::ServerContext* /*context*/, const v1::WorkReport* request,
                                            v1::WorkReportResponse*) {
  return ToGrpcStatus(manager_->Report(*request));
}

grpc::Status ClusterServiceImpl::ListMembers(grpc::ServerContext* /*context*/, const v1::ListMembersRequest*,
                                             v1::ListMembersResponse* response) {
  for (v1::MemberInfo& member : manager_->Members()) *response->add_members() = std::move(member);
  return ToGrpcStatus(absl::OkStatus());
}

grpc::Status ClusterServiceImpl::Leave(grpc::ServerContext* /*context*/, const v1::LeaveRequest* request, v1::LeaveResponse*) {
  return ToGrpcStatus(manager_->Leave(request->member_id(), request->incarnation()));
}

std::shared_ptr<v1::ParameterService::Stub> GrpcServerControl::StubLocked(const std::string& address) {
  auto& stub = stubs_[address];
  if (stub == nullptr) stub = v1::ParameterService::NewStub(MakeChannel(address));
  return stub;
}

size_t GrpcServerControl::channels() const {
  MutexLock lock(&mu_);
  return stubs_.size();
}

bool GrpcServerControl::dead(const std::string& address) const {
  MutexLock lock(&mu_);
  return dead_.count(address) > 0;
}

template <typename Request, typename Response>
absl::Status GrpcServerControl::Call(const std::string& address,
                                     grpc::Status (v1::ParameterService::Stub::*method)(grpc::ClientContext*,
                                                                                       const Request&, Response*),
                                     const Request& request, Response* response, double seconds) {
  const absl::Time deadline = absl::Now() + absl::Seconds(seconds);
  BusyBackoff busy;
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    std::shared_ptr<v1::ParameterService::Stub> stub;
    {
      MutexLock lock(&mu_);
      if (cancelled_) return absl::CancelledError("the scheduler is stopping");
      if (dead_.count(address) > 0) {
        return absl::UnavailableError(absl::StrCat(
            "the server at ", address, " lost its lease; it is not called until it registers again"));
      }
      stub = StubLocked(address);
      in_flight_.emplace(&context, address);
    }
    absl::Status status = FromGrpcStatus((stub.get()->*method)(&context, request, response));
    {
      MutexLock lock(&mu_);
      in_flight_.erase(&context);
      if (cut_.erase(&context) > 0) {
        return absl::UnavailableError(absl::StrCat(
            "the server at ", address, " lost its lease while the call was in flight: cut short"));
      }
    }
    if (!IsServerBusy(status)) return status;
    // Refused as busy (gRPC's threads all taken there), before the method
    // ran: sent again within the call's deadline; still refused then, a
    // failure for now, tried again as for a server away, never one of the
    // job's.
    if (!busy.WaitBefore(deadline)) {
      return absl::UnavailableError(absl::StrCat(
          "the server at ", address, " is busy (refused until the call's deadline): ", status.message()));
    }
  }
}

absl::Status GrpcServerControl::SetupJob(const std::string& address, const v1::SetupJobRequest& request) {
  v1::SetupJobResponse response;
  return Call(address, &v1::ParameterService::Stub::SetupJob, request, &response, 30.0);
}

absl::Status GrpcServerControl::Reconfigure(const std::string& address, const std::string& job_id,
                                            const v1::ShardMap& map) {
  return SendMap(address, job_id, map, /*moves_committed=*/false);
}

absl::Status GrpcServerControl::FreeMovedChunks(const std::string& address, const std::string& job_id,
                                                const v1::ShardMap& map) {
  return SendMap(address, job_id, map, /*moves_committed=*/true);
}

absl::Status GrpcServerControl::SendMap(const std::string& address, const std::string& job_id,
                                        const v1::ShardMap& map, bool moves_committed) {
  v1::ReconfigureRequest request;
  request.set_job_id(job_id);
  *request.mutable_shard_map() = map;
  request.set_moves_committed(moves_committed);
  absl::Status status;
  for (int attempt = 0; attempt < 3; ++attempt) {  // a server that misses the new map stalls the job's pushes
    v1::ReconfigureResponse response;
    status = Call(address, &v1::ParameterService::Stub::Reconfigure, request, &response, 5.0);
    if (status.ok() || !absl::IsUnavailable(status)) break;
  }
  if (absl::IsFailedPrecondition(status) && absl::StrContains(status.message(), "older than the one held")) {
    // The server holds a newer map already: the scheduler's calls run on a
    // pool, so a later Reconfigure can overtake this one. Nothing is lost.
    FLOG(INFO) << "job " << job_id << " on " << address << ": map v" << map.version() << " superseded there ("
               << status.message() << ")";
  } else if (!status.ok()) {
    FLOG(WARNING) << "reconfiguring job " << job_id << " on " << address << ": " << status;
  }
  return status;
}

absl::Status GrpcServerControl::DropJob(const std::string& address, const std::string& job_id,
                                        const std::string& reason, bool keep_parameters, int64_t map_version) {
  v1::DropJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  request.set_keep_parameters(keep_parameters);
  request.set_map_version(map_version);
  v1::DropJobResponse response;
  absl::Status status = Call(address, &v1::ParameterService::Stub::DropJob, request, &response, 5.0);
  if (!status.ok()) FLOG(WARNING) << "dropping job " << job_id << " on " << address << ": " << status;
  return status;
}

absl::StatusOr<v1::CheckpointResponse> GrpcServerControl::Checkpoint(const std::string& address,
                                                                     const v1::CheckpointRequest& request) {
  v1::CheckpointResponse response;
  // The cut's wait, then the write.
  RETURN_IF_ERROR(Call(address, &v1::ParameterService::Stub::Checkpoint, request, &response,
                       request.timeout_ms() / 1000.0 + 30.0));
  return response;
}

void GrpcServerControl::CancelAll() {
  MutexLock lock(&mu_);
  cancelled_ = true;
  for (const auto& [context, address] : in_flight_) context->TryCancel();
}

void GrpcServerControl::MarkDead(const std::string& address) {
  MutexLock lock(&mu_);
  if (dead_.insert(address).second) {
    dead_order_.push_back(address);
    if (dead_order_.size() > kMaxDeadAddresses) {
      // Forgotten: its channel goes too (it closes once the calls in flight
      // end). A dead server's channel is kept until then: one that comes
      // back (a paused process) is called on its open connection at once,
      // and the calls queued for it go out in the order they were made.
      stubs_.erase(dead_order_.front());
      dead_.erase(dead_order_.front());
      dead_order_.pop_front();
    }
  }
  for (const auto& [context, to] : in_flight_) {
    if (to != address) continue;
    cut_.insert(context);
    context->TryCancel();
  }
}

void GrpcServerControl::MarkAlive(const std::string& address) {
  MutexLock lock(&mu_);
  if (dead_.erase(address) > 0) dead_order_.erase(std::find(dead_order_.begin(), dead_order_.end(), address));
}

absl::Status GrpcServerControl::DeleteCheckpoint(const std::string& address, const std::string& job_id,
                                                 int64_t checkpoint_id) {
  v1::DeleteCheckpointRequest request;
  request.set_job_id(job_id);
  request.set_checkpoint_id(checkpoint_id);
  v1::DeleteCheckpointResponse response;
  absl::Status status = Call(address, &v1::ParameterService::Stub::DeleteCheckpoint, request, &response, 10.0);
  if (!status.ok()) FLOG(WARNING) << "deleting checkpoint " << checkpoint_id << " of job " << job_id << " on " << address << ": " << status;
  return status;
}

}  // namespace fulcrum
