// The start-up and shutdown every Fulcrum daemon (scheduler, server, worker)
// shares, so that their main() only wires their own objects together:
//
//   Daemon daemon("server", "fulcrum-server --scheduler HOST:PORT ...");
//   if (absl::Status s = daemon.Init(argc, argv); !s.ok()) return daemon.Exit(s);
//   ... build the process's objects ...
//   if (absl::Status s = daemon.Serve({&service}); !s.ok()) return daemon.Exit(s);
//   daemon.WaitForShutdown();
//   ... stop the objects ...
//   daemon.StopServing(absl::Seconds(2));
//
// The flags it owns (besides the security flags of common/security_flags.h):
//   --host, --port, --metrics_port, --port_file, --log_level, --memory_budget.
#ifndef FULCRUM_COMMON_DAEMON_H_
#define FULCRUM_COMMON_DAEMON_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/rpc.h"

namespace fulcrum {

class Daemon {
 public:
  // `role` tags the log lines ("scheduler", "server", "worker"); `usage` is
  // the --help text.
  Daemon(std::string role, std::string usage);

  // Blocks termination signals (call before any thread exists), parses the
  // flags, sets the log level, reads the security files and starts the
  // metrics endpoint. `job_token_file`, when given, is asked (after parsing)
  // for the token a JobService accepts. INVALID_ARGUMENT for a bad flag;
  // UNAVAILABLE when the metrics port cannot be bound.
  absl::Status Init(int argc, char** argv, const std::function<std::string()>& job_token_file = nullptr);

  // Serves `services` (may be empty: health and reflection only) on
  // --host:--port, the plaintext health port if --health_port asks for one,
  // and writes the port file (with `id`, when known).
  absl::Status Serve(const std::vector<ServedService>& services, const std::string& id = "");

  // Waits for SIGTERM or SIGINT (or RequestShutdown); logs it.
  int WaitForShutdown();
  // Stops the gRPC servers, letting calls in flight finish for `grace`.
  void StopServing(absl::Duration grace);

  // Logs `status` (as an error) and returns the exit code for it: 2 for a
  // bad command line or configuration, 1 otherwise.
  int Exit(const absl::Status& status) const;

  const std::string& host() const { return host_; }
  int grpc_port() const { return server_.port; }
  std::string grpc_address() const;
  std::string metrics_address() const;
  MetricsEndpoint* metrics() const { return metrics_.get(); }
  prometheus::Registry& registry() const { return metrics_->registry(); }
  // What the jobs this process serves may claim (--memory_budget).
  int64_t memory_budget() const { return memory_budget_; }

 private:
  const std::string role_;
  const std::string usage_;
  std::string host_;
  int64_t memory_budget_ = 0;
  std::unique_ptr<MetricsEndpoint> metrics_;
  std::unique_ptr<ScrapedGauge> budget_gauge_;  // fulcrum_memory_budget_bytes
  RunningServer server_;
  std::optional<RunningServer> health_server_;
};

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_DAEMON_H_
