#include "common/rpc_security.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace fulcrum {
namespace {

constexpr char kClusterTokenHeader[] = "x-fulcrum-cluster-token";
constexpr char kAuthorizationHeader[] = "authorization";

struct Security {
  bool tls = false;
  std::string cert, key, ca;
  std::string accepted_job_token;  // a scheduler's JobService accepts it
  std::string sent_job_token;      // a client (the CLI) sends it
  std::string cluster_token;       // required by internal services, sent on every channel
};

Security& Current() {
  static Security* security = new Security();
  return *security;
}

absl::Status ReadFile(const std::string& path, const char* what, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, ": cannot read ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  *out = buffer.str();
  return absl::OkStatus();
}

// Constant time in the length of `expected`.
bool SameToken(absl::string_view given, const std::string& expected) {
  unsigned char differ = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    differ |= static_cast<unsigned char>(expected[i] ^ (i < given.size() ? given[i] : 0));
  }
  return differ == 0;
}

std::string Header(const grpc::ServerContext* context, const char* name) {
  auto it = context->client_metadata().find(name);
  if (it == context->client_metadata().end()) return "";
  return std::string(it->second.data(), it->second.size());
}

// Adds the configured tokens to the initial metadata of every call.
class CredentialsInterceptor final : public grpc::experimental::Interceptor {
 public:
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      const Security& s = Current();
      auto* metadata = methods->GetSendInitialMetadata();
      if (!s.cluster_token.empty()) metadata->insert({kClusterTokenHeader, s.cluster_token});
      if (!s.sent_job_token.empty()) metadata->insert({kAuthorizationHeader, bearer_});
    }
    methods->Proceed();
  }
  explicit CredentialsInterceptor(std::string bearer) : bearer_(std::move(bearer)) {}

 private:
  std::string bearer_;
};

class CredentialsInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new CredentialsInterceptor(absl::StrCat("Bearer ", Current().sent_job_token));
  }
};

}  // namespace

std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> CredentialInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  const Security& s = Current();
  if (!s.cluster_token.empty() || !s.sent_job_token.empty()) {
    factories.push_back(std::make_unique<CredentialsInterceptorFactory>());
  }
  return factories;
}

absl::Status ConfigureRpcSecurity(const RpcSecurityFiles& files) {
  std::string job, cluster;
  if (!files.job_token.empty()) {
    if (absl::Status s = ReadFile(files.job_token, "--token-file", &job); !s.ok()) return s;
  }
  if (!files.cluster_token.empty()) {
    if (absl::Status s = ReadFile(files.cluster_token, "--cluster-token-file", &cluster); !s.ok()) return s;
  }
  RETURN_IF_ERROR(ConfigureRpcSecurity(files, "", std::string(absl::StripAsciiWhitespace(cluster))));
  Current().accepted_job_token = std::string(absl::StripAsciiWhitespace(job));
  return absl::OkStatus();
}

absl::Status ConfigureRpcSecurity(const RpcSecurityFiles& files, const std::string& job_token,
                                  const std::string& cluster_token) {
  Security security;
  const int given = !files.tls_cert.empty() + !files.tls_key.empty() + !files.tls_ca.empty();
  if (given != 0 && given != 3) {
    return absl::InvalidArgumentError("TLS needs all of --tls-cert, --tls-key and --tls-ca");
  }
  if (given == 3) {
    security.tls = true;
    if (absl::Status s = ReadFile(files.tls_cert, "--tls-cert", &security.cert); !s.ok()) return s;
    if (absl::Status s = ReadFile(files.tls_key, "--tls-key", &security.key); !s.ok()) return s;
    if (absl::Status s = ReadFile(files.tls_ca, "--tls-ca", &security.ca); !s.ok()) return s;
  }
  security.sent_job_token = job_token;
  security.cluster_token = cluster_token;
  Current() = std::move(security);
  return absl::OkStatus();
}

bool TlsEnabled() { return Current().tls; }

std::shared_ptr<grpc::ServerCredentials> ServerCredentials() {
  const Security& s = Current();
  if (!s.tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = s.ca;
  options.pem_key_cert_pairs.push_back({s.key, s.cert});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() {
  const Security& s = Current();
  if (!s.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = s.ca;
  options.pem_private_key = s.key;
  options.pem_cert_chain = s.cert;
  return grpc::SslCredentials(options);
}

absl::Status Authorize(const grpc::ServerContext* context, Caller caller) {
  const Security& s = Current();
  if (caller == Caller::kClusterMember) {
    if (s.cluster_token.empty()) return absl::OkStatus();
    std::string given = Header(context, kClusterTokenHeader);
    if (given.empty()) {
      return absl::UnauthenticatedError("this cluster requires its cluster credential (--cluster-token-file)");
    }
    if (!SameToken(given, s.cluster_token)) return absl::PermissionDeniedError("wrong cluster credential");
    return absl::OkStatus();
  }
  if (s.accepted_job_token.empty()) return absl::OkStatus();
  std::string given = Header(context, kAuthorizationHeader);
  if (!absl::StartsWith(given, "Bearer ") || given.size() == 7) {
    return absl::UnauthenticatedError("this scheduler requires a token: pass --token or set FULCRUM_TOKEN");
  }
  if (!SameToken(absl::string_view(given).substr(7), s.accepted_job_token)) {
    return absl::PermissionDeniedError("the token is not valid for this scheduler");
  }
  return absl::OkStatus();
}

}  // namespace fulcrum
