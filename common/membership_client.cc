#include "common/membership_client.h"

#include <unistd.h>

#include <algorithm>
#include <random>

#include "absl/time/clock.h"

#include "common/logging.h"
#include "common/rpc.h"
#include "common/sync.h"

namespace fulcrum {

namespace {

// The heartbeat interval while hurried (see Hurry).
constexpr int64_t kHurriedIntervalMs = 50;

uint64_t NewIncarnation() {
  std::random_device random;
  return ((static_cast<uint64_t>(random()) << 32) ^ random() ^ static_cast<uint64_t>(absl::GetCurrentTimeNanos())) | 1;
}

}  // namespace

MembershipClient::MembershipClient(Options options)
    : options_(std::move(options)),
      incarnation_(NewIncarnation()),
      stub_(v1::ClusterService::NewStub(MakeChannel(options_.scheduler))) {}

MembershipClient::~MembershipClient() { Stop(); }

void MembershipClient::Start() { thread_ = std::thread([this] { Loop(); }); }

void MembershipClient::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool MembershipClient::LeaseValid() const {
  MutexLock lock(&mu_);
  return absl::Now() - last_renewal_ < absl::Milliseconds(lease_ms_);
}

std::string MembershipClient::member_id() const {
  MutexLock lock(&mu_);
  return member_id_;
}

bool MembershipClient::RegisterOnce() {
  v1::RegisterRequest request;
  request.set_role(options_.role);
  request.set_address(options_.address);
  request.set_metrics_address(options_.metrics_address);
  // Register again under the id the scheduler gave us before (it may have
  // restarted): a worker then goes back to its job.
  std::string previous;
  {
    MutexLock lock(&mu_);
    previous = last_id_;
  }
  request.set_requested_id(!options_.requested_id.empty() ? options_.requested_id : previous);
  if (options_.held_jobs) {
    for (const std::string& job : options_.held_jobs()) request.add_jobs(job);
  }
  request.set_pid(getpid());
  request.set_incarnation(incarnation_);
  request.set_device(options_.device);
  request.set_memory_budget_bytes(options_.memory_budget);
  v1::RegisterResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, 2.0);
  const absl::Time sent = absl::Now();
  grpc::Status status = stub_->Register(&context, request, &response);
  if (!status.ok()) {
    FLOG(WARNING) << "cannot register with scheduler " << options_.scheduler << ": "
                  << status.error_message() << " (retrying)";
    return false;
  }
  FLOG(INFO) << "registered with scheduler " << options_.scheduler << " as "
             << response.member_id() << " (lease " << response.lease_ms() << " ms)";
  SetLogTag(response.member_id());
  MutexLock lock(&mu_);
  member_id_ = response.member_id();
  last_id_ = member_id_;
  lease_ms_ = response.lease_ms();
  last_renewal_ = sent;
  interval_ms_ = std::max<int64_t>(50, response.heartbeat_interval_ms());
  return true;
}

bool MembershipClient::HeartbeatOnce() {
  v1::HeartbeatRequest request;
  request.set_member_id(member_id());
  request.set_incarnation(incarnation_);
  if (options_.current_job) request.set_job_id(options_.current_job());
  if (options_.held_bytes) {
    for (const auto& [job, bytes] : options_.held_bytes()) (*request.mutable_held_bytes())[job] = bytes;
  }
  v1::HeartbeatResponse response;
  grpc::Status status;
  // The lease runs from when the heartbeat was sent: never later than when
  // the scheduler starts counting it.
  absl::Time sent;
  // A busy scheduler's refusal (its gRPC threads all taken) is sent again
  // within the heartbeat's 2 s: a lease must not run out on it.
  const absl::Time give_up = absl::Now() + absl::Seconds(2);
  BusyBackoff backoff;
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(give_up));
    sent = absl::Now();
    status = stub_->Heartbeat(&context, request, &response);
    if (!IsServerBusy(FromGrpcStatus(status)) || !backoff.WaitBefore(give_up)) break;
  }
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    FLOG(WARNING) << "scheduler does not know " << request.member_id() << ": registering again";
    MutexLock lock(&mu_);
    member_id_.clear();
    return false;
  }
  if (!status.ok()) {
    FLOG(WARNING) << "heartbeat to " << options_.scheduler << " failed: " << status.error_message();
    MutexLock lock(&mu_);
    unreachable_ = true;
    return false;
  }
  {
    MutexLock lock(&mu_);
    last_renewal_ = sent;
    drained_ = response.drained();
    unreachable_ = false;
  }
  if (options_.on_heartbeat) options_.on_heartbeat(response);
  return true;
}

void MembershipClient::Loop() {
  while (true) {
    bool registered = !member_id().empty() || RegisterOnce();
    if (registered) HeartbeatOnce();
    MutexLock lock(&mu_);
    int64_t wait_ms = registered ? interval_ms_ : 500;
    if (absl::Now() < hurry_until_) wait_ms = std::min(wait_ms, kHurriedIntervalMs);
    mu_.AwaitWithTimeout(absl::Condition(this, &MembershipClient::Woken), absl::Milliseconds(wait_ms));
    if (stopping_) return;
    hurry_now_ = false;
  }
}

void MembershipClient::Hurry(absl::Duration period) {
  MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now >= hurry_until_) hurry_now_ = true;  // not hurried yet: heartbeat at once
  hurry_until_ = std::max(hurry_until_, now + period);
}

bool MembershipClient::LeaveAndDrain(absl::Duration timeout) {
  v1::LeaveRequest request;
  request.set_member_id(member_id());
  request.set_incarnation(incarnation_);
  if (request.member_id().empty()) return false;
  {
    MutexLock lock(&mu_);
    drained_ = false;
  }
  v1::LeaveResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, 2.0);
  if (!stub_->Leave(&context, request, &response).ok()) return false;
  FLOG(INFO) << "leaving: waiting for the scheduler to move this server's shards away";
  MutexLock lock(&mu_);
  unreachable_ = false;
  mu_.AwaitWithTimeout(absl::Condition(this, &MembershipClient::DrainSettled), timeout);
  return drained_;
}

absl::Status MembershipClient::Report(v1::WorkReport report) {
  report.set_member_id(member_id());
  // Progress is sent again soon anyway; anything else is retried while the
  // scheduler is unreachable (restarting) or busy, for about a minute.
  const int attempts = report.kind() == v1::WorkReport::PROGRESS ? 2 : 60;
  grpc::Status status;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    if (attempt > 0) usleep(std::min(1000000, 100000 * attempt));  // backoff before retrying
    v1::WorkReportResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, 5.0);
    status = stub_->ReportWork(&context, report, &response);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE && !IsServerBusy(FromGrpcStatus(status))) break;
  }
  return FromGrpcStatus(status);
}

}  // namespace fulcrum
