// fulcrum-server: holds parameter shards and applies the server-side optimizer.
#include <atomic>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/kv_store.h"
#include "common/logging.h"
#include "common/membership_client.h"
#include "common/metrics.h"
#include "common/process.h"
#include "common/rpc.h"
#include "common/security_flags.h"
#include "server/parameter_service.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind and advertise");
ABSL_FLAG(int, port, 0, "gRPC port (0 = pick a free one)");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0 = pick a free one)");
ABSL_FLAG(std::string, scheduler, "", "Scheduler address host:port (required)");
ABSL_FLAG(std::string, id, "", "Requested member id (default: assigned by the scheduler)");
ABSL_FLAG(std::string, port_file, "", "Write the bound ports as JSON to this file");
ABSL_FLAG(std::string, data_dir, "",
          "Folder for this server's RocksDB (checkpoints); created if missing. Without it the server takes "
          "no checkpoints");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

int main(int argc, char** argv) {
  using namespace fulcrum;
  BlockTerminationSignals();
  ParseFlags(argc, argv, "fulcrum-server --scheduler HOST:PORT [--port P] [--metrics-port M]");
  if (auto s = SetMinLogLevelFromString(absl::GetFlag(FLAGS_log_level)); !s.ok()) {
    FLOG(ERROR) << s.message();
    return 2;
  }
  if (absl::GetFlag(FLAGS_scheduler).empty()) {
    FLOG(ERROR) << "--scheduler HOST:PORT is required";
    return 2;
  }
  if (absl::Status s = ConfigureSecurityFromFlags(); !s.ok()) {
    FLOG(ERROR) << s.message();
    return 2;
  }
  const std::string host = absl::GetFlag(FLAGS_host);

  auto metrics = MetricsEndpoint::Start(host, absl::GetFlag(FLAGS_metrics_port));
  if (!metrics.ok()) {
    FLOG(ERROR) << metrics.status().message();
    return 1;
  }
  std::unique_ptr<KvStore> kv;
  std::unique_ptr<CheckpointStore> checkpoints;
  if (!absl::GetFlag(FLAGS_data_dir).empty()) {
    auto opened = OpenRocksDbStore(absl::GetFlag(FLAGS_data_dir));
    if (!opened.ok()) {
      FLOG(ERROR) << "--data-dir: " << opened.status().message();
      return 1;
    }
    kv = *std::move(opened);
    checkpoints = std::make_unique<CheckpointStore>(kv.get());
    FLOG(INFO) << "checkpoints in " << absl::GetFlag(FLAGS_data_dir);
  } else {
    FLOG(WARNING) << "no --data-dir: this server takes no checkpoints";
  }
  ParameterStore store;
  std::atomic<MembershipClient*> membership_ptr{nullptr};
  ParameterServiceImpl service(
      &store, metrics->get(),
      [&membership_ptr] {
        MembershipClient* membership = membership_ptr.load();
        return membership != nullptr && membership->LeaseValid();
      },
      checkpoints.get());
  auto server = StartGrpcServer(host, absl::GetFlag(FLAGS_port), {&service}, metrics->get());
  if (!server.ok()) {
    FLOG(ERROR) << server.status().message();
    return 1;
  }
  // Probes see it only once the main server listens.
  auto health_server = StartHealthServerFromFlags(host);
  if (!health_server.ok()) {
    FLOG(ERROR) << health_server.status().message();
    return 1;
  }
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    auto status = WritePortFile(absl::GetFlag(FLAGS_port_file), server->port, (*metrics)->port(),
                                absl::GetFlag(FLAGS_id));
    if (!status.ok()) FLOG(ERROR) << status.message();
  }
  MembershipClient::Options options;
  options.scheduler = absl::GetFlag(FLAGS_scheduler);
  options.role = v1::SERVER;
  options.address = absl::StrCat(host, ":", server->port);
  options.metrics_address = absl::StrCat(host, ":", (*metrics)->port());
  options.requested_id = absl::GetFlag(FLAGS_id);
  options.held_jobs = [&store] { return store.JobIds(); };
  MembershipClient membership(options);
  membership_ptr = &membership;
  membership.Start();
  FLOG(INFO) << "server serving gRPC on " << options.address
             << ", metrics on " << options.metrics_address;
  int sig = WaitForShutdown();
  FLOG(INFO) << "shutting down (signal " << sig << ")";
  // Hand running jobs' shards to other servers before going (bounded: a
  // scheduler that is gone or slow does not keep this process alive).
  {
    bool drained = membership.LeaveAndDrain(absl::Seconds(30));
    FLOG(INFO) << (drained ? "drained: no running job needs this server" : "leaving without a drain");
  }
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  membership.Stop();
  membership_ptr = nullptr;
  return 0;
}
