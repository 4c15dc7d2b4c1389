// fulcrum-optimizer-bench: how fast a server applies an optimizer update to
// one chunk, against memcpy on the same machine in the same run.
//
// The measure is bytes touched per second: memcpy reads and writes n floats
// (8n bytes); SGD reads the gradient and reads and writes the values (12n);
// momentum adds the velocity (20n); Adam and Adagrad the moments (28n, 20n).
// Issue 14's goal: every apply at >= 50% of memcpy's rate.
//
// Google Benchmark runs every case --benchmark_repetitions times (default 7
// here) in random interleaving, each repetition on freshly allocated and
// faulted buffers; the summary gives min / median / max per case and the
// ratio of medians to memcpy of the same size.
//
//   fulcrum-optimizer-bench                       # 256 KiB and 4 MiB chunks
//   fulcrum-optimizer-bench --benchmark_repetitions=15
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/sync.h"
#include "server/optimizer.h"

namespace fulcrum {
namespace {

// The chunk sizes measured: the scheduler's default (--chunk-bytes 256 KiB)
// and the largest a server takes (4 MiB).
constexpr int64_t kSizes[] = {int64_t{1} << 16, int64_t{1} << 20};

struct Case {
  const char* name;
  OptimizerConfig config;
  int arrays_touched;  // read or written, each counted once per direction
};

std::vector<Case> Cases() {
  OptimizerConfig sgd;
  OptimizerConfig momentum;
  momentum.momentum = 0.9f;
  OptimizerConfig adam;
  adam.kind = OptimizerKind::kAdam;
  OptimizerConfig adagrad;
  adagrad.kind = OptimizerKind::kAdagrad;
  // Bytes touched per value / 4: grad read, values read + written, each slot
  // read + written.
  return {{"sgd", sgd, 3}, {"momentum", momentum, 5}, {"adam", adam, 7}, {"adagrad", adagrad, 5}};
}

// Buffers filled with small values so that no update overflows or goes
// subnormal over many iterations (which would change the speed).
std::vector<float> Filled(int64_t n, float base) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = base + 1e-3f * static_cast<float>(i % 97);
  return v;
}

void BM_Memcpy(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> src = Filled(n, 0.5f);
  std::vector<float> dst = Filled(n, 0.0f);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 8);
}

void BM_Apply(benchmark::State& state, const Case& c) {
  const int64_t n = state.range(0);
  std::vector<float> grad = Filled(n, 1e-4f);
  std::vector<float> values = Filled(n, 0.5f);
  std::vector<std::vector<float>> slots(OptimizerStateSlots(c.config), std::vector<float>(n));
  std::vector<float*> slot_ptrs;
  for (auto& s : slots) slot_ptrs.push_back(s.data());
  InitOptimizerState(c.config, n, slot_ptrs.data());
  int64_t step = 1;
  for (auto _ : state) {
    ApplyOptimizer(c.config, 1e-3f, step++, n, grad.data(), values.data(), slot_ptrs.data());
    benchmark::DoNotOptimize(values.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 4 * c.arrays_touched);
}

// Keeps every repetition's rate, and prints the summary table at the end.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      const auto rate = run.counters.find("bytes_per_second");
      if (rate == run.counters.end()) continue;
      rates_[run.run_name.function_name][run.run_name.args].push_back(rate->second.value);
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n| case | chunk | GB/s touched min / median / max | median / memcpy | goal >= 0.5 |\n");
    std::printf("|---|---|---|---|---|\n");
    for (const auto& [name, by_size] : rates_) {
      for (const auto& [size, rates] : by_size) {
        const double med = Median(rates);
        const double base = Median(rates_["BM_Memcpy"][size]);
        const bool is_base = name == "BM_Memcpy";
        std::printf("| %s | %s floats | %.2f / %.2f / %.2f | %s | %s |\n", name.c_str(), size.c_str(),
                    *std::min_element(rates.begin(), rates.end()) / 1e9, med / 1e9,
                    *std::max_element(rates.begin(), rates.end()) / 1e9,
                    is_base ? "1 (baseline)" : Format(med / base).c_str(),
                    is_base ? "" : (med / base >= 0.5 ? "met" : "NOT met"));
      }
    }
  }

 private:
  static double Median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
  static std::string Format(double ratio) {
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%.2f", ratio);
    return buffer;
  }

  std::map<std::string, std::map<std::string, std::vector<double>>> rates_;
};

}  // namespace
}  // namespace fulcrum

int main(int argc, char** argv) {
  fulcrum::SetMutexDeadlockDetection(false);  // as every daemon (common/sync.h)
  std::vector<char*> args(argv, argv + argc);
  // Defaults: repetitions in random interleaving (each its own buffers), so
  // that no case runs on caches or pages another left warm.
  std::string repetitions = "--benchmark_repetitions=7";
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  std::string min_time = "--benchmark_min_time=0.2";
  bool has_repetitions = false, has_min_time = false;
  for (int i = 1; i < argc; ++i) {
    has_repetitions |= std::strncmp(argv[i], "--benchmark_repetitions", 23) == 0;
    has_min_time |= std::strncmp(argv[i], "--benchmark_min_time", 20) == 0;
  }
  if (!has_repetitions) args.push_back(repetitions.data());
  if (!has_min_time) args.push_back(min_time.data());
  args.push_back(interleave.data());
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  for (int64_t n : fulcrum::kSizes) {
    benchmark::RegisterBenchmark("BM_Memcpy", fulcrum::BM_Memcpy)->Arg(n);
    for (const fulcrum::Case& c : fulcrum::Cases()) {
      benchmark::RegisterBenchmark((std::string("BM_Apply_") + c.name).c_str(),
                                   [c](benchmark::State& state) { fulcrum::BM_Apply(state, c); })
          ->Arg(n);
    }
  }
  fulcrum::SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
