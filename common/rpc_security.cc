#include "common/rpc_security.h"

#include <fstream>

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

// Credentials and certificates are small; a bigger file is a mistake (or
// /dev/zero) and is refused rather than read without bound.
constexpr size_t kMaxCredentialFileBytes = 1 << 20;

absl::Status ReadFile(const std::string& path, const char* what, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, ": cannot read ", path));
  out->assign(kMaxCredentialFileBytes + 1, '\0');
  in.read(out->data(), static_cast<std::streamsize>(out->size()));
  out->resize(static_cast<size_t>(in.gcount()));
  if (in.bad()) return absl::NotFoundError(absl::StrCat(what, ": cannot read ", path));
  if (out->size() > kMaxCredentialFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is over ", kMaxCredentialFileBytes, " bytes"));
  }
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

// The value of metadata entry `name` ("" if absent).
absl::string_view Header(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata, const char* name) {
  auto it = metadata.find(name);
  if (it == metadata.end()) return "";
  return absl::string_view(it->second.data(), it->second.size());
}

// A PEM file; INVALID_ARGUMENT when it holds no PEM block (an empty Secret).
absl::Status ReadPem(const std::string& path, const char* flag, std::string* pem) {
  RETURN_IF_ERROR(ReadFile(path, flag, pem));
  if (pem->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds no PEM data (",
                                                    pem->empty() ? "it is empty" : "no -----BEGIN line", ")"));
  }
  return absl::OkStatus();
}

// The token in `path`, whitespace trimmed; INVALID_ARGUMENT when there is none.
absl::Status ReadToken(const std::string& path, const char* flag, std::string* token) {
  std::string text;
  RETURN_IF_ERROR(ReadFile(path, flag, &text));
  *token = std::string(absl::StripAsciiWhitespace(text));
  if (token->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds no token (it is empty or blank); "
                                                    "an empty credential would turn security off: put a token "
                                                    "in it, or leave the flag out to run without one"));
  }
  return absl::OkStatus();
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
  if (!files.job_token.empty()) RETURN_IF_ERROR(ReadToken(files.job_token, "--token-file", &job));
  if (!files.cluster_token.empty()) RETURN_IF_ERROR(ReadToken(files.cluster_token, "--cluster-token-file", &cluster));
  RETURN_IF_ERROR(ConfigureRpcSecurity(files, "", cluster));
  Current().accepted_job_token = job;
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
    RETURN_IF_ERROR(ReadPem(files.tls_cert, "--tls-cert", &security.cert));
    RETURN_IF_ERROR(ReadPem(files.tls_key, "--tls-key", &security.key));
    RETURN_IF_ERROR(ReadPem(files.tls_ca, "--tls-ca", &security.ca));
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

CredentialCheck CheckCredential(CallerKind kind, const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) {
  const Security& s = Current();
  CredentialCheck check;
  if (kind == kClusterMember) {
    absl::string_view given = Header(metadata, kClusterTokenHeader);
    check.presented = !given.empty();
    check.valid = s.cluster_token.empty() || (check.presented && SameToken(given, s.cluster_token));
    check.missing = "this cluster requires its cluster credential (--cluster-token-file)";
    check.wrong = "wrong cluster credential";
    return check;
  }
  if (kind == kJobClient) {
    absl::string_view given = Header(metadata, kAuthorizationHeader);
    check.presented = absl::StartsWith(given, "Bearer ") && given.size() > 7;
    check.valid = s.accepted_job_token.empty() || (check.presented && SameToken(given.substr(7), s.accepted_job_token));
    check.missing = "this scheduler requires a token: pass --token or set FULCRUM_TOKEN";
    check.wrong = "the token is not valid for this scheduler";
    return check;
  }
  check.valid = kind == kAnyone;
  return check;
}

}  // namespace fulcrum
