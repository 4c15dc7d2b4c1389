#include "common/authorization.h"

#include <dirent.h>
#include <stdlib.h>

#include <atomic>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/method_handler.h>
#include <grpcpp/support/sync_stream.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc.h"
#include "common/rpc_security.h"
#include "common/sync.h"
#include "fulcrum/v1/parameter.grpc.pb.h"

namespace fulcrum {
namespace {

// "/package.Service/Method" for every rpc of every service declared in the
// .proto files under proto/ of the source tree (read as text, so a service
// is found whether or not a binary links it).
std::vector<std::string> EveryMethod() {
  std::vector<std::string> methods;
  const std::string dir = std::string(FULCRUM_SOURCE_DIR) + "/proto/fulcrum/v1";
  DIR* d = opendir(dir.c_str());
  EXPECT_NE(d, nullptr) << dir;
  if (d == nullptr) return methods;
  const std::regex package_re(R"(^\s*package\s+([\w.]+)\s*;)");
  const std::regex service_re(R"(^\s*service\s+(\w+))");
  const std::regex rpc_re(R"(^\s*rpc\s+(\w+)\s*\()");
  while (dirent* entry = readdir(d)) {
    std::string name = entry->d_name;
    if (!absl::EndsWith(name, ".proto")) continue;
    std::ifstream in(dir + "/" + name);
    std::string line, package, service;
    std::smatch match;
    while (std::getline(in, line)) {
      line = line.substr(0, line.find("//"));
      if (std::regex_search(line, match, package_re)) package = match[1];
      if (std::regex_search(line, match, service_re)) service = match[1];
      if (std::regex_search(line, match, rpc_re)) {
        EXPECT_FALSE(service.empty()) << name << ": rpc outside a service";
        methods.push_back(absl::StrCat("/", package, ".", service, "/", std::string(match[1])));
      }
    }
  }
  closedir(d);
  return methods;
}

TEST(AuthorizationTableTest, EveryMethodOfEveryServiceHasAnEntry) {
  std::vector<std::string> methods = EveryMethod();
  ASSERT_GE(methods.size(), 20u) << "the proto folder was not found or holds fewer services than expected";
  for (const std::string& method : methods) {
    auto entry = AuthorizationTable().find(method);
    ASSERT_NE(entry, AuthorizationTable().end()) << method << " has no entry in the authorization table";
    EXPECT_NE(entry->second, 0u) << method << " allows no caller";
  }
  // And no entry names a fulcrum method that does not exist.
  std::set<std::string> known(methods.begin(), methods.end());
  for (const auto& [method, callers] : AuthorizationTable()) {
    if (absl::StartsWith(method, "/fulcrum.")) {
      EXPECT_EQ(known.count(method), 1u) << method << " is not in proto/";
    }
  }
}

TEST(AuthorizationTableTest, NoFulcrumMethodIsOpenToAnyone) {
  for (const auto& [method, callers] : AuthorizationTable()) {
    if (absl::StartsWith(method, "/fulcrum.")) {
      EXPECT_EQ(callers & kAnyone, 0u) << method;
    }
  }
}

// The gate on a live server: each fulcrum.v1 method, served by the generated
// base services (whose handlers answer UNIMPLEMENTED), is refused without
// the right credential and reaches the handler with it. ParameterService is
// served with the callback API, so both kinds of handler are gated.
class GateTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string dir = absl::StrCat(testing::TempDir(), "/gate.XXXXXX");
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    RpcSecurityFiles files;
    files.job_token = dir + "/job-token";
    files.cluster_token = dir + "/cluster-token";
    std::ofstream(files.job_token) << "the-job-token\n";
    std::ofstream(files.cluster_token) << "the-cluster-token\n";
    ASSERT_TRUE(ConfigureRpcSecurity(files).ok());
    server_ = new RunningServer(*StartGrpcServer("127.0.0.1", 0, {&jobs_, &cluster_, &parameters_}));
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port), grpc::InsecureChannelCredentials());
  }
  static void TearDownTestSuite() {
    server_->server->Shutdown();
    delete server_;
    ASSERT_TRUE(ConfigureRpcSecurity(RpcSecurityFiles()).ok());
  }

  // Calls `method` with `payload` and the given metadata; returns the status
  // (and the answer's bytes in *answer when given).
  static grpc::Status Call(const std::string& method, const std::vector<std::pair<std::string, std::string>>& metadata,
                           const std::string& payload = "") {
    return CallOn(channel_, method, metadata, payload, nullptr);
  }
  static grpc::Status CallOn(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                             const std::vector<std::pair<std::string, std::string>>& metadata,
                             const std::string& payload, std::string* answer) {
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    SetDeadline(&context, 10);
    for (const auto& [key, value] : metadata) context.AddMetadata(key, value);
    grpc::Slice slice(payload);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::Status status;
    Notification done;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    done.WaitForNotification();
    std::vector<grpc::Slice> slices;
    if (answer != nullptr && status.ok() && response.Dump(&slices).ok()) {
      for (const grpc::Slice& slice : slices) answer->append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    return status;
  }

  static inline v1::JobService::Service jobs_;
  static inline v1::ClusterService::Service cluster_;
  static inline v1::ParameterService::CallbackService parameters_;
  static inline RunningServer* server_ = nullptr;
  static inline std::shared_ptr<grpc::Channel> channel_;
};

const std::pair<std::string, std::string> kJob = {"authorization", "Bearer the-job-token"};
const std::pair<std::string, std::string> kWrongJob = {"authorization", "Bearer another-token"};
const std::pair<std::string, std::string> kMember = {"x-fulcrum-cluster-token", "the-cluster-token"};
const std::pair<std::string, std::string> kWrongMember = {"x-fulcrum-cluster-token", "the-cluster-tokeN"};

TEST_F(GateTest, EveryMethodRefusesCallersWithoutTheCredentialItNeeds) {
  for (const std::string& method : EveryMethod()) {
    const uint32_t allowed = AuthorizationTable().at(method);
    SCOPED_TRACE(method);
    grpc::Status none = Call(method, {});
    EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
    EXPECT_FALSE(none.error_message().empty());
    if (allowed & kJobClient) {
      EXPECT_EQ(Call(method, {kWrongJob}).error_code(), grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_EQ(Call(method, {kJob}).error_code(), grpc::StatusCode::UNIMPLEMENTED) << "the job token is refused";
    } else {
      // A valid credential of the wrong kind does not open the method.
      EXPECT_EQ(Call(method, {kJob}).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
    if (allowed & kClusterMember) {
      EXPECT_EQ(Call(method, {kWrongMember}).error_code(), grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_EQ(Call(method, {kMember}).error_code(), grpc::StatusCode::UNIMPLEMENTED)
          << "the cluster credential is refused";
    } else {
      EXPECT_EQ(Call(method, {kMember}).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
  }
}

TEST_F(GateTest, GarbageRequestsAreInvalidArgumentNamingTheMessage) {
  const std::string garbage("\xff\xff\xff\xff\x0f\x01", 6);  // a truncated varint
  for (const std::string& method : EveryMethod()) {
    SCOPED_TRACE(method);
    grpc::Status status = Call(method, {kJob, kMember}, garbage);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_TRUE(absl::StrContains(status.error_message(), "fulcrum.v1.")) << status.error_message();
  }
}

// A service whose Push takes raw bytes as a "streamed unary" method (as the
// parameter server's does): such a handler reads its own request and would
// run whatever the request status said, so the gate must answer a refused
// call without it.
class StreamedPushService final : public v1::ParameterService::Service {
 public:
  StreamedPushService() {
    MarkMethodStreamed(v1::PushRequest::descriptor()->file()->FindServiceByName("ParameterService")
                           ->FindMethodByName("Push")
                           ->index(),
                       new grpc::internal::StreamedUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                           [this](grpc::ServerContext*, grpc::ServerUnaryStreamer<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
                             ran_.fetch_add(1);
                             grpc::ByteBuffer request;
                             if (!stream->Read(&request)) return grpc::Status(grpc::StatusCode::CANCELLED, "no request");
                             grpc::Slice answer(std::string("ok"));
                             stream->Write(grpc::ByteBuffer(&answer, 1));
                             return grpc::Status::OK;
                           }));
  }
  int ran() const { return ran_.load(); }

 private:
  std::atomic<int> ran_{0};
};

TEST_F(GateTest, AStreamedUnaryMethodRunsOnlyForAllowedCallers) {
  StreamedPushService service;
  RunningServer server = *StartGrpcServer("127.0.0.1", 0, {&service});
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server.port), grpc::InsecureChannelCredentials());
  auto call = [&](const std::vector<std::pair<std::string, std::string>>& metadata, std::string* answer) {
    return CallOn(channel, "/fulcrum.v1.ParameterService/Push", metadata, "request", answer);
  };
  std::string answer;
  EXPECT_EQ(call({}, &answer).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call({kWrongMember}, &answer).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(call({kJob}, &answer).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(service.ran(), 0) << "the handler ran for a refused caller";
  grpc::Status allowed = call({kMember}, &answer);
  EXPECT_TRUE(allowed.ok()) << allowed.error_message();
  EXPECT_EQ(answer, "ok");
  EXPECT_EQ(service.ran(), 1);
  server.server->Shutdown();
}

TEST(CredentialFilesTest, EmptyOrBlankOrMissingCredentialFilesAreRefused) {
  std::string dir = absl::StrCat(testing::TempDir(), "/creds.XXXXXX");
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  { std::ofstream empty(dir + "/empty"); }  // an empty file
  std::ofstream(dir + "/blank") << " \n\t\n";
  for (const char* name : {"/empty", "/blank"}) {
    RpcSecurityFiles job;
    job.job_token = dir + name;
    absl::Status status = ConfigureRpcSecurity(job);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_TRUE(absl::StrContains(status.message(), "--token-file")) << status;
    RpcSecurityFiles cluster;
    cluster.cluster_token = dir + name;
    status = ConfigureRpcSecurity(cluster);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_TRUE(absl::StrContains(status.message(), "--cluster-token-file")) << status;
    RpcSecurityFiles tls;
    tls.tls_cert = tls.tls_key = tls.tls_ca = dir + name;
    EXPECT_EQ(ConfigureRpcSecurity(tls).code(), absl::StatusCode::kInvalidArgument) << name;
  }
  RpcSecurityFiles missing;
  missing.cluster_token = dir + "/no-such-file";
  EXPECT_EQ(ConfigureRpcSecurity(missing).code(), absl::StatusCode::kNotFound);
  RpcSecurityFiles endless;
  endless.job_token = "/dev/zero";
  EXPECT_EQ(ConfigureRpcSecurity(endless).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ConfigureRpcSecurity(RpcSecurityFiles()).ok());
}

}  // namespace
}  // namespace fulcrum
