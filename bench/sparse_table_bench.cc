// fulcrum-sparse-table-bench: a server's sparse table (server/sparse_table.h)
// against the obvious alternatives, a hash map of per-row vectors (Abseil's
// open-addressing flat_hash_map and std::unordered_map), in the same run.
//
// Each case fills a table of --rows rows (16 floats with Adagrad state, 128
// bytes of values and state a row) and then times pulls or Adagrad pushes of
// batches of 10,000 distinct keys drawn uniformly from the rows. Reported:
// keys per second, and the memory a row takes (the heap's growth while the
// table was filled, from mallinfo2, divided by the rows) against its 128 raw
// bytes. Google Benchmark runs every case --benchmark_repetitions times (7)
// in random interleaving, each repetition with a table of its own.
//
// Checkpoints of the same table (BM_checkpoint): between two checkpoints
// 1 or 10 batches of 10,000 keys are pushed (untimed: about 1% or 10% of
// the rows change), then the table is captured as a checkpoint takes it
// (SparseTable::AppendCheckpointState), whole or incremental on the
// checkpoint before. Reported: the time of the capture and the bytes it
// yields, which is what the server then checksums and writes to RocksDB.
// BM_restore: a restore of the table as of the second checkpoint, from a
// whole copy, or from the whole first one with the second's changes
// applied on it (SparseTable::ApplyChanges), as a server restores a chain.
//
//   fulcrum-sparse-table-bench [--rows=1000000]
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/sync.h"
#include "server/sparse_table.h"

namespace fulcrum {
namespace {

constexpr int kDim = 16;
constexpr int kBatch = 10000;
constexpr float kLr = 0.05f;
int64_t rows_flag = 1000000;

int64_t HeapBytes() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
}

// The keys of the table's rows and the batches drawn from them.
struct Workload {
  std::vector<uint64_t> keys;
  std::vector<std::vector<uint64_t>> batches;  // distinct keys each
  std::vector<float> grads;

  Workload() : grads(static_cast<size_t>(kBatch) * kDim, 0.25f) {
    keys.resize(static_cast<size_t>(rows_flag));
    for (int64_t i = 0; i < rows_flag; ++i) keys[i] = SplitMix64(static_cast<uint64_t>(i));
    std::mt19937_64 random(1);
    for (int b = 0; b < 16; ++b) {
      std::vector<uint64_t> batch;
      std::vector<bool> taken(keys.size(), false);
      while (static_cast<int>(batch.size()) < kBatch) {
        const size_t i = random() % keys.size();
        if (!taken[i]) {
          taken[i] = true;
          batch.push_back(keys[i]);
        }
      }
      batches.push_back(std::move(batch));
    }
  }
};

const Workload& TheWorkload() {
  static const Workload* const workload = new Workload();
  return *workload;
}

// A map of rows as vectors: values then Adagrad state (2 x kDim floats).
template <typename Map>
class MapTable {
 public:
  void Fill(const std::vector<uint64_t>& keys) {
    map_.reserve(keys.size());
    for (uint64_t key : keys) map_[key] = std::vector<float>(2 * kDim, 0.0f);
  }
  void Pull(const std::vector<uint64_t>& keys, float* out) const {
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = map_.find(keys[i]);
      if (it == map_.end()) {
        std::memset(out + i * kDim, 0, kDim * sizeof(float));
      } else {
        std::memcpy(out + i * kDim, it->second.data(), kDim * sizeof(float));
      }
    }
  }
  void Push(const std::vector<uint64_t>& keys, const float* grads) {
    for (size_t i = 0; i < keys.size(); ++i) {
      std::vector<float>& row = map_[keys[i]];
      if (row.empty()) row.assign(2 * kDim, 0.0f);
      const float* g = grads + i * kDim;
      for (int j = 0; j < kDim; ++j) {
        row[kDim + j] += g[j] * g[j];
        row[j] -= kLr * (g[j] / (std::sqrt(row[kDim + j]) + 1e-10f));
      }
    }
  }

 private:
  Map map_;
};

// The server's table of the cases: kDim floats, Adagrad.
std::unique_ptr<SparseTable> EmptyTable() {
  SparseTableConfig config;
  config.name = "bench";
  config.dim = kDim;
  config.optimizer.kind = SparseOptimizerKind::kAdagrad;
  config.optimizer.lr = kLr;
  return *SparseTable::Create(config);
}

// A row for each key, pushed in batches of kBatch zero gradients.
void FillTable(SparseTable* table, const std::vector<uint64_t>& keys) {
  const std::vector<float> zeros(static_cast<size_t>(kBatch) * kDim, 0.0f);
  for (size_t at = 0; at < keys.size(); at += kBatch) {
    const size_t n = std::min<size_t>(kBatch, keys.size() - at);
    (void)table->Push(0, absl::Span<const uint64_t>(keys.data() + at, n), zeros.data());
  }
}

class FulcrumTable {
 public:
  FulcrumTable() : table_(EmptyTable()) {}
  void Fill(const std::vector<uint64_t>& keys) { FillTable(table_.get(), keys); }
  void Pull(const std::vector<uint64_t>& keys, float* out) const { table_->Pull(keys, out); }
  void Push(const std::vector<uint64_t>& keys, const float* grads) { (void)table_->Push(1, keys, grads); }

 private:
  std::unique_ptr<SparseTable> table_;
};

template <typename Table>
void BM_Sparse(benchmark::State& state, bool push) {
  const Workload& work = TheWorkload();
  const int64_t before = HeapBytes();
  auto table = std::make_unique<Table>();
  table->Fill(work.keys);
  const double per_row = static_cast<double>(HeapBytes() - before) / static_cast<double>(work.keys.size());
  std::vector<float> out(static_cast<size_t>(kBatch) * kDim);
  size_t b = 0;
  for (auto _ : state) {
    const std::vector<uint64_t>& keys = work.batches[b++ % work.batches.size()];
    if (push) {
      table->Push(keys, work.grads.data());
    } else {
      table->Pull(keys, out.data());
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * kBatch);
  state.counters["bytes_per_row"] = per_row;
  state.counters["vs_raw"] = per_row / (2 * kDim * sizeof(float));
}

std::unique_ptr<SparseTable> FilledTable() {
  std::unique_ptr<SparseTable> table = EmptyTable();
  FillTable(table.get(), TheWorkload().keys);
  return table;
}

void BM_Checkpoint(benchmark::State& state, bool incremental, int changed_batches) {
  const Workload& work = TheWorkload();
  std::unique_ptr<SparseTable> table = FilledTable();
  int64_t id = 1;
  std::string out;
  table->AppendCheckpointState(id, 0, /*base_is_stored_here=*/true, &out);  // the first is whole
  size_t b = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (int i = 0; i < changed_batches; ++i) {
      (void)table->Push(1, work.batches[b++ % work.batches.size()], work.grads.data());
    }
    out.clear();
    ++id;
    state.ResumeTiming();
    table->AppendCheckpointState(id, incremental ? id - 1 : 0, /*base_is_stored_here=*/true, &out);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["MB"] = static_cast<double>(out.size()) / 1e6;
  state.counters["rows"] = static_cast<double>(table->rows());
}

// A restore of the table as of the second checkpoint: from a whole copy
// (LoadState), or from the whole first one and the second's changes
// (LoadState, then ApplyChanges), into a fresh table each time.
void BM_Restore(benchmark::State& state, bool incremental, int changed_batches) {
  const Workload& work = TheWorkload();
  std::unique_ptr<SparseTable> table = FilledTable();
  std::string base, changes, whole;
  table->AppendCheckpointState(1, 0, true, &base);
  for (int i = 0; i < changed_batches; ++i) (void)table->Push(1, work.batches[static_cast<size_t>(i)], work.grads.data());
  table->AppendCheckpointState(2, 1, true, &changes);
  table->AppendState(&whole);
  table.reset();
  for (auto _ : state) {
    state.PauseTiming();
    std::unique_ptr<SparseTable> restored = EmptyTable();
    state.ResumeTiming();
    absl::Status status = restored->LoadState(incremental ? base : whole);
    if (status.ok() && incremental) status = restored->ApplyChanges(changes);
    if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
    state.PauseTiming();
    restored.reset();  // its memory goes back untimed
    state.ResumeTiming();
  }
  state.counters["MB_read"] = static_cast<double>(incremental ? base.size() + changes.size() : whole.size()) / 1e6;
}

}  // namespace
}  // namespace fulcrum

int main(int argc, char** argv) {
  fulcrum::SetMutexDeadlockDetection(false);  // as every daemon (common/sync.h)
  // Every allocation of 128 KiB or more (a table's blocks of rows, a state's
  // bytes) is a mapping of its own, whatever was freed before: glibc would
  // otherwise raise that threshold as big blocks are freed and serve later
  // ones from memory already faulted in, so a case's time would depend on
  // the cases run before it in the process.
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rows=", 7) == 0) {
      fulcrum::rows_flag = std::max<int64_t>(fulcrum::kBatch, std::atoll(argv[i] + 7));
    } else {
      args.push_back(argv[i]);
    }
  }
  std::string repetitions = "--benchmark_repetitions=7";
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  std::string min_time = "--benchmark_min_time=0.2";
  std::string aggregates = "--benchmark_report_aggregates_only=true";
  bool has_repetitions = false;
  for (char* arg : args) has_repetitions |= std::strncmp(arg, "--benchmark_repetitions", 23) == 0;
  if (!has_repetitions) args.push_back(repetitions.data());
  args.push_back(min_time.data());
  args.push_back(interleave.data());
  args.push_back(aggregates.data());
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  using Flat = fulcrum::MapTable<absl::flat_hash_map<uint64_t, std::vector<float>>>;
  using Std = fulcrum::MapTable<std::unordered_map<uint64_t, std::vector<float>>>;
  auto min = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  auto max = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  for (bool push : {false, true}) {
    const std::string op = push ? "push" : "pull";
    for (auto* bench : {benchmark::RegisterBenchmark(("BM_" + op + "/fulcrum_sparse_table").c_str(),
                                                     [push](benchmark::State& s) {
                                                       fulcrum::BM_Sparse<fulcrum::FulcrumTable>(s, push);
                                                     }),
                        benchmark::RegisterBenchmark(("BM_" + op + "/absl_flat_hash_map_of_vectors").c_str(),
                                                     [push](benchmark::State& s) {
                                                       fulcrum::BM_Sparse<Flat>(s, push);
                                                     }),
                        benchmark::RegisterBenchmark(("BM_" + op + "/std_unordered_map_of_vectors").c_str(),
                                                     [push](benchmark::State& s) {
                                                       fulcrum::BM_Sparse<Std>(s, push);
                                                     })}) {
      bench->ComputeStatistics("min", min)->ComputeStatistics("max", max)->Unit(benchmark::kMicrosecond);
    }
  }
  using TableCase = void (*)(benchmark::State&, bool incremental, int changed_batches);
  for (int changed : {1, 10}) {
    for (const auto& [op, run] : {std::pair<const char*, TableCase>{"checkpoint", fulcrum::BM_Checkpoint},
                                  {"restore", fulcrum::BM_Restore}}) {
      for (bool incremental : {false, true}) {
        const std::string name = std::string("BM_") + op + "/" + (incremental ? "incremental" : "whole") +
                                 "/changed_batches:" + std::to_string(changed);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [run = run, incremental, changed](benchmark::State& s) {
                                       run(s, incremental, changed);
                                     })
            ->ComputeStatistics("min", min)
            ->ComputeStatistics("max", max)
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
