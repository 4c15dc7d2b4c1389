// fulcrum-train-bench: what the worker's transfer options buy, measured side
// by side in one run on local clusters of the real processes.
//
// Two clusters, each of 2 servers and 2 workers on loopback: in one the
// workers push each layer's gradients while the layers below are still in
// the backward pass and ask for that layer's next values right after
// (--overlap_push, --prefetch_pull: the defaults), in the other they push the
// whole step after the pass and then pull (both false). Each runs the same BSP
// synthetic job (MLP 784-H-H-10, batch 64 per worker) in every wire format
// (WIRE_FP32, WIRE_BF16, WIRE_FP16); the six variants are run in turn, round
// after round, so drift on a noisy machine spreads over all of them. Each
// cluster first runs a warm-up job (connections, allocations).
//
// For each variant: steps/s (median over the rounds, from the job's first
// step to its end), the ratio against the baseline (fp32, whole-step pushes),
// and the gradient payload pushed a step (both workers; message headers
// left out). Printed as a markdown
// table at the end. Exit code 1 when a variant could not be measured.
//
//   fulcrum-train-bench [--quick] [--hidden N] [--steps N] [--rounds N] [--device D] [--keep-logs]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "client/local_cluster.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "fulcrum/v1/job.grpc.pb.h"
#include "worker/parameter_client.h"

ABSL_FLAG(bool, quick, false, "A smoke test: hidden 512, 20 steps a job, one round; the figures are rough");
ABSL_FLAG(int, hidden, 0, "Width of the two hidden layers (0: 2048, or 512 with --quick)");
ABSL_FLAG(int, steps, 0, "Steps of each job (0: 120, or 20 with --quick)");
ABSL_FLAG(int, rounds, 0, "Rounds of all six variants (0: 3, or 1 with --quick)");
ABSL_FLAG(std::string, device, "cpu", "The workers' --device (cpu, auto, cuda, cuda:N)");
ABSL_FLAG(bool, keep_logs, false, "Keep the temp folder (cluster logs) even when every figure was measured");

namespace fulcrum {
namespace {

using bench::Log;
using bench::Median;
using Cluster = bench::BenchCluster;

constexpr int kWorkers = 2;
constexpr absl::Duration kJobLimit = absl::Minutes(20);
constexpr v1::WireFormat kFormats[] = {v1::WIRE_FP32, v1::WIRE_BF16, v1::WIRE_FP16};

v1::JobSpec StepSpec(int hidden, int64_t steps, v1::WireFormat format) {
  // 65536 examples: 512 steps an epoch, so at most one evaluation a job.
  v1::JobSpec spec = bench::SyntheticMlpSpec(absl::StrCat("train-bench-", WireFormatName(format)),
                                             {hidden, hidden}, 65536, 0.01f, steps, kWorkers);
  spec.set_replicas(1);
  spec.set_wire_format(format);
  return spec;
}

struct Variant {
  bool overlap;
  v1::WireFormat format;
  std::vector<double> steps_per_second;
  double push_bytes_per_step = 0;  // gradient payload, both workers
};

std::string Name(const Variant& v) {
  return absl::StrCat(WireFormatName(v.format), v.overlap ? ", layer by layer" : ", whole step");
}

absl::Status Measure(const std::string& dir, int hidden, int64_t steps, int rounds, std::vector<Variant>* variants) {
  std::map<bool, std::unique_ptr<Cluster>> clusters;
  for (bool overlap : {true, false}) {
    LocalCluster::Options options;
    options.dir = absl::StrCat(dir, overlap ? "/overlap" : "/whole");
    options.servers = 2;
    options.workers = kWorkers;
    options.replicas = 1;
    options.worker_flags.push_back(absl::StrCat("--overlap_push=", overlap ? "true" : "false"));
    options.worker_flags.push_back(absl::StrCat("--prefetch_pull=", overlap ? "true" : "false"));
    options.worker_flags.push_back(absl::StrCat("--device=", absl::GetFlag(FLAGS_device)));
    ASSIGN_OR_RETURN(clusters[overlap], Cluster::Start(options, kJobLimit));
    ASSIGN_OR_RETURN(v1::JobStatus warmup, clusters[overlap]->RunToEnd(StepSpec(hidden, 10, v1::WIRE_FP32)));
    Log(absl::StrFormat("cluster with %s pushes up; warm-up job %.2f steps/s", overlap ? "layer-by-layer" : "whole-step",
                        bench::StepsPerSecond(warmup)));
  }
  for (int round = 0; round < rounds; ++round) {
    for (Variant& v : *variants) {
      ASSIGN_OR_RETURN(v1::JobStatus done, clusters[v.overlap]->RunToEnd(StepSpec(hidden, steps, v.format)));
      const double rate = bench::StepsPerSecond(done);
      v.steps_per_second.push_back(rate);
      // Every worker pushes every tensor once a step.
      v.push_bytes_per_step =
          ParameterClient(done.shard_map(), done.job_id(), "train-bench", nullptr, v.format).total_bytes() * kWorkers;
      Log(absl::StrFormat("round %d/%d, %s: %.3f steps/s (%d steps)", round + 1, rounds, Name(v), rate,
                          done.progress().step()));
    }
  }
  return absl::OkStatus();
}

void PrintTable(const std::vector<Variant>& variants, int hidden, int64_t steps, int rounds) {
  const Variant* baseline = nullptr;
  for (const Variant& v : variants) {
    if (!v.overlap && v.format == v1::WIRE_FP32) baseline = &v;
  }
  const double base = baseline != nullptr ? Median(baseline->steps_per_second) : 0;
  std::printf(
      "\nBSP, 2 servers + 2 workers (--device=%s) on loopback, MLP 784-%d-%d-10, batch 64 a worker, %lld steps "
      "a job, median of %d rounds\n\n",
      absl::GetFlag(FLAGS_device).c_str(), hidden, hidden, static_cast<long long>(steps), rounds);
  std::printf("| wire format | push and pull | steps/s | vs fp32 whole-step | push payload MB / step |\n|---|---|---|---|---|\n");
  for (const Variant& v : variants) {
    if (v.steps_per_second.empty()) {
      std::printf("| %s | %s | not measured | | |\n", WireFormatName(v.format),
                  v.overlap ? "layer by layer" : "whole step");
      continue;
    }
    const double rate = Median(v.steps_per_second);
    std::printf("| %s | %s | %.3f | %.3fx | %.2f |\n", WireFormatName(v.format),
                v.overlap ? "layer by layer" : "whole step", rate, base > 0 ? rate / base : 0,
                v.push_bytes_per_step / 1e6);
  }
  std::fflush(stdout);
}

int Run() {
  const bool quick = absl::GetFlag(FLAGS_quick);
  int hidden = absl::GetFlag(FLAGS_hidden);
  int64_t steps = absl::GetFlag(FLAGS_steps);
  int rounds = absl::GetFlag(FLAGS_rounds);
  if (hidden <= 0) hidden = quick ? 512 : 2048;
  if (steps <= 0) steps = quick ? 20 : 120;
  if (rounds <= 0) rounds = quick ? 1 : 3;
  const bool keep = absl::GetFlag(FLAGS_keep_logs);
  const std::string dir = bench::MakeTempDir("fulcrum-train-bench");
  if (dir.empty()) return 1;
  bench::RegisterTempDir(dir, keep);
  Log(absl::StrCat("temp folder ", dir));
  std::vector<Variant> variants;
  for (v1::WireFormat format : kFormats) {
    for (bool overlap : {false, true}) variants.push_back({overlap, format, {}, 0});
  }
  const absl::Status status = Measure(dir, hidden, steps, rounds, &variants);
  if (!status.ok()) Log(absl::StrCat("not measured: ", status.ToString()));
  PrintTable(variants, hidden, steps, rounds);
  return bench::FinishRun(dir, status.ok(), keep);
}

}  // namespace
}  // namespace fulcrum

int main(int argc, char** argv) {
  return fulcrum::bench::BenchMain(argc, argv, "train_step_bench.cc",
                                   "fulcrum-train-bench [--quick] [--hidden N] [--steps N] [--rounds N] [--device D] [--keep-logs]",
                                   fulcrum::Run);
}
