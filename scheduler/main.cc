// fulcrum-scheduler: the control plane (jobs, membership, shard maps).
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "common/kv_store.h"
#include "common/metrics.h"
#include "common/process.h"
#include "common/rpc.h"
#include "common/security_flags.h"
#include "scheduler/job_manager.h"
#include "scheduler/scheduler_metrics.h"
#include "scheduler/services.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind");
ABSL_FLAG(int, port, 0, "gRPC port (0 = pick a free one)");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0 = pick a free one)");
ABSL_FLAG(std::string, port_file, "", "Write the bound ports as JSON to this file");
ABSL_FLAG(int, lease_ms, 1800,
          "Membership lease: a member silent this long is declared dead (a failover then takes about this long)");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token JobService requires (clients: fulcrum --token / FULCRUM_TOKEN); "
          "\"\" = no token");
ABSL_FLAG(double, straggler_factor, 2.0,
          "Flag a worker whose step time stays above this many times the other workers' median");
ABSL_FLAG(int, heartbeat_ms, 300, "Heartbeat interval members are told to use");
ABSL_FLAG(int64_t, chunk_bytes, 256 << 10, "Dense tensors are cut into chunks of this many bytes");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(int, default_replicas, 1, "Replicas per parameter shard for jobs whose spec sets none");
ABSL_FLAG(bool, grow_shards, true,
          "Servers joining the cluster become new shards of running jobs with numShards 0 "
          "(about 1/N of the chunks move to them while training continues)");
ABSL_FLAG(std::string, data_dir, "",
          "Keep the scheduler's state (jobs, shard maps, membership) in a RocksDB database here, so that a "
          "restarted scheduler carries on with running jobs (default: in memory only)");

int main(int argc, char** argv) {
  using namespace fulcrum;
  BlockTerminationSignals();
  ParseFlags(argc, argv, "fulcrum-scheduler [--port P] [--metrics-port M] [--lease-ms L]");
  SetLogTag("scheduler");
  if (auto s = SetMinLogLevelFromString(absl::GetFlag(FLAGS_log_level)); !s.ok()) {
    FLOG(ERROR) << s.message();
    return 2;
  }
  if (absl::Status s = ConfigureSecurityFromFlags(absl::GetFlag(FLAGS_token_file)); !s.ok()) {
    FLOG(ERROR) << s.message();
    return 2;
  }
  SchedulerOptions options;
  options.lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  options.heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
  options.straggler_factor = absl::GetFlag(FLAGS_straggler_factor);
  options.chunk_elems = absl::GetFlag(FLAGS_chunk_bytes) / 4;
  options.default_replicas = absl::GetFlag(FLAGS_default_replicas);
  options.grow_shards = absl::GetFlag(FLAGS_grow_shards);
  if (options.default_replicas < 1 || options.default_replicas > 8) {
    FLOG(ERROR) << "--default-replicas must be in [1, 8]";
    return 2;
  }
  if (options.lease <= options.heartbeat_interval || options.chunk_elems < 1 ||
      options.chunk_elems > (1 << 20)) {
    FLOG(ERROR) << "--lease-ms must exceed --heartbeat-ms and --chunk-bytes must be in [4, 4194304]";
    return 2;
  }
  const std::string host = absl::GetFlag(FLAGS_host);
  auto metrics = MetricsEndpoint::Start(host, absl::GetFlag(FLAGS_metrics_port));
  if (!metrics.ok()) {
    FLOG(ERROR) << metrics.status().message();
    return 1;
  }
  std::unique_ptr<KvStore> store;
  if (!absl::GetFlag(FLAGS_data_dir).empty()) {
    auto opened = OpenRocksDbStore(absl::GetFlag(FLAGS_data_dir));
    if (!opened.ok()) {
      FLOG(ERROR) << opened.status().message();
      return 1;
    }
    store = std::move(*opened);
  }
  GrpcServerControl server_control;
  JobManager manager(options, &server_control, nullptr, store.get());
  if (absl::Status recovered = manager.Recover(); !recovered.ok()) {
    FLOG(ERROR) << "cannot recover the scheduler state from " << absl::GetFlag(FLAGS_data_dir) << ": "
                << recovered.message();
    return 1;
  }
  JobServiceImpl job_service(&manager);
  ClusterServiceImpl cluster_service(&manager);
  auto server = StartGrpcServer(host, absl::GetFlag(FLAGS_port), {&job_service, &cluster_service}, metrics->get());
  auto health_server = StartHealthServerFromFlags(host);
  if (!health_server.ok()) {
    FLOG(ERROR) << health_server.status().message();
    return 1;
  }
  if (!server.ok()) {
    FLOG(ERROR) << server.status().message();
    return 1;
  }
  manager.Start();
  // Cluster and job gauges, refreshed once a second.
  SchedulerMetrics scheduler_metrics(&(*metrics)->registry());
  absl::Notification stop_gauges;
  std::thread gauges([&] {
    do {
      scheduler_metrics.Update(manager.List(), manager.Members(), absl::Now());
    } while (!stop_gauges.WaitForNotificationWithTimeout(absl::Seconds(1)));
  });
  FLOG(INFO) << "scheduler serving gRPC on " << host << ":" << server->port << ", metrics on " << host
             << ":" << (*metrics)->port();
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    auto status = WritePortFile(absl::GetFlag(FLAGS_port_file), server->port, (*metrics)->port(), "scheduler");
    if (!status.ok()) FLOG(ERROR) << status.message();
  }
  int sig = WaitForShutdown();
  FLOG(INFO) << "shutting down (signal " << sig << ")";
  stop_gauges.Notify();
  gauges.join();
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  manager.Stop();
  return 0;
}
