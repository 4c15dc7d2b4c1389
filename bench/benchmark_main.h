// The Google Benchmark setup the micro-benchmarks share: 5 repetitions
// unless the command line says otherwise, interleaved at random so that
// drift on a noisy machine spreads over every case.
#ifndef FULCRUM_BENCH_BENCHMARK_MAIN_H_
#define FULCRUM_BENCH_BENCHMARK_MAIN_H_

#include <cstring>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"

namespace fulcrum {
namespace bench {

// Initializes Google Benchmark with `args` (the command line less the
// bench's own flags); false when an argument is not one of its flags.
inline bool InitializeInterleaved(std::vector<char*> args) {
  static std::string repetitions = "--benchmark_repetitions=5";
  static std::string interleave = "--benchmark_enable_random_interleaving=true";
  bool has_repetitions = false;
  for (char* arg : args) has_repetitions |= std::strncmp(arg, "--benchmark_repetitions", 23) == 0;
  if (!has_repetitions) args.push_back(repetitions.data());
  args.push_back(interleave.data());
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  return !benchmark::ReportUnrecognizedArguments(count, args.data());
}

}  // namespace bench
}  // namespace fulcrum

#endif  // FULCRUM_BENCH_BENCHMARK_MAIN_H_
