#include "common/security_flags.h"

#include "absl/flags/flag.h"
#include "common/logging.h"
#include "common/rpc_security.h"

ABSL_FLAG(std::string, tls_cert, "", "PEM certificate of this process (mTLS; with --tls-key and --tls-ca)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificate that peers' certificates must be signed by");
ABSL_FLAG(std::string, cluster_token_file, "",
          "File holding the cluster credential: internal services require it, and this process sends it");
ABSL_FLAG(int, health_port, -1,
          "Plaintext port serving only grpc.health.v1 (for probes when TLS is on); -1 = none, 0 = a free one");

namespace fulcrum {

absl::Status ConfigureSecurityFromFlags(const std::string& job_token_file) {
  RpcSecurityFiles files;
  files.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  files.tls_key = absl::GetFlag(FLAGS_tls_key);
  files.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  files.cluster_token = absl::GetFlag(FLAGS_cluster_token_file);
  files.job_token = job_token_file;
  absl::Status status = ConfigureRpcSecurity(files);
  if (status.ok()) {
    FLOG(INFO) << "gRPC: " << (TlsEnabled() ? "mTLS" : "plaintext")
               << (files.cluster_token.empty() ? "" : ", cluster credential required")
               << (job_token_file.empty() ? "" : ", JobService token required");
  }
  return status;
}

absl::StatusOr<std::optional<RunningServer>> StartHealthServerFromFlags(const std::string& host) {
  const int port = absl::GetFlag(FLAGS_health_port);
  if (port < 0) return std::optional<RunningServer>();
  auto server = StartGrpcServer(host, port, {}, nullptr, /*plaintext=*/true);
  if (!server.ok()) return server.status();
  FLOG(INFO) << "plaintext health on " << host << ":" << server->port;
  return std::optional<RunningServer>(std::move(*server));
}

}  // namespace fulcrum
