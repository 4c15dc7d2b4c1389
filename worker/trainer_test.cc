// The worker's training loops (BSP, ASP, SSP) against real parameter
// services in this process: InProcessTransport hands a Trainer's requests to
// ParameterServiceImpl as the bytes gRPC would carry, so the loops, their
// prefetches, retries and map changes run against the real parameter store,
// deduplication and held pulls, without sockets or other processes. A
// JobHarness stands in for the scheduler's side of the hooks.
#include "worker/trainer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/data_partition.h"
#include "common/metrics.h"
#include "common/rpc.h"
#include "common/sync.h"
#include "common/test_metrics.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/mlp.h"
#include "kernels/model_from_spec.h"
#include "scheduler/job_spec.h"
#include "scheduler/placement.h"
#include "server/parameter_service.h"
#include "server/parameter_store.h"
#include "worker/dataset.h"
#include "worker/example_audit.h"
#include "worker/in_process_transport.h"
#include "worker/parameter_client.h"

namespace fulcrum {
namespace {

constexpr char kJob[] = "job-1";
constexpr int kExamples = 384;
constexpr int kFeatures = 6;
constexpr int kClasses = 3;
constexpr int kBatch = 16;
constexpr int kEpochs = 2;
constexpr int64_t kChunkElems = 9;  // several chunks per tensor, on both servers (of 40, all lie on one)
constexpr absl::Duration kRpcTimeout = absl::Seconds(10);

v1::JobSpec Spec(v1::Mode mode, int partitions) {
  v1::JobSpec spec;
  spec.mutable_model()->set_kind(v1::ModelSpec::MLP);
  spec.mutable_model()->add_hidden_sizes(8);
  v1::DataSpec* data = spec.mutable_data();
  data->set_dataset(v1::DataSpec::SYNTHETIC);
  data->set_synthetic_examples(kExamples);
  data->set_synthetic_features(kFeatures);
  data->set_synthetic_classes(kClasses);
  data->set_batch_size(kBatch);
  data->set_epochs(kEpochs);
  data->set_shuffle_seed(7);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_lr(0.1f);
  spec.mutable_optimizer()->set_momentum(0.9f);
  spec.set_mode(mode);
  spec.set_num_workers(partitions);
  spec.set_seed(3);
  ApplyJobSpecDefaults(&spec);
  return spec;
}

// Parameter servers in this process holding one job, reached through `transport`.
class InProcessCluster {
 public:
  InProcessCluster(int servers, v1::JobSpec spec, int partitions, int64_t chunk_elems = kChunkElems)
      : spec_(std::move(spec)), partitions_(partitions), partitioning_(kExamples, StepBatchSize(spec_), partitions) {
    for (int i = 0; i < servers; ++i) {
      stores_.push_back(std::make_unique<ParameterStore>());
      services_.push_back(std::make_unique<ParameterServiceImpl>(stores_.back().get(), SharedTestMetrics()));
      refs_.push_back({absl::StrCat("server-", i), absl::StrCat("in-process:", i)});
      servers_by_id_[refs_.back().id] = i;
      transport_.Serve(refs_.back().address, services_.back().get());
    }
    map_ = PlanShardMap(LayoutFor(spec_, kFeatures, kClasses).tensors, refs_, /*num_shards=*/0, /*replicas=*/1,
                        chunk_elems, /*version=*/1);
  }

  // SetupJob on every server, as the scheduler sends it.
  absl::Status Setup() {
    const ModelLayout layout = LayoutFor(spec_, kFeatures, kClasses);
    for (size_t i = 0; i < services_.size(); ++i) {
      v1::SetupJobRequest request;
      request.set_job_id(kJob);
      *request.mutable_spec() = spec_;
      request.set_num_partitions(partitions_);
      request.set_total_steps(total_steps());
      *request.mutable_shard_map() = map_;
      request.set_server_id(refs_[i].id);
      for (const v1::ChunkLocation& chunk : map_.chunks()) {
        if (map_.shards(chunk.shard()).server_id() == refs_[i].id) AddChunkSetup(chunk, layout, &request);
      }
      v1::SetupJobResponse response;
      grpc::Status status = services_[i]->SetupJob(nullptr, &request, &response);
      if (!status.ok()) return absl::InternalError(status.error_message());
    }
    return absl::OkStatus();
  }

  // A new version of the shard map (same placement) on every server, as after a failover elsewhere.
  absl::Status BumpMapVersion() {
    map_.set_version(map_.version() + 1);
    for (const auto& service : services_) {
      v1::ReconfigureRequest request;
      request.set_job_id(kJob);
      *request.mutable_shard_map() = map_;
      v1::ReconfigureResponse response;
      grpc::Status status = service->Reconfigure(nullptr, &request, &response);
      if (!status.ok()) return absl::InternalError(status.error_message());
    }
    return absl::OkStatus();
  }

  v1::Assignment AssignmentFor(const std::vector<int32_t>& partitions, int64_t membership_epoch = 1) const {
    v1::Assignment assignment;
    assignment.set_job_id(kJob);
    assignment.set_phase(v1::Assignment::TRAIN);
    *assignment.mutable_spec() = spec_;
    *assignment.mutable_shard_map() = map_;
    assignment.set_steps_per_epoch(partitioning_.steps_per_epoch());
    assignment.set_total_steps(total_steps());
    assignment.set_num_partitions(partitions_);
    assignment.set_membership_epoch(membership_epoch);
    for (int32_t p : partitions) assignment.add_partitions(p);
    return assignment;
  }

  // The job's parameters once every chunk has `version` updates.
  absl::StatusOr<std::vector<std::vector<float>>> Params(int64_t version) {
    ParameterClient client(map_, kJob, "reader", nullptr, v1::WIRE_FP32, &transport_);
    std::vector<std::vector<float>> params = client.MakeBuffers();
    ParameterClient::Versions versions;
    absl::Status pulled = client.Pull(version, kRpcTimeout, &params, &versions);
    if (!pulled.ok()) return pulled;
    if (versions.min != versions.max) return absl::InternalError("chunks at different versions");
    return params;
  }

  // Every chunk's example audit, as its server holds it.
  std::vector<ExampleAudit> Audits() {
    std::vector<ExampleAudit> audits;
    for (const v1::ChunkLocation& chunk : map_.chunks()) {
      v1::CopyChunkRequest request;
      request.set_job_id(kJob);
      request.set_chunk_id(chunk.chunk_id());
      v1::ChunkState state;
      const int server = servers_by_id_.at(map_.shards(chunk.shard()).server_id());
      EXPECT_TRUE(services_[server]->CopyChunk(nullptr, &request, &state).ok()) << chunk.chunk_id();
      audits.push_back({state.examples_seen(), state.examples_digest()});
    }
    return audits;
  }

  int64_t total_steps() const { return partitioning_.steps_per_epoch() * kEpochs; }
  int partitions() const { return partitions_; }
  const v1::JobSpec& spec() const { return spec_; }
  InProcessTransport* transport() { return &transport_; }

 private:
  const v1::JobSpec spec_;
  const int partitions_;
  const DataPartitioning partitioning_;
  std::vector<ServerRef> refs_;
  std::map<std::string, int> servers_by_id_;  // index into refs_ and services_
  std::vector<std::unique_ptr<ParameterStore>> stores_;
  std::vector<std::unique_ptr<ParameterServiceImpl>> services_;
  InProcessTransport transport_;
  v1::ShardMap map_;
};

// The scheduler's side of the trainers' hooks for one job: assignments per
// worker, the reports they send, and the end of the job once every
// partition reported DONE.
class JobHarness {
 public:
  explicit JobHarness(InProcessCluster* cluster) : cluster_(cluster) {}

  void Assign(const std::string& worker, v1::Assignment assignment) {
    MutexLock lock(&mu_);
    assignments_[worker] = std::move(assignment);
  }

  TrainerHooks Hooks(const std::string& worker) {
    TrainerHooks hooks;
    hooks.report = [this, worker](v1::WorkReport report) {
      MutexLock lock(&mu_);
      if (report.kind() == v1::WorkReport::DONE) {
        for (int32_t p : report.partitions()) done_.insert(p);
        if (static_cast<int>(done_.size()) == cluster_->partitions()) ended_ = true;  // the job succeeded
      }
      reports_[worker].push_back(std::move(report));
    };
    hooks.should_stop = [this] {
      MutexLock lock(&mu_);
      return ended_ || withdrawn_;
    };
    hooks.latest_assignment = [this, worker] {
      MutexLock lock(&mu_);
      return assignments_[worker];
    };
    hooks.wait_for_change = [this, worker](int64_t epoch, absl::Duration timeout) {
      MutexLock lock(&mu_);
      auto changed = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return ended_ || withdrawn_ || assignments_[worker].membership_epoch() > epoch;
      };
      mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
      return assignments_[worker];
    };
    hooks.observe_prefetch = [this](bool used) {
      MutexLock lock(&mu_);
      if (used) ++prefetches_used_;
    };
    hooks.watch_client = [this](ParameterClient* client, const std::string&) {
      MutexLock lock(&mu_);
      if (client != nullptr) ++clients_;
    };
    hooks.observe_staleness = [this](int64_t staleness) {
      MutexLock lock(&mu_);
      max_staleness_ = std::max(max_staleness_, staleness);
    };
    return hooks;
  }

  // Runs one Trainer per entry of `workers` (worker id -> partitions) in
  // threads until each returns; their statuses by worker.
  std::map<std::string, absl::Status> Run(const std::map<std::string, std::vector<int32_t>>& workers,
                                          TransferOptions transfer = {}) {
    std::map<std::string, absl::Status> results;
    for (const auto& [worker, partitions] : workers) {
      Assign(worker, cluster_->AssignmentFor(partitions));
      results[worker] = absl::UnknownError("did not run");
    }
    std::vector<std::thread> threads;
    for (auto& [worker, result] : results) {
      threads.emplace_back([this, transfer, id = worker, status = &result] {
        std::unique_ptr<kernels::Backend> backend = kernels::MakeCpuBackend();
        Trainer trainer(id, backend.get(), Hooks(id), transfer, {}, cluster_->transport());
        const v1::Assignment assignment = Hooks(id).latest_assignment();
        *status = trainer.Load(assignment);
        if (status->ok()) *status = trainer.Train(assignment);
      });
    }
    for (std::thread& thread : threads) thread.join();
    return results;
  }

  void Withdraw() {
    MutexLock lock(&mu_);
    withdrawn_ = true;
  }
  std::vector<v1::WorkReport> Reports(const std::string& worker) {
    MutexLock lock(&mu_);
    return reports_[worker];
  }
  std::set<int32_t> done() {
    MutexLock lock(&mu_);
    return done_;
  }
  int64_t prefetches_used() {
    MutexLock lock(&mu_);
    return prefetches_used_;
  }
  // Parameter clients the trainers made (one per shard map they used).
  int64_t clients() {
    MutexLock lock(&mu_);
    return clients_;
  }
  int64_t max_staleness() {
    MutexLock lock(&mu_);
    return max_staleness_;
  }

 private:
  InProcessCluster* const cluster_;
  Mutex mu_;
  std::map<std::string, v1::Assignment> assignments_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<v1::WorkReport>> reports_ ABSL_GUARDED_BY(mu_);
  std::set<int32_t> done_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool withdrawn_ ABSL_GUARDED_BY(mu_) = false;
  int64_t prefetches_used_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_staleness_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t clients_ ABSL_GUARDED_BY(mu_) = 0;
};

// A BSP job of 2 data partitions on 2 servers, trained by `workers` (id ->
// partitions) with `transfer`; `fault` (optional) is the transport's fault
// hook meanwhile.
struct BspResult {
  std::vector<std::vector<float>> params;
  std::vector<ExampleAudit> audits;
  std::map<std::string, absl::Status> statuses;
  int64_t prefetches_used = 0;
  std::vector<v1::WorkReport> reports;  // of the first worker
};

BspResult RunBsp(const std::map<std::string, std::vector<int32_t>>& workers, TransferOptions transfer = {},
                 InProcessTransport::Fault fault = nullptr, const v1::JobSpec& spec = Spec(v1::BSP, 2)) {
  InProcessCluster cluster(2, spec, spec.num_workers());
  EXPECT_TRUE(cluster.Setup().ok());
  cluster.transport()->set_fault(std::move(fault));
  JobHarness harness(&cluster);
  BspResult result;
  result.statuses = harness.Run(workers, transfer);
  cluster.transport()->set_fault(nullptr);
  std::set<int32_t> partitions;
  for (int32_t p = 0; p < spec.num_workers(); ++p) partitions.insert(p);
  EXPECT_EQ(harness.done(), partitions);
  auto params = cluster.Params(cluster.total_steps());
  EXPECT_TRUE(params.ok()) << params.status();
  if (params.ok()) result.params = *std::move(params);
  result.audits = cluster.Audits();
  result.prefetches_used = harness.prefetches_used();
  result.reports = harness.Reports(workers.begin()->first);
  return result;
}

// Each chunk accepted the gradients of every example of every epoch once.
void ExpectEveryExampleOnce(const v1::JobSpec& spec, const std::vector<ExampleAudit>& audits) {
  const ExampleAudit expected = ExpectedExampleAudit(spec, kExamples);
  ASSERT_FALSE(audits.empty());
  for (size_t c = 0; c < audits.size(); ++c) {
    EXPECT_EQ(audits[c].examples, expected.examples) << "chunk " << c;
    EXPECT_EQ(audits[c].digest, expected.digest) << "chunk " << c;
  }
}

// The cluster's job ended with `expected` parameters and every example of
// every epoch counted once.
void ExpectFinishedAs(InProcessCluster* cluster, const std::vector<std::vector<float>>& expected) {
  auto params = cluster->Params(cluster->total_steps());
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_EQ(*params, expected);
  ExpectEveryExampleOnce(cluster->spec(), cluster->Audits());
}

TEST(TrainerTest, BspTrainsEveryStepAndEvaluatesAtEpochEnds) {
  BspResult run = RunBsp({{"w0", {0, 1}}});
  EXPECT_TRUE(run.statuses["w0"].ok()) << run.statuses["w0"];
  ExpectEveryExampleOnce(Spec(v1::BSP, 2), run.audits);
  // The last step's parameters were prefetched while its pushes went out.
  EXPECT_GT(run.prefetches_used, 0);
  std::vector<int64_t> evaluated;
  double last_accuracy = 0;
  for (const v1::WorkReport& report : run.reports) {
    if (report.kind() != v1::WorkReport::EVAL) continue;
    evaluated.push_back(report.step());
    last_accuracy = report.test_accuracy();
  }
  const int64_t steps_per_epoch = DataPartitioning(kExamples, kBatch, 2).steps_per_epoch();
  EXPECT_EQ(evaluated, (std::vector<int64_t>{steps_per_epoch, 2 * steps_per_epoch}));
  EXPECT_GT(last_accuracy, 1.5 / kClasses);  // learned something: well above chance
}

TEST(TrainerTest, BspParametersAreBitIdenticalWhoeverComputesThePartitions) {
  BspResult one = RunBsp({{"w0", {0, 1}}});
  BspResult two = RunBsp({{"w0", {0}}, {"w1", {1}}});
  TransferOptions sequential;
  sequential.overlap_push = false;
  sequential.prefetch_pull = false;
  BspResult unoverlapped = RunBsp({{"w0", {1, 0}}}, sequential);
  for (const auto& [worker, status] : two.statuses) EXPECT_TRUE(status.ok()) << worker << ": " << status;
  ASSERT_FALSE(one.params.empty());
  EXPECT_EQ(one.params, two.params);
  EXPECT_EQ(one.params, unoverlapped.params);
  EXPECT_EQ(unoverlapped.prefetches_used, 0);
}

// The largest difference between two runs' parameters, checking that each
// lies within `relative` of the other (plus a small absolute slack).
double ExpectParamsNear(const std::vector<std::vector<float>>& actual,
                        const std::vector<std::vector<float>>& expected, double relative) {
  double largest = 0;
  EXPECT_EQ(actual.size(), expected.size());
  for (size_t t = 0; t < std::min(actual.size(), expected.size()); ++t) {
    EXPECT_EQ(actual[t].size(), expected[t].size());
    for (size_t i = 0; i < std::min(actual[t].size(), expected[t].size()); ++i) {
      EXPECT_NEAR(actual[t][i], expected[t][i], relative * std::fabs(expected[t][i]) + 1e-6)
          << "tensor " << t << " element " << i;
      largest = std::max<double>(largest, std::fabs(actual[t][i] - expected[t][i]));
    }
  }
  return largest;
}

// data.gradientAccumulation: 4 micro-batches of 4 examples a step train the
// same model as batches of 16, within float rounding, over the same steps
// and examples.
TEST(TrainerTest, GradientAccumulationOfMicroBatchesEqualsOneBatchOfTheirSize) {
  const BspResult whole = RunBsp({{"w0", {0, 1}}});
  v1::JobSpec spec = Spec(v1::BSP, 2);
  spec.mutable_data()->set_batch_size(kBatch / 4);
  spec.mutable_data()->set_gradient_accumulation(4);
  const BspResult micro = RunBsp({{"w0", {0}}, {"w1", {1}}}, {}, nullptr, spec);
  for (const auto& [worker, status] : micro.statuses) EXPECT_TRUE(status.ok()) << worker << ": " << status;
  ExpectEveryExampleOnce(spec, micro.audits);
  // Not the same code path in disguise: the sums were taken in another order.
  EXPECT_GT(ExpectParamsNear(micro.params, whole.params, 1e-4), 0.0);
  // The same steps: evaluations at the same epoch ends.
  auto evaluated = [](const BspResult& run) {
    std::vector<int64_t> steps;
    for (const v1::WorkReport& report : run.reports) {
      if (report.kind() == v1::WorkReport::EVAL) steps.push_back(report.step());
    }
    return steps;
  };
  EXPECT_FALSE(evaluated(whole).empty());
  EXPECT_EQ(evaluated(micro), evaluated(whole));
}

// localSgd with one partition and an outer SGD of rate 1 is plain SGD: 4
// local steps of 4 examples at rate 0.05 a push train the model that batches
// of 4 at rate 0.05 train over the same examples in the same order, with a
// quarter of the pushes.
TEST(TrainerTest, LocalSgdOfOnePartitionWithAnOuterRateOfOneIsPlainSgd) {
  v1::JobSpec plain = Spec(v1::BSP, 1);
  plain.mutable_data()->set_batch_size(4);
  plain.mutable_optimizer()->set_lr(0.05f);
  plain.mutable_optimizer()->set_momentum(0);
  const BspResult sgd = RunBsp({{"w0", {0}}}, {}, nullptr, plain);
  v1::JobSpec local = plain;
  local.mutable_optimizer()->set_lr(1.0f);
  local.mutable_local_sgd()->set_steps(4);
  local.mutable_local_sgd()->set_lr(0.05f);
  const BspResult run = RunBsp({{"w0", {0}}}, {}, nullptr, local);
  EXPECT_TRUE(run.statuses.at("w0").ok()) << run.statuses.at("w0");
  ExpectEveryExampleOnce(local, run.audits);
  ExpectParamsNear(run.params, sgd.params, 1e-4);
}

// Local SGD computed here on the host, step by step: each partition's
// local_sgd.steps SGD steps from the current parameters over its examples,
// then the outer SGD step (no momentum) over the mean of how far they moved.
std::vector<std::vector<float>> LocalSgdReference(const v1::JobSpec& spec, std::vector<std::vector<float>> w) {
  std::unique_ptr<kernels::Backend> backend = kernels::MakeCpuBackend();
  kernels::Mlp mlp(LayoutFor(spec, kFeatures, kClasses).config, backend.get());
  const Dataset data = MakeSynthetic(spec.seed(), kExamples, kFeatures, kClasses, 0);
  const int partitions = spec.num_workers(), batch = spec.data().batch_size();
  const DataPartitioning parts(kExamples, StepBatchSize(spec), partitions);
  std::vector<std::vector<float>> local, grads, moved;
  std::vector<float> x(static_cast<size_t>(batch) * kFeatures);
  std::vector<int32_t> y(batch);
  for (int64_t step = 0; step < parts.steps_per_epoch() * kEpochs; ++step) {
    const std::vector<int64_t> perm =
        EpochPermutation(spec.data().shuffle_seed(), parts.EpochOf(step), kExamples);
    moved.assign(w.size(), {});
    for (size_t t = 0; t < w.size(); ++t) moved[t].assign(w[t].size(), 0.0f);
    for (int p = 0; p < partitions; ++p) {
      local = w;
      grads = w;
      for (int h = 0; h < spec.local_sgd().steps(); ++h) {
        for (int i = 0; i < batch; ++i) {
          const int64_t example = perm[parts.FirstRow(step, p) + int64_t{h} * batch + i];
          std::copy_n(data.features.begin() + example * kFeatures, kFeatures, x.begin() + int64_t{i} * kFeatures);
          y[i] = data.labels[example];
        }
        std::vector<const float*> params;
        std::vector<float*> grad_ptrs;
        for (auto& tensor : local) params.push_back(tensor.data());
        for (auto& tensor : grads) grad_ptrs.push_back(tensor.data());
        EXPECT_TRUE(mlp.ForwardBackward(params, x.data(), y.data(), batch, grad_ptrs, nullptr).ok());
        for (size_t t = 0; t < w.size(); ++t) {
          for (size_t e = 0; e < w[t].size(); ++e) local[t][e] -= spec.local_sgd().lr() * grads[t][e];
        }
      }
      for (size_t t = 0; t < w.size(); ++t) {
        for (size_t e = 0; e < w[t].size(); ++e) moved[t][e] += w[t][e] - local[t][e];
      }
    }
    for (size_t t = 0; t < w.size(); ++t) {
      for (size_t e = 0; e < w[t].size(); ++e) w[t][e] -= spec.optimizer().lr() * moved[t][e] / partitions;
    }
  }
  return w;
}

// localSgd over two partitions in BSP, outer SGD of rate 1: every update is
// the average of the two partitions' local models (as computed here on the
// host), whichever worker computes them, and every example is used once.
TEST(TrainerTest, LocalSgdAveragesThePartitionsLocalModels) {
  v1::JobSpec spec = Spec(v1::BSP, 2);
  spec.mutable_optimizer()->set_lr(1.0f);
  spec.mutable_optimizer()->set_momentum(0);
  spec.mutable_data()->set_batch_size(4);
  spec.mutable_local_sgd()->set_steps(4);
  spec.mutable_local_sgd()->set_lr(0.05f);
  const BspResult one = RunBsp({{"w0", {0, 1}}}, {}, nullptr, spec);
  const BspResult two = RunBsp({{"w0", {1}}, {"w1", {0}}}, {}, nullptr, spec);
  for (const auto& [worker, status] : two.statuses) EXPECT_TRUE(status.ok()) << worker << ": " << status;
  ExpectEveryExampleOnce(spec, two.audits);
  EXPECT_EQ(one.params, two.params);
  InProcessCluster fresh(2, spec, 2);
  ASSERT_TRUE(fresh.Setup().ok());
  auto initial = fresh.Params(0);
  ASSERT_TRUE(initial.ok()) << initial.status();
  const std::vector<std::vector<float>> expected = LocalSgdReference(spec, *initial);
  EXPECT_NE(expected, *initial);
  ExpectParamsNear(two.params, expected, 1e-4);
  // Learned something: the last evaluation well above chance.
  double last_accuracy = 0;
  for (const v1::WorkReport& report : one.reports) {
    if (report.kind() == v1::WorkReport::EVAL) last_accuracy = report.test_accuracy();
  }
  EXPECT_GT(last_accuracy, 1.5 / kClasses);
}

// localSgd's deltas travel like gradients: in a 16-bit wire format, INT8
// compressed (error feedback keeps what rounding leaves out) and in ASP. Each
// such job runs through, uses every example once and learns.
TEST(TrainerTest, LocalSgdDeltasTravelInEveryWireFormatAndMode) {
  struct Variant {
    const char* name;
    std::function<void(v1::JobSpec*)> set;
  };
  const std::vector<Variant> variants = {
      {"bf16 wire", [](v1::JobSpec* s) { s->set_wire_format(v1::WIRE_BF16); }},
      {"int8 compression", [](v1::JobSpec* s) { s->mutable_compression()->set_kind(v1::CompressionSpec::INT8); }},
      {"ASP", [](v1::JobSpec* s) { s->set_mode(v1::ASP); }},
  };
  for (const Variant& variant : variants) {
    SCOPED_TRACE(variant.name);
    v1::JobSpec spec = Spec(v1::BSP, 2);
    spec.mutable_optimizer()->set_lr(1.0f);
    spec.mutable_optimizer()->set_momentum(0);
    spec.mutable_data()->set_batch_size(4);
    spec.mutable_local_sgd()->set_steps(4);
    spec.mutable_local_sgd()->set_lr(0.1f);
    variant.set(&spec);
    ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
    InProcessCluster cluster(2, spec, 2);
    ASSERT_TRUE(cluster.Setup().ok());
    JobHarness harness(&cluster);
    auto statuses = harness.Run({{"w0", {0}}, {"w1", {1}}});
    for (const auto& [worker, status] : statuses) {
      // ASP trainers return once the job ends after they are through.
      EXPECT_TRUE(status.ok() || (spec.mode() == v1::ASP && absl::IsCancelled(status))) << worker << ": " << status;
    }
    EXPECT_EQ(harness.done(), (std::set<int32_t>{0, 1}));
    ExpectEveryExampleOnce(spec, cluster.Audits());
    double last_accuracy = 0;
    for (const v1::WorkReport& report : harness.Reports("w0")) {
      if (report.kind() == v1::WorkReport::EVAL) last_accuracy = report.test_accuracy();
    }
    EXPECT_GT(last_accuracy, 1.5 / kClasses);
  }
}

// A pull a busy server refuses (RESOURCE_EXHAUSTED "server busy": its pull
// answers in flight at their bound) is sent again after a short backoff,
// without counting as an attempt, until its deadline: a whole Pull and a
// PullStream each get every value past more refusals than attempts.
TEST(TrainerTest, PullsRefusedAsBusyAreSentAgainUntilTheirDeadline) {
  InProcessCluster cluster(2, Spec(v1::ASP, 1), 1);
  ASSERT_TRUE(cluster.Setup().ok());
  const absl::StatusOr<std::vector<std::vector<float>>> expected = cluster.Params(0);
  ASSERT_TRUE(expected.ok()) << expected.status();
  constexpr int kRefusals = 12;  // past the 5 attempts UNAVAILABLE gets
  std::atomic<int> refusals{0};
  std::atomic<int> most{kRefusals};
  cluster.transport()->set_fault(
      [&](const std::string&, ParameterTransport::Method method, InProcessTransport::Stage stage) {
        if (method != ParameterTransport::Method::kPull ||
            stage != InProcessTransport::Stage::kBeforeServer || refusals.fetch_add(1) >= most) {
          return absl::OkStatus();
        }
        return absl::ResourceExhaustedError(absl::StrCat(kServerBusy, ": pulls in flight hold 5 bytes"));
      });
  const absl::StatusOr<std::vector<std::vector<float>>> pulled = cluster.Params(0);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(*pulled, *expected);
  EXPECT_GT(refusals, kRefusals);

  refusals = 0;
  const v1::ShardMap map = cluster.AssignmentFor({0}).shard_map();
  ParameterClient client(map, kJob, "w0", nullptr, v1::WIRE_FP32, cluster.transport());
  std::vector<std::vector<float>> streamed = client.MakeBuffers();
  std::unique_ptr<ParameterClient::PullStream> stream = client.StartPull(0, kRpcTimeout, &streamed);
  std::vector<int> tensors;
  for (int t = 0; t < map.tensors_size(); ++t) tensors.push_back(t);
  stream->Fetch(tensors);
  const absl::Status finished = stream->Finish(nullptr);
  ASSERT_TRUE(finished.ok()) << finished;
  EXPECT_EQ(streamed, *expected);
  EXPECT_GT(refusals, kRefusals);

  // Refused until its deadline: a slow step to the training loops, naming
  // the refusal (RESOURCE_EXHAUSTED would fail the job).
  refusals = 0;
  most = INT32_MAX;
  std::vector<std::vector<float>> params = client.MakeBuffers();
  const absl::Time start = absl::Now();
  const absl::Status refused = client.Pull(0, absl::Milliseconds(300), &params);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDeadlineExceeded) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), kServerBusy)) << refused;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << refused;
  cluster.transport()->set_fault(nullptr);
}

TEST(TrainerTest, LostPushAnswersAreRetriedAndAppliedOnce) {
  BspResult clean = RunBsp({{"w0", {0, 1}}});
  // Every 25th push is applied by its server but its answer is lost, and every
  // 20th pull fails before it gets there: the trainer resends, the servers
  // deduplicate, and nothing changes.
  std::atomic<int> pushes{0}, pulls{0};
  std::atomic<int> lost{0};
  BspResult faulty = RunBsp({{"w0", {0, 1}}}, {}, [&](const std::string&, ParameterTransport::Method method,
                                                      InProcessTransport::Stage stage) {
    if (method == ParameterTransport::Method::kPush && stage == InProcessTransport::Stage::kAfterServer &&
        ++pushes % 25 == 0) {
      ++lost;
      return absl::UnavailableError("connection reset after the push was applied");
    }
    if (method == ParameterTransport::Method::kPull && stage == InProcessTransport::Stage::kBeforeServer &&
        ++pulls % 20 == 0) {
      ++lost;
      return absl::UnavailableError("connection refused");
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(faulty.statuses["w0"].ok()) << faulty.statuses["w0"];
  EXPECT_GT(lost.load(), 2);
  ASSERT_FALSE(clean.params.empty());
  EXPECT_EQ(faulty.params, clean.params);
  ExpectEveryExampleOnce(Spec(v1::BSP, 2), faulty.audits);
}

TEST(TrainerTest, PushesRefusedAsBusyAreSentAgainAndAppliedOnce) {
  BspResult clean = RunBsp({{"w0", {0, 1}}});
  // Every 7th push is refused as busy before it reaches its server: by the
  // server's pull bound, or by gRPC with its threads all taken. Each is
  // sent again; before, a push refused so failed the job.
  std::atomic<int> pushes{0}, refused{0};
  BspResult busy =
      RunBsp({{"w0", {0, 1}}}, {},
             [&](const std::string&, ParameterTransport::Method method, InProcessTransport::Stage stage) {
               if (method != ParameterTransport::Method::kPush ||
                   stage != InProcessTransport::Stage::kBeforeServer || ++pushes % 7 != 0) {
                 return absl::OkStatus();
               }
               return ++refused % 2 == 0
                          ? absl::ResourceExhaustedError(kGrpcThreadsExhausted)
                          : absl::ResourceExhaustedError(absl::StrCat(kServerBusy, ": 5 bytes in flight"));
             });
  EXPECT_TRUE(busy.statuses["w0"].ok()) << busy.statuses["w0"];
  EXPECT_GT(refused.load(), 2);
  ASSERT_FALSE(clean.params.empty());
  EXPECT_EQ(busy.params, clean.params);
  ExpectEveryExampleOnce(Spec(v1::BSP, 2), busy.audits);
}

// Pushes lend the transport slices over the worker's gradient buffers. A
// transport that keeps some requests alive after their calls ended (gRPC
// with a write stuck on a paused server) must see them unchanged: the
// worker does not write the next step's gradients where they point but goes
// on with fresh buffers, and the job ends as it would have.
TEST(TrainerTest, GradientsLentToAStuckWriteAreNeverOverwritten) {
  v1::JobSpec spec = Spec(v1::BSP, 2);
  spec.mutable_model()->set_hidden_sizes(0, 300);  // 1200-byte chunks: payloads big enough to be lent, not inlined
  constexpr int64_t kBigChunk = 300;
  std::vector<std::vector<float>> clean;
  {
    InProcessCluster cluster(2, spec, 2, kBigChunk);
    ASSERT_TRUE(cluster.Setup().ok());
    JobHarness harness(&cluster);
    auto statuses = harness.Run({{"w0", {0, 1}}});
    ASSERT_TRUE(statuses["w0"].ok()) << statuses["w0"];
    auto params = cluster.Params(cluster.total_steps());
    ASSERT_TRUE(params.ok()) << params.status();
    clean = *std::move(params);
  }
  InProcessCluster cluster(2, spec, 2, kBigChunk);
  ASSERT_TRUE(cluster.Setup().ok());
  std::atomic<int> pushes{0};
  cluster.transport()->set_keep([&](ParameterTransport::Method method) {
    return method == ParameterTransport::Method::kPush && ++pushes % 17 == 0;
  });
  JobHarness harness(&cluster);
  auto statuses = harness.Run({{"w0", {0, 1}}});
  ASSERT_TRUE(statuses["w0"].ok()) << statuses["w0"];
  cluster.transport()->set_keep(nullptr);
  const std::vector<InProcessTransport::Kept> kept = cluster.transport()->TakeKept();
  ASSERT_GE(kept.size(), 3u);
  int lent = 0;  // kept requests with a payload outside their first slice (lent, not copied)
  for (const InProcessTransport::Kept& request : kept) {
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(request.request.Dump(&slices).ok());
    lent += slices.size() > 1 ? 1 : 0;
    EXPECT_TRUE(BufferBytes(request.request) == request.sent) << "a kept request changed after it was sent";
  }
  EXPECT_EQ(lent, static_cast<int>(kept.size()));
  ExpectFinishedAs(&cluster, clean);
}

TEST(TrainerTest, BspFollowsANewShardMapAndLosesNothing) {
  BspResult clean = RunBsp({{"w0", {0, 1}}});
  InProcessCluster cluster(2, Spec(v1::BSP, 2), 2);
  ASSERT_TRUE(cluster.Setup().ok());
  JobHarness harness(&cluster);
  // Halfway through, the servers move to map version 2: the worker's
  // requests at version 1 are refused (ABORTED), and it must pick up the
  // new assignment and go on where it was.
  std::atomic<int> pushes{0};
  std::atomic<bool> moved{false};
  cluster.transport()->set_fault([&](const std::string&, ParameterTransport::Method method,
                                     InProcessTransport::Stage stage) {
    if (method == ParameterTransport::Method::kPush && stage == InProcessTransport::Stage::kBeforeServer &&
        ++pushes == 20) {
      EXPECT_TRUE(cluster.BumpMapVersion().ok());
      harness.Assign("w0", cluster.AssignmentFor({0, 1}, /*membership_epoch=*/2));
      moved = true;
    }
    return absl::OkStatus();
  });
  auto statuses = harness.Run({{"w0", {0, 1}}});
  cluster.transport()->set_fault(nullptr);
  EXPECT_TRUE(moved.load());
  EXPECT_EQ(harness.clients(), 2);  // it switched to the new map once
  EXPECT_TRUE(statuses["w0"].ok()) << statuses["w0"];
  ExpectFinishedAs(&cluster, clean.params);
}

// Runs `spec` with worker w0 killed right after push request `kill_at` (its
// last request applied, its answer and everything after lost), then w1 on
// every partition; the job must end with `expected`, every example once.
void KillAfterPushThenFinish(const v1::JobSpec& spec, int kill_at, const std::vector<std::vector<float>>& expected) {
  SCOPED_TRACE(absl::StrCat("killed after push request ", kill_at));
  InProcessCluster cluster(2, spec, 2);
  ASSERT_TRUE(cluster.Setup().ok());
  JobHarness dying(&cluster);
  std::atomic<int> pushes{0};
  std::atomic<bool> dead{false};
  cluster.transport()->set_fault([&](const std::string&, ParameterTransport::Method method,
                                     InProcessTransport::Stage stage) {
    if (dead.load()) return absl::UnavailableError("the worker is dead");
    if (method == ParameterTransport::Method::kPush && stage == InProcessTransport::Stage::kAfterServer &&
        ++pushes == kill_at) {
      dead = true;
      // The dead trainer must notice that it is out (it would otherwise
      // retry for seconds): a new map and a withdrawn assignment.
      EXPECT_TRUE(cluster.BumpMapVersion().ok());
      dying.Assign("w0", cluster.AssignmentFor({0, 1}, /*membership_epoch=*/2));
      dying.Withdraw();
      return absl::UnavailableError("the worker died after the server applied this");
    }
    return absl::OkStatus();
  });
  auto died = dying.Run({{"w0", {0, 1}}});
  cluster.transport()->set_fault(nullptr);
  ASSERT_TRUE(dead.load());
  EXPECT_TRUE(absl::IsCancelled(died["w0"])) << died["w0"];
  JobHarness harness(&cluster);
  auto statuses = harness.Run({{"w1", {0, 1}}});
  EXPECT_TRUE(statuses["w1"].ok()) << statuses["w1"];
  ExpectFinishedAs(&cluster, expected);
}

// A worker dies halfway through its pushes of a step (its last request
// applied, its answer and everything after lost); another takes over its
// partitions. Killed at each of 8 consecutive push requests, this covers
// both takeovers: a partition's push cut short before
// any chunk could complete the step (the newcomer pushes what is missing),
// and one cut short after some chunks completed it while others wait, where
// the newcomer has no parameters of that step and must compute it from the
// values the servers kept from before it (exact pulls). Either way the
// result is bit-identical to an undisturbed run and every example counts once.
TEST(TrainerTest, AStepHalfPushedByAWorkerThatDiedIsFinishedByAnother) {
  BspResult clean = RunBsp({{"w0", {0, 1}}});
  ASSERT_FALSE(clean.params.empty());
  for (int kill_at = 40; kill_at < 48; ++kill_at) KillAfterPushThenFinish(Spec(v1::BSP, 2), kill_at, clean.params);
}

v1::JobSpec LambSpec() {
  v1::JobSpec spec = Spec(v1::BSP, 2);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::LAMB);
  spec.mutable_optimizer()->set_lr(0.05f);
  spec.mutable_optimizer()->set_momentum(0);
  spec.mutable_optimizer()->set_weight_decay(0.01f);
  return spec;
}

// LAMB's trust ratio is a norm over each whole tensor. With the tensors cut
// into chunks of kChunkElems on two servers, each step's norms are summed over the
// chunks by the workers and applied on every chunk: the run equals one
// whose tensors are single chunks on one server (up to the order of the
// norms' double sums), and is bit-identical whoever computes the partitions.
// A trust ratio per chunk would be far from it.
TEST(TrainerTest, LambOverChunksOnSeveralServersIsTheWholeTensorsUpdate) {
  const v1::JobSpec spec = LambSpec();
  auto run = [&spec](int servers, int64_t chunk_elems, const std::map<std::string, std::vector<int32_t>>& workers) {
    InProcessCluster cluster(servers, spec, 2, chunk_elems);
    EXPECT_TRUE(cluster.Setup().ok());
    JobHarness harness(&cluster);
    for (const auto& [worker, status] : harness.Run(workers)) EXPECT_TRUE(status.ok()) << worker << ": " << status;
    ExpectEveryExampleOnce(spec, cluster.Audits());
    auto params = cluster.Params(cluster.total_steps());
    EXPECT_TRUE(params.ok()) << params.status();
    return params.ok() ? *params : std::vector<std::vector<float>>();
  };
  // kChunkElems: 11 chunks; both weight matrices have chunks on both servers.
  const auto chunked = run(2, kChunkElems, {{"w0", {0, 1}}});
  const auto chunked_two_workers = run(2, kChunkElems, {{"w0", {0}}, {"w1", {1}}});
  const auto whole = run(1, int64_t{1} << 20, {{"w0", {0, 1}}});
  ASSERT_FALSE(chunked.empty());
  EXPECT_EQ(chunked, chunked_two_workers);
  ExpectParamsNear(chunked, whole, 1e-4);
  // It trained: the weights moved from their initial values.
  InProcessCluster fresh(1, spec, 2, int64_t{1} << 20);
  ASSERT_TRUE(fresh.Setup().ok());
  auto initial = fresh.Params(0);
  ASSERT_TRUE(initial.ok());
  EXPECT_NE(*initial, whole);
}

// As AStepHalfPushedByAWorkerThatDiedIsFinishedByAnother, with LAMB: a
// worker dies after any of 12 consecutive push requests (gradients, or a
// step's norms, where one server's chunks applied the step and the other's
// still wait for its norms); the newcomer settles what is open and the job
// ends bit-identical.
TEST(TrainerTest, ALambStepLeftHalfDoneByAWorkerThatDiedIsFinishedByAnother) {
  const v1::JobSpec spec = LambSpec();
  BspResult clean = RunBsp({{"w0", {0, 1}}}, {}, nullptr, spec);
  ASSERT_FALSE(clean.params.empty());
  for (int kill_at = 40; kill_at < 52; ++kill_at) KillAfterPushThenFinish(spec, kill_at, clean.params);
}

TEST(TrainerTest, AspRunsEveryPartitionStepOnce) {
  InProcessCluster cluster(2, Spec(v1::ASP, 3), 3);
  ASSERT_TRUE(cluster.Setup().ok());
  JobHarness harness(&cluster);
  auto statuses = harness.Run({{"w0", {0, 1}}, {"w1", {2}}});
  // ASP trainers return once the job ends after they are through.
  for (const auto& [worker, status] : statuses) EXPECT_TRUE(absl::IsCancelled(status)) << worker << ": " << status;
  EXPECT_EQ(harness.done(), (std::set<int32_t>{0, 1, 2}));
  ExpectEveryExampleOnce(cluster.spec(), cluster.Audits());
  // Each partition reported its last step.
  std::map<int32_t, int64_t> last;
  for (const char* worker : {"w0", "w1"}) {
    for (const v1::WorkReport& report : harness.Reports(worker)) {
      for (int i = 0; i < report.partitions_size() && i < report.partition_steps_size(); ++i) {
        last[report.partitions(i)] = std::max(last[report.partitions(i)], report.partition_steps(i));
      }
    }
  }
  EXPECT_EQ(last, (std::map<int32_t, int64_t>{{0, cluster.total_steps()},
                                              {1, cluster.total_steps()},
                                              {2, cluster.total_steps()}}));
}

TEST(TrainerTest, SspKeepsEveryPullWithinTheStalenessBound) {
  v1::JobSpec spec = Spec(v1::SSP, 2);
  spec.set_staleness(1);
  InProcessCluster cluster(2, spec, 2);
  ASSERT_TRUE(cluster.Setup().ok());
  JobHarness harness(&cluster);
  // One partition's pushes are slowed by its own server round trips failing
  // now and then (a retry backs off), so the other runs ahead and must wait.
  std::atomic<int> pushes{0};
  cluster.transport()->set_fault([&](const std::string&, ParameterTransport::Method method,
                                     InProcessTransport::Stage stage) {
    if (method == ParameterTransport::Method::kPush && stage == InProcessTransport::Stage::kBeforeServer &&
        ++pushes % 17 == 0) {
      return absl::UnavailableError("dropped");
    }
    return absl::OkStatus();
  });
  auto statuses = harness.Run({{"w0", {0}}, {"w1", {1}}});
  cluster.transport()->set_fault(nullptr);
  for (const auto& [worker, status] : statuses) EXPECT_TRUE(absl::IsCancelled(status)) << worker << ": " << status;
  EXPECT_EQ(harness.done(), (std::set<int32_t>{0, 1}));
  EXPECT_LE(harness.max_staleness(), 1);
  for (const char* worker : {"w0", "w1"}) {
    for (const v1::WorkReport& report : harness.Reports(worker)) EXPECT_LE(report.max_staleness_seen(), 1);
  }
  ExpectEveryExampleOnce(cluster.spec(), cluster.Audits());
}

TEST(TrainerTest, AWithdrawnAssignmentStopsTraining) {
  InProcessCluster cluster(1, Spec(v1::BSP, 1), 1);
  ASSERT_TRUE(cluster.Setup().ok());
  JobHarness harness(&cluster);
  std::atomic<int> pushes{0};
  cluster.transport()->set_fault([&](const std::string&, ParameterTransport::Method method,
                                     InProcessTransport::Stage stage) {
    if (method == ParameterTransport::Method::kPush && stage == InProcessTransport::Stage::kAfterServer &&
        ++pushes == 5) {
      harness.Withdraw();
    }
    return absl::OkStatus();
  });
  auto statuses = harness.Run({{"w0", {0}}});
  cluster.transport()->set_fault(nullptr);
  EXPECT_TRUE(absl::IsCancelled(statuses["w0"])) << statuses["w0"];
  EXPECT_TRUE(harness.done().empty());
}

}  // namespace
}  // namespace fulcrum
