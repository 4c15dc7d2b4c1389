// Transport security and credentials for every gRPC server and channel of a
// process, configured once at start-up (before any server or channel is
// made) and read-only afterwards.
//
// - mTLS: with a certificate, key and CA, servers require and verify client
//   certificates signed by the CA, and channels present theirs and verify
//   the server's. Health can then be served on a separate plaintext port so
//   that Kubernetes probes work.
// - Job token: JobService requires `authorization: Bearer TOKEN`
//   (UNAUTHENTICATED without one, PERMISSION_DENIED for a wrong one). The
//   scheduler holds the accepted token; clients (the CLI) send theirs.
// - Cluster token: the internal services (ClusterService, ParameterService)
//   require `x-fulcrum-cluster-token`; every daemon sends it on its channels.
#ifndef FULCRUM_COMMON_RPC_SECURITY_H_
#define FULCRUM_COMMON_RPC_SECURITY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/status/status.h"

namespace fulcrum {

struct RpcSecurityFiles {
  std::string tls_cert;  // PEM files; all three or none
  std::string tls_key;
  std::string tls_ca;
  std::string cluster_token;  // files holding one token each (whitespace trimmed); "" = none
  std::string job_token;      // scheduler: the token JobService accepts; CLI: the one it sends
};

// Reads the files and installs the configuration. INVALID_ARGUMENT for an
// incomplete TLS triple or a credential file that holds no token (an empty
// secret must never turn security off), NOT_FOUND naming a file that cannot
// be read.
absl::Status ConfigureRpcSecurity(const RpcSecurityFiles& files);
// The same with the tokens given directly (the CLI's --token / FULCRUM_TOKEN).
absl::Status ConfigureRpcSecurity(const RpcSecurityFiles& files, const std::string& job_token,
                                  const std::string& cluster_token);

bool TlsEnabled();
std::shared_ptr<grpc::ServerCredentials> ServerCredentials();
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials();
// The client interceptors that put the configured tokens into every call's
// metadata; MakeChannel installs them on its channels.
std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> CredentialInterceptors();

// The callers of an RPC, by the credential they present; see
// common/authorization.h for the table that says who may call what.
enum CallerKind : uint32_t {
  kAnyone = 1u << 0,
  kJobClient = 1u << 1,
  kClusterMember = 1u << 2,
};

// What a call's metadata shows of one kind of credential.
struct CredentialCheck {
  bool valid = false;      // it matches the configured one (or none is configured)
  bool presented = false;  // the call carries one
  std::string missing;     // the refusal when it carries none
  std::string wrong;       // the refusal when it does not match
};
CredentialCheck CheckCredential(CallerKind kind, const std::multimap<grpc::string_ref, grpc::string_ref>& metadata);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_RPC_SECURITY_H_
