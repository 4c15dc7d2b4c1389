// libFuzzer: every ClusterService handler (and the JobService calls that
// change state) fed mutated requests in any order against a fresh scheduler
// (a JobManager with an in-memory state store and servers that answer OK),
// with its clock moved on between calls and its tick run: members register,
// heartbeat, report, leave and expire while jobs are submitted, scheduled,
// failed over, cancelled and retained. Properties: no crash, no hang, and
// the scheduler's answers stay consistent (every listed job can be got).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/kv_store.h"
#include "scheduler/job_manager.h"
#include "scheduler/services.h"
#include "tests/fuzz/fuzz_input.h"

namespace fulcrum {
namespace {

class OkServers final : public ServerControl {
 public:
  absl::Status SetupJob(const std::string&, const v1::SetupJobRequest&) override { return absl::OkStatus(); }
  absl::Status DropJob(const std::string&, const std::string&, const std::string&, bool, int64_t) override {
    return absl::OkStatus();
  }
  absl::Status Reconfigure(const std::string&, const std::string&, const v1::ShardMap&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<v1::CheckpointResponse> Checkpoint(const std::string&, const v1::CheckpointRequest&) override {
    return absl::UnavailableError("no checkpoints here");
  }
  absl::Status DeleteCheckpoint(const std::string&, const std::string&, int64_t) override { return absl::OkStatus(); }
};

}  // namespace
}  // namespace fulcrum

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fulcrum;
  OkServers servers;
  std::unique_ptr<KvStore> state = NewMemoryStore();
  absl::Time now = absl::FromUnixSeconds(1700000000);
  SchedulerOptions options;
  options.retain_finished_jobs = 2;
  options.max_finished_records = 4;
  JobManager manager(options, &servers, [&now] { return now; }, state.get());
  JobServiceImpl jobs(&manager);
  ClusterServiceImpl cluster(&manager);
  FuzzInput input(data, size);
  uint8_t command = 0;
  std::string bytes;
  while (input.Next(&command, &bytes)) {
    grpc::ServerContext context;
    switch (command % 10) {
      case 0: {
        v1::RegisterRequest request;
        v1::RegisterResponse response;
        if (request.ParseFromString(bytes)) (void)cluster.Register(&context, &request, &response);
        break;
      }
      case 1: {
        v1::HeartbeatRequest request;
        v1::HeartbeatResponse response;
        if (request.ParseFromString(bytes)) (void)cluster.Heartbeat(&context, &request, &response);
        break;
      }
      case 2: {
        v1::WorkReport request;
        v1::WorkReportResponse response;
        if (request.ParseFromString(bytes)) (void)cluster.ReportWork(&context, &request, &response);
        break;
      }
      case 3: {
        v1::LeaveRequest request;
        v1::LeaveResponse response;
        if (request.ParseFromString(bytes)) (void)cluster.Leave(&context, &request, &response);
        break;
      }
      case 4: {
        v1::ListMembersRequest request;
        v1::ListMembersResponse response;
        if (request.ParseFromString(bytes)) (void)cluster.ListMembers(&context, &request, &response);
        break;
      }
      case 5: {
        v1::SubmitJobRequest request;
        v1::SubmitJobResponse response;
        if (request.ParseFromString(bytes)) (void)jobs.SubmitJob(&context, &request, &response);
        break;
      }
      case 6: {
        v1::CancelJobRequest request;
        v1::JobStatus response;
        if (request.ParseFromString(bytes)) (void)jobs.CancelJob(&context, &request, &response);
        break;
      }
      case 7: {
        v1::GetJobRequest request;
        v1::JobStatus response;
        if (request.ParseFromString(bytes)) (void)jobs.GetJob(&context, &request, &response);
        break;
      }
      case 8:
        now += absl::Milliseconds(bytes.empty() ? 100 : static_cast<uint8_t>(bytes[0]) * 20);
        break;
      case 9:
        manager.Tick();
        break;
    }
  }
  manager.Tick();
  for (const v1::JobStatus& job : manager.List()) {
    if (!manager.Get(job.job_id()).ok()) std::abort();
  }
  return 0;
}
