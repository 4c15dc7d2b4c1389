// fulcrum-server: holds parameter shards and applies the server-side optimizer.
#include <atomic>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/daemon.h"
#include "common/kv_store.h"
#include "common/logging.h"
#include "common/membership_client.h"
#include "server/parameter_service.h"

ABSL_FLAG(std::string, scheduler, "", "Scheduler address host:port (required)");
ABSL_FLAG(std::string, id, "", "Requested member id (default: assigned by the scheduler)");
ABSL_FLAG(std::string, data_dir, "",
          "Folder for this server's RocksDB (checkpoints); created if missing. Without it the server takes "
          "no checkpoints");

namespace fulcrum {
namespace {

int Run(int argc, char** argv) {
  Daemon daemon("server", "fulcrum-server --scheduler HOST:PORT [--port P] [--metrics-port M]");
  if (absl::Status s = daemon.Init(argc, argv); !s.ok()) return daemon.Exit(s);
  if (absl::GetFlag(FLAGS_scheduler).empty()) {
    return daemon.Exit(absl::InvalidArgumentError("--scheduler HOST:PORT is required"));
  }
  std::unique_ptr<KvStore> kv;
  std::unique_ptr<CheckpointStore> checkpoints;
  if (!absl::GetFlag(FLAGS_data_dir).empty()) {
    auto opened = OpenRocksDbStore(absl::GetFlag(FLAGS_data_dir));
    if (!opened.ok()) return daemon.Exit(absl::Status(opened.status().code(), absl::StrCat("--data-dir: ", opened.status().message())));
    kv = *std::move(opened);
    checkpoints = std::make_unique<CheckpointStore>(kv.get());
    FLOG(INFO) << "checkpoints in " << absl::GetFlag(FLAGS_data_dir);
  } else {
    FLOG(WARNING) << "no --data-dir: this server takes no checkpoints";
  }
  ParameterStore store(daemon.memory_budget());
  const std::unique_ptr<ScrapedGauge> budget_used = daemon.metrics()->AddScrapedGauge(
      "fulcrum_server_budget_used_bytes",
      "Bytes of the memory budget this server's jobs hold now: parameters, optimizer state, tables and a "
      "checkpoint's copies while it is written",
      [&store] { return static_cast<double>(store.bytes()); });
  std::atomic<MembershipClient*> membership_ptr{nullptr};
  ParameterServiceImpl service(
      &store, daemon.metrics(),
      [&membership_ptr] {
        MembershipClient* membership = membership_ptr.load();
        return membership != nullptr && membership->LeaseValid();
      },
      checkpoints.get());
  if (absl::Status s = daemon.Serve({&service}, absl::GetFlag(FLAGS_id)); !s.ok()) return daemon.Exit(s);
  MembershipClient::Options options;
  options.scheduler = absl::GetFlag(FLAGS_scheduler);
  options.role = v1::SERVER;
  options.address = daemon.grpc_address();
  options.metrics_address = daemon.metrics_address();
  options.requested_id = absl::GetFlag(FLAGS_id);
  options.memory_budget = daemon.memory_budget();
  options.held_jobs = [&store] { return store.JobIds(); };
  options.held_bytes = [&store] { return store.JobBytes(); };
  MembershipClient membership(options);
  membership_ptr = &membership;
  membership.Start();
  daemon.WaitForShutdown();
  // Hand running jobs' shards to other servers before going (bounded: a
  // scheduler that is gone or slow does not keep this process alive).
  {
    bool drained = membership.LeaveAndDrain(absl::Seconds(30));
    FLOG(INFO) << (drained ? "drained: no running job needs this server" : "leaving without a drain");
  }
  daemon.StopServing(absl::Seconds(2));
  membership.Stop();
  membership_ptr = nullptr;
  return 0;
}

}  // namespace
}  // namespace fulcrum

int main(int argc, char** argv) { return fulcrum::Run(argc, argv); }
