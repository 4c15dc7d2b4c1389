// The transport-security flags every daemon shares:
//   --tls_cert, --tls_key, --tls_ca   mTLS on every gRPC server and channel
//   --cluster_token_file              the cluster credential (internal services)
//   --health_port                     with TLS: a plaintext port serving only
//                                     grpc.health.v1 (Kubernetes probes)
#ifndef FULCRUM_COMMON_SECURITY_FLAGS_H_
#define FULCRUM_COMMON_SECURITY_FLAGS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/rpc.h"

namespace fulcrum {

// Reads the flags' files and configures the process (ConfigureRpcSecurity);
// `job_token_file` is the token a scheduler's JobService accepts ("" = none).
absl::Status ConfigureSecurityFromFlags(const std::string& job_token_file = "");

// With --health_port >= 0 (0: a free port), a plaintext server on host:port
// serving health only; none otherwise.
absl::StatusOr<std::optional<RunningServer>> StartHealthServerFromFlags(const std::string& host);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_SECURITY_FLAGS_H_
