// Observability against a live local cluster: every /metrics endpoint
// passes `promtool check metrics`; the Grafana dashboard and the alert rules
// query only metrics Fulcrum exports; the alert rules pass their promtool
// unit tests; and a real Prometheus server scrapes the cluster and answers a
// query for a Fulcrum metric through its HTTP API.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/metrics.h"
#include "tests/cluster_fixture.h"

namespace fulcrum {
namespace {

// The source tree (tests find deploy/ there); set by CMake.
std::string SourceDir() { return FULCRUM_SOURCE_DIR; }

bool Installed(const std::string& tool) {
  return std::system(absl::StrCat("command -v ", tool, " >/dev/null 2>&1").c_str()) == 0;
}

std::string Body(const std::string& response) {
  size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

// Runs a shell command; returns its exit code and output (stdout + stderr).
std::pair<int, std::string> Shell(const std::string& command) { return RunCommand(absl::StrCat(command, " 2>&1")); }

// Every endpoint serves the standard process_* metrics read from /proc at
// the scrape, and a scraped gauge while its handle lives.
TEST(ProcessMetricsTest, AnEndpointServesTheProcessesMemoryAndItsScrapedGauges) {
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint = MetricsEndpoint::Start("127.0.0.1", 0);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*endpoint)->port());
  double answer = 42;
  auto gauge =
      (*endpoint)->AddScrapedGauge("fulcrum_test_answer", "A test gauge", [&answer] { return answer; });
  const std::string before = Body(HttpGet(address, "/metrics"));
  EXPECT_EQ(MetricValue(before, "fulcrum_test_answer"), 42) << before;
  answer = 43;  // read at every scrape
  EXPECT_EQ(MetricValue(Body(HttpGet(address, "/metrics")), "fulcrum_test_answer"), 43);
  const double resident = MetricValue(before, "process_resident_memory_bytes");
  EXPECT_GT(resident, 1 << 20) << before;
  EXPECT_GE(MetricValue(before, "fulcrum_process_resident_memory_peak_bytes"), resident);
  EXPECT_GE(MetricValue(before, "process_threads"), 2);  // this one and the exposer's
  EXPECT_GT(MetricValue(before, "process_open_fds"), 2);
  EXPECT_GE(MetricValue(before, "process_max_fds"), MetricValue(before, "process_open_fds"));
  const double now = static_cast<double>(absl::ToUnixMicros(absl::Now())) / 1e6;
  EXPECT_GT(MetricValue(before, "process_start_time_seconds"), now - 3600);
  EXPECT_LE(MetricValue(before, "process_start_time_seconds"), now + 1);
  // 64 MiB touched shows in the resident memory.
  std::vector<char> touched(64 << 20, 1);
  const std::string after = Body(HttpGet(address, "/metrics"));
  EXPECT_GT(MetricValue(after, "process_resident_memory_bytes"), resident + (48 << 20))
      << touched[touched.size() / 2];
  gauge.reset();  // no longer served, never read again
  answer = 44;
  EXPECT_EQ(MetricValue(Body(HttpGet(address, "/metrics")), "fulcrum_test_answer"), -1);
  if (Installed("promtool")) {
    const std::string file = absl::StrCat(MakeTempDir(), "/process.prom");
    std::ofstream(file) << after;
    auto [rc, out] = Shell(absl::StrCat("promtool check metrics < ", file));
    EXPECT_EQ(rc, 0) << out;
  }
}

class ObservabilityTest : public ClusterTest {
 protected:
  static void SetUpTestSuite() { StartCluster(2, 2, /*replicas=*/2); }

  // A job running with checkpoints and replicas, so that every family
  // (training, replication, checkpoint metrics) has series.
  static std::string StartBusyJob() {
    v1::JobSpec spec = SyntheticSpec(v1::BSP, 1, 2, 0);
    spec.mutable_data()->set_epochs(60);
    spec.mutable_checkpoint()->set_every_steps(200);
    auto id = Submit(spec);
    EXPECT_TRUE(id.ok()) << id.status();
    v1::JobStatus status = WaitFor(
        *id,
        [](const v1::JobStatus& s) {
          int complete = 0;
          for (const auto& c : s.checkpoints()) complete += c.state() == v1::CheckpointInfo::COMPLETE ? 1 : 0;
          return complete > 0 || Terminal(s.state());
        },
        absl::Seconds(60));
    EXPECT_EQ(status.state(), v1::RUNNING);
    return *id;
  }

  // A click job on the other worker, running once it has evaluated (AUC), so
  // that the sparse tables' and the AUC's families have series too.
  static std::string StartClickJob() {
    v1::JobSpec spec;
    spec.mutable_model()->set_kind(v1::ModelSpec::FM);
    spec.mutable_model()->set_embedding_dim(4);
    spec.mutable_data()->set_dataset(v1::DataSpec::SYNTHETIC_CTR);
    spec.mutable_data()->mutable_synthetic_ctr()->set_examples(100000);
    spec.mutable_data()->set_batch_size(8);
    spec.mutable_data()->set_epochs(100);
    spec.mutable_data()->set_eval_every_steps(20);
    spec.mutable_optimizer()->set_lr(0.01f);
    spec.set_replicas(1);
    auto id = Submit(spec);
    EXPECT_TRUE(id.ok()) << id.status();
    v1::JobStatus status =
        WaitFor(*id, [](const v1::JobStatus& s) { return s.progress().has_test_auc() || Terminal(s.state()); },
                absl::Seconds(60));
    EXPECT_EQ(status.state(), v1::RUNNING) << status.reason();
    return *id;
  }

  static void Cancel(const std::string& id) {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_job_id(id);
    v1::JobStatus status;
    (void)stub_->CancelJob(&context, request, &status);
  }
};

TEST_F(ObservabilityTest, EveryEndpointPassesPromtoolAndDashboardsUseExportedMetrics) {
  if (!Installed("promtool")) GTEST_SKIP() << "promtool (Debian package prometheus) is not installed";
  if (!Installed("python3")) GTEST_SKIP() << "python3 is not installed";
  const std::string id = StartBusyJob();
  const std::string click_id = StartClickJob();
  // Until the scheduler's gauges (refreshed every second) show the job's
  // checkpoint (bounded).
  std::string scheduler_metrics;
  for (const auto& process : cluster_->file().processes()) {
    if (process.role() == "scheduler") scheduler_metrics = process.metrics_address();
  }
  for (absl::Time deadline = absl::Now() + absl::Seconds(20); absl::Now() < deadline;) {
    const std::string page = HttpGet(scheduler_metrics, "/metrics");
    if (page.find("fulcrum_job_last_checkpoint_bytes{") != std::string::npos &&
        page.find("fulcrum_job_test_auc{") != std::string::npos) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));  // polling for the next gauge refresh
  }
  const std::string dir = MakeTempDir();
  std::set<std::string> names;
  for (const auto& process : cluster_->file().processes()) {
    std::string body = Body(HttpGet(process.metrics_address(), "/metrics"));
    ASSERT_FALSE(body.empty()) << process.id() << " served no metrics";
    const std::string file = absl::StrCat(dir, "/", process.id(), ".prom");
    std::ofstream(file) << body;
    auto [rc, out] = Shell(absl::StrCat("promtool check metrics < ", file));
    EXPECT_EQ(rc, 0) << process.id() << " fails promtool check metrics:\n" << out;
    for (absl::string_view line : absl::StrSplit(body, '\n')) {
      if (!absl::StartsWith(line, "# TYPE ")) continue;
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      if (parts.size() >= 3) names.insert(parts[2]);
    }
  }
  Cancel(id);
  Cancel(click_id);
  for (const char* expected :
       {"grpc_server_handled_total", "grpc_server_handling_seconds", "fulcrum_job_step",
        "fulcrum_server_replication_seconds", "fulcrum_job_last_checkpoint_timestamp_seconds",
        "fulcrum_job_test_auc", "fulcrum_server_table_rows", "fulcrum_server_table_bytes",
        "fulcrum_server_table_admitted_rows", "fulcrum_server_table_expired_rows",
        "fulcrum_server_sparse_keys_pulled_total", "process_resident_memory_bytes",
        "process_cpu_seconds_total", "fulcrum_memory_budget_bytes", "fulcrum_server_budget_used_bytes"}) {
    EXPECT_EQ(names.count(expected), 1u) << expected << " is not exported";
  }
  const std::string names_file = dir + "/names.txt";
  {
    std::ofstream out(names_file);
    for (const std::string& name : names) out << name << "\n";
  }
  auto [rc, out] = Shell(absl::StrCat("python3 ", SourceDir(), "/tests/deploy/check_metric_names.py ", names_file, " ",
                                      SourceDir(), "/deploy/grafana/fulcrum-dashboard.json ", SourceDir(),
                                      "/deploy/prometheus/alerts.yml"));
  EXPECT_EQ(rc, 0) << out;
}

TEST_F(ObservabilityTest, AlertRulesPassTheirUnitTests) {
  if (!Installed("promtool")) GTEST_SKIP() << "promtool (Debian package prometheus) is not installed";
  auto [check_rc, check_out] = Shell(absl::StrCat("promtool check rules ", SourceDir(), "/deploy/prometheus/alerts.yml"));
  EXPECT_EQ(check_rc, 0) << check_out;
  auto [rc, out] = Shell(absl::StrCat("cd ", SourceDir(), "/deploy/prometheus && promtool test rules alerts_test.yml"));
  EXPECT_EQ(rc, 0) << out;
  if (Installed("yamllint")) {
    auto [lint_rc, lint_out] = Shell(absl::StrCat("yamllint -d '{extends: relaxed, rules: {line-length: {max: 200}}}' ",
                                                  SourceDir(), "/deploy"));
    EXPECT_EQ(lint_rc, 0) << lint_out;
  }
}

// A real Prometheus (Debian's) scrapes the local cluster through the
// targets file it writes, and answers a query for a Fulcrum metric.
TEST_F(ObservabilityTest, RealPrometheusScrapesTheClusterAndAnswersQueries) {
  if (!Installed("prometheus")) GTEST_SKIP() << "prometheus (Debian package prometheus) is not installed";
  const std::string dir = MakeTempDir();
  // A free port: bind port 0, read it, release it for Prometheus.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  close(fd);
  const std::string config = dir + "/prometheus.yml";
  std::ofstream(config) << "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                        << "rule_files: ['" << SourceDir() << "/deploy/prometheus/alerts.yml']\n"
                        << "scrape_configs:\n  - job_name: fulcrum\n    file_sd_configs:\n"
                        << "      - files: ['" << cluster_->dir() << "/prometheus-targets.json']\n"
                        << "        refresh_interval: 1s\n";
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto pid = SpawnProcess({"/usr/bin/prometheus", "--config.file=" + config, "--storage.tsdb.path=" + dir + "/data",
                           "--web.listen-address=" + address},
                          dir + "/prometheus.log");
  ASSERT_TRUE(pid.ok()) << pid.status();
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reaper{*pid};
  // Poll Prometheus's HTTP API until a scrape of every server is in (bounded).
  std::string answer;
  const std::string query = "/api/v1/query?query=fulcrum_scheduler_members%7Bmember_role%3D%22SERVER%22%7D";
  for (absl::Time deadline = absl::Now() + absl::Seconds(60); absl::Now() < deadline;) {
    answer = Body(HttpGet(address, query));
    if (answer.find("\"result\":[{") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(200));  // polling for Prometheus's first scrape
  }
  ASSERT_NE(answer.find("\"result\":[{"), std::string::npos)
      << "Prometheus never returned the metric; last answer: " << answer;
  EXPECT_NE(answer.find("\"member_role\":\"SERVER\""), std::string::npos) << answer;
  EXPECT_NE(answer.find("\"2\"]"), std::string::npos) << "expected 2 live servers: " << answer;
  // And it sees every target up, with the role labels of the targets file.
  auto all_roles = [](const std::string& text) {
    for (const char* role : {"scheduler", "server", "worker"}) {
      if (text.find(absl::StrCat("\"role\":\"", role, "\"")) == std::string::npos) return false;
    }
    return true;
  };
  std::string up;
  for (absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;) {
    up = Body(HttpGet(address, "/api/v1/query?query=sum%20by%20(role)%20(up)"));
    if (all_roles(up)) break;
    absl::SleepFor(absl::Milliseconds(200));  // polling until every target has been scraped once
  }
  EXPECT_TRUE(all_roles(up)) << up;

  // A sparse table's series name the Fulcrum job in `job_id`: a `job`
  // label would be renamed `exported_job` on scrape (Prometheus sets `job`
  // to the scrape job), and the dashboard's per-table panels would group
  // by the scrape job instead.
  const std::string click_id = StartClickJob();
  std::string rows;
  for (absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;) {
    rows = Body(
        HttpGet(address, "/api/v1/query?query=sum%20by%20(job_id%2C%20table)%20(fulcrum_server_table_rows)"));
    if (rows.find(absl::StrCat("\"job_id\":\"", click_id, "\"")) != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(200));  // polling for a scrape after the job's first push
  }
  const std::string raw = Body(HttpGet(address, "/api/v1/query?query=fulcrum_server_table_bytes"));
  Cancel(click_id);
  EXPECT_NE(rows.find(absl::StrCat("\"job_id\":\"", click_id, "\"")), std::string::npos) << rows;
  EXPECT_NE(rows.find("\"table\":\"embedding\""), std::string::npos) << rows;
  EXPECT_NE(raw.find(absl::StrCat("\"job_id\":\"", click_id, "\"")), std::string::npos) << raw;
  EXPECT_EQ(raw.find("exported_job"), std::string::npos) << raw;
  EXPECT_NE(raw.find("\"job\":\"fulcrum\""), std::string::npos) << "the scrape job's own label: " << raw;
}

}  // namespace
}  // namespace fulcrum
