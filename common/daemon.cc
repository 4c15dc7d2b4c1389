#include "common/daemon.h"

#include <chrono>
#include <cstdlib>
#include <string_view>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/memory_budget.h"
#include "common/process.h"
#include "common/security_flags.h"
#include "common/status_macros.h"
#include "common/sync.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind and advertise");
ABSL_FLAG(int, port, 0, "gRPC port (0 = pick a free one)");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0 = pick a free one)");
ABSL_FLAG(std::string, port_file, "", "Write the bound ports as JSON to this file");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(bool, keep_freed_memory, true,
          "Keep memory freed by finished requests for the next ones instead of returning it to the kernel at once "
          "(see KeepFreedMemoryForReuse in common/memory_budget.h): faster transfers, RSS at the peak of use");
ABSL_FLAG(
    bool, mutex_deadlock_detection, false,
    "Check the lock order of every mutex lock (Abseil's deadlock detection: slow, one global lock; see "
    "SetMutexDeadlockDetection in common/sync.h). Also on when FULCRUM_MUTEX_DEADLOCK_DETECTION=1, as the "
    "tests set it");
ABSL_FLAG(
    std::string, memory_budget, "",
    "Memory the jobs this process serves may claim, e.g. 8GiB; at most the machine's or cgroup's memory "
    "less 64 MiB for the process itself (default: 80% of it, within that bound)");

namespace fulcrum {

Daemon::Daemon(std::string role, std::string usage) : role_(std::move(role)), usage_(std::move(usage)) {}

absl::Status Daemon::Init(int argc, char** argv, const std::function<std::string()>& job_token_file) {
  BlockTerminationSignals();
  ParseFlags(argc, argv, usage_.c_str());
  const char* detection = std::getenv("FULCRUM_MUTEX_DEADLOCK_DETECTION");
  SetMutexDeadlockDetection(absl::GetFlag(FLAGS_mutex_deadlock_detection) ||
                            (detection != nullptr && std::string_view(detection) == "1"));
  if (absl::GetFlag(FLAGS_keep_freed_memory)) KeepFreedMemoryForReuse();
  SetLogTag(role_);
  RETURN_IF_ERROR(SetMinLogLevelFromString(absl::GetFlag(FLAGS_log_level)));
  const std::string budget = absl::GetFlag(FLAGS_memory_budget);
  const MemoryLimit limit = ReadMemoryLimit();
  if (budget.empty()) {
    memory_budget_ = DefaultMemoryBudget(limit.bytes);
  } else {
    absl::StatusOr<int64_t> parsed = ParseBytes(budget);
    if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("--memory-budget: ", parsed.status().message()));
    if (absl::Status fits = CheckMemoryBudget(*parsed, limit); !fits.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--memory-budget ", budget, ": ", fits.message()));
    }
    memory_budget_ = *parsed;
  }
  RETURN_IF_ERROR(ConfigureSecurityFromFlags(job_token_file ? job_token_file() : ""));
  host_ = absl::GetFlag(FLAGS_host);
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics = MetricsEndpoint::Start(host_, absl::GetFlag(FLAGS_metrics_port));
  if (!metrics.ok()) return metrics.status();
  metrics_ = *std::move(metrics);
  budget_gauge_ = metrics_->AddScrapedGauge(
      "fulcrum_memory_budget_bytes", "What the jobs this process serves may claim (--memory-budget)",
      [budget = memory_budget_] { return static_cast<double>(budget); });
  FLOG(INFO) << role_ << ": memory budget " << FormatBytes(memory_budget_);
  return absl::OkStatus();
}

absl::Status Daemon::Serve(const std::vector<ServedService>& services, const std::string& id) {
  absl::StatusOr<RunningServer> server = StartGrpcServer(host_, absl::GetFlag(FLAGS_port), services, metrics_.get());
  if (!server.ok()) return server.status();
  server_ = *std::move(server);
  // Probes see the health port only once the main server listens.
  absl::StatusOr<std::optional<RunningServer>> health = StartHealthServerFromFlags(host_);
  if (!health.ok()) return health.status();
  health_server_ = *std::move(health);
  FLOG(INFO) << role_ << " serving gRPC on " << grpc_address() << ", metrics on " << metrics_address();
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    absl::Status written = WritePortFile(port_file, server_.port, metrics_->port(), id);
    if (!written.ok()) FLOG(ERROR) << written.message();
  }
  return absl::OkStatus();
}

int Daemon::WaitForShutdown() {
  int sig = fulcrum::WaitForShutdown();
  FLOG(INFO) << "shutting down (signal " << sig << ")";
  return sig;
}

void Daemon::StopServing(absl::Duration grace) {
  const auto deadline = std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace);
  if (health_server_.has_value() && health_server_->server != nullptr) health_server_->server->Shutdown(deadline);
  if (server_.server != nullptr) server_.server->Shutdown(deadline);
}

int Daemon::Exit(const absl::Status& status) const {
  FLOG(ERROR) << status.message();
  return absl::IsInvalidArgument(status) || absl::IsNotFound(status) ? 2 : 1;
}

std::string Daemon::grpc_address() const { return absl::StrCat(host_, ":", server_.port); }

std::string Daemon::metrics_address() const {
  return absl::StrCat(host_, ":", metrics_ != nullptr ? metrics_->port() : 0);
}

}  // namespace fulcrum
