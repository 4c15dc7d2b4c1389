// The multi-process test fixture: a real scheduler, servers and workers on
// loopback (started through LocalCluster, the code behind `fulcrum local
// up`), driven through the public gRPC API. Every process is killed by pid in
// teardown, also when a test fails. Shared by the integration test binaries.
#ifndef FULCRUM_TESTS_CLUSTER_FIXTURE_H_
#define FULCRUM_TESTS_CLUSTER_FIXTURE_H_

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/local_cluster.h"
#include "common/half.h"
#include "common/rpc.h"
#include "fulcrum/v1/job.grpc.pb.h"
#include "fulcrum/v1/parameter.grpc.pb.h"
#include "worker/example_audit.h"
#include "worker/parameter_client.h"

namespace fulcrum {

inline std::string MakeTempDir() {
  std::string pattern = absl::StrCat(testing::TempDir(), "/fulcrum-it.XXXXXX");
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  char* dir = mkdtemp(buffer.data());
  return dir ? dir : "";
}

// A small synthetic classification job that trains in well under a second.
inline v1::JobSpec SyntheticSpec(v1::Mode mode, int workers, int batch, int64_t max_steps) {
  v1::JobSpec spec;
  spec.set_name("synthetic");
  spec.mutable_model()->set_kind(v1::ModelSpec::MLP);
  spec.mutable_model()->add_hidden_sizes(16);
  spec.mutable_model()->set_activation(v1::TANH);
  v1::DataSpec* data = spec.mutable_data();
  data->set_dataset(v1::DataSpec::SYNTHETIC);
  data->set_synthetic_examples(4096);
  data->set_synthetic_features(20);
  data->set_synthetic_classes(4);
  data->set_batch_size(batch);
  data->set_epochs(3);
  data->set_shuffle_seed(7);
  data->set_max_steps(max_steps);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_lr(0.1f);
  spec.mutable_optimizer()->set_momentum(0.9f);
  spec.set_mode(mode);
  spec.set_num_workers(workers);
  spec.set_seed(3);
  return spec;
}

inline bool Terminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

// "N of M values differ, first at i (a vs b)" for a failure message.
inline std::string DescribeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  size_t differ = 0, first = a.size();
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (FloatBits(a[i]) != FloatBits(b[i])) {
      if (differ++ == 0) first = i;
    }
  }
  if (differ == 0) return "no value differs";
  return absl::StrCat(differ, " of ", a.size(), " values differ, first at ", first, " (", a[first], " vs ", b[first], ")");
}

class ClusterTest : public testing::Test {
 protected:
  static void StartCluster(int servers, int workers, int replicas = 1,
                           const std::vector<std::string>& scheduler_flags = {},
                           const std::vector<std::string>& worker_flags = {}) {
    LocalCluster::Options options;
    options.dir = MakeTempDir();
    options.servers = servers;
    options.workers = workers;
    options.replicas = replicas;
    // Short leases so that a dead worker is noticed quickly.
    options.scheduler_flags = {"--lease-ms=1500", "--heartbeat-ms=200", "--chunk-bytes=4096"};
    options.scheduler_flags.insert(options.scheduler_flags.end(), scheduler_flags.begin(), scheduler_flags.end());
    options.worker_flags = worker_flags;
    options_ = options;
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    stub_ = v1::JobService::NewStub(MakeChannel(cluster_->scheduler_address()));
  }
  // Kill -9 every process of the cluster, then start it again in the same
  // folder: same member ids, same state folders (scheduler and servers).
  static void KillAndRestartWholeCluster() {
    stub_.reset();
    cluster_.reset();  // SIGKILLs and reaps every process
    auto cluster = LocalCluster::Start(options_);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    stub_ = v1::JobService::NewStub(MakeChannel(cluster_->scheduler_address()));
  }
  static void SetUpTestSuite() { StartCluster(2, 2); }
  static void TearDownTestSuite() {
    stub_.reset();
    cluster_.reset();  // SIGKILLs and reaps every process it started
    // The cluster's folder (logs, state: tens of MB) stays only for a suite
    // that failed, to be read.
    const testing::TestSuite* suite = testing::UnitTest::GetInstance()->current_test_suite();
    if (!options_.dir.empty() && suite != nullptr && suite->Passed()) {
      std::error_code ignored;
      std::filesystem::remove_all(options_.dir, ignored);
    }
  }

  // Submits `spec`, from checkpoint `resume_from` (JOB or JOB/ID) when given.
  static absl::StatusOr<std::string> Submit(const v1::JobSpec& spec, const std::string& resume_from = "") {
    grpc::ClientContext context;
    SetDeadline(&context, 10);
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    request.set_resume_from(resume_from);
    v1::SubmitJobResponse response;
    grpc::Status status = stub_->SubmitJob(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status);
    return response.job_id();
  }

  // Follows WatchJob until `done` holds or `timeout` passes.
  template <typename Predicate>
  static v1::JobStatus WaitFor(const std::string& job_id, Predicate done, absl::Duration timeout) {
    grpc::ClientContext context;
    SetDeadline(&context, absl::ToDoubleSeconds(timeout));
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    auto reader = stub_->WatchJob(&context, request);
    v1::JobStatus status;
    while (reader->Read(&status)) {
      if (done(status)) {
        context.TryCancel();
        break;
      }
    }
    reader->Finish();
    return status;
  }

  static v1::JobStatus WaitForEnd(const std::string& job_id, absl::Duration timeout = absl::Seconds(120)) {
    return WaitFor(job_id, [](const v1::JobStatus& s) { return Terminal(s.state()); }, timeout);
  }

  // Runs `spec` to its end; fails the test unless it SUCCEEDED. Call it in
  // ASSERT_NO_FATAL_FAILURE.
  static void RunToSuccess(const v1::JobSpec& spec, v1::JobStatus* done) {
    auto id = Submit(spec);
    ASSERT_TRUE(id.ok()) << id.status();
    *done = WaitForEnd(*id);
    ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  }

  // Runs `spec` to its end; fails the test unless it FAILED. Call it in
  // ASSERT_NO_FATAL_FAILURE.
  static void RunToFailure(const v1::JobSpec& spec, v1::JobStatus* done) {
    auto id = Submit(spec);
    ASSERT_TRUE(id.ok()) << id.status();
    *done = WaitForEnd(*id);
    ASSERT_EQ(done->state(), v1::FAILED) << done->reason();
  }

  // Waits until the job has done more than `step` steps (or ended).
  static v1::JobStatus WaitForStep(const std::string& job_id, int64_t step) {
    return WaitFor(
        job_id, [step](const v1::JobStatus& s) { return s.progress().step() > step || Terminal(s.state()); },
        absl::Seconds(60));
  }

  // The job ended with exactly the parameters `expected` (bit for bit).
  static void ExpectSameParameters(const std::vector<float>& expected, const v1::JobStatus& done) {
    std::vector<float> actual = FinalParameters(done);
    ASSERT_EQ(actual.size(), expected.size());
    EXPECT_EQ(0, std::memcmp(actual.data(), expected.data(), actual.size() * sizeof(float)))
        << DescribeDifference(expected, actual);
  }

  static std::vector<float> FinalParameters(const v1::JobStatus& job) {
    ParameterClient client(job.shard_map(), job.job_id(), "test-reader");
    auto params = client.MakeBuffers();
    absl::Status status = client.Pull(0, absl::Seconds(10), &params);
    EXPECT_TRUE(status.ok()) << status;
    std::vector<float> flat;
    for (const auto& t : params) flat.insert(flat.end(), t.begin(), t.end());
    return flat;
  }

  // Every chunk's replica holds an audit of the examples behind the gradients
  // it accepted (their count and the sum of their ExampleDigest tags). Checks
  // it against every example of every epoch used exactly once: a lost step,
  // a step applied twice or a partition computed on the wrong examples
  // changes the sum.
  static void ExpectEveryExampleUsedOncePerEpoch(const v1::JobStatus& done, int64_t num_examples) {
    const v1::JobSpec& spec = done.spec();
    const DataPartitioning partitioning = DataPartitioning::For(spec, num_examples);
    ASSERT_EQ(done.progress().total_steps(), partitioning.steps_per_epoch() * spec.data().epochs())
        << "a full-epochs job expected";
    const ExampleAudit expected = ExpectedExampleAudit(spec, num_examples);
    absl::StatusOr<std::vector<ChunkAudit>> audits = ReadChunkAudits(done);
    ASSERT_TRUE(audits.ok()) << audits.status();
    for (const ChunkAudit& chunk : *audits) {
      EXPECT_EQ(chunk.audit.examples, expected.examples) << "chunk " << chunk.chunk_id;
      EXPECT_EQ(chunk.audit.digest, expected.digest)
          << "chunk " << chunk.chunk_id << ": the examples behind its updates are not each example once per epoch";
    }
  }

  static inline LocalCluster::Options options_;
  static inline std::unique_ptr<LocalCluster> cluster_;
  static inline std::unique_ptr<v1::JobService::Stub> stub_;
};

// Runs a shell command; returns its exit code and its stdout.
inline std::pair<int, std::string> RunCommand(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Runs the fulcrum CLI; returns its exit code and stdout.
inline std::pair<int, std::string> RunCli(const std::string& args) {
  return RunCommand(absl::StrCat(DefaultBinDir(), "/fulcrum ", args, " 2>/dev/null"));
}

// A plain HTTP/1.0 GET; returns the whole response (status line, headers, body).
// The value of the sample `name` (with its labels, as exposed) in a
// Prometheus text exposition; -1 if absent.
inline double MetricValue(const std::string& body, const std::string& name) {
  size_t at = body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::atof(body.c_str() + at + name.size() + 2);
}

inline std::string HttpGet(const std::string& address, const std::string& path) {
  std::string host = address.substr(0, address.rfind(':'));
  int port = std::atoi(address.substr(address.rfind(':') + 1).c_str());
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host, "\r\n\r\n");
  if (write(fd, request.data(), request.size()) < 0) {
    close(fd);
    return "";
  }
  std::string response;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  close(fd);
  return response;
}

// The sum of `metric` over the servers of `cluster` (an absent one counts 0).
inline double ServersTotal(const v1::LocalClusterFile& cluster, const std::string& metric) {
  double total = 0;
  for (const auto& process : cluster.processes()) {
    if (process.role() != "server") continue;
    total += std::max(0.0, MetricValue(HttpGet(process.metrics_address(), "/metrics"), metric));
  }
  return total;
}

// The sum over the servers of a per-table gauge (`fulcrum_server_table_` +
// `gauge`: rows, bytes, admitted_rows, expired_rows) of one job's table.
inline double ServersTableTotal(const v1::LocalClusterFile& cluster, const std::string& gauge,
                                const std::string& job_id, const std::string& table) {
  return ServersTotal(cluster, absl::StrCat("fulcrum_server_table_", gauge, "{job_id=\"", job_id,
                                            "\",table=\"", table, "\"}"));
}

}  // namespace fulcrum

#endif  // FULCRUM_TESTS_CLUSTER_FIXTURE_H_
