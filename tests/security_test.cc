// Transport security on a live local cluster started like `fulcrum local up
// --tls`: mTLS on every channel, a JobService token and a cluster
// credential. A plaintext client is refused, a missing or wrong token is
// refused, a valid one works (and a job trains over mTLS), a worker without
// the cluster credential cannot register, and health is served in plaintext
// on a separate port for probes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc_security.h"
#include "fulcrum/v1/cluster.grpc.pb.h"
#include "tests/cluster_fixture.h"
#include "common/sync.h"

namespace fulcrum {
namespace {

std::string ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                     getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  return bound ? ntohs(addr.sin_port) : 0;
}

// A process the test starts itself; killed and reaped when it goes.
struct Child {
  pid_t pid = -1;
  std::string log;
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

class SecurityTest : public ClusterTest {
 protected:
  static void SetUpTestSuite() {
    LocalCluster::Options options;
    options.dir = MakeTempDir();
    options.servers = 1;
    options.workers = 1;
    options.tls = true;
    options.scheduler_flags = {"--lease-ms=1500", "--heartbeat-ms=200"};
    tls_ = options.dir + "/tls";
    ASSERT_TRUE(EnsureDevCertificates(tls_, DefaultBinDir()).ok());
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }

  static RpcSecurityFiles Files() {
    RpcSecurityFiles files;
    files.tls_cert = tls_ + "/node.crt";
    files.tls_key = tls_ + "/node.key";
    files.tls_ca = tls_ + "/ca.crt";
    return files;
  }

  // A JobService stub whose calls carry `token` (and the cluster credential
  // when `cluster` is set) over mTLS.
  static std::unique_ptr<v1::JobService::Stub> JobStub(const std::string& token, bool cluster = false) {
    EXPECT_TRUE(ConfigureRpcSecurity(Files(), token, cluster ? ReadLine(tls_ + "/cluster-token") : "").ok());
    return v1::JobService::NewStub(MakeChannel(cluster_->scheduler_address()));
  }

  static grpc::Status List(v1::JobService::Stub* stub) {
    grpc::ClientContext context;
    SetDeadline(&context, 10);
    v1::ListJobsResponse response;
    return stub->ListJobs(&context, v1::ListJobsRequest(), &response);
  }

  std::vector<std::string> SecurityFlags(bool with_cluster_token) {
    std::vector<std::string> flags = {"--tls_cert=" + tls_ + "/node.crt", "--tls_key=" + tls_ + "/node.key",
                                      "--tls_ca=" + tls_ + "/ca.crt"};
    if (with_cluster_token) flags.push_back("--cluster_token_file=" + tls_ + "/cluster-token");
    return flags;
  }

  static inline std::string tls_;
};

TEST_F(SecurityTest, ValidTokenWorksAndAJobTrainsOverMutualTls) {
  stub_ = JobStub(ReadLine(tls_ + "/token"));
  EXPECT_TRUE(List(stub_.get()).ok());
  auto id = Submit(SyntheticSpec(v1::BSP, 1, 16, 30));
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus done = WaitForEnd(*id);
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
}

TEST_F(SecurityTest, PlaintextClientIsRefused) {
  auto plain = v1::JobService::NewStub(grpc::CreateChannel(cluster_->scheduler_address(),
                                                           grpc::InsecureChannelCredentials()));
  grpc::Status status = List(plain.get());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST_F(SecurityTest, MissingOrWrongTokenIsRefused) {
  auto none = JobStub("");
  grpc::Status missing = List(none.get());
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED) << missing.error_message();
  auto wrong = JobStub("not-the-token");
  grpc::Status refused = List(wrong.get());
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED) << refused.error_message();
  // The CLI says so too, and exits 1.
  auto [rc, out] = RunCli(absl::StrCat("list --scheduler ", cluster_->scheduler_address(), " --tls-cert ", tls_,
                                       "/node.crt --tls-key ", tls_, "/node.key --tls-ca ", tls_,
                                       "/ca.crt --token wrong"));
  EXPECT_EQ(rc, 1);
}

TEST_F(SecurityTest, WorkerWithoutTheClusterCredentialCannotRegister) {
  Child worker;
  worker.log = MakeTempDir() + "/worker.log";
  std::vector<std::string> argv = {DefaultBinDir() + "/fulcrum-worker", "--scheduler=" + cluster_->scheduler_address(),
                                   "--id=intruder"};
  for (std::string& f : SecurityFlags(/*with_cluster_token=*/false)) argv.push_back(f);
  auto pid = SpawnProcess(argv, worker.log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  worker.pid = *pid;
  std::string log;
  for (absl::Time deadline = absl::Now() + absl::Seconds(20); absl::Now() < deadline;) {
    std::ifstream in(worker.log);
    log.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (log.find("cannot register") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(50));  // polling its log for the refusal
  }
  EXPECT_NE(log.find("requires its cluster credential"), std::string::npos) << log;
  // The scheduler does not list it.
  EXPECT_TRUE(ConfigureRpcSecurity(Files(), "", ReadLine(tls_ + "/cluster-token")).ok());
  auto cluster = v1::ClusterService::NewStub(MakeChannel(cluster_->scheduler_address()));
  grpc::ClientContext context;
  SetDeadline(&context, 10);
  v1::ListMembersResponse members;
  ASSERT_TRUE(cluster->ListMembers(&context, v1::ListMembersRequest(), &members).ok());
  for (const auto& m : members.members()) EXPECT_NE(m.member_id(), "intruder");
  EXPECT_GE(members.members_size(), 2);
}

TEST_F(SecurityTest, HealthIsServedInPlaintextOnItsOwnPort) {
  Child server;
  server.log = MakeTempDir() + "/server.log";
  const int port = FreePort();
  std::vector<std::string> argv = {DefaultBinDir() + "/fulcrum-server", "--scheduler=" + cluster_->scheduler_address(),
                                   "--id=probed", absl::StrCat("--health_port=", port)};
  for (std::string& f : SecurityFlags(/*with_cluster_token=*/true)) argv.push_back(f);
  auto pid = SpawnProcess(argv, server.log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  server.pid = *pid;
  auto health = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(health);
  bool serving = false;
  for (absl::Time deadline = absl::Now() + absl::Seconds(20); absl::Now() < deadline && !serving;) {
    grpc::ClientContext context;
    SetDeadline(&context, 2);
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), response;
    grpc::Status result;
    Notification done;
    stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) {
                     result = std::move(s);
                     done.Notify();
                   });
    done.WaitForNotification();
    if (result.ok()) {
      std::vector<grpc::Slice> slices;
      (void)response.Dump(&slices);
      std::string bytes;
      for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      serving = bytes == std::string("\x08\x01", 2);  // HealthCheckResponse{status: SERVING}
    }
    if (!serving) absl::SleepFor(absl::Milliseconds(100));  // polling until it has started
  }
  EXPECT_TRUE(serving) << "no plaintext SERVING answer on port " << port;
}

// An empty or blank credential (an empty Kubernetes Secret) must stop every
// daemon at start-up: serving with it would turn the check off.
TEST_F(SecurityTest, EmptyCredentialFilesStopEveryDaemonAtStartUp) {
  const std::string dir = MakeTempDir();
  { std::ofstream empty(dir + "/empty"); }  // an empty file
  std::ofstream(dir + "/blank") << "  \n\t\n";
  struct Case {
    std::string binary;
    std::string flag;
  };
  std::vector<Case> cases;
  for (const char* file : {"/empty", "/blank"}) {
    cases.push_back({"fulcrum-scheduler", "--token_file=" + dir + file});
    for (const char* binary : {"fulcrum-scheduler", "fulcrum-server", "fulcrum-worker"}) {
      cases.push_back({binary, "--cluster_token_file=" + dir + file});
    }
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.binary + " " + c.flag);
    Child child;
    child.log = dir + "/" + c.binary + ".log";
    std::remove(child.log.c_str());
    std::vector<std::string> argv = {DefaultBinDir() + "/" + c.binary, c.flag};
    if (c.binary != "fulcrum-scheduler") argv.push_back("--scheduler=" + cluster_->scheduler_address());
    for (std::string& f : SecurityFlags(/*with_cluster_token=*/false)) argv.push_back(f);
    auto pid = SpawnProcess(argv, child.log);
    ASSERT_TRUE(pid.ok()) << pid.status();
    int status = 0;
    // It must exit on its own: waitpid returns once it does (a daemon that
    // starts serving never would, and the ctest timeout reports it).
    ASSERT_EQ(waitpid(*pid, &status, 0), *pid);
    child.pid = -1;
    ASSERT_TRUE(WIFEXITED(status)) << "killed by a signal";
    EXPECT_NE(WEXITSTATUS(status), 0) << "it started with an empty credential";
    std::ifstream log(child.log);
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("holds no token"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace fulcrum
