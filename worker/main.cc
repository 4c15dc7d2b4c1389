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
#include "common/process.h"
#include "kernels/cpu/cpu_backend.h"
#include "worker/worker_daemon.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind /metrics on");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0 = pick a free one)");
ABSL_FLAG(std::string, scheduler, "", "Scheduler address host:port (required)");
ABSL_FLAG(std::string, id, "", "Requested member id (default: assigned by the scheduler)");
ABSL_FLAG(std::string, device, "auto", "auto or cpu (cuda comes with the CUDA backend)");
ABSL_FLAG(std::string, port_file, "", "Write the bound ports as JSON to this file");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

extern "C" void openblas_set_num_threads(int);

int main(int argc, char** argv) {
  using namespace fulcrum;
  BlockTerminationSignals();
  absl::SetProgramUsageMessage("fulcrum-worker --scheduler HOST:PORT [--device auto|cpu]");
  AcceptDashedFlags(argc, argv);
  absl::ParseCommandLine(argc, argv);
  if (auto s = SetMinLogLevelFromString(absl::GetFlag(FLAGS_log_level)); !s.ok()) {
    FLOG(ERROR) << s.message();
    return 2;
  }
  if (absl::GetFlag(FLAGS_scheduler).empty()) {
    FLOG(ERROR) << "--scheduler HOST:PORT is required";
    return 2;
  }
  std::string device = absl::GetFlag(FLAGS_device);
  if (device != "auto" && device != "cpu") {
    FLOG(ERROR) << "--device must be auto or cpu (got \"" << device
                << "\"); this build has no CUDA backend yet";
    return 2;
  }
  if (device == "auto") FLOG(INFO) << "--device auto: using the CPU backend (no CUDA backend in this build)";
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) openblas_set_num_threads(1);
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
  std::unique_ptr<kernels::Backend> backend = kernels::MakeCpuBackend();
  WorkerDaemon daemon(backend.get(), &step_seconds, &steps_total);
  MembershipClient::Options options;
  options.scheduler = absl::GetFlag(FLAGS_scheduler);
  options.role = v1::WORKER;
  options.metrics_address = absl::StrCat(absl::GetFlag(FLAGS_host), ":", (*metrics)->port());
  options.requested_id = absl::GetFlag(FLAGS_id);
  options.device = backend->Name();
  options.on_heartbeat = [&daemon](const v1::HeartbeatResponse& r) { daemon.OnHeartbeat(r); };
  options.current_job = [&daemon] { return daemon.CurrentJob(); };
  MembershipClient membership(options);
  membership.Start();
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    auto status = WritePortFile(absl::GetFlag(FLAGS_port_file), 0, (*metrics)->port(), absl::GetFlag(FLAGS_id));
    if (!status.ok()) FLOG(ERROR) << status.message();
  }
  FLOG(INFO) << "worker ready, metrics on " << options.metrics_address;
  std::thread loop([&] { daemon.Run(&membership); });
  int sig = WaitForShutdown();
  FLOG(INFO) << "shutting down (signal " << sig << ")";
  daemon.Stop();
  loop.join();
  membership.Stop();
  return 0;
}
