// fulcrum-scheduler: the control plane (jobs, membership, shard maps).
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/synchronization/notification.h"
#include "common/daemon.h"
#include "common/kv_store.h"
#include "common/logging.h"
#include "scheduler/job_manager.h"
#include "scheduler/scheduler_metrics.h"
#include "scheduler/services.h"
#include "common/sync.h"

ABSL_FLAG(int, lease_ms, 1800,
          "Membership lease: a member silent this long is declared dead (a failover then takes about this long)");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token JobService requires (clients: fulcrum --token / FULCRUM_TOKEN); "
          "\"\" = no token");
ABSL_FLAG(double, straggler_factor, 2.0,
          "Flag a worker whose step time stays above this many times the other workers' median");
ABSL_FLAG(int, heartbeat_ms, 300, "Heartbeat interval members are told to use");
ABSL_FLAG(int64_t, chunk_bytes, 256 << 10, "Dense tensors are cut into chunks of this many bytes (larger for a model that would take over 8192)");
ABSL_FLAG(int, default_replicas, 1, "Replicas per parameter shard for jobs whose spec sets none");
ABSL_FLAG(bool, grow_shards, true,
          "Servers joining the cluster become new shards of running jobs with numShards 0 "
          "(about 1/N of the chunks move to them while training continues)");
ABSL_FLAG(absl::Duration, max_queue_wait, absl::Seconds(60),
          "A job waiting for workers or servers other jobs hold keeps the jobs queued behind it waiting at most this "
          "long; then those that fit may start first");
ABSL_FLAG(int, retain_finished_jobs, 100,
          "Servers keep the parameters of the newest this many finished jobs (readable by fulcrum export); older "
          "ones are released");
ABSL_FLAG(absl::Duration, retain_finished_for, absl::Hours(24),
          "Servers release a finished job's parameters this long after it ended, at the latest");
ABSL_FLAG(int, max_finished_records, 1000,
          "The scheduler keeps the records (status, events, checkpoints) of at most this many finished jobs");
ABSL_FLAG(int, max_active_jobs, 1000,
          "At most this many jobs not ended (pending or running); a submit past it is refused with "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(
    int, max_members, 10000,
    "At most this many registered servers and workers; a registration under a new id past it is refused "
    "with RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, data_dir, "",
          "Keep the scheduler's state (jobs, shard maps, membership) in a RocksDB database here, so that a "
          "restarted scheduler carries on with running jobs (default: in memory only)");

namespace fulcrum {
namespace {

absl::StatusOr<SchedulerOptions> OptionsFromFlags() {
  SchedulerOptions options;
  options.lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  options.heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
  options.straggler_factor = absl::GetFlag(FLAGS_straggler_factor);
  options.chunk_elems = absl::GetFlag(FLAGS_chunk_bytes) / 4;
  options.default_replicas = absl::GetFlag(FLAGS_default_replicas);
  options.grow_shards = absl::GetFlag(FLAGS_grow_shards);
  options.server_call_threads = 8;
  options.max_queue_wait = absl::GetFlag(FLAGS_max_queue_wait);
  options.retain_finished_jobs = absl::GetFlag(FLAGS_retain_finished_jobs);
  options.retain_finished_for = absl::GetFlag(FLAGS_retain_finished_for);
  options.max_finished_records = absl::GetFlag(FLAGS_max_finished_records);
  options.max_active_jobs = absl::GetFlag(FLAGS_max_active_jobs);
  options.max_members = absl::GetFlag(FLAGS_max_members);
  if (options.max_active_jobs < 1 || options.max_members < 1) {
    return absl::InvalidArgumentError("--max_active_jobs and --max_members must be at least 1");
  }
  if (options.retain_finished_jobs < 0 || options.max_finished_records < options.retain_finished_jobs) {
    return absl::InvalidArgumentError("--retain-finished-jobs must be in [0, --max-finished-records]");
  }
  if (options.max_queue_wait < absl::ZeroDuration() || options.retain_finished_for < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--max-queue-wait and --retain-finished-for must not be negative");
  }
  if (options.default_replicas < 1 || options.default_replicas > 8) {
    return absl::InvalidArgumentError("--default-replicas must be in [1, 8]");
  }
  if (options.lease <= options.heartbeat_interval || options.chunk_elems < 1 || options.chunk_elems > (1 << 20)) {
    return absl::InvalidArgumentError("--lease-ms must exceed --heartbeat-ms and --chunk-bytes must be in [4, 4194304]");
  }
  return options;
}

int Run(int argc, char** argv) {
  Daemon daemon("scheduler", "fulcrum-scheduler [--port P] [--metrics-port M] [--lease-ms L]");
  if (absl::Status s = daemon.Init(argc, argv, [] { return absl::GetFlag(FLAGS_token_file); }); !s.ok()) {
    return daemon.Exit(s);
  }
  absl::StatusOr<SchedulerOptions> options = OptionsFromFlags();
  if (!options.ok()) return daemon.Exit(options.status());
  std::unique_ptr<KvStore> store;
  if (!absl::GetFlag(FLAGS_data_dir).empty()) {
    auto opened = OpenRocksDbStore(absl::GetFlag(FLAGS_data_dir));
    if (!opened.ok()) return daemon.Exit(opened.status());
    store = std::move(*opened);
  }
  GrpcServerControl server_control;
  JobManager manager(*options, &server_control, nullptr, store.get());
  if (absl::Status recovered = manager.Recover(); !recovered.ok()) {
    return daemon.Exit(absl::Status(recovered.code(), absl::StrCat("cannot recover the scheduler state from ",
                                                                   absl::GetFlag(FLAGS_data_dir), ": ",
                                                                   recovered.message())));
  }
  JobServiceImpl job_service(&manager);
  ClusterServiceImpl cluster_service(&manager);
  if (absl::Status s = daemon.Serve({&job_service, &cluster_service}, "scheduler"); !s.ok()) return daemon.Exit(s);
  manager.Start();
  // Cluster and job gauges, refreshed once a second.
  SchedulerMetrics scheduler_metrics(&daemon.registry());
  Notification stop_gauges;
  std::thread gauges([&] {
    do {
      scheduler_metrics.Update(manager.List(), manager.Members(), absl::Now());
    } while (!stop_gauges.WaitForNotificationWithTimeout(absl::Seconds(1)));
  });
  daemon.WaitForShutdown();
  stop_gauges.Notify();
  gauges.join();
  daemon.StopServing(absl::Seconds(2));
  manager.Stop();
  return 0;
}

}  // namespace
}  // namespace fulcrum

int main(int argc, char** argv) { return fulcrum::Run(argc, argv); }
