// Users' click data held as an index (RecordIndex: 8 bytes a record, each
// record read again with a pread and parsed when a step needs it) against
// held whole (every record parsed once into memory), side by side in one run:
//
//   BM_batch/held, BM_batch/indexed   a step's batch of 256 records in the
//                                     epoch's shuffled order (what a worker
//                                     does each step), per batch
//   BM_load/read, BM_load/index       reading every file at the start
//   BM_synthetic/fm_dim:D/cache:C     making examples_flag synthetic click
//                                     examples on one thread (fields_flag
//                                     fields, FM latent width D of the true
//                                     model), with and without the cache of
//                                     ids' true values that workers use
//
// counters: examples/s, and MB held in memory by each. The file is written
// once in a temporary folder and is in the page cache for both (a file
// bigger than memory would be read from the disk by the indexed case).
// Flags: --examples=N (default 500000), --fields=N (default 26, as Criteo's
// categorical ones), --vocabulary=N (ids per field of BM_synthetic, default
// 10^6).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/benchmark_main.h"
#include "benchmark/benchmark.h"
#include "common/sync.h"
#include "worker/ctr_data.h"

namespace fulcrum {
namespace {

int64_t examples_flag = 500000;
int64_t vocabulary_flag = 1000000;
int32_t fields_flag = 26;
constexpr int kBatch = 256;

// A libsvm file of examples_flag records of fields_flag Zipf-distributed ids
// (written once).
const std::string& DataFile() {
  static const std::string* path = [] {
    SyntheticCtrSpec spec;
    spec.examples = examples_flag;
    spec.fields = fields_flag;
    spec.vocabulary = 1000000;
    auto* name = new std::string(absl::StrCat(std::filesystem::temp_directory_path().string(), "/fulcrum-ctr-data-",
                                              getpid(), ".libsvm"));
    std::ofstream out(*name, std::ios::binary);
    for (int64_t first = 0; first < spec.examples; first += 10000) {
      const SparseDataset part = MakeSyntheticCtr(spec, 0, first, std::min<int64_t>(10000, spec.examples - first));
      for (int64_t e = 0; e < part.num_examples(); ++e) {
        std::string line = absl::StrCat(part.labels[static_cast<size_t>(e)]);
        for (int64_t j = part.offsets[static_cast<size_t>(e * spec.fields)];
             j < part.offsets[static_cast<size_t>((e + 1) * spec.fields)]; ++j) {
          absl::StrAppend(&line, " ", part.ids[static_cast<size_t>(j)], ":1");
        }
        out << line << '\n';
      }
    }
    return name;
  }();
  return *path;
}

// Appends record `e` of `data` to `batch`.
void Append(const SparseDataset& data, int64_t e, SparseDataset* batch) {
  const auto u = static_cast<size_t>(e);
  batch->labels.push_back(data.labels[u]);
  for (int32_t f = 0; f < data.num_fields; ++f) {
    const size_t bag = u * static_cast<size_t>(data.num_fields) + static_cast<size_t>(f);
    for (int64_t j = data.offsets[bag]; j < data.offsets[bag + 1]; ++j) {
      batch->ids.push_back(data.ids[static_cast<size_t>(j)]);
      batch->weights.push_back(data.weights[static_cast<size_t>(j)]);
    }
    batch->offsets.push_back(static_cast<int64_t>(batch->ids.size()));
  }
}

void BM_Batch(benchmark::State& state, bool indexed) {
  ReadStats stats;
  SparseDataset held;
  std::unique_ptr<RecordIndex> index;
  if (indexed) {
    index = std::move(*RecordIndex::BuildLibsvm({DataFile()}, {}, &stats));
  } else if (!ReadLibsvmFile(DataFile(), {}, &held, &stats).ok()) {
    state.SkipWithError("read failed");
    return;
  }
  const int64_t n = indexed ? index->num_examples() : held.num_examples();
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) order[static_cast<size_t>(e)] = e;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(1));
  size_t next = 0;
  for (auto _ : state) {
    if (next + kBatch > order.size()) next = 0;
    SparseDataset batch;
    batch.num_fields = 1;
    if (indexed) {  // as a worker's step: the batch's records at once, then copied into the batch
      SparseDataset records;
      if (!index->Read(&order[next], kBatch, &records).ok()) state.SkipWithError("read failed");
      for (int i = 0; i < kBatch; ++i) Append(records, i, &batch);
    } else {
      for (int i = 0; i < kBatch; ++i) Append(held, order[next + static_cast<size_t>(i)], &batch);
    }
    next += kBatch;
    benchmark::DoNotOptimize(batch.ids.data());
  }
  state.counters["examples_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * kBatch), benchmark::Counter::kIsRate);
  state.counters["MB_held"] = static_cast<double>(indexed ? index->bytes() : HeldBytes(held)) / 1e6;
}

void BM_Load(benchmark::State& state, bool indexed) {
  int64_t bytes = 0;
  for (auto _ : state) {
    ReadStats stats;
    if (indexed) {
      auto index = RecordIndex::BuildLibsvm({DataFile()}, {}, &stats);
      bytes = (*index)->bytes();
    } else {
      SparseDataset held;
      if (!ReadLibsvmFile(DataFile(), {}, &held, &stats).ok()) state.SkipWithError("read failed");
      bytes = HeldBytes(held);
    }
  }
  state.counters["MB_held"] = static_cast<double>(bytes) / 1e6;
  state.counters["MB_file"] = static_cast<double>(std::filesystem::file_size(DataFile())) / 1e6;
}

void BM_Synthetic(benchmark::State& state) {
  SyntheticCtrSpec spec;
  spec.examples = examples_flag;
  spec.fields = fields_flag;
  spec.vocabulary = vocabulary_flag;
  spec.fm_dim = static_cast<int32_t>(state.range(0));
  const bool cached = state.range(1) != 0;
  for (auto _ : state) {
    const SyntheticCtrGenerator generator(spec, 1);
    SyntheticCtrGenerator::IdCache cache(spec);
    SparseDataset data;
    data.num_fields = spec.fields;
    std::vector<float> truth;
    for (int64_t e = 0; e < spec.examples; ++e) generator.Append(e, &data, &truth, cached ? &cache : nullptr);
    benchmark::DoNotOptimize(data.labels.data());
  }
  state.counters["examples_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * spec.examples), benchmark::Counter::kIsRate);
}

}  // namespace
}  // namespace fulcrum

int main(int argc, char** argv) {
  fulcrum::SetMutexDeadlockDetection(false);  // as every daemon (common/sync.h)
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--examples=", 11) == 0) {
      fulcrum::examples_flag = std::max<int64_t>(fulcrum::kBatch, std::atoll(argv[i] + 11));
    } else if (std::strncmp(argv[i], "--vocabulary=", 13) == 0) {
      fulcrum::vocabulary_flag = std::max<int64_t>(1, std::atoll(argv[i] + 13));
    } else if (std::strncmp(argv[i], "--fields=", 9) == 0) {
      fulcrum::fields_flag = std::max(1, std::atoi(argv[i] + 9));
    } else {
      args.push_back(argv[i]);
    }
  }
  if (!fulcrum::bench::InitializeInterleaved(args)) return 1;
  for (bool indexed : {false, true}) {
    const char* name = indexed ? "indexed" : "held";
    benchmark::RegisterBenchmark(absl::StrCat("BM_batch/", name).c_str(),
                                 [indexed](benchmark::State& s) { fulcrum::BM_Batch(s, indexed); })
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(absl::StrCat("BM_load/", indexed ? "index" : "read").c_str(),
                                 [indexed](benchmark::State& s) { fulcrum::BM_Load(s, indexed); })
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1);
  }
  benchmark::RegisterBenchmark("BM_synthetic", fulcrum::BM_Synthetic)
      ->ArgNames({"fm_dim", "cache"})
      ->ArgsProduct({{0, 16}, {0, 1}})
      ->Unit(benchmark::kMillisecond)
      ->Iterations(1);
  fulcrum::DataFile();
  benchmark::RunSpecifiedBenchmarks();
  std::filesystem::remove(fulcrum::DataFile());
  return 0;
}
