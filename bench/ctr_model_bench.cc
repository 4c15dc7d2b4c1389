// What a layer graph costs against the preset kinds' fused code, side by
// side in one run: a step's forward and backward pass on the CPU over one
// batch, the same model as a preset kind (kernels/ctr_model.h) and as the
// graph CtrModelAsGraph writes for it (kernels/graph_model.h).
//
//   BM_step/deepfm/{fused,graph,backend}   DeepFM: linear + FM + MLP 32-16
//   BM_step/dlrm/{fused,graph,backend}     DLRM: bottom MLP 16, dot interaction, MLP 32
//
// "backend" is the graph computing through a kernels::Backend, the path a
// GPU worker takes (--device=cpu, the default: the CPU backend, which shows
// what the backend ops cost against the host graph; --device=cuda: the GPU,
// parameters and rows copied in and gradients out every step as a worker
// does).
//
// A batch of 256 synthetic click examples (Zipf ids, --fields=N fields,
// default 26 as Criteo's categorical ones; 13 dense features; embedding dim
// 16), distinct keys numbered per table as a worker does. Each case owns its
// model (and so its scratch), warmed by Google Benchmark's first
// iterations; the cases are interleaved at random over 5 repetitions.
// counters: examples/s.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/benchmark_main.h"
#include "benchmark/benchmark.h"
#include "common/sync.h"
#include "kernels/backend_loader.h"
#include "kernels/ctr_model.h"
#include "kernels/graph_model.h"
#include "worker/ctr_data.h"

namespace fulcrum {
namespace {

int32_t fields_flag = 26;
constexpr int kBatch = 256;
constexpr int kDense = 13;
constexpr int kDim = 16;

kernels::CtrModelConfig Config(bool dlrm) {
  kernels::CtrModelConfig c;
  c.num_fields = fields_flag;
  c.num_dense = kDense;
  c.embedding_dim = kDim;
  if (dlrm) {
    c.linear = false;
    c.hidden = {32};
    c.bottom = {16};
    c.dot_interaction = true;
  } else {
    c.fm = true;
    c.hidden = {32, 16};
  }
  return c;
}

// One batch and parameters for a model's tensors and tables.
struct Problem {
  SparseDataset data;
  std::vector<int32_t> rows;  // per id: its distinct key's row (every table reads every field)
  int32_t unique = 0;
  std::vector<std::vector<float>> dense, tables, dense_grads, table_grads;
};

Problem MakeProblem(const std::vector<kernels::TensorInfo>& tensors, const std::vector<kernels::CtrTableInfo>& tables) {
  Problem p;
  SyntheticCtrSpec spec;
  spec.examples = kBatch;
  spec.fields = fields_flag;
  spec.vocabulary = 100000;
  spec.dense = kDense;
  p.data = MakeSyntheticCtr(spec, 0, 0, kBatch);
  std::map<uint64_t, int32_t> index;
  for (uint64_t id : p.data.ids) p.rows.push_back(index.try_emplace(id, static_cast<int32_t>(index.size())).first->second);
  p.unique = static_cast<int32_t>(index.size());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-0.1f, 0.1f);
  for (const kernels::TensorInfo& t : tensors) {
    std::vector<float>& values = p.dense.emplace_back(static_cast<size_t>(t.size));
    for (float& x : values) x = uniform(rng);
    p.dense_grads.emplace_back(static_cast<size_t>(t.size));
  }
  for (const kernels::CtrTableInfo& t : tables) {
    std::vector<float>& values = p.tables.emplace_back(static_cast<size_t>(p.unique) * static_cast<size_t>(t.dim));
    for (float& x : values) x = uniform(rng);
    p.table_grads.emplace_back(values.size());
  }
  return p;
}

kernels::CtrParams Params(const Problem& p) {
  kernels::CtrParams params;
  for (const auto& t : p.dense) params.dense.push_back(t.data());
  for (const auto& t : p.tables) params.tables.push_back(t.data());
  return params;
}

kernels::CtrGrads Grads(Problem* p) {
  kernels::CtrGrads grads;
  for (auto& t : p->dense_grads) grads.dense.push_back(t.data());
  for (auto& t : p->table_grads) grads.tables.push_back(t.data());
  return grads;
}

// The batch's fields both batch types share.
template <typename Batch>
Batch BatchOf(const Problem& p) {
  Batch batch;
  batch.batch = kBatch;
  batch.labels = p.data.labels.data();
  batch.dense = p.data.dense.data();
  batch.offsets = p.data.offsets.data();
  batch.weights = p.data.weights.data();
  return batch;
}

template <typename Model, typename Batch>
void Run(benchmark::State& state, Model* model, const Batch& batch, Problem* p) {
  for (auto _ : state) {
    if (!model->ForwardBackward(batch, Params(*p), Grads(p), nullptr).ok()) state.SkipWithError("refused");
  }
  state.counters["examples_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * kBatch), benchmark::Counter::kIsRate);
}

std::string device_flag = "cpu";
kernels::Backend* backend = nullptr;

enum class Path { kFused, kGraph, kBackend };

void BM_Step(benchmark::State& state, bool dlrm, Path path) {
  const kernels::CtrModelConfig config = Config(dlrm);
  if (path != Path::kFused) {
    kernels::GraphModel model(kernels::CtrModelAsGraph(config), path == Path::kBackend ? backend : nullptr);
    Problem p = MakeProblem(model.dense_tensors(), model.tables());
    auto batch = BatchOf<kernels::GraphBatch>(p);
    batch.rows.assign(model.tables().size(), p.rows.data());
    batch.unique_rows.assign(model.tables().size(), p.unique);
    Run(state, &model, batch, &p);
  } else {
    kernels::CtrModel model(config);
    Problem p = MakeProblem(kernels::CtrDenseTensors(config), kernels::CtrTables(config));
    auto batch = BatchOf<kernels::CtrBatch>(p);
    batch.rows = p.rows.data();
    batch.unique_rows = p.unique;
    Run(state, &model, batch, &p);
  }
}

}  // namespace
}  // namespace fulcrum

int main(int argc, char** argv) {
  fulcrum::SetMutexDeadlockDetection(false);  // as every daemon (common/sync.h)
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--device=", 9) == 0) {
      fulcrum::device_flag = argv[i] + 9;
    } else if (std::strncmp(argv[i], "--fields=", 9) == 0) {
      fulcrum::fields_flag = std::max(2, std::min(256, std::atoi(argv[i] + 9)));
    } else {
      args.push_back(argv[i]);
    }
  }
  if (!fulcrum::bench::InitializeInterleaved(args)) return 1;
  auto choice = fulcrum::kernels::MakeBackend(fulcrum::device_flag);
  if (!choice.ok()) {
    std::fprintf(stderr, "--device=%s: %s\n", fulcrum::device_flag.c_str(), std::string(choice.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<fulcrum::kernels::Backend> backend = std::move(choice->backend);
  fulcrum::backend = backend.get();
  std::fprintf(stderr, "backend: %s\n", backend->Name());
  using fulcrum::Path;
  for (bool dlrm : {false, true}) {
    for (Path path : {Path::kFused, Path::kGraph, Path::kBackend}) {
      const char* name = path == Path::kFused ? "fused" : path == Path::kGraph ? "graph" : "backend";
      benchmark::RegisterBenchmark(absl::StrCat("BM_step/", dlrm ? "dlrm" : "deepfm", "/", name).c_str(),
                                   [dlrm, path](benchmark::State& s) { fulcrum::BM_Step(s, dlrm, path); })
          ->Unit(benchmark::kMicrosecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
