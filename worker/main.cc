// fulcrum-worker: a stateless training daemon.
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/membership_client.h"
#include "common/metrics.h"
#include "common/security_flags.h"
#include "common/process.h"
#include "common/rpc.h"
#include "kernels/backend_loader.h"
#include "worker/worker_daemon.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind /metrics on");
ABSL_FLAG(int, port, 0, "gRPC port for health checks and reflection (0 = pick a free one)");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0 = pick a free one)");
ABSL_FLAG(std::string, scheduler, "", "Scheduler address host:port (required)");
ABSL_FLAG(std::string, id, "", "Requested member id (default: assigned by the scheduler)");
ABSL_FLAG(std::string, device, "auto",
          "auto (a GPU when a CUDA driver and device are present, else the CPU), cpu, cuda or cuda:N");
ABSL_FLAG(std::string, port_file, "", "Write the bound ports as JSON to this file");
ABSL_FLAG(bool, overlap_push, true,
          "Push each layer's gradients while the backward pass computes the layers below (false: after the whole "
          "pass; for measuring what the overlap gains)");
ABSL_FLAG(bool, prefetch_pull, true,
          "BSP: pull each layer's parameters for the next step as soon as this worker has pushed that layer, while "
          "the layers below are computed (false: pull the whole model after the pushes)");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

// Weak: absent when the CPU backend runs on a reference BLAS.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

int main(int argc, char** argv) {
  using namespace fulcrum;
  BlockTerminationSignals();
  ParseFlags(argc, argv, "fulcrum-worker --scheduler HOST:PORT [--device auto|cpu|cuda[:N]]");
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
  // One BLAS thread per worker: a node runs several workers (and servers).
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr && openblas_set_num_threads != nullptr) {
    openblas_set_num_threads(1);
  }
  if (!absl::GetFlag(FLAGS_id).empty()) SetLogTag(absl::GetFlag(FLAGS_id));
  auto metrics = MetricsEndpoint::Start(absl::GetFlag(FLAGS_host), absl::GetFlag(FLAGS_metrics_port));
  if (!metrics.ok()) {
    FLOG(ERROR) << metrics.status().message();
    return 1;
  }
  auto& step_seconds = prometheus::BuildHistogram()
                           .Name("fulcrum_worker_step_seconds")
                           .Help("Time of one training step (pull, compute, push)")
                           .Register((*metrics)->registry())
                           .Add({}, DurationBuckets());
  auto& steps_total = prometheus::BuildCounter()
                          .Name("fulcrum_worker_steps_total")
                          .Help("Training steps completed")
                          .Register((*metrics)->registry())
                          .Add({});
  auto& examples_total = prometheus::BuildCounter()
                             .Name("fulcrum_worker_examples_total")
                             .Help("Training examples computed (rate: samples per second)")
                             .Register((*metrics)->registry())
                             .Add({});
  auto& pull_wait = prometheus::BuildHistogram()
                        .Name("fulcrum_worker_pull_wait_seconds")
                        .Help("Time in one pull of the parameters; in BSP mostly waiting for the step to complete")
                        .Register((*metrics)->registry())
                        .Add({}, DurationBuckets());
  auto& staleness = prometheus::BuildHistogram()
                        .Name("fulcrum_worker_staleness_steps")
                        .Help("ASP/SSP: how many steps a worker's pull was ahead of the slowest data partition")
                        .Register((*metrics)->registry())
                        .Add({}, prometheus::Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32, 64, 128});
  auto choice = kernels::MakeBackend(absl::GetFlag(FLAGS_device));
  if (!choice.ok()) {
    FLOG(ERROR) << choice.status().message();
    return 2;
  }
  FLOG(INFO) << choice->explanation;
  std::unique_ptr<kernels::Backend> backend = std::move(choice->backend);
  // Workers serve no API of their own, but answer gRPC health checks (and
  // reflection) like every Fulcrum process.
  auto health = StartGrpcServer(absl::GetFlag(FLAGS_host), absl::GetFlag(FLAGS_port), {}, metrics->get());
  if (!health.ok()) {
    FLOG(ERROR) << health.status().message();
    return 1;
  }
  // Probes see it only once the main server listens.
  auto health_server = StartHealthServerFromFlags(absl::GetFlag(FLAGS_host));
  if (!health_server.ok()) {
    FLOG(ERROR) << health_server.status().message();
    return 1;
  }
  auto& compute_seconds = prometheus::BuildHistogram()
                              .Name("fulcrum_worker_compute_seconds")
                              .Help("Forward + backward of one partition step on the compute backend (GPU: kernel time, "
                                    "synchronized)")
                              .Register((*metrics)->registry())
                              .Add({}, DurationBuckets());
  auto& device_memory = prometheus::BuildGauge()
                            .Name("fulcrum_worker_device_memory_bytes")
                            .Help("Backend (GPU) memory the worker holds, in use and cached; 0 on the CPU")
                            .Register((*metrics)->registry())
                            .Add({});
  auto& prefetches = prometheus::BuildCounter()
                        .Name("fulcrum_worker_prefetches_total")
                        .Help("BSP: pulls of the next step's parameters issued while pushing; result=used, or "
                              "missed (late or failed: pulled again)")
                        .Register((*metrics)->registry());
  TransferOptions transfer;
  transfer.overlap_push = absl::GetFlag(FLAGS_overlap_push);
  transfer.prefetch_pull = absl::GetFlag(FLAGS_prefetch_pull);
  WorkerDaemon daemon(backend.get(),
                      {&step_seconds, &steps_total, &examples_total, &pull_wait, &staleness, &compute_seconds,
                       &device_memory, &prefetches.Add({{"result", "used"}}), &prefetches.Add({{"result", "missed"}})},
                      transfer);
  MembershipClient::Options options;
  options.scheduler = absl::GetFlag(FLAGS_scheduler);
  options.role = v1::WORKER;
  options.address = absl::StrCat(absl::GetFlag(FLAGS_host), ":", health->port);
  options.metrics_address = absl::StrCat(absl::GetFlag(FLAGS_host), ":", (*metrics)->port());
  options.requested_id = absl::GetFlag(FLAGS_id);
  options.device = backend->Name();
  options.on_heartbeat = [&daemon](const v1::HeartbeatResponse& r) { daemon.OnHeartbeat(r); };
  options.current_job = [&daemon] { return daemon.CurrentJob(); };
  MembershipClient membership(options);
  membership.Start();
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    auto status = WritePortFile(absl::GetFlag(FLAGS_port_file), health->port, (*metrics)->port(), absl::GetFlag(FLAGS_id));
    if (!status.ok()) FLOG(ERROR) << status.message();
  }
  FLOG(INFO) << "worker ready, metrics on " << options.metrics_address;
  std::thread loop([&] { daemon.Run(&membership); });
  int sig = WaitForShutdown();
  FLOG(INFO) << "shutting down (signal " << sig << ")";
  daemon.Stop();
  loop.join();
  membership.Stop();
  health->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}
