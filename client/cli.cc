#include "client/cli.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/export.h"
#include "common/memory_budget.h"
#include "client/local_cluster.h"
#include "client/spec_file.h"
#include "common/process.h"
#include "common/quote.h"
#include "common/table_spec.h"
#include "common/rpc.h"
#include "common/rpc_security.h"
#include "fulcrum/v1/cluster.grpc.pb.h"
#include "fulcrum/v1/job.grpc.pb.h"
#include "google/protobuf/util/json_util.h"

namespace fulcrum {
namespace {

constexpr char kUsage[] = R"(fulcrum: submit and watch training jobs on a Fulcrum cluster.

Usage:
  fulcrum submit -f JOB.yaml [--wait] [--resume-from JOB[/CHECKPOINT]]
                                           submit a job (YAML or JSON JobSpec; - reads stdin),
                                           optionally starting from another job's checkpoint
  fulcrum get JOB                          show a job: state, progress, checkpoints, history
  fulcrum checkpoint JOB                   take a checkpoint of a training job now (waits for it)
  fulcrum export JOB [--checkpoint ID] -o FILE.safetensors
                                           write the model (now, or as checkpoint ID holds it)
  fulcrum list                             list jobs
  fulcrum watch JOB                        follow a job until it ends
  fulcrum cancel JOB                       cancel a pending or running job
  fulcrum cluster                          list the live servers and workers
  fulcrum local up [--servers N] [--workers M] [--replicas R (default min(2, N))] [--dir DIR] [--detach] [--device D] [--tls]
                   [--server-memory-budget SIZE] [--worker-memory-budget SIZE]
  fulcrum local add worker|server [--dir DIR] [--device D]
  fulcrum local restart ID [--dir DIR]   (a dead scheduler, server-N or worker-N, as before)
  fulcrum local down [--dir DIR]

Options:
  --scheduler HOST:PORT   the cluster (default $FULCRUM_SCHEDULER, else the
                          local cluster in --dir)
  -o json                 machine-readable output
  --dir DIR               local cluster folder (default $FULCRUM_LOCAL_DIR or ~/.fulcrum/local)
  --timeout SECONDS       give up on RPCs after this long (default 30)
  --device D              local workers' compute device: auto (default), cpu, cuda, cuda:N
  --tls                   local up: mTLS between all processes, a cluster credential and a
                          JobService token, from DIR/tls (made by scripts/dev-certs.sh)
  --token T               JobService bearer token (default $FULCRUM_TOKEN)
  --tls-cert F, --tls-key F, --tls-ca F
                          mTLS client identity (default $FULCRUM_TLS_CERT/_KEY/_CA)
  --cluster-token-file F  the cluster credential, for export (reads the servers)

`submit --wait` and `watch` exit 0 only when the job SUCCEEDED.
)";

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;
  std::set<std::string> flags;
  bool Has(const std::string& flag) const { return flags.count(flag) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = options.find(name);
    return it == options.end() ? fallback : it->second;
  }
};

const std::set<std::string> kValueOptions = {"-f",        "--file",    "-o",         "--output",     "--scheduler",
                                             "--servers", "--workers", "--replicas", "--dir",        "--timeout",
                                             "--device",  "--checkpoint", "--resume-from", "--token",
                                             "--tls-cert", "--tls-key",  "--tls-ca",  "--cluster-token-file",
                                             "--server-memory-budget", "--worker-memory-budget"};
const std::set<std::string> kFlagOptions = {"--wait", "--detach", "--tls", "-h", "--help"};

absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& raw) {
  Args args;
  for (size_t i = 0; i < raw.size(); ++i) {
    std::string arg = raw[i];
    std::string value;
    bool has_value = false;
    if (arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos) {
      value = arg.substr(arg.find('=') + 1);
      arg = arg.substr(0, arg.find('='));
      has_value = true;
    }
    if (kFlagOptions.count(arg)) {
      args.flags.insert(arg);
    } else if (kValueOptions.count(arg)) {
      if (!has_value) {
        if (i + 1 >= raw.size()) return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
        value = raw[++i];
      }
      if (arg == "--file") arg = "-f";
      if (arg == "--output") arg = "-o";
      args.options[arg] = value;
    } else if (arg.size() > 1 && arg[0] == '-' && arg != "-") {
      return absl::InvalidArgumentError(absl::StrCat("unknown option ", arg));
    } else {
      args.positional.push_back(raw[i]);
    }
  }
  std::string output = args.Get("-o", "text");
  const bool exporting = !args.positional.empty() && args.positional[0] == "export";  // -o names the file
  if (!exporting && output != "text" && output != "json") {
    return absl::InvalidArgumentError(absl::StrCat("-o must be json or text (got ", output, ")"));
  }
  return args;
}

std::string LocalDir(const Args& args) {
  if (!args.Get("--dir").empty()) return args.Get("--dir");
  if (const char* env = std::getenv("FULCRUM_LOCAL_DIR"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return absl::StrCat(home ? home : "/tmp", "/.fulcrum/local");
}

// The CLI's transport security: --tls-cert/--tls-key/--tls-ca (or
// $FULCRUM_TLS_CERT/_KEY/_CA), --token (or $FULCRUM_TOKEN) for JobService and
// --cluster-token-file for `export` (which reads the servers); a local
// cluster started with --tls provides all of them from DIR/tls.
absl::Status ConfigureClientSecurity(const Args& args) {
  auto pick = [&](const std::string& option, const char* env) {
    if (!args.Get(option).empty()) return args.Get(option);
    const char* value = std::getenv(env);
    return std::string(value != nullptr ? value : "");
  };
  RpcSecurityFiles files;
  files.tls_cert = pick("--tls-cert", "FULCRUM_TLS_CERT");
  files.tls_key = pick("--tls-key", "FULCRUM_TLS_KEY");
  files.tls_ca = pick("--tls-ca", "FULCRUM_TLS_CA");
  // Trimmed: a token read from a file or a Secret often ends in a newline.
  std::string token = std::string(absl::StripAsciiWhitespace(pick("--token", "FULCRUM_TOKEN")));
  std::string cluster_token_file = pick("--cluster-token-file", "FULCRUM_CLUSTER_TOKEN_FILE");
  const bool explicit_scheduler = !args.Get("--scheduler").empty() || std::getenv("FULCRUM_SCHEDULER") != nullptr;
  auto local = LocalCluster::Open(LocalDir(args));
  if (local.ok() && (*local)->file().tls() && (files.tls_cert.empty() || !explicit_scheduler)) {
    const std::string tls = (*local)->dir() + "/tls";
    if (files.tls_cert.empty()) {
      files.tls_cert = tls + "/node.crt";
      files.tls_key = tls + "/node.key";
      files.tls_ca = tls + "/ca.crt";
    }
    if (token.empty()) {
      std::ifstream in(tls + "/token");
      std::getline(in, token);
    }
    if (cluster_token_file.empty()) cluster_token_file = tls + "/cluster-token";
  }
  std::string cluster_token;
  if (!cluster_token_file.empty()) {
    std::ifstream in(cluster_token_file);
    if (!in) return absl::NotFoundError(absl::StrCat("--cluster-token-file: cannot read ", cluster_token_file));
    std::getline(in, cluster_token);
  }
  return ConfigureRpcSecurity(files, token, std::string(absl::StripAsciiWhitespace(cluster_token)));
}

absl::StatusOr<std::string> SchedulerAddress(const Args& args) {
  if (!args.Get("--scheduler").empty()) return args.Get("--scheduler");
  if (const char* env = std::getenv("FULCRUM_SCHEDULER"); env && *env) return std::string(env);
  auto local = LocalCluster::Open(LocalDir(args));
  if (local.ok() && !(*local)->scheduler_address().empty()) return (*local)->scheduler_address();
  return absl::FailedPreconditionError(
      "no scheduler: pass --scheduler HOST:PORT, set FULCRUM_SCHEDULER, or start one with `fulcrum local up`");
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) return "{}";
  return json;
}

int Fail(const absl::Status& status) {
  std::cerr << "fulcrum: " << Printable(status.message()) << " [" << absl::StatusCodeToString(status.code())
            << "]\n";
  return 1;
}

std::string ModelText(const v1::JobSpec& spec) {
  if (spec.model().kind() == v1::ModelSpec::SOFTMAX_REGRESSION) return "softmax regression";
  if (spec.model().kind() == v1::ModelSpec::GRAPH) {
    return absl::StrCat("layer graph of ", spec.model().layers_size(), " layers");
  }
  if (IsClickModel(spec)) {
    return absl::StrCat(v1::ModelSpec::Kind_Name(spec.model().kind()), ", embedding dim ", spec.model().embedding_dim());
  }
  std::vector<std::string> sizes;
  for (int h : spec.model().hidden_sizes()) sizes.push_back(absl::StrCat(h));
  return absl::StrCat("MLP hidden ", absl::StrJoin(sizes, "-"), " ",
                      v1::Activation_Name(spec.model().activation()));
}

std::string ProgressLine(const v1::JobStatus& job) {
  const v1::JobProgress& p = job.progress();
  std::string line = absl::StrFormat("%s %-9s epoch %d/%d  step %d/%d  loss %.4f  %.0f samples/s  %.1fs",
                                     job.job_id(), v1::JobState_Name(job.state()), p.epoch(), p.epochs(),
                                     p.step(), p.total_steps(), p.train_loss(), p.samples_per_second(),
                                     p.elapsed_seconds());
  if (p.test_accuracy() >= 0) absl::StrAppendFormat(&line, "  test acc %.4f", p.test_accuracy());
  // A binary task's test log-loss beside its AUC; a regression's one figure.
  if ((p.test_accuracy() < 0 || p.has_test_auc()) && p.has_test_loss()) {
    absl::StrAppendFormat(&line, "  test %s %.4f", p.has_test_auc() ? "log-loss" : "loss", p.test_loss());
  }
  if (p.has_test_auc()) absl::StrAppendFormat(&line, "  test AUC %.4f", p.test_auc());
  return line;
}

// A click job's sparse tables: their names, widths, bucket counts and, in a
// BSP job, whether they are synchronous (the rows live on the servers:
// fulcrum_server_table_rows).
std::string TablesText(const v1::JobStatus& job) {
  std::string text;
  const bool bsp = job.spec().mode() == v1::BSP;
  for (const v1::TableLayout& table : job.shard_map().tables()) {
    bool async = false;
    for (const v1::TableSpec& named : job.spec().model().tables()) {
      async |= named.name() == table.name() && named.consistency() == v1::TableSpec::ASYNC;
    }
    absl::StrAppend(&text, text.empty() ? " + sparse tables " : ", ", Printable(table.name()), " (", table.dim(),
                    table.dim() == 1 ? " float a row, " : " floats a row, ", table.buckets(),
                    table.buckets() == 1 ? " bucket" : " buckets",
                    bsp ? (async ? ", asynchronous" : ", synchronous") : "", ")");
  }
  return text;
}

void PrintJob(const v1::JobStatus& job) {
  const v1::JobSpec& spec = job.spec();
  std::cout << "Job:        " << job.job_id() << (spec.name().empty() ? "" : " (" + Printable(spec.name()) + ")") << "\n"
            << "State:      " << v1::JobState_Name(job.state()) << " - " << Printable(job.reason()) << "\n"
            << "Progress:   " << ProgressLine(job).substr(job.job_id().size() + 1) << "\n"
            << "Model:      " << ModelText(spec) << ", " << job.num_parameters()
            << (job.shard_map().tables_size() > 0 ? " dense parameters" : " parameters") << TablesText(job) << "\n"
            << "Training:   " << v1::Mode_Name(spec.mode()) << ", " << spec.num_workers() << " workers x batch "
            << spec.data().batch_size()
            << (spec.data().gradient_accumulation() > 1
                    ? absl::StrCat(" x ", spec.data().gradient_accumulation(), " micro-batches")
                    : std::string())
            << (spec.local_sgd().steps() > 1
                    ? absl::StrCat(" x ", spec.local_sgd().steps(), " local SGD steps (lr ", spec.local_sgd().lr(), ")")
                    : std::string())
            << ", " << v1::OptimizerSpec::Kind_Name(spec.optimizer().kind())
            << " lr " << spec.optimizer().lr() << ", "
            << v1::LrScheduleSpec::Kind_Name(spec.lr_schedule().kind()) << " schedule, precision "
            << v1::Precision_Name(spec.precision()) << ", wire " << v1::WireFormat_Name(spec.wire_format());
  if (spec.compression().kind() == v1::CompressionSpec::TOPK) {
    std::cout << ", pushes top-k " << spec.compression().topk_ratio();
  } else if (spec.compression().kind() == v1::CompressionSpec::INT8) {
    std::cout << ", pushes int8";
  }
  std::cout << "\n";
  if (job.parameters_released_unix_ms() > 0) {
    std::cout << "Parameters: released by the servers at "
              << absl::FormatTime("%Y-%m-%d %H:%M:%S UTC",
                                  absl::FromUnixMillis(job.parameters_released_unix_ms()),
                                  absl::UTCTimeZone())
              << " (retention, or a server restarted without them: see Events); its checkpoints remain\n";
  } else if (job.state() == v1::SUCCEEDED) {
    std::cout << "Parameters: kept on the servers (fulcrum export " << job.job_id() << " -o FILE)\n";
  } else if (job.state() == v1::CANCELLED || job.state() == v1::FAILED) {
    std::cout
        << "Parameters: dropped by the servers when the job ended (only a job that succeeded keeps them); "
           "its checkpoints remain (fulcrum export "
        << job.job_id() << " --checkpoint ID -o FILE)\n";
  }
  std::cout << "Membership: epoch " << job.membership_epoch() << ", " << job.workers_size() << " workers (min "
            << spec.min_workers() << ", max " << spec.max_workers() << "), " << spec.max_workers()
            << " data partitions\n";
  int stragglers = 0;
  for (const auto& w : job.workers()) stragglers += w.straggler() ? 1 : 0;
  std::cout << absl::StrFormat("Throughput: %.0f samples/s over %d workers%s\n", job.progress().samples_per_second(),
                               job.workers_size(),
                               stragglers > 0 ? absl::StrCat(", ", stragglers, " straggler(s)") : "");
  for (const auto& w : job.workers()) {
    std::cout << absl::StrFormat("  %-12s rank %-3d %-8s partitions {%s}  %.1f ms/step  %.0f samples/s%s\n",
                                 w.worker_id(), w.rank(), w.ready() ? "training" : "loading",
                                 absl::StrJoin(w.partitions(), ","), w.step_seconds() * 1e3, w.samples_per_second(),
                                 w.straggler() ? "  STRAGGLER" : "");
  }
  std::cout << "Shards:\n";
  for (const auto& s : job.shards()) {
    std::cout << absl::StrFormat("  shard %-3d %-10s %-21s %4d chunks %10d elements", s.shard(), s.server_id(),
                                 s.address(), s.chunks(), s.elements());
    if (s.backup_ids_size() > 0) std::cout << "  backups " << absl::StrJoin(s.backup_ids(), ",");
    std::cout << "\n";
  }
  if (!job.resumed_from().empty()) std::cout << "Resumed:    from checkpoint " << job.resumed_from() << "\n";
  if (job.checkpoints_size() > 0) {
    std::cout << "Checkpoints:\n"
              << absl::StrFormat("  %4s %-9s %8s %-8s %12s %10s %6s %8s %-13s %s\n", "ID", "STATE", "STEP",
                                 "TIME", "BYTES", "IN_MEMORY", "BASE", "SECONDS", "TRIGGER", "REASON");
  }
  for (const auto& c : job.checkpoints()) {
    // IN_MEMORY: what one copy took on the servers when taken (its restore
    // is placed by it). BASE: the checkpoint whose tables it stores the
    // changes of ("-": whole).
    std::cout << absl::StrFormat(
        "  %4d %-9s %8d %-8s %12d %10s %6s %8.2f %-13s %s\n", c.id(),
        v1::CheckpointInfo::State_Name(c.state()), c.step(),
        absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(c.time_unix_ms()), absl::LocalTimeZone()),
        c.bytes(), c.server_bytes() > 0 ? FormatBytes(c.server_bytes()) : "-",
        c.base_id() > 0 ? absl::StrCat(c.base_id()) : "-", c.duration_seconds(), c.trigger(),
        Printable(c.reason()));
  }
  if (job.events_size() > 0) std::cout << "Events:\n";
  for (const auto& e : job.events()) {
    std::cout << absl::StrFormat("  %s  epoch %-4d %s\n",
                                 absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(e.time_unix_ms()),
                                                  absl::LocalTimeZone()),
                                 e.membership_epoch(), Printable(e.message()));
  }
  // Click models' evaluations have an AUC: a column of its own then. Points
  // are in the order they came (an asynchronous job's evaluation may come
  // after a progress point of a later step).
  const bool auc = std::any_of(job.history().begin(), job.history().end(),
                               [](const v1::MetricPoint& h) { return h.has_test_auc(); });
  std::cout << "History:\n"
            << absl::StrFormat("  %5s %8s %10s %9s %10s%s %12s %9s\n", "EPOCH", "STEP", "LOSS", "TEST_ACC",
                               "TEST_LOSS", auc ? absl::StrFormat(" %9s", "TEST_AUC") : "", "SAMPLES/S",
                               "ELAPSED");
  for (const auto& h : job.history()) {
    const std::string auc_column =
        !auc ? "" : absl::StrFormat(" %9s", h.has_test_auc() ? absl::StrFormat("%.4f", h.test_auc()) : "-");
    std::cout << absl::StrFormat(
        "  %5d %8d %10s %9s %10s%s %12.0f %8.1fs\n", h.epoch(), h.step(),
        h.train_loss() >= 0 ? absl::StrFormat("%.4f", h.train_loss()) : "-",
        h.test_accuracy() >= 0 ? absl::StrFormat("%.4f", h.test_accuracy()) : "-",
        h.evaluation() || h.test_accuracy() >= 0 ? absl::StrFormat("%.4f", h.test_loss()) : "-", auc_column,
        h.samples_per_second(), h.elapsed_seconds());
  }
  const v1::LossCurve& curve = job.loss_curve();
  if (curve.loss_size() > 0) {
    // Ten evenly spaced points of the per-step curve; -o json gives all.
    std::cout << absl::StrFormat("Loss curve: %d steps, %d a point (every point: -o json, lossCurve)\n",
                                 curve.steps(), curve.steps_per_point());
    const int n = curve.loss_size();
    std::string line = " ";
    for (int k = 0; k < std::min(n, 10); ++k) {
      const int i = n <= 10 ? k : static_cast<int>(static_cast<int64_t>(k) * (n - 1) / 9);
      absl::StrAppendFormat(&line, " step %d: %.4f;", static_cast<int64_t>(i) * curve.steps_per_point(),
                            curve.loss(i));
    }
    line.pop_back();
    std::cout << line << "\n";
  }
}

bool Terminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

class Client {
 public:
  Client(const std::string& address, double timeout)
      : address_(address),
        timeout_(timeout),
        jobs_(v1::JobService::NewStub(MakeChannel(address))),
        cluster_(v1::ClusterService::NewStub(MakeChannel(address))) {}

  template <typename Call>
  absl::Status Run(Call call) {
    grpc::ClientContext context;
    SetDeadline(&context, timeout_);
    grpc::Status status = call(&context);
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return absl::UnavailableError(absl::StrCat("scheduler ", address_, " unreachable: ", status.error_message()));
    }
    return FromGrpcStatus(status);
  }

  // Follows the job until it ends; returns its last status.
  absl::StatusOr<v1::JobStatus> Follow(const std::string& job_id, bool json) {
    const bool tty = isatty(STDOUT_FILENO) && !json;
    v1::JobStatus last;
    absl::Time last_print;
    for (int attempt = 0; attempt < 20; ++attempt) {
      grpc::ClientContext context;
      v1::WatchJobRequest request;
      request.set_job_id(job_id);
      auto reader = jobs_->WatchJob(&context, request);
      v1::JobStatus status;
      while (reader->Read(&status)) {
        last = status;
        if (json) continue;
        if (tty) {
          std::cout << "\r\033[K" << ProgressLine(status) << std::flush;
        } else if (absl::Now() - last_print > absl::Seconds(1) || Terminal(status.state())) {
          std::cout << ProgressLine(status) << std::endl;
          last_print = absl::Now();
        }
      }
      grpc::Status finished = reader->Finish();
      if (Terminal(last.state())) break;
      if (!finished.ok() && finished.error_code() != grpc::StatusCode::UNAVAILABLE) {
        return FromGrpcStatus(finished);
      }
      absl::SleepFor(absl::Seconds(1));  // the stream broke (scheduler restart?): follow again
    }
    if (tty) std::cout << "\n";
    if (json) std::cout << ToJson(last) << "\n";
    return last;
  }

  v1::JobService::Stub* jobs() { return jobs_.get(); }
  const std::string& address() const { return address_; }
  double timeout() const { return timeout_; }
  v1::ClusterService::Stub* cluster() { return cluster_.get(); }

 private:
  std::string address_;
  double timeout_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::ClusterService::Stub> cluster_;
};

int FinalVerdict(const v1::JobStatus& job) {
  if (job.state() == v1::SUCCEEDED) {
    std::cerr << "job " << job.job_id() << " SUCCEEDED: " << Printable(job.reason()) << "\n";
    return 0;
  }
  std::cerr << "job " << job.job_id() << " " << v1::JobState_Name(job.state()) << ": " << Printable(job.reason()) << "\n";
  return 1;
}

int Submit(Client& client, const Args& args, bool json) {
  if (args.Get("-f").empty()) return Fail(absl::InvalidArgumentError("submit needs -f JOB.yaml"));
  auto spec = ReadJobSpecFile(args.Get("-f"));
  if (!spec.ok()) return Fail(spec.status());
  v1::SubmitJobRequest request;
  *request.mutable_spec() = *spec;
  request.set_resume_from(args.Get("--resume-from"));
  v1::SubmitJobResponse response;
  absl::Status status = client.Run([&](grpc::ClientContext* c) { return client.jobs()->SubmitJob(c, request, &response); });
  if (!status.ok()) return Fail(status);
  if (!args.Has("--wait")) {
    if (json) {
      std::cout << ToJson(response.status()) << "\n";
    } else {
      std::cout << response.job_id() << "\n";
    }
    return 0;
  }
  if (!json) std::cout << "submitted " << response.job_id() << "\n";
  auto last = client.Follow(response.job_id(), json);
  if (!last.ok()) return Fail(last.status());
  return FinalVerdict(*last);
}

int JobCall(Client& client, const Args& args, const std::string& verb, bool json) {
  if (args.positional.size() != 2) return Fail(absl::InvalidArgumentError(absl::StrCat(verb, " needs a JOB id")));
  const std::string& job_id = args.positional[1];
  if (verb == "watch") {
    auto last = client.Follow(job_id, json);
    if (!last.ok()) return Fail(last.status());
    return FinalVerdict(*last);
  }
  v1::JobStatus job;
  absl::Status status;
  if (verb == "get") {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    status = client.Run([&](grpc::ClientContext* c) { return client.jobs()->GetJob(c, request, &job); });
  } else {
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    status = client.Run([&](grpc::ClientContext* c) { return client.jobs()->CancelJob(c, request, &job); });
  }
  if (!status.ok()) return Fail(status);
  if (json) {
    std::cout << ToJson(job) << "\n";
  } else if (verb == "get") {
    PrintJob(job);
  } else {
    std::cout << job.job_id() << " " << v1::JobState_Name(job.state()) << ": " << Printable(job.reason()) << "\n";
  }
  return 0;
}

int Checkpoint(Client& client, const Args& args, bool json) {
  if (args.positional.size() != 2) return Fail(absl::InvalidArgumentError("checkpoint needs a JOB id"));
  v1::CheckpointJobRequest request;
  request.set_job_id(args.positional[1]);
  v1::CheckpointInfo info;
  // Waits for the write: at least ten minutes unless --timeout says more.
  Client patient(client.address(), std::max(client.timeout(), 600.0));
  absl::Status status =
      patient.Run([&](grpc::ClientContext* c) { return patient.jobs()->CheckpointJob(c, request, &info); });
  if (!status.ok()) return Fail(status);
  if (json) {
    std::cout << ToJson(info) << "\n";
  } else {
    std::cout << absl::StrFormat("checkpoint %d of %s: %s at step %d, %d bytes, %.2f s%s\n", info.id(),
                                 args.positional[1], v1::CheckpointInfo::State_Name(info.state()), info.step(),
                                 info.bytes(), info.duration_seconds(),
                                 info.reason().empty() ? "" : absl::StrCat(" (", Printable(info.reason()), ")"));
  }
  return info.state() == v1::CheckpointInfo::COMPLETE ? 0 : 1;
}

int Export(Client& client, const Args& args) {
  if (args.positional.size() != 2) return Fail(absl::InvalidArgumentError("export needs a JOB id"));
  const std::string path = args.Get("-o");
  if (path.empty()) return Fail(absl::InvalidArgumentError("export needs -o FILE.safetensors"));
  int64_t checkpoint_id = 0;
  if (!args.Get("--checkpoint").empty() &&
      (!absl::SimpleAtoi(args.Get("--checkpoint"), &checkpoint_id) || checkpoint_id <= 0)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--checkpoint must be a checkpoint id (a positive number), got ", args.Get("--checkpoint"))));
  }
  // Before the gather, which may take a while: the same check as the write.
  if (absl::Status replaceable = CheckReplaceable(path); !replaceable.ok()) return Fail(replaceable);
  const std::string& job_id = args.positional[1];
  auto gathered = GatherParameters(client.address(), job_id, checkpoint_id, client.timeout());
  if (!gathered.ok()) return Fail(gathered.status());
  std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"fulcrum.job", job_id}, {"fulcrum.step", absl::StrCat(gathered->step)}};
  if (checkpoint_id > 0) metadata["fulcrum.checkpoint"] = absl::StrCat(checkpoint_id);
  std::vector<SafetensorsTensor> tensors = gathered->tensors;
  tensors.insert(tensors.end(), gathered->tables.begin(), gathered->tables.end());
  absl::Status written = WriteSafetensorsFile(path, tensors, metadata);
  if (!written.ok()) return Fail(written);
  int64_t elements = 0;
  for (const auto& t : gathered->tensors) elements += static_cast<int64_t>(t.data.size());
  std::cout << "wrote " << path << ": " << gathered->tensors.size() << " tensors, " << elements
            << " float32 values, ";
  for (size_t t = 0; t + 1 < gathered->tables.size(); t += 2) {
    const SafetensorsTensor& rows = gathered->tables[t + 1];
    std::cout << "table " << rows.name.substr(6, rows.name.size() - 11) << " (" << rows.shape[0] << " rows of "
              << rows.shape[1] << "), ";
  }
  std::cout << (checkpoint_id > 0 ? absl::StrCat("checkpoint ", checkpoint_id, ", ") : "") << "step "
            << gathered->step << "\n";
  return 0;
}

// Every job's summary: the pages of ListJobs, one after another.
absl::Status ListAllJobs(Client& client, v1::ListJobsResponse* all) {
  v1::ListJobsRequest request;
  do {
    v1::ListJobsResponse page;
    absl::Status status =
        client.Run([&](grpc::ClientContext* c) { return client.jobs()->ListJobs(c, request, &page); });
    if (!status.ok()) return status;
    // A token that does not move on (a scheduler gone wrong) ends the list.
    if (!page.next_page_token().empty() && page.next_page_token() <= request.page_token()) {
      return absl::InternalError(absl::StrCat("ListJobs: page token ", Quote(page.next_page_token(), 64),
                                              " does not follow ", Quote(request.page_token(), 64)));
    }
    for (v1::JobStatus& job : *page.mutable_jobs()) *all->add_jobs() = std::move(job);
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return absl::OkStatus();
}

int List(Client& client, bool json) {
  v1::ListJobsResponse response;
  absl::Status status = ListAllJobs(client, &response);
  if (!status.ok()) return Fail(status);
  if (json) {
    std::cout << ToJson(response) << "\n";
    return 0;
  }
  std::cout << absl::StrFormat("%-10s %-24s %-10s %-15s %-9s %s\n", "JOB", "NAME", "STATE", "STEP", "TEST_ACC", "REASON");
  for (const auto& job : response.jobs()) {
    const auto& p = job.progress();
    // A name is any UTF-8: its column is cut and padded by terminal cells.
    std::cout << absl::StrFormat(
        "%-10s %s %-10s %-15s %-9s %s\n", Printable(job.job_id()), Column(Printable(job.spec().name()), 24),
        v1::JobState_Name(job.state()), absl::StrCat(p.step(), "/", p.total_steps()),
        p.test_accuracy() >= 0 ? absl::StrFormat("%.4f", p.test_accuracy()) : "-", Printable(job.reason()));
  }
  return 0;
}

int Cluster(Client& client, bool json) {
  v1::ListMembersRequest request;
  v1::ListMembersResponse response;
  absl::Status status =
      client.Run([&](grpc::ClientContext* c) { return client.cluster()->ListMembers(c, request, &response); });
  if (!status.ok()) return Fail(status);
  if (json) {
    std::cout << ToJson(response) << "\n";
    return 0;
  }
  std::cout << absl::StrFormat("%-12s %-7s %-22s %-22s %-8s %-10s %-21s %s\n", "MEMBER", "ROLE", "GRPC",
                               "METRICS", "DEVICE", "JOB", "MEMORY", "HEALTH");
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  for (const auto& m : response.members()) {
    std::string health = absl::StrFormat("heartbeat %.1fs ago", (now_ms - m.last_heartbeat_unix_ms()) / 1000.0);
    if (m.draining()) absl::StrAppend(&health, ", draining");
    // Servers: what the jobs on it claim (each its estimate, or what the
    // server holds of it when more) of the budget; workers: the budget.
    std::string memory = m.memory_budget_bytes() > 0 ? FormatBytes(m.memory_budget_bytes()) : "-";
    if (m.role() == v1::SERVER) memory = absl::StrCat(FormatBytes(m.memory_claimed_bytes()), "/", memory);
    std::cout << absl::StrFormat("%-12s %-7s %-22s %-22s %-8s %-10s %-21s %s\n", m.member_id(),
                                 v1::Role_Name(m.role()), m.address().empty() ? "-" : m.address(),
                                 m.metrics_address(), m.device().empty() ? "-" : m.device(),
                                 m.job_id().empty() ? "-" : m.job_id(), memory, health);
  }
  // The shards of running jobs: primaries, backups, epochs.
  v1::ListJobsResponse jobs;
  absl::Status listed = ListAllJobs(client, &jobs);
  if (!listed.ok()) return Fail(listed);
  for (const auto& job : jobs.jobs()) {
    if (job.state() != v1::RUNNING || job.shards_size() == 0) continue;
    std::cout << absl::StrFormat("\n%s: membership epoch %d, shard map version %d, %d failovers, %d workers\n",
                                 job.job_id(), job.membership_epoch(), job.shard_map().version(), job.failovers(),
                                 job.workers_size());
    for (const auto& s : job.shards()) {
      std::cout << absl::StrFormat("  shard %-3d primary %-10s backups %-20s %4d chunks\n", s.shard(),
                                   s.server_id().empty() ? "-" : s.server_id(),
                                   s.backup_ids().empty() ? "-" : absl::StrJoin(s.backup_ids(), ","), s.chunks());
    }
  }
  return 0;
}

void PrintProcesses(const v1::LocalClusterFile& file) {
  std::cout << absl::StrFormat("%-10s %-10s %-8s %-22s %s\n", "ROLE", "ID", "PID", "GRPC", "METRICS");
  for (const auto& p : file.processes()) {
    std::cout << absl::StrFormat("%-10s %-10s %-8d %-22s %s\n", p.role(), p.id(), p.pid(),
                                 p.grpc_address().empty() ? "-" : p.grpc_address(), p.metrics_address());
  }
}

absl::StatusOr<int> IntOption(const Args& args, const std::string& name, int fallback) {
  std::string text = args.Get(name);
  if (text.empty()) return fallback;
  char* end = nullptr;
  long value = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || value < 0 || value > 256) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be an integer in [0, 256] (got ", text, ")"));
  }
  return static_cast<int>(value);
}

int LocalUp(const Args& args, bool json) {
  LocalCluster::Options options;
  options.dir = LocalDir(args);
  auto servers = IntOption(args, "--servers", 2);
  auto workers = IntOption(args, "--workers", 2);
  // Two replicas per shard once there are two servers: a local cluster
  // survives losing a server unless told otherwise.
  auto replicas = IntOption(args, "--replicas", servers.ok() ? std::min(2, std::max(1, *servers)) : 1);
  for (const auto* v : {&servers, &workers, &replicas}) {
    if (!v->ok()) return Fail(v->status());
  }
  options.servers = *servers;
  options.workers = *workers;
  options.replicas = *replicas;
  options.tls = args.Has("--tls");
  if (!args.Get("--device").empty()) options.worker_flags.push_back("--device=" + args.Get("--device"));
  for (const auto& [option, flags] : {std::pair{"--server-memory-budget", &options.server_flags},
                                       std::pair{"--worker-memory-budget", &options.worker_flags}}) {
    const std::string& budget = args.Get(option);
    if (budget.empty()) continue;
    if (absl::StatusOr<int64_t> bytes = ParseBytes(budget); !bytes.ok() || *bytes <= 0) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat(option, " must be a size such as 512MiB or 2GiB, got ", budget)));
    }
    flags->push_back("--memory_budget=" + budget);
  }
  const bool detach = args.Has("--detach");
  if (!detach) BlockTerminationSignals();  // before any thread: Ctrl-C is handled below
  auto cluster = LocalCluster::Start(options);
  if (!cluster.ok()) return Fail(cluster.status());
  if (json) {
    std::cout << ToJson((*cluster)->file()) << "\n";
  } else {
    PrintProcesses((*cluster)->file());
    std::cout << "\nlocal cluster up in " << (*cluster)->dir() << "; scheduler at " << (*cluster)->scheduler_address()
              << "\n  export FULCRUM_SCHEDULER=" << (*cluster)->scheduler_address() << "\n";
  }
  if (detach) {
    (*cluster)->Release();
    if (!json) std::cout << "  stop it with: fulcrum local down --dir " << (*cluster)->dir() << "\n";
    return 0;
  }
  std::cout << "press Ctrl-C to stop it" << std::endl;
  WaitForShutdown();
  std::cout << "\nstopping the local cluster..." << std::endl;
  absl::Status status = (*cluster)->Down();
  return status.ok() ? 0 : Fail(status);
}

int Local(const Args& args, bool json) {
  if (args.positional.size() < 2)
    return Fail(absl::InvalidArgumentError("local needs up, add, restart or down"));
  const std::string& verb = args.positional[1];
  if (verb == "up") return LocalUp(args, json);
  auto cluster = LocalCluster::Open(LocalDir(args));
  if (!cluster.ok()) return Fail(cluster.status());
  if (verb == "down") {
    absl::Status status = (*cluster)->Down();
    if (!status.ok()) return Fail(status);
    std::cout << "local cluster in " << (*cluster)->dir() << " stopped\n";
    return 0;
  }
  if (verb == "add") {
    std::string role = args.positional.size() > 2 ? args.positional[2] : "";
    if (role != "worker" && role != "server") {
      return Fail(absl::InvalidArgumentError("local add needs worker or server"));
    }
    std::vector<std::string> flags;
    if (!args.Get("--device").empty()) flags.push_back("--device=" + args.Get("--device"));
    auto process = role == "worker" ? (*cluster)->AddWorker(flags) : (*cluster)->AddServer();
    (*cluster)->Release();
    if (!process.ok()) return Fail(process.status());
    if (json) {
      std::cout << ToJson(*process) << "\n";
    } else {
      std::cout << "started " << process->role() << " " << process->id() << " (pid " << process->pid() << ")\n";
    }
    return 0;
  }
  if (verb == "restart") {
    // A process that died or was killed, started again as a restarted pod
    // would be: under its id, with its flags, a server on its state folder,
    // the scheduler on its port (a hand-started copy of its recorded command
    // line would bind a new port, which no member knows).
    const std::string id = args.positional.size() > 2 ? args.positional[2] : "";
    if (id.empty())
      return Fail(absl::InvalidArgumentError(
          "local restart needs the id of a process (scheduler, server-N, worker-N)"));
    auto process = id == "scheduler" ? (*cluster)->RestartScheduler() : (*cluster)->RestartMember(id);
    (*cluster)->Release();
    if (!process.ok()) return Fail(process.status());
    if (json) {
      std::cout << ToJson(*process) << "\n";
    } else {
      std::cout << "restarted " << process->role() << " " << process->id() << " (pid " << process->pid()
                << ")\n";
    }
    return 0;
  }
  return Fail(
      absl::InvalidArgumentError(absl::StrCat("unknown local verb ", verb, " (up, add, restart, down)")));
}

}  // namespace

int RunCli(const std::vector<std::string>& raw) {
  auto args = ParseArgs(raw);
  if (!args.ok()) {
    std::cerr << "fulcrum: " << args.status().message() << "\n\n" << kUsage;
    return 2;
  }
  if (args->Has("-h") || args->Has("--help") || args->positional.empty() || args->positional[0] == "help") {
    std::cout << kUsage;
    return args->positional.empty() && !args->Has("-h") && !args->Has("--help") ? 2 : 0;
  }
  const std::string verb = args->positional[0];
  const bool json = args->Get("-o") == "json";
  if (verb == "local") return Local(*args, json);
  static const std::set<std::string> kVerbs = {"submit", "get",     "list",      "watch",
                                               "cancel", "cluster", "checkpoint", "export"};
  if (!kVerbs.count(verb)) {
    std::cerr << "fulcrum: unknown command \"" << verb << "\"\n\n" << kUsage;
    return 2;
  }
  auto address = SchedulerAddress(*args);
  if (!address.ok()) return Fail(address.status());
  if (absl::Status security = ConfigureClientSecurity(*args); !security.ok()) return Fail(security);
  double timeout = std::atof(args->Get("--timeout", "30").c_str());
  if (timeout <= 0) return Fail(absl::InvalidArgumentError("--timeout must be a positive number of seconds"));
  Client client(*address, timeout);
  if (verb == "submit") return Submit(client, *args, json);
  if (verb == "list") return List(client, json);
  if (verb == "cluster") return Cluster(client, json);
  if (verb == "checkpoint") return Checkpoint(client, *args, json);
  if (verb == "export") return Export(client, *args);
  return JobCall(client, *args, verb, json);
}

}  // namespace fulcrum
