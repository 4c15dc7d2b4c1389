// fulcrum-failover-bench: what losing a parameter server costs a running BSP
// job, measured on a local cluster of real processes on loopback (the
// LocalCluster behind `fulcrum local up`, every port picked by the kernel).
//
// 1. Stall after a primary kill, at the scheduler's default lease: 3 servers,
//    2 workers, 2 replicas, a synthetic job with one replica group. Mid-job
//    the shard's primary is SIGKILLed; the stall is the wall time from the
//    kill to the first step applied after it (a Pull on the new shard map for
//    one version past the highest seen before the kill). Repeated --runs
//    times, a server added back after each kill; min / median / max.
// 2. Acknowledged updates lost: every disturbed job must end bit-identical to
//    one undisturbed run of the same spec, and every chunk's example audit
//    (ChunkState.examples_seen / examples_digest on its primary) must equal
//    every example of every epoch used exactly once.
// 3. Throughput cost of 2 replicas: a larger MLP (a step of a few ms) on 2
//    servers and 2 workers, jobs with replicas 1 and 2 alternated on the same
//    cluster; steps/s of each and the ratio.
//
// Each figure is logged as it is measured; the three are printed as a
// markdown table at the end. Every process started is killed on exit, also on
// SIGINT / SIGTERM. Exit code 1 when a figure could not be measured or an
// update was lost.
//
//   fulcrum-failover-bench [--quick] [--runs N] [--throughput-runs N]
//                          [--throughput-steps N] [--keep-logs]
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "client/local_cluster.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "fulcrum/v1/job.grpc.pb.h"
#include "fulcrum/v1/parameter.grpc.pb.h"
#include "worker/example_audit.h"
#include "worker/parameter_client.h"
#include "common/half.h"

ABSL_FLAG(bool, quick, false,
          "Short jobs and one repeat of each figure (a smoke test; the figures are rough)");
ABSL_FLAG(int, runs, 0, "Primary kills for the stall figure (0: 3, or 1 with --quick)");
ABSL_FLAG(int, throughput_runs, 0,
          "Jobs per replica count for the throughput figure (0: 2, or 1 with --quick)");
ABSL_FLAG(int64_t, throughput_steps, 0, "Steps of each throughput job (0: 1000, or 150 with --quick)");
ABSL_FLAG(bool, keep_logs, false,
          "Keep the clusters' folder (process logs) even when every figure was measured");

namespace fulcrum {
namespace {

// The failover job: tests/integration_test.cc's SyntheticSpec with batch 2, so
// that steps are short and many (a fine clock for "the first step after").
constexpr int64_t kFailoverExamples = 4096;
constexpr int kFailoverBatch = 2;
constexpr int kWorkers = 2;
// The scheduler is polled at most this often.
constexpr absl::Duration kPollInterval = absl::Milliseconds(20);
// Longest wait from a kill to the first step after it before giving up.
constexpr absl::Duration kStallLimit = absl::Seconds(120);
constexpr absl::Duration kJobLimit = absl::Minutes(15);

using bench::Log;
using bench::Mean;
using bench::Median;
using bench::StepsPerSecond;
using bench::Terminal;
using Audit = ExampleAudit;
using Cluster = bench::BenchCluster;

// ---------------------------------------------------------------------------
// The clusters.
// ---------------------------------------------------------------------------

// `servers` servers and kWorkers workers; scheduler flags otherwise default:
// the default lease.
absl::StatusOr<std::unique_ptr<Cluster>> StartCluster(const std::string& dir, int servers, int replicas) {
  LocalCluster::Options options;
  options.dir = dir;
  options.servers = servers;
  options.workers = kWorkers;
  options.replicas = replicas;
  return Cluster::Start(options, kJobLimit);
}

// The --lease-ms default of the fulcrum-scheduler next to this program, read
// from its --help (scheduler/main.cc); -1 if it cannot be read.
int64_t SchedulerDefaultLeaseMs() {
  std::string command = absl::StrCat(DefaultBinDir(), "/fulcrum-scheduler --help 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  pclose(pipe);
  size_t flag = out.find("--lease_ms");
  if (flag == std::string::npos) return -1;
  size_t value = out.find("default: ", flag);
  if (value == std::string::npos) return -1;
  return std::strtoll(out.c_str() + value + 9, nullptr, 10);
}

// ---------------------------------------------------------------------------
// Job specs and what is read from a finished job.
// ---------------------------------------------------------------------------

// A deterministic BSP job with one replica group (a primary and a backup);
// full epochs (no max_steps), so that the example audit is exact.
v1::JobSpec FailoverSpec(int epochs, int64_t max_steps = 0) {
  v1::JobSpec spec;
  spec.set_name("failover-bench");
  spec.mutable_model()->set_kind(v1::ModelSpec::MLP);
  spec.mutable_model()->add_hidden_sizes(16);
  spec.mutable_model()->set_activation(v1::TANH);
  v1::DataSpec* data = spec.mutable_data();
  data->set_dataset(v1::DataSpec::SYNTHETIC);
  data->set_synthetic_examples(kFailoverExamples);
  data->set_synthetic_features(20);
  data->set_synthetic_classes(4);
  data->set_batch_size(kFailoverBatch);
  data->set_epochs(epochs);
  data->set_shuffle_seed(7);
  data->set_max_steps(max_steps);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_lr(0.1f);
  spec.mutable_optimizer()->set_momentum(0.9f);
  spec.set_mode(v1::BSP);
  spec.set_num_workers(kWorkers);
  spec.set_num_shards(1);
  spec.set_replicas(2);
  spec.set_seed(3);
  return spec;
}

// A step of a few ms: 784 -> 256 -> 10 on batches of 64, one shard per server.
v1::JobSpec ThroughputSpec(int replicas, int64_t steps) {
  v1::JobSpec spec =
      bench::SyntheticMlpSpec(absl::StrCat("throughput-r", replicas), {256}, 16384, 0.05f, steps, kWorkers);
  spec.set_replicas(replicas);
  return spec;
}

absl::StatusOr<std::vector<float>> FinalParameters(const v1::JobStatus& done) {
  ParameterClient client(done.shard_map(), done.job_id(), "failover-bench");
  auto params = client.MakeBuffers();
  RETURN_IF_ERROR(client.Pull(0, absl::Seconds(10), &params));
  std::vector<float> flat;
  for (const auto& t : params) flat.insert(flat.end(), t.begin(), t.end());
  return flat;
}

// "" when `a` and `b` are bit-identical, else how they differ.
std::string Difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return absl::StrCat(a.size(), " vs ", b.size(), " values");
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (FloatBits(a[i]) != FloatBits(b[i]) && differ++ == 0) first = i;
  }
  if (differ == 0) return "";
  return absl::StrCat(differ, " of ", a.size(), " values differ, first at ", first, " (", a[first], " vs ",
                      b[first], ")");
}

// OK when every chunk's primary holds exactly the `expected` example audit;
// DATA_LOSS naming the first chunk that does not.
absl::Status CheckAudit(const v1::JobStatus& done, const Audit& expected) {
  ASSIGN_OR_RETURN(std::vector<ChunkAudit> audits, ReadChunkAudits(done));
  for (const ChunkAudit& chunk : audits) {
    if (chunk.audit.examples != expected.examples || chunk.audit.digest != expected.digest) {
      return absl::DataLossError(absl::StrCat(
          "chunk ", chunk.chunk_id, " at ", chunk.address, " saw ", chunk.audit.examples, " examples (digest ",
          chunk.audit.digest, "), expected ", expected.examples, " (digest ", expected.digest, ")"));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Figure 1: the stall after a primary kill.
// ---------------------------------------------------------------------------

struct Stall {
  std::string victim;
  std::string new_primary;
  int64_t step_at_kill = 0;     // the job's reported step
  int64_t version_before = 0;   // highest chunk version seen just before the kill
  int64_t first_version = 0;    // the version the first Pull after the kill saw
  double failover_seconds = 0;  // kill -> the scheduler's shard map names a new primary
  double seconds = 0;           // kill -> the first step applied after it
};

// Polls GetJob (at most every kPollInterval) until the job's shard map is
// newer than `map_version` and no longer led by `victim`.
absl::StatusOr<v1::JobStatus> WaitForNewPrimary(Cluster& cluster, const std::string& job_id,
                                                int64_t map_version, const std::string& victim,
                                                absl::Time deadline) {
  while (true) {
    const absl::Time polled = absl::Now();
    absl::StatusOr<v1::JobStatus> job = cluster.Get(job_id);
    if (job.ok()) {
      if (Terminal(job->state())) {
        return absl::FailedPreconditionError(
            absl::StrCat("job ", job_id, " ended ", v1::JobState_Name(job->state()),
                         " before a new primary was named: ", job->reason()));
      }
      if (job->shard_map().version() > map_version && job->shards_size() > 0 &&
          job->shards(0).server_id() != victim) {
        return job;
      }
    }
    if (polled > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("no new primary for job ", job_id, " within ",
                                                      absl::FormatDuration(kStallLimit), " of killing ",
                                                      victim));
    }
    absl::SleepFor(kPollInterval - (absl::Now() - polled));
  }
}

// Waits, on `job`'s shard map (refreshed if it moves again), until every chunk
// has at least `min_version` updates; returns the version seen.
absl::StatusOr<int64_t> WaitForVersion(Cluster& cluster, v1::JobStatus job, int64_t min_version,
                                       absl::Time deadline) {
  while (true) {
    const absl::Time tried = absl::Now();
    ParameterClient client(job.shard_map(), job.job_id(), "failover-bench");
    auto params = client.MakeBuffers();
    ParameterClient::Versions versions;
    absl::Status status =
        client.Pull(min_version, std::max(deadline - tried, absl::Milliseconds(1)), &params, &versions);
    if (status.ok() && versions.min >= min_version) return versions.min;
    if (status.ok()) {
      // A finished job's chunks answer at once, whatever their version.
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job.job_id(), " ended at version ", versions.min,
                       " without a step after the kill (wanted ", min_version, ")"));
    }
    if (absl::Now() > deadline) return status;
    absl::SleepFor(kPollInterval - (absl::Now() - tried));
    // The map may have moved again (ABORTED), or the new primary not be ready yet.
    absl::StatusOr<v1::JobStatus> fresh = cluster.Get(job.job_id());
    if (fresh.ok()) job = *std::move(fresh);
  }
}

// SIGKILLs the primary of running job `job_id`'s shard 0 and times the stall.
absl::StatusOr<Stall> KillPrimaryAndTimeStall(Cluster& cluster, const std::string& job_id) {
  ASSIGN_OR_RETURN(v1::JobStatus running, cluster.Get(job_id));
  if (running.state() != v1::RUNNING || running.shards_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " is ", v1::JobState_Name(running.state()), " at the kill: make it longer"));
  }
  Stall stall;
  stall.victim = running.shards(0).server_id();
  stall.step_at_kill = running.progress().step();
  ParameterClient before(running.shard_map(), job_id, "failover-bench");
  auto params = before.MakeBuffers();
  ParameterClient::Versions versions;
  RETURN_IF_ERROR(before.Pull(0, absl::Seconds(5), &params, &versions));
  stall.version_before = versions.max;
  const absl::Time killed = absl::Now();
  RETURN_IF_ERROR(cluster.local().Signal(stall.victim, SIGKILL));
  const absl::Time deadline = killed + kStallLimit;
  ASSIGN_OR_RETURN(v1::JobStatus moved,
                   WaitForNewPrimary(cluster, job_id, running.shard_map().version(), stall.victim, deadline));
  stall.failover_seconds = absl::ToDoubleSeconds(absl::Now() - killed);
  stall.new_primary = moved.shards(0).server_id();
  ASSIGN_OR_RETURN(stall.first_version, WaitForVersion(cluster, moved, stall.version_before + 1, deadline));
  stall.seconds = absl::ToDoubleSeconds(absl::Now() - killed);
  return stall;
}

struct FailoverResults {
  int64_t lease_ms = -1;
  int epochs = 0;
  std::vector<double> stalls;
  std::vector<double> failovers;
  int runs = 0;
  int verified = 0;  // runs whose parameters and audit both matched
  std::vector<std::string> failures;
};

// A job of about `seconds` at the measured pace of FailoverSpec's steps.
absl::StatusOr<int> EpochsForSeconds(Cluster& cluster, double seconds, bool quick) {
  ASSIGN_OR_RETURN(v1::JobStatus done, cluster.RunToEnd(FailoverSpec(1, quick ? 300 : 600)));
  const double rate = StepsPerSecond(done);
  const int64_t steps_per_epoch = kFailoverExamples / (kFailoverBatch * kWorkers);
  const int epochs = static_cast<int>(std::clamp<double>(seconds * rate / steps_per_epoch + 0.5, 2, 1000));
  Log(absl::StrFormat("calibration: %.0f steps/s, %d steps per epoch -> %d epochs for ~%.0f s", rate,
                      steps_per_epoch, epochs, seconds));
  return epochs;
}

// One disturbed run: submit, kill the primary after `kill_after`, time the
// stall, add a server back, and check the result against `reference`.
void RunWithPrimaryKill(Cluster& cluster, const v1::JobSpec& spec, const std::vector<float>& reference,
                        const Audit& audit, absl::Duration kill_after, int run, FailoverResults* results) {
  const std::string tag = absl::StrCat("kill ", run + 1, "/", results->runs);
  auto fail = [&](const std::string& why) {
    results->failures.push_back(absl::StrCat(tag, ": ", why));
    Log(absl::StrCat(tag, ": NOT VERIFIED: ", why));
  };
  absl::StatusOr<std::string> id = cluster.Submit(spec);
  if (!id.ok()) return fail(id.status().ToString());
  absl::StatusOr<v1::JobStatus> started = cluster.WaitFor(
      *id, [](const v1::JobStatus& s) { return s.progress().step() > 0; }, kJobLimit);
  if (!started.ok()) return fail(started.status().ToString());
  absl::SleepFor(kill_after);
  absl::StatusOr<Stall> stall = KillPrimaryAndTimeStall(cluster, *id);
  if (stall.ok()) {
    results->stalls.push_back(stall->seconds);
    results->failovers.push_back(stall->failover_seconds);
    Log(
        absl::StrFormat("%s: killed primary %s at step %d (chunk version %d); %s primary after %.3f s; "
                        "first step after the kill (version %d) %.3f s after it",
                        tag, stall->victim, stall->step_at_kill, stall->version_before, stall->new_primary,
                        stall->failover_seconds, stall->first_version, stall->seconds));
  } else {
    Log(absl::StrCat(tag, ": stall not measured: ", stall.status().ToString()));
  }
  if (absl::StatusOr<v1::LocalProcess> added = cluster.local().AddServer(); added.ok()) {
    Log(absl::StrCat(tag, ": ", added->id(), " added; the cluster has 3 live servers again"));
  } else {
    Log(absl::StrCat(tag, ": could not add a server: ", added.status().ToString()));
  }
  absl::StatusOr<v1::JobStatus> done = cluster.WaitForEnd(*id);
  if (!done.ok()) return fail(done.status().ToString());
  if (done->state() != v1::SUCCEEDED)
    return fail(absl::StrCat("job ended ", v1::JobState_Name(done->state()), ": ", done->reason()));
  absl::StatusOr<std::vector<float>> params = FinalParameters(*done);
  if (!params.ok()) return fail(params.status().ToString());
  if (std::string diff = Difference(reference, *params); !diff.empty()) {
    return fail(absl::StrCat("parameters differ from the undisturbed run: ", diff));
  }
  if (absl::Status checked = CheckAudit(*done, audit); !checked.ok()) return fail(checked.ToString());
  ++results->verified;
  Log(
      absl::StrFormat("%s: job succeeded (%d steps, shard map version %d): parameters bit-identical to the "
                      "undisturbed run, every example of every epoch used once",
                      tag, done->progress().step(), done->shard_map().version()));
}

absl::StatusOr<FailoverResults> MeasureFailover(const std::string& dir, int runs, bool quick) {
  FailoverResults results;
  results.runs = runs;
  results.lease_ms = SchedulerDefaultLeaseMs();
  Log(absl::StrCat(
      "figure 1+2: 3 servers, 2 workers, 2 replicas, scheduler lease ",
      results.lease_ms > 0 ? absl::StrCat(results.lease_ms, " ms (its default)") : "(default; unread)"));
  ASSIGN_OR_RETURN(std::unique_ptr<Cluster> cluster, StartCluster(dir, 3, 2));
  ASSIGN_OR_RETURN(results.epochs, EpochsForSeconds(*cluster, quick ? 8 : 20, quick));
  const v1::JobSpec spec = FailoverSpec(results.epochs);
  const Audit audit = ExpectedExampleAudit(spec, kFailoverExamples);

  const absl::Time reference_start = absl::Now();
  ASSIGN_OR_RETURN(v1::JobStatus reference_done, cluster->RunToEnd(spec));
  // Read now, before any server goes away.
  ASSIGN_OR_RETURN(std::vector<float> reference, FinalParameters(reference_done));
  absl::Status reference_audit = CheckAudit(reference_done, audit);
  Log(absl::StrFormat("reference (undisturbed) run: %d steps in %.1f s, audit %s",
                      reference_done.progress().step(), absl::ToDoubleSeconds(absl::Now() - reference_start),
                      reference_audit.ok() ? "exact" : reference_audit.ToString()));
  if (!reference_audit.ok()) return reference_audit;

  for (int run = 0; run < runs; ++run) {
    RunWithPrimaryKill(*cluster, spec, reference, audit, quick ? absl::Seconds(2) : absl::Seconds(4), run,
                       &results);
  }
  return results;
}

// ---------------------------------------------------------------------------
// Figure 3: throughput with 2 replicas against 1.
// ---------------------------------------------------------------------------

struct ThroughputResults {
  std::vector<double> r1;  // steps/s
  std::vector<double> r2;
};

absl::StatusOr<ThroughputResults> MeasureThroughput(const std::string& dir, int runs, int64_t steps) {
  Log(absl::StrCat("figure 3: 2 servers, 2 workers, MLP 784-256-10, batch 64, BSP, ", steps,
                   " steps a job; replicas 1 and 2 alternated, ", runs, " each"));
  ASSIGN_OR_RETURN(std::unique_ptr<Cluster> cluster, StartCluster(dir, 2, 1));
  // Not counted: the first job on fresh processes also pays for connections
  // and allocations that every later job finds ready.
  ASSIGN_OR_RETURN(v1::JobStatus warm_up, cluster->RunToEnd(ThroughputSpec(1, std::min<int64_t>(steps, 50))));
  Log(absl::StrFormat("warm-up job: %d steps", warm_up.progress().step()));
  ThroughputResults results;
  for (int run = 0; run < runs; ++run) {
    for (int replicas : {1, 2}) {
      ASSIGN_OR_RETURN(v1::JobStatus done, cluster->RunToEnd(ThroughputSpec(replicas, steps)));
      const double rate = StepsPerSecond(done);
      (replicas == 1 ? results.r1 : results.r2).push_back(rate);
      Log(absl::StrFormat("R=%d run %d/%d: %.1f steps/s (%d steps, %d shards)", replicas, run + 1, runs, rate,
                          done.progress().step(), done.shards_size()));
    }
  }
  return results;
}

// ---------------------------------------------------------------------------
// The report.
// ---------------------------------------------------------------------------

void PrintTable(const absl::StatusOr<FailoverResults>& failover,
                const absl::StatusOr<ThroughputResults>& throughput) {
  std::printf("\n| figure | value | detail |\n|---|---|---|\n");
  if (!failover.ok()) {
    std::printf("| stall after a primary kill | not measured | %s |\n", failover.status().ToString().c_str());
    std::printf("| acknowledged updates lost | not measured | |\n");
  } else {
    const FailoverResults& f = *failover;
    const std::string lease = f.lease_ms > 0 ? absl::StrCat(f.lease_ms, " ms") : "unread";
    if (f.stalls.empty()) {
      std::printf("| stall after a primary kill (default lease %s) | not measured | see the log above |\n",
                  lease.c_str());
    } else {
      std::printf(
          "| stall after a primary kill (default lease %s) | min %.2f s / median %.2f s / max %.2f s | "
          "kills: %zu; new primary named after median %.2f s |\n",
          lease.c_str(), *std::min_element(f.stalls.begin(), f.stalls.end()), Median(f.stalls),
          *std::max_element(f.stalls.begin(), f.stalls.end()), f.stalls.size(), Median(f.failovers));
    }
    const int differing = f.runs - f.verified;
    std::printf(
        "| acknowledged updates lost | %s | %d disturbed runs of %d epochs vs 1 undisturbed: final "
        "parameters bit for bit and every chunk's example audit |\n",
        differing == 0 ? "lost updates: 0" : absl::StrCat(differing, " of ", f.runs, " runs differ").c_str(),
        f.runs, f.epochs);
  }
  if (!throughput.ok() || throughput->r1.empty()) {
    std::printf("| throughput, R=2 vs R=1 | not measured | %s |\n",
                throughput.ok() ? "no runs" : throughput.status().ToString().c_str());
  } else {
    const double r1 = Mean(throughput->r1), r2 = Mean(throughput->r2);
    const double ratio = r1 > 0 ? r2 / r1 : 0;
    std::printf(
        "| throughput, R=2 vs R=1 | %.3f (%.1f%% cost) | R=1 %.1f steps/s, R=2 %.1f steps/s (mean of %zu "
        "each, alternated) |\n",
        ratio, (1 - ratio) * 100, r1, r2, throughput->r1.size());
  }
  std::fflush(stdout);
}

int Run() {
  const bool quick = absl::GetFlag(FLAGS_quick);
  int runs = absl::GetFlag(FLAGS_runs);
  int throughput_runs = absl::GetFlag(FLAGS_throughput_runs);
  int64_t throughput_steps = absl::GetFlag(FLAGS_throughput_steps);
  if (runs <= 0) runs = quick ? 1 : 3;
  if (throughput_runs <= 0) throughput_runs = quick ? 1 : 2;
  if (throughput_steps <= 0) throughput_steps = quick ? 150 : 1000;
  const std::string dir = bench::MakeTempDir("fulcrum-failover-bench");
  if (dir.empty()) return 1;
  Log(absl::StrCat("clusters and their logs in ", dir));
  absl::StatusOr<FailoverResults> failover = MeasureFailover(dir + "/failover", runs, quick);
  if (!failover.ok()) Log(absl::StrCat("figures 1+2 not measured: ", failover.status().ToString()));
  absl::StatusOr<ThroughputResults> throughput =
      MeasureThroughput(dir + "/throughput", throughput_runs, throughput_steps);
  if (!throughput.ok()) Log(absl::StrCat("figure 3 not measured: ", throughput.status().ToString()));
  PrintTable(failover, throughput);
  const bool good =
      failover.ok() && throughput.ok() && !failover->stalls.empty() && failover->verified == failover->runs;
  return bench::FinishRun(dir, good, absl::GetFlag(FLAGS_keep_logs));
}

}  // namespace
}  // namespace fulcrum

int main(int argc, char** argv) {
  return fulcrum::bench::BenchMain(argc, argv, "failover_bench.cc",
                                   "fulcrum-failover-bench [--quick] [--runs N] [--throughput-runs N] "
                                   "[--throughput-steps N] [--keep-logs]",
                                   fulcrum::Run);
}
