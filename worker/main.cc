// fulcrum-worker: a stateless training daemon.
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "common/daemon.h"
#include "common/logging.h"
#include "common/membership_client.h"
#include "kernels/backend_loader.h"
#include "worker/dataset.h"
#include "worker/worker_daemon.h"

ABSL_FLAG(std::string, scheduler, "", "Scheduler address host:port (required)");
ABSL_FLAG(std::string, id, "", "Requested member id (default: assigned by the scheduler)");
ABSL_FLAG(std::string, device, "auto",
          "auto (a GPU when a CUDA driver and device are present, else the CPU), cpu, cuda or cuda:N");
ABSL_FLAG(bool, overlap_push, true,
          "Push each layer's gradients while the backward pass computes the layers below (false: after the whole "
          "pass; for measuring what the overlap gains)");
ABSL_FLAG(bool, prefetch_pull, true,
          "BSP: pull each layer's parameters for the next step as soon as this worker has pushed that layer, while "
          "the layers below are computed (false: pull the whole model after the pushes)");
ABSL_FLAG(bool, click_models_on_backend, false,
          "Compute click models (tables and layer graphs) through the --device backend even when it is the CPU's "
          "(a GPU's computes them either way; on the CPU the host's fused models are faster): the GPU's code path, "
          "for testing it without one");
ABSL_FLAG(std::string, data_root, fulcrum::kDefaultDataRoots,
          "Comma-separated folders jobs may read datasets from (data.path must lie under one, symlinks resolved); "
          "\"/\" allows any path");

ABSL_FLAG(int64_t, exit_mid_push, 0,
          "Testing only: kill this process (SIGKILL) in its N-th partition step, after the first layer's gradients "
          "are acknowledged and before the others are sent (a worker dying with its push half sent); 0 = never");

// Weak: absent when the CPU backend runs on a reference BLAS.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace fulcrum {
namespace {

WorkerDaemon::Metrics RegisterMetrics(prometheus::Registry& registry) {
  WorkerDaemon::Metrics m;
  m.step_seconds = &prometheus::BuildHistogram()
                        .Name("fulcrum_worker_step_seconds")
                        .Help("Time of one training step (pull, compute, push)")
                        .Register(registry)
                        .Add({}, DurationBuckets());
  m.steps_total = &prometheus::BuildCounter()
                       .Name("fulcrum_worker_steps_total")
                       .Help("Training steps completed")
                       .Register(registry)
                       .Add({});
  m.examples_total = &prometheus::BuildCounter()
                          .Name("fulcrum_worker_examples_total")
                          .Help("Training examples computed (rate: samples per second)")
                          .Register(registry)
                          .Add({});
  m.pull_wait_seconds = &prometheus::BuildHistogram()
                             .Name("fulcrum_worker_pull_wait_seconds")
                             .Help("Time in one pull of the parameters; in BSP mostly waiting for the step to complete")
                             .Register(registry)
                             .Add({}, DurationBuckets());
  m.staleness_steps = &prometheus::BuildHistogram()
                           .Name("fulcrum_worker_staleness_steps")
                           .Help("ASP/SSP: how many steps a worker's pull was ahead of the slowest data partition")
                           .Register(registry)
                           .Add({}, prometheus::Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32, 64, 128});
  m.compute_seconds = &prometheus::BuildHistogram()
                           .Name("fulcrum_worker_compute_seconds")
                           .Help("Forward + backward of one partition step on the compute backend (GPU: kernel time, "
                                 "synchronized)")
                           .Register(registry)
                           .Add({}, DurationBuckets());
  m.device_memory_bytes = &prometheus::BuildGauge()
                               .Name("fulcrum_worker_device_memory_bytes")
                               .Help("Backend (GPU) memory the worker holds, in use and cached; 0 on the CPU")
                               .Register(registry)
                               .Add({});
  auto& prefetches = prometheus::BuildCounter()
                         .Name("fulcrum_worker_prefetches_total")
                         .Help("BSP: pulls of the next step's parameters issued while pushing; result=used, or "
                               "missed (late or failed: pulled again)")
                         .Register(registry);
  m.prefetches_used = &prefetches.Add({{"result", "used"}});
  m.prefetches_missed = &prefetches.Add({{"result", "missed"}});
  return m;
}

int Run(int argc, char** argv) {
  Daemon daemon("worker", "fulcrum-worker --scheduler HOST:PORT [--device auto|cpu|cuda[:N]]");
  if (absl::Status s = daemon.Init(argc, argv); !s.ok()) return daemon.Exit(s);
  if (absl::GetFlag(FLAGS_scheduler).empty()) {
    return daemon.Exit(absl::InvalidArgumentError("--scheduler HOST:PORT is required"));
  }
  // One BLAS thread per worker: a node runs several workers (and servers).
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr && openblas_set_num_threads != nullptr) {
    openblas_set_num_threads(1);
  }
  if (!absl::GetFlag(FLAGS_id).empty()) SetLogTag(absl::GetFlag(FLAGS_id));
  auto choice = kernels::MakeBackend(absl::GetFlag(FLAGS_device));
  if (!choice.ok()) return daemon.Exit(absl::InvalidArgumentError(choice.status().message()));
  FLOG(INFO) << choice->explanation;
  std::unique_ptr<kernels::Backend> backend = std::move(choice->backend);
  WorkerLimits limits;
  for (absl::string_view root : absl::StrSplit(absl::GetFlag(FLAGS_data_root), ',', absl::SkipWhitespace())) {
    if (root != "/") limits.data_roots.emplace_back(root);
  }
  if (limits.data_roots.empty() && absl::GetFlag(FLAGS_data_root).find('/') == std::string::npos) {
    return daemon.Exit(absl::InvalidArgumentError("--data-root: give at least one folder (\"/\" allows any path)"));
  }
  limits.memory_budget_bytes = daemon.memory_budget();
  FLOG(INFO) << "datasets may be read from "
             << (limits.data_roots.empty() ? std::string("anywhere (--data-root=/)") : absl::GetFlag(FLAGS_data_root));
  SetExitMidPush(absl::GetFlag(FLAGS_exit_mid_push));
  TransferOptions transfer;
  transfer.overlap_push = absl::GetFlag(FLAGS_overlap_push);
  transfer.prefetch_pull = absl::GetFlag(FLAGS_prefetch_pull);
  transfer.click_models_on_backend = absl::GetFlag(FLAGS_click_models_on_backend);
  WorkerDaemon worker(backend.get(), RegisterMetrics(daemon.registry()), transfer, limits);
  // Workers serve no API of their own, but answer gRPC health checks (and
  // reflection) like every Fulcrum process.
  if (absl::Status s = daemon.Serve({}, absl::GetFlag(FLAGS_id)); !s.ok()) return daemon.Exit(s);
  MembershipClient::Options options;
  options.scheduler = absl::GetFlag(FLAGS_scheduler);
  options.role = v1::WORKER;
  options.address = daemon.grpc_address();
  options.metrics_address = daemon.metrics_address();
  options.requested_id = absl::GetFlag(FLAGS_id);
  options.device = backend->Name();
  options.memory_budget = daemon.memory_budget();
  options.on_heartbeat = [&worker](const v1::HeartbeatResponse& r) { worker.OnHeartbeat(r); };
  options.current_job = [&worker] { return worker.CurrentJob(); };
  MembershipClient membership(options);
  membership.Start();
  FLOG(INFO) << "worker ready, metrics on " << options.metrics_address;
  std::thread loop([&] { worker.Run(&membership); });
  daemon.WaitForShutdown();
  worker.Stop();
  loop.join();
  membership.Stop();
  daemon.StopServing(absl::Seconds(1));
  return 0;
}

}  // namespace
}  // namespace fulcrum

int main(int argc, char** argv) { return fulcrum::Run(argc, argv); }
