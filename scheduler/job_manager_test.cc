#include "scheduler/job_manager.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/memory_budget.h"
#include "common/rpc.h"
#include "common/sync.h"
#include "common/table_spec.h"
#include "common/test_util.h"
#include "fulcrum/v1/cluster.pb.h"
#include "fulcrum/v1/job.pb.h"
#include "fulcrum/v1/parameter.pb.h"
#include "gtest/gtest.h"
#include "kernels/model_from_spec.h"
#include "scheduler/admission.h"
#include "scheduler/checkpoint_coordinator.h"
#include "scheduler/membership.h"

namespace fulcrum {
namespace {

// Records the scheduler's calls to the parameter servers.
class FakeServers : public ServerControl {
 public:
  struct Setup {
    std::string address;
    v1::SetupJobRequest request;
  };
  struct Drop {
    std::string address;
    std::string job_id;
    std::string reason;
    bool keep_parameters;
  };

  absl::Status SetupJob(const std::string& address,
                        const v1::SetupJobRequest& request) override {
    std::function<void()> during;
    {
      MutexLock lock(&mu_);
      during = std::exchange(during_setup_, nullptr);
    }
    if (during) during();  // what happens elsewhere while this setup runs
    MutexLock lock(&mu_);
    setups_.push_back({address, request});
    calls_.push_back(absl::StrCat("SetupJob ", address, " v", request.shard_map().version(),
                                  request.await_activation() ? " awaiting activation" : ""));
    auto at = setup_results_at_.find(address);
    return at != setup_results_at_.end() ? at->second : setup_result_;
  }
  absl::Status DropJob(const std::string& address, const std::string& job_id,
                       const std::string& reason, bool keep_parameters, int64_t map_version) override {
    MutexLock lock(&mu_);
    drops_.push_back({address, job_id, reason, keep_parameters});
    calls_.push_back(absl::StrCat("DropJob ", address, " v", map_version));
    return absl::OkStatus();
  }

  absl::Status Reconfigure(const std::string& address, const std::string& /*job_id*/,
                           const v1::ShardMap& map) override {
    MutexLock lock(&mu_);
    reconfigures_.push_back(map);
    calls_.push_back(absl::StrCat("Reconfigure ", address, " v", map.version()));
    return reconfigure_result_;
  }
  absl::Status FreeMovedChunks(const std::string& address, const std::string& /*job_id*/,
                               const v1::ShardMap& map) override {
    MutexLock lock(&mu_);
    calls_.push_back(absl::StrCat("FreeMovedChunks ", address, " v", map.version()));
    return absl::OkStatus();
  }
  void FailReconfigures(absl::Status status) {
    MutexLock lock(&mu_);
    reconfigure_result_ = std::move(status);
  }
  // SetupJob, Reconfigure, FreeMovedChunks and DropJob calls in order, as
  // "SetupJob ADDRESS vVERSION" (+ " awaiting activation"), "Reconfigure
  // ADDRESS vVERSION", "FreeMovedChunks ADDRESS vVERSION" and "DropJob
  // ADDRESS vVERSION".
  std::vector<std::string> calls() const {
    MutexLock lock(&mu_);
    return calls_;
  }
  // Refused unless AnswerCheckpointsFor gave a map: then every chunk and
  // table bucket of the shards the address serves in it, at step 5.
  absl::StatusOr<v1::CheckpointResponse> Checkpoint(const std::string& address,
                                                    const v1::CheckpointRequest& /*request*/) override {
    MutexLock lock(&mu_);
    if (!checkpoint_map_.has_value()) return absl::UnimplementedError("no checkpoints in this fake");
    std::set<int32_t> shards;
    for (const v1::ShardLocation& shard : checkpoint_map_->shards()) {
      const auto& backups = shard.backup_addresses();
      if (shard.address() == address || std::find(backups.begin(), backups.end(), address) != backups.end()) {
        shards.insert(shard.shard());
      }
    }
    v1::CheckpointResponse response;
    response.set_max_version(5);
    response.set_min_version(5);
    auto add = [&response](int32_t chunk_id) {
      v1::CheckpointChunk* chunk = response.add_chunks();
      chunk->set_chunk_id(chunk_id);
      chunk->set_checksum(static_cast<uint32_t>(chunk_id) + 1);
      chunk->set_bytes(100);
    };
    for (const v1::ChunkLocation& chunk : checkpoint_map_->chunks()) {
      if (shards.count(chunk.shard()) > 0) add(chunk.chunk_id());
    }
    for (int t = 0; t < checkpoint_map_->tables_size(); ++t) {
      for (int b = 0; b < checkpoint_map_->tables(t).bucket_shards_size(); ++b) {
        if (shards.count(checkpoint_map_->tables(t).bucket_shards(b)) > 0) add(TableChunkId(t, b));
      }
    }
    return response;
  }
  void AnswerCheckpointsFor(const v1::ShardMap& map) {
    MutexLock lock(&mu_);
    checkpoint_map_ = map;
  }
  absl::Status DeleteCheckpoint(const std::string& address, const std::string& job_id,
                                int64_t checkpoint_id) override {
    MutexLock lock(&mu_);
    deleted_checkpoints_.push_back({address, absl::StrCat(job_id, "/", checkpoint_id)});
    return absl::OkStatus();
  }
  std::vector<std::pair<std::string, std::string>> deleted_checkpoints() const {
    MutexLock lock(&mu_);
    return deleted_checkpoints_;
  }
  std::vector<v1::ShardMap> reconfigures() const {
    MutexLock lock(&mu_);
    return reconfigures_;
  }

  // Runs `during` inside the next SetupJob call, before it answers.
  void DuringNextSetup(std::function<void()> during) {
    MutexLock lock(&mu_);
    during_setup_ = std::move(during);
  }
  void FailSetups(absl::Status status) {
    MutexLock lock(&mu_);
    setup_result_ = std::move(status);
  }
  // Setups on `address` answer `status` (over FailSetups').
  void FailSetupsAt(const std::string& address, absl::Status status) {
    MutexLock lock(&mu_);
    setup_results_at_[address] = std::move(status);
  }
  std::vector<Setup> setups() const {
    MutexLock lock(&mu_);
    return setups_;
  }
  std::vector<Drop> drops() const {
    MutexLock lock(&mu_);
    return drops_;
  }

 private:
  mutable Mutex mu_;
  absl::Status setup_result_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status> setup_results_at_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::ShardMap> checkpoint_map_ ABSL_GUARDED_BY(mu_);
  absl::Status reconfigure_result_ ABSL_GUARDED_BY(mu_);
  std::vector<Setup> setups_ ABSL_GUARDED_BY(mu_);
  std::vector<Drop> drops_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ShardMap> reconfigures_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
  std::function<void()> during_setup_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, std::string>> deleted_checkpoints_ ABSL_GUARDED_BY(mu_);  // address, job/id
};

constexpr char kServerAddress[] = "127.0.0.1:7001";
constexpr int kBatch = 64;
constexpr int kEpochs = 3;
constexpr int64_t kTrainExamples = 1000;
constexpr int kFeatures = 784;
constexpr int kClasses = 10;

v1::JobSpec MlpSpec(int num_workers = 2) {
  v1::JobSpec spec;
  spec.set_name("mlp");
  spec.mutable_model()->set_kind(v1::ModelSpec::MLP);
  spec.mutable_model()->add_hidden_sizes(256);
  spec.mutable_data()->set_dataset(v1::DataSpec::FASHION_MNIST);
  spec.mutable_data()->set_batch_size(kBatch);
  spec.mutable_data()->set_epochs(kEpochs);
  spec.mutable_optimizer()->set_lr(0.1f);
  spec.set_num_workers(num_workers);
  spec.set_seed(7);
  return spec;
}

// A small FM click job (its embeddings in sparse tables) on synthetic data.
v1::JobSpec SmallClickSpec(int num_workers) {
  v1::JobSpec spec;
  spec.set_name("click");
  spec.mutable_model()->set_kind(v1::ModelSpec::FM);
  spec.mutable_model()->set_embedding_dim(4);
  v1::DataSpec* data = spec.mutable_data();
  data->set_dataset(v1::DataSpec::SYNTHETIC_CTR);
  data->mutable_synthetic_ctr()->set_examples(1000);
  data->set_batch_size(10);
  data->set_epochs(1);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
  spec.mutable_optimizer()->set_lr(0.01f);
  spec.set_num_workers(num_workers);
  return spec;
}

// A store in memory whose writes fail while `failing` is set.
class FailableStore final : public KvStore {
 public:
  absl::Status Write(std::vector<std::pair<std::string, std::string>> puts,
                     const std::vector<std::string>& deletes) override {
    if (failing.load()) return absl::UnavailableError("the disk is gone");
    return store_->Write(std::move(puts), deletes);
  }
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(const std::string& prefix) override {
    return store_->Scan(prefix);
  }
  std::atomic<bool> failing{false};

 private:
  std::unique_ptr<KvStore> store_ = NewMemoryStore();
};

class JobManagerTest : public ::testing::Test {
 protected:
  JobManagerTest() {
    options_.chunk_elems = 50000;  // cuts the 784x256 weight unevenly
    manager_ = std::make_unique<JobManager>(options_, &servers_,
                                            [this] { return now_; }, store_.get());
  }

  // A new manager on the same store: the scheduler restarted.
  void Restart() {
    manager_.reset();
    manager_ = std::make_unique<JobManager>(options_, &servers_, [this] { return now_; }, store_.get());
    ASSERT_TRUE(manager_->Recover().ok());
  }

  // Registers a server and a worker, submits `spec` and starts it: the
  // server's one setup.
  void StartOnOneServer(const v1::JobSpec& spec, std::vector<FakeServers::Setup>* setups) {
    RegisterMember(v1::SERVER, kServerAddress);
    workers_.push_back(RegisterMember(v1::WORKER));
    const std::string job_id = SubmitOk(spec);
    manager_->Tick();
    ASSERT_TRUE(ReportKind(workers_[0], job_id, v1::WorkReport::READY).ok());
    manager_->Tick();
    *setups = servers_.setups();
    ASSERT_EQ(setups->size(), 1u);
  }

  std::string RegisterAs(v1::Role role, const std::string& id, const std::string& address = "",
                         const std::vector<std::string>& jobs = {}) {
    v1::RegisterRequest request;
    request.set_role(role);
    request.set_requested_id(id);
    request.set_address(address);
    for (const auto& j : jobs) request.add_jobs(j);
    absl::StatusOr<v1::RegisterResponse> response = manager_->Register(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->member_id() : "";
  }

  void Advance(absl::Duration d) { now_ += d; }
  std::unique_ptr<FailableStore> store_ = std::make_unique<FailableStore>();

  std::string RegisterMember(v1::Role role, const std::string& address = "", int64_t memory_budget = 0) {
    v1::RegisterRequest request;
    request.set_role(role);
    request.set_address(address);
    request.set_memory_budget_bytes(memory_budget);
    absl::StatusOr<v1::RegisterResponse> response = manager_->Register(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->member_id() : "";
  }

  // Registers one server and two workers.
  void RegisterCluster() {
    server_ = RegisterMember(v1::SERVER, kServerAddress);
    workers_.push_back(RegisterMember(v1::WORKER));
    workers_.push_back(RegisterMember(v1::WORKER));
  }

  std::string SubmitOk(v1::JobSpec spec, const std::string& resume_from = "") {
    absl::StatusOr<v1::JobStatus> status = manager_->Submit(std::move(spec), resume_from);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? status->job_id() : "";
  }

  v1::JobStatus GetOk(const std::string& job_id) {
    absl::StatusOr<v1::JobStatus> status = manager_->Get(job_id);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : v1::JobStatus();
  }

  v1::Assignment HeartbeatOk(const std::string& member,
                             const std::string& job_id = "") {
    v1::HeartbeatRequest request;
    request.set_member_id(member);
    request.set_job_id(job_id);
    absl::StatusOr<v1::HeartbeatResponse> response = manager_->Heartbeat(request);
    EXPECT_TRUE(response.ok()) << member << ": " << response.status();
    return response.ok() ? response->assignment() : v1::Assignment();
  }

  absl::Status ReportKind(const std::string& member, const std::string& job_id,
                          v1::WorkReport::Kind kind,
                          int64_t train_examples = kTrainExamples,
                          const std::string& reason = "") {
    v1::WorkReport report;
    report.set_member_id(member);
    report.set_job_id(job_id);
    report.set_kind(kind);
    if (kind == v1::WorkReport::READY) {
      report.set_train_examples(train_examples);
      report.set_test_examples(200);
      report.set_features(kFeatures);
      report.set_classes(kClasses);
    }
    if (kind == v1::WorkReport::DONE) {
      // A worker reports the partitions it finished: those it owns now.
      v1::HeartbeatRequest heartbeat;
      heartbeat.set_member_id(member);
      auto response = manager_->Heartbeat(heartbeat);
      if (response.ok()) {
        for (int32_t p : response->assignment().partitions()) report.add_partitions(p);
      }
    }
    report.set_reason(reason);
    return manager_->Report(report);
  }

  // Registers the cluster and a second server (*second), and runs a 2-worker
  // MLP job with 2 replicas of each shard to training; returns its id.
  std::string StartReplicatedJob(std::string* second) {
    RegisterCluster();
    *second = RegisterMember(v1::SERVER, "127.0.0.1:7002");
    v1::JobSpec spec = MlpSpec();
    spec.set_replicas(2);
    const std::string job_id = SubmitOk(spec);
    manager_->Tick();
    MakeTraining(job_id);
    return job_id;
  }

  // Submits a 2-worker MLP job and runs it to RUNNING/loading.
  std::string StartJob() {
    RegisterCluster();
    const std::string job_id = SubmitOk(MlpSpec());
    manager_->Tick();
    EXPECT_EQ(GetOk(job_id).state(), v1::RUNNING);
    return job_id;
  }

  // A training job that checkpoints every step, with checkpoint 1 queued
  // (no checkpoint thread runs it: it stays WRITING).
  void StartCheckpointOne(std::string* job_id) {
    RegisterCluster();
    v1::JobSpec spec = MlpSpec();
    spec.mutable_checkpoint()->set_every_steps(1);
    *job_id = SubmitOk(spec);
    manager_->Tick();
    MakeTraining(*job_id);
    v1::WorkReport progress;
    progress.set_member_id(workers_[0]);
    progress.set_job_id(*job_id);
    progress.set_kind(v1::WorkReport::PROGRESS);
    progress.set_step(2);
    ASSERT_TRUE(manager_->Report(progress).ok());
    manager_->Tick();  // queues checkpoint 1
  }

  // An ASP click job of `examples` training examples checkpointing every
  // `every_steps`, submitted and run to training in *job_id.
  void StartAspClickJob(int64_t examples, int64_t every_steps, int keep_last, std::string* job_id) {
    v1::JobSpec spec = SmallClickSpec(2);
    spec.set_replicas(1);
    spec.set_mode(v1::ASP);
    spec.mutable_data()->mutable_synthetic_ctr()->set_examples(examples);
    spec.mutable_checkpoint()->set_every_steps(every_steps);
    spec.mutable_checkpoint()->set_keep_last(keep_last);
    RegisterCluster();
    *job_id = SubmitOk(spec);
    manager_->Tick();
    for (const std::string& w : workers_)
      ASSERT_TRUE(ReportKind(w, *job_id, v1::WorkReport::READY, examples).ok());
    manager_->Tick();
    ASSERT_EQ(GetOk(*job_id).reason(), "training");
  }

  // Worker 0 reports progress at `step`; a tick follows.
  void ProgressTo(const std::string& job_id, int64_t step) {
    v1::WorkReport report;
    report.set_member_id(workers_[0]);
    report.set_job_id(job_id);
    report.set_kind(v1::WorkReport::PROGRESS);
    report.set_step(step);
    ASSERT_TRUE(manager_->Report(report).ok());
    manager_->Tick();
  }

  // Runs a started job through READY and shard setup to training.
  void MakeTraining(const std::string& job_id) {
    for (const std::string& w : workers_) {
      ASSERT_TRUE(ReportKind(w, job_id, v1::WorkReport::READY).ok());
    }
    manager_->Tick();
    ASSERT_EQ(GetOk(job_id).state(), v1::RUNNING);
    ASSERT_EQ(GetOk(job_id).reason(), "training");
  }

  SchedulerOptions options_;
  FakeServers servers_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  std::unique_ptr<JobManager> manager_;
  std::string server_;
  std::vector<std::string> workers_;
};

TEST_F(JobManagerTest, SubmittedJobIsPendingWaitingForWorkers) {
  const std::string job_id = SubmitOk(MlpSpec());
  v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::PENDING);
  EXPECT_TRUE(Contains(status.reason(), "worker"));
  EXPECT_EQ(status.spec().num_workers(), 2);
  // Defaults were applied.
  EXPECT_EQ(status.spec().mode(), v1::BSP);

  // One worker and no server: still pending, and the reason says why.
  RegisterMember(v1::WORKER);
  manager_->Tick();
  status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::PENDING);
  EXPECT_TRUE(Contains(status.reason(), "needs 2 workers"));
  EXPECT_TRUE(Contains(status.reason(), "(1 registered)"));
  EXPECT_TRUE(Contains(status.reason(), "(0 registered)"));
  // Both workers and a server, one worker busy elsewhere: waiting.
  RegisterMember(v1::WORKER);
  RegisterMember(v1::SERVER, kServerAddress);
  v1::JobSpec other = MlpSpec(1);
  other.set_name("other");
  const std::string first = SubmitOk(other);  // queued behind job_id, which now starts
  manager_->Tick();
  EXPECT_EQ(GetOk(job_id).state(), v1::RUNNING);
  EXPECT_EQ(GetOk(first).state(), v1::PENDING);
  EXPECT_TRUE(Contains(GetOk(first).reason(), "0 of 1 workers idle")) << GetOk(first).reason();
}

// On a cluster whose jobs get 2 replicas by default, a click job that names
// none runs with one (its tables are not replicated yet) and says so; one
// that asks for 2 is refused naming the field.
// Sparse tables are replicated like the dense chunks: a click job takes the
// cluster's default replica count, or the one it asks for.
TEST_F(JobManagerTest, ClickJobTakesTheClusterDefaultReplicas) {
  SchedulerOptions options = options_;
  options.default_replicas = 2;
  std::unique_ptr<KvStore> store = NewMemoryStore();
  JobManager manager(options, &servers_, [this] { return now_; }, store.get());
  v1::JobSpec spec = SmallClickSpec(1);
  absl::StatusOr<v1::JobStatus> submitted = manager.Submit(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_EQ(submitted->spec().replicas(), 2);
  spec.set_replicas(3);
  absl::StatusOr<v1::JobStatus> three = manager.Submit(spec);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->spec().replicas(), 3);
}

TEST_F(JobManagerTest, AssignsLoadToWorkersWithDistinctRanks) {
  const std::string job_id = StartJob();
  v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::RUNNING);
  EXPECT_EQ(status.workers_size(), 2);

  std::set<int> ranks;
  for (const std::string& w : workers_) {
    v1::Assignment a = HeartbeatOk(w);
    EXPECT_EQ(a.job_id(), job_id);
    EXPECT_EQ(a.phase(), v1::Assignment::LOAD);
    EXPECT_EQ(a.world_size(), 2);
    EXPECT_EQ(a.spec().data().batch_size(), kBatch);
    ranks.insert(a.rank());
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));
  // No server work before the workers are ready.
  EXPECT_TRUE(servers_.setups().empty());
  // A server's heartbeat carries no assignment.
  EXPECT_TRUE(HeartbeatOk(server_).job_id().empty());
}

TEST_F(JobManagerTest, ReadyWorkersLeadToSetupCoveringEveryElementOnce) {
  const std::string job_id = StartJob();
  ASSERT_TRUE(ReportKind(workers_[0], job_id, v1::WorkReport::READY).ok());
  manager_->Tick();
  EXPECT_TRUE(servers_.setups().empty()) << "set up before every worker was ready";
  ASSERT_TRUE(ReportKind(workers_[1], job_id, v1::WorkReport::READY).ok());
  manager_->Tick();

  const std::vector<FakeServers::Setup> setups = servers_.setups();
  ASSERT_EQ(setups.size(), 1u);
  const v1::SetupJobRequest& request = setups[0].request;
  EXPECT_EQ(setups[0].address, kServerAddress);
  EXPECT_EQ(request.job_id(), job_id);
  EXPECT_EQ(request.num_partitions(), 2);
  const int64_t steps_per_epoch = kTrainExamples / (kBatch * 2);
  EXPECT_EQ(request.total_steps(), steps_per_epoch * kEpochs);
  EXPECT_EQ(request.spec().seed(), 7u);

  v1::JobStatus status = GetOk(job_id);
  ASSERT_EQ(status.state(), v1::RUNNING);
  const v1::ShardMap& map = status.shard_map();
  ASSERT_EQ(map.tensors_size(), 4);
  const std::vector<std::vector<int64_t>> shapes = {
      {kFeatures, 256}, {256}, {256, kClasses}, {kClasses}};
  int64_t total = 0;
  for (int t = 0; t < map.tensors_size(); ++t) {
    std::vector<int64_t> shape(map.tensors(t).shape().begin(),
                               map.tensors(t).shape().end());
    EXPECT_EQ(shape, shapes[t]) << "tensor " << t;
    int64_t product = 1;
    for (int64_t d : shape) product *= d;
    EXPECT_EQ(map.tensors(t).size(), product);
    total += product;
  }
  EXPECT_EQ(status.num_parameters(), total);
  EXPECT_EQ(status.num_parameters(), 784 * 256 + 256 + 256 * 10 + 10);

  // Every element of every tensor is in exactly one chunk of the request.
  std::vector<std::vector<int>> covered(map.tensors_size());
  for (int t = 0; t < map.tensors_size(); ++t) {
    covered[t].assign(map.tensors(t).size(), 0);
  }
  std::set<int32_t> chunk_ids;
  const ModelLayout layout = LayoutFor(request.spec(), kFeatures, kClasses);
  for (const v1::ChunkSetup& chunk : request.chunks()) {
    EXPECT_TRUE(chunk_ids.insert(chunk.chunk_id()).second)
        << "chunk " << chunk.chunk_id() << " twice";
    ASSERT_GE(chunk.tensor(), 0);
    ASSERT_LT(chunk.tensor(), map.tensors_size());
    ASSERT_GT(chunk.length(), 0);
    ASSERT_LE(chunk.length(), options_.chunk_elems);
    ASSERT_GE(chunk.offset(), 0);
    ASSERT_LE(chunk.offset() + chunk.length(), map.tensors(chunk.tensor()).size());
    for (int64_t i = chunk.offset(); i < chunk.offset() + chunk.length(); ++i) {
      ++covered[chunk.tensor()][i];
    }
    const auto& tensor = layout.tensors[chunk.tensor()];
    EXPECT_EQ(chunk.init(), tensor.init == InitKind::kUniform
                                ? v1::ChunkSetup::UNIFORM
                                : v1::ChunkSetup::ZEROS);
    EXPECT_EQ(chunk.init_scale(), tensor.init_scale);
  }
  for (int t = 0; t < map.tensors_size(); ++t) {
    for (size_t i = 0; i < covered[t].size(); ++i) {
      ASSERT_EQ(covered[t][i], 1) << "tensor " << t << " element " << i;
    }
  }
  // The request's chunks are the shard map's chunks.
  ASSERT_EQ(map.chunks_size(), request.chunks_size());
  for (const v1::ChunkLocation& loc : map.chunks()) {
    bool found = false;
    for (const v1::ChunkSetup& chunk : request.chunks()) {
      if (chunk.chunk_id() != loc.chunk_id()) continue;
      found = true;
      EXPECT_EQ(chunk.tensor(), loc.tensor());
      EXPECT_EQ(chunk.offset(), loc.offset());
      EXPECT_EQ(chunk.length(), loc.length());
    }
    EXPECT_TRUE(found) << "chunk " << loc.chunk_id() << " not set up";
    EXPECT_EQ(map.shards(loc.shard()).address(), kServerAddress);
  }

  // Workers now train with the shard map.
  std::set<int> ranks;
  for (const std::string& w : workers_) {
    v1::Assignment a = HeartbeatOk(w, job_id);
    EXPECT_EQ(a.job_id(), job_id);
    EXPECT_EQ(a.phase(), v1::Assignment::TRAIN);
    EXPECT_EQ(a.world_size(), 2);
    EXPECT_EQ(a.steps_per_epoch(), steps_per_epoch);
    EXPECT_EQ(a.total_steps(), steps_per_epoch * kEpochs);
    EXPECT_EQ(a.shard_map().SerializeAsString(), map.SerializeAsString());
    ranks.insert(a.rank());
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));
  EXPECT_EQ(status.progress().total_steps(), steps_per_epoch * kEpochs);
}

TEST_F(JobManagerTest, MaxStepsCapsTotalSteps) {
  RegisterCluster();
  v1::JobSpec spec = MlpSpec();
  spec.mutable_data()->set_max_steps(5);
  const std::string job_id = SubmitOk(spec);
  manager_->Tick();
  MakeTraining(job_id);
  EXPECT_EQ(HeartbeatOk(workers_[0], job_id).total_steps(), 5);
  ASSERT_EQ(servers_.setups().size(), 1u);
  EXPECT_EQ(servers_.setups()[0].request.total_steps(), 5);
}

// An ASP job's evaluating partition lags the others: its evaluation at
// step 40 arrives after progress at steps 50 and 60, and the history lists it
// before them (in step order), not after; later points follow it as they come.
TEST_F(JobManagerTest, ALateEvaluationTakesItsPlaceInTheHistoryByStep) {
  const std::string job_id = StartJob();
  MakeTraining(job_id);
  auto report = [&](v1::WorkReport::Kind kind, int64_t step) {
    Advance(absl::Seconds(1));  // a progress point a second at most
    v1::WorkReport r;
    r.set_member_id(workers_[0]);
    r.set_job_id(job_id);
    r.set_kind(kind);
    r.set_step(step);
    r.set_epoch(1);
    if (kind == v1::WorkReport::EVAL) r.set_test_accuracy(0.5);
    if (kind == v1::WorkReport::PROGRESS) r.set_loss(1.0);
    ASSERT_TRUE(manager_->Report(r).ok());
  };
  ASSERT_NO_FATAL_FAILURE(report(v1::WorkReport::PROGRESS, 30));
  ASSERT_NO_FATAL_FAILURE(report(v1::WorkReport::PROGRESS, 50));
  ASSERT_NO_FATAL_FAILURE(report(v1::WorkReport::PROGRESS, 60));
  ASSERT_NO_FATAL_FAILURE(report(v1::WorkReport::EVAL, 40));
  ASSERT_NO_FATAL_FAILURE(report(v1::WorkReport::PROGRESS, 70));
  std::vector<std::pair<int64_t, bool>> order;
  const v1::JobStatus status = GetOk(job_id);
  for (const v1::MetricPoint& point : status.history()) order.emplace_back(point.step(), point.evaluation());
  const std::vector<std::pair<int64_t, bool>> expected = {
      {30, false}, {40, true}, {50, false}, {60, false}, {70, false}};
  EXPECT_EQ(order, expected);
}

// An evaluation before the first progress report (data.evalEverySteps)
// records no training loss (-1), not a loss of 0; the step losses of the
// progress reports that follow build the loss curve.
TEST_F(JobManagerTest, EarlyEvaluationHasNoTrainingLossAndStepLossesMakeTheCurve) {
  const std::string job_id = StartJob();
  MakeTraining(job_id);
  v1::WorkReport eval;
  eval.set_member_id(workers_[0]);
  eval.set_job_id(job_id);
  eval.set_kind(v1::WorkReport::EVAL);
  eval.set_step(5);
  eval.set_epoch(1);
  eval.set_test_accuracy(0.5);
  ASSERT_TRUE(manager_->Report(eval).ok());
  v1::JobStatus status = GetOk(job_id);
  ASSERT_GT(status.history_size(), 0);
  EXPECT_EQ(status.history(status.history_size() - 1).train_loss(), -1);
  for (int w = 0; w < 2; ++w) {
    v1::WorkReport progress;
    progress.set_member_id(workers_[w]);
    progress.set_job_id(job_id);
    progress.set_kind(v1::WorkReport::PROGRESS);
    progress.set_step(2);
    progress.set_loss(1.0);
    for (int64_t step = 0; step < 2; ++step) {
      v1::StepLoss* loss = progress.add_step_losses();
      loss->set_step(step);
      loss->set_partition(w);
      loss->set_loss(static_cast<float>(w + 1));
    }
    ASSERT_TRUE(manager_->Report(progress).ok());
  }
  status = GetOk(job_id);
  EXPECT_EQ(status.loss_curve().steps(), 2);
  EXPECT_EQ(std::vector<float>(status.loss_curve().loss().begin(), status.loss_curve().loss().end()),
            (std::vector<float>{1.5f, 1.5f}));
}

TEST_F(JobManagerTest, AllDoneSucceedsAndKeepsParameters) {
  const std::string job_id = StartJob();
  MakeTraining(job_id);
  ASSERT_TRUE(ReportKind(workers_[0], job_id, v1::WorkReport::DONE).ok());
  EXPECT_EQ(GetOk(job_id).state(), v1::RUNNING);
  ASSERT_TRUE(ReportKind(workers_[1], job_id, v1::WorkReport::DONE).ok());
  EXPECT_EQ(GetOk(job_id).state(), v1::SUCCEEDED);

  manager_->Tick();  // runs the server calls
  const std::vector<FakeServers::Drop> drops = servers_.drops();
  ASSERT_EQ(drops.size(), 1u);
  EXPECT_EQ(drops[0].address, kServerAddress);
  EXPECT_EQ(drops[0].job_id, job_id);
  EXPECT_TRUE(drops[0].keep_parameters);

  // The workers are free again.
  for (const std::string& w : workers_) {
    EXPECT_TRUE(HeartbeatOk(w, job_id).job_id().empty());
  }
  // Reports for an ended job are refused.
  EXPECT_EQ(ReportKind(workers_[0], job_id, v1::WorkReport::DONE).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobManagerTest, FailedReportFailsJobNamingWorker) {
  const std::string job_id = StartJob();
  MakeTraining(job_id);
  ASSERT_TRUE(ReportKind(workers_[1], job_id, v1::WorkReport::FAILED,
                         kTrainExamples, "out of memory in layer0")
                  .ok());
  v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_TRUE(Contains(status.reason(), "out of memory in layer0"));
  EXPECT_TRUE(Contains(status.reason(), workers_[1]));

  manager_->Tick();
  const std::vector<FakeServers::Drop> drops = servers_.drops();
  ASSERT_EQ(drops.size(), 1u);
  EXPECT_FALSE(drops[0].keep_parameters);
  EXPECT_EQ(drops[0].job_id, job_id);
}

TEST_F(JobManagerTest, ReportsFromStrangersAreRefused) {
  const std::string job_id = StartJob();
  const std::string outsider = RegisterMember(v1::WORKER);
  EXPECT_EQ(ReportKind(outsider, job_id, v1::WorkReport::READY).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ReportKind(workers_[0], "job-9999", v1::WorkReport::READY).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ReportKind(workers_[0], job_id, v1::WorkReport::KIND_UNSPECIFIED).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(JobManagerTest, LostWorkerLeaseMovesItsPartitionsToTheOthers) {
  const std::string job_id = StartJob();
  MakeTraining(job_id);
  const int64_t epoch_before = GetOk(job_id).membership_epoch();
  // Half a lease later everyone but worker 1 heartbeats; another half lease
  // (plus a bit) later worker 1 has been silent for longer than the lease.
  Advance(options_.lease / 2);
  HeartbeatOk(server_);
  HeartbeatOk(workers_[0], job_id);
  Advance(options_.lease / 2 + absl::Milliseconds(100));
  manager_->Tick();

  v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::RUNNING);
  EXPECT_GT(status.membership_epoch(), epoch_before);
  ASSERT_GT(status.events_size(), 0);
  EXPECT_TRUE(Contains(status.events(status.events_size() - 1).message(), workers_[1]));
  ASSERT_EQ(status.workers_size(), 1);
  // The survivor computes every partition now.
  v1::Assignment a = HeartbeatOk(workers_[0], job_id);
  EXPECT_EQ(a.phase(), v1::Assignment::TRAIN);
  EXPECT_EQ(std::vector<int32_t>(a.partitions().begin(), a.partitions().end()), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(a.num_partitions(), 2);

  v1::HeartbeatRequest request;
  request.set_member_id(workers_[1]);
  EXPECT_EQ(manager_->Heartbeat(request).status().code(), absl::StatusCode::kNotFound);
  manager_->Tick();
  EXPECT_TRUE(servers_.drops().empty());
  // The job finishes with the survivor alone.
  ASSERT_TRUE(ReportKind(workers_[0], job_id, v1::WorkReport::DONE).ok());
  EXPECT_EQ(GetOk(job_id).state(), v1::SUCCEEDED);
}

// A worker taken out of a job (its lease lost) and added back under a new
// rank may still report from its earlier run, which it has not yet seen end
// (a push refused by servers that dropped the job): such a report is
// refused, so it neither fails nor advances the job. Its new rank's reports
// count, and a report without a rank is taken as today.
TEST_F(JobManagerTest, AReportOfARankTheWorkerNoLongerHoldsIsRefused) {
  const std::string job_id = StartJob();
  MakeTraining(job_id);
  const int32_t old_rank = HeartbeatOk(workers_[1], job_id).rank();
  Advance(options_.lease / 2);
  HeartbeatOk(server_);
  HeartbeatOk(workers_[0], job_id);
  Advance(options_.lease / 2 + absl::Milliseconds(100));
  manager_->Tick();
  ASSERT_EQ(GetOk(job_id).workers_size(), 1) << "worker 1 was taken out";
  ASSERT_EQ(RegisterAs(v1::WORKER, workers_[1]), workers_[1]);
  manager_->Tick();
  const v1::Assignment back = HeartbeatOk(workers_[1]);
  ASSERT_EQ(back.job_id(), job_id) << "added back";
  ASSERT_NE(back.rank(), old_rank);

  v1::WorkReport stale;
  stale.set_member_id(workers_[1]);
  stale.set_job_id(job_id);
  stale.set_kind(v1::WorkReport::FAILED);
  stale.set_reason("server 127.0.0.1:1: sparse tables take no pushes: the job restarts from a checkpoint");
  stale.set_rank(old_rank);
  const absl::Status refused = manager_->Report(stale);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(Contains(refused.message(), "a run that is over")) << refused;
  stale.set_kind(v1::WorkReport::DONE);
  stale.add_partitions(0);
  stale.add_partitions(1);
  EXPECT_EQ(manager_->Report(stale).code(), absl::StatusCode::kFailedPrecondition);
  manager_->Tick();
  EXPECT_EQ(GetOk(job_id).state(), v1::RUNNING) << GetOk(job_id).reason();

  v1::WorkReport ready;
  ready.set_member_id(workers_[1]);
  ready.set_job_id(job_id);
  ready.set_kind(v1::WorkReport::READY);
  ready.set_train_examples(kTrainExamples);
  ready.set_test_examples(200);
  ready.set_features(kFeatures);
  ready.set_classes(kClasses);
  ready.set_rank(back.rank());
  EXPECT_TRUE(manager_->Report(ready).ok());
  v1::WorkReport failed = stale;
  failed.clear_partitions();
  failed.set_kind(v1::WorkReport::FAILED);
  failed.clear_rank();
  failed.set_reason("out of memory");
  EXPECT_TRUE(manager_->Report(failed).ok());
  manager_->Tick();
  EXPECT_EQ(GetOk(job_id).state(), v1::FAILED);
  EXPECT_TRUE(Contains(GetOk(job_id).reason(), "out of memory")) << GetOk(job_id).reason();
}

TEST_F(JobManagerTest, LostServerLeaseFailsJob) {
  const std::string job_id = StartJob();
  MakeTraining(job_id);
  Advance(options_.lease / 2);
  for (const std::string& w : workers_) HeartbeatOk(w, job_id);
  Advance(options_.lease / 2 + absl::Milliseconds(100));
  manager_->Tick();
  v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_TRUE(Contains(status.reason(), "lost its lease"));
  EXPECT_TRUE(Contains(status.reason(), server_));
}

TEST_F(JobManagerTest, JoiningWorkerTakesPartitionsOnceReady) {
  RegisterCluster();
  v1::JobSpec spec = MlpSpec();
  spec.set_max_workers(3);
  const std::string job_id = SubmitOk(spec);
  manager_->Tick();
  MakeTraining(job_id);
  std::set<int32_t> owned;
  for (const std::string& w : workers_) {
    const v1::Assignment assignment = HeartbeatOk(w, job_id);
    for (int32_t p : assignment.partitions()) EXPECT_TRUE(owned.insert(p).second);
  }
  EXPECT_EQ(owned, (std::set<int32_t>{0, 1, 2}));
  // A third worker joins the running job: it loads first, then takes a partition.
  const std::string joiner = RegisterMember(v1::WORKER);
  manager_->Tick();
  v1::Assignment loading = HeartbeatOk(joiner, job_id);
  EXPECT_EQ(loading.job_id(), job_id);
  EXPECT_EQ(loading.phase(), v1::Assignment::LOAD);
  ASSERT_TRUE(ReportKind(joiner, job_id, v1::WorkReport::READY).ok());
  v1::Assignment training = HeartbeatOk(joiner, job_id);
  EXPECT_EQ(training.phase(), v1::Assignment::TRAIN);
  EXPECT_EQ(training.partitions_size(), 1);
  owned.clear();
  for (const std::string& w : {workers_[0], workers_[1], joiner}) {
    v1::Assignment a = HeartbeatOk(w, job_id);
    EXPECT_EQ(a.partitions_size(), 1) << w;
    for (int32_t p : a.partitions()) EXPECT_TRUE(owned.insert(p).second);
  }
  EXPECT_EQ(owned, (std::set<int32_t>{0, 1, 2}));
}

TEST_F(JobManagerTest, HeartbeatsKeepTheLease) {
  const std::string job_id = StartJob();
  for (int i = 0; i < 5; ++i) {
    Advance(options_.lease / 2);
    HeartbeatOk(server_);
    for (const std::string& w : workers_) HeartbeatOk(w, job_id);
    manager_->Tick();
  }
  EXPECT_EQ(GetOk(job_id).state(), v1::RUNNING);
}

TEST_F(JobManagerTest, CancelPendingJob) {
  const std::string job_id = SubmitOk(MlpSpec());
  absl::StatusOr<v1::JobStatus> cancelled = manager_->Cancel(job_id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(GetOk(job_id).state(), v1::CANCELLED);

  // It is no longer scheduled when resources appear.
  RegisterCluster();
  manager_->Tick();
  EXPECT_EQ(GetOk(job_id).state(), v1::CANCELLED);
  for (const std::string& w : workers_) EXPECT_TRUE(HeartbeatOk(w).job_id().empty());

  EXPECT_EQ(manager_->Cancel(job_id).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobManagerTest, CancelRunningJobFreesWorkers) {
  const std::string job_id = StartJob();
  for (const std::string& w : workers_) ASSERT_EQ(HeartbeatOk(w).job_id(), job_id);
  absl::StatusOr<v1::JobStatus> cancelled = manager_->Cancel(job_id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  for (const std::string& w : workers_) {
    EXPECT_TRUE(HeartbeatOk(w, job_id).job_id().empty());
  }
  EXPECT_EQ(manager_->Cancel(job_id).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // The freed workers take the next job.
  const std::string next = SubmitOk(MlpSpec());
  manager_->Tick();
  EXPECT_EQ(GetOk(next).state(), v1::RUNNING);
  for (const std::string& w : workers_) EXPECT_EQ(HeartbeatOk(w).job_id(), next);
}

TEST_F(JobManagerTest, CancelTrainingJobDropsItsShards) {
  const std::string job_id = StartJob();
  MakeTraining(job_id);
  ASSERT_TRUE(manager_->Cancel(job_id).ok());
  for (const std::string& w : workers_) {
    EXPECT_TRUE(HeartbeatOk(w, job_id).job_id().empty());
  }
  manager_->Tick();
  const std::vector<FakeServers::Drop> drops = servers_.drops();
  ASSERT_EQ(drops.size(), 1u);
  EXPECT_EQ(drops[0].job_id, job_id);
  EXPECT_FALSE(drops[0].keep_parameters);
}

TEST_F(JobManagerTest, UnknownJobIsNotFound) {
  EXPECT_EQ(manager_->Get("job-4242").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->Cancel("job-4242").status().code(), absl::StatusCode::kNotFound);
  int64_t version = 0;
  EXPECT_EQ(manager_->WaitForChange("job-4242", &version, absl::ZeroDuration())
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, BadSpecIsInvalidArgument) {
  v1::JobSpec spec = MlpSpec();
  spec.mutable_data()->set_batch_size(0);
  absl::StatusOr<v1::JobStatus> status = manager_->Submit(spec);
  EXPECT_EQ(status.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status.status().message(), "data.batchSize"));
  EXPECT_TRUE(manager_->List().empty());
}

TEST_F(JobManagerTest, BadRegistrationsAreInvalidArgument) {
  v1::RegisterRequest no_role;
  EXPECT_EQ(manager_->Register(no_role).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::RegisterRequest server_without_address;
  server_without_address.set_role(v1::SERVER);
  EXPECT_EQ(manager_->Register(server_without_address).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::HeartbeatRequest stranger;
  stranger.set_member_id("nobody");
  EXPECT_EQ(manager_->Heartbeat(stranger).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, TooFewExamplesForOneGlobalBatchFailsJob) {
  const std::string job_id = StartJob();
  // 100 examples < batch 64 * 2 workers.
  for (const std::string& w : workers_) {
    ASSERT_TRUE(ReportKind(w, job_id, v1::WorkReport::READY, 100).ok());
  }
  manager_->Tick();
  v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_TRUE(Contains(status.reason(), "global batch"));
  EXPECT_TRUE(servers_.setups().empty());
  for (const std::string& w : workers_) {
    EXPECT_TRUE(HeartbeatOk(w, job_id).job_id().empty());
  }
}

// A warm-up longer than the job (known once the workers counted the data)
// fails it naming both.
TEST_F(JobManagerTest, AWarmUpLongerThanTheJobFailsItNamingBoth) {
  RegisterCluster();
  v1::JobSpec spec = MlpSpec();
  spec.mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::WARMUP_COSINE);
  spec.mutable_lr_schedule()->set_warmup_steps(1000000);
  const std::string job_id = SubmitOk(spec);
  manager_->Tick();
  for (const std::string& w : workers_) ASSERT_TRUE(ReportKind(w, job_id, v1::WorkReport::READY).ok());
  manager_->Tick();
  const v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_TRUE(Contains(status.reason(), absl::StrCat("lrSchedule.warmupSteps 1000000 is more than the job's ",
                                                     status.progress().total_steps(), " steps")))
      << status.reason();
  EXPECT_TRUE(servers_.setups().empty());
}

// Workers whose data differ by a few examples make the same steps an epoch
// (which each checks) but shuffle otherwise: the job fails naming them.
TEST_F(JobManagerTest, WorkersReadingDifferentDataFailTheJob) {
  const std::string job_id = StartJob();
  ASSERT_TRUE(ReportKind(workers_[0], job_id, v1::WorkReport::READY, kTrainExamples).ok());
  ASSERT_TRUE(ReportKind(workers_[1], job_id, v1::WorkReport::READY, kTrainExamples + 1).ok());
  manager_->Tick();
  const v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_TRUE(Contains(
      status.reason(),
      absl::StrCat(workers_[1], " read ", kTrainExamples + 1, " training and 200 test examples, where ",
                   workers_[0], " read ", kTrainExamples, " and 200: the workers read different data")))
      << status.reason();
  EXPECT_TRUE(servers_.setups().empty());
}

TEST_F(JobManagerTest, SetupFailureFailsJob) {
  const std::string job_id = StartJob();
  servers_.FailSetups(absl::UnavailableError("server is on fire"));
  for (const std::string& w : workers_) {
    ASSERT_TRUE(ReportKind(w, job_id, v1::WorkReport::READY).ok());
  }
  manager_->Tick();
  ASSERT_EQ(servers_.setups().size(), 1u);
  v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_TRUE(Contains(status.reason(), "server is on fire"));
  for (const std::string& w : workers_) {
    EXPECT_TRUE(HeartbeatOk(w, job_id).job_id().empty());
  }
  // Whatever the servers did set up is dropped.
  manager_->Tick();
  const std::vector<FakeServers::Drop> drops = servers_.drops();
  ASSERT_EQ(drops.size(), 1u);
  EXPECT_FALSE(drops[0].keep_parameters);
}

TEST_F(JobManagerTest, WaitForChangeReturnsAfterAChange) {
  const std::string job_id = SubmitOk(MlpSpec());

  // An older version returns at once with the current one.
  int64_t version = -1;
  absl::StatusOr<v1::JobStatus> status =
      manager_->WaitForChange(job_id, &version, absl::Hours(1));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_GE(version, 0);
  EXPECT_EQ(status->state(), v1::PENDING);

  // No change: the wait times out and keeps the version.
  const int64_t before = version;
  ASSERT_TRUE(manager_->WaitForChange(job_id, &version, absl::ZeroDuration()).ok());
  EXPECT_EQ(version, before);

  // A scheduling pass that updates the reason is a change.
  manager_->Tick();
  status = manager_->WaitForChange(job_id, &version, absl::Hours(1));
  ASSERT_TRUE(status.ok());
  EXPECT_GT(version, before);

  // A waiter blocked in another thread is woken by Cancel. If the cancel
  // lands before the wait starts, the wait returns at once instead.
  const int64_t waiting_from = version;
  int64_t seen = waiting_from;
  absl::StatusOr<v1::JobStatus> woken;
  std::thread waiter([&] { woken = manager_->WaitForChange(job_id, &seen, absl::Hours(1)); });
  ASSERT_TRUE(manager_->Cancel(job_id).ok());
  waiter.join();
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_GT(seen, waiting_from);
  EXPECT_EQ(woken->state(), v1::CANCELLED);
}

TEST_F(JobManagerTest, ListShowsEveryJob) {
  const std::string a = SubmitOk(MlpSpec());
  const std::string b = SubmitOk(MlpSpec(1));
  EXPECT_NE(a, b);
  std::set<std::string> ids;
  for (const v1::JobStatus& s : manager_->List()) ids.insert(s.job_id());
  EXPECT_EQ(ids, (std::set<std::string>{a, b}));
}

// ListJobs comes in pages: at most page_size jobs and never past the page
// byte bound (but one job), each page's token leading to the next, so a
// list of any length fits a message. Summaries leave out what grows with a
// job (history, events, the shard map but its version).
TEST_F(JobManagerTest, ListJobsComesInPagesThatFitTheirBounds) {
  options_.list_page_bytes = 400;
  ASSERT_NO_FATAL_FAILURE(Restart());
  std::vector<std::string> submitted;
  for (int i = 0; i < 7; ++i) submitted.push_back(SubmitOk(MlpSpec()));
  const int64_t one = static_cast<int64_t>(manager_->List()[0].ByteSizeLong());
  ASSERT_LE(2 * one, options_.list_page_bytes);
  ASSERT_GT(3 * one, options_.list_page_bytes) << "pages of 2 jobs by bytes";

  auto all_pages = [&](int page_size) {
    std::vector<std::string> listed;
    v1::ListJobsRequest request;
    request.set_page_size(page_size);
    for (int pages = 0; pages < 20; ++pages) {
      absl::StatusOr<v1::ListJobsResponse> page = manager_->ListPage(request);
      EXPECT_TRUE(page.ok()) << page.status();
      if (!page.ok()) break;
      EXPECT_LE(page->jobs_size(), page_size > 0 ? page_size : 2);
      int64_t bytes = 0;
      for (const v1::JobStatus& job : page->jobs()) {
        listed.push_back(job.job_id());
        bytes += static_cast<int64_t>(job.ByteSizeLong());
        EXPECT_EQ(job.events_size(), 0);
        EXPECT_EQ(job.shard_map().chunks_size(), 0);
      }
      EXPECT_LE(bytes, options_.list_page_bytes);
      if (page->next_page_token().empty()) break;
      EXPECT_EQ(page->next_page_token(), listed.back());
      request.set_page_token(page->next_page_token());
    }
    return listed;
  };
  EXPECT_EQ(all_pages(0), submitted) << "pages by bytes";
  EXPECT_EQ(all_pages(1), submitted) << "one job a page";
  EXPECT_EQ(all_pages(3), submitted) << "three jobs a page, or fewer by bytes";

  for (const int size : {-1, JobManager::kMaxListPageSize + 1}) {
    v1::ListJobsRequest bad;
    bad.set_page_size(size);
    EXPECT_EQ(manager_->ListPage(bad).status().code(), absl::StatusCode::kInvalidArgument) << size;
  }
  v1::ListJobsRequest garbage;
  garbage.set_page_token(std::string("job-\0\x01", 6));
  EXPECT_EQ(manager_->ListPage(garbage).status().code(), absl::StatusCode::kInvalidArgument);
  garbage.set_page_token(std::string(129, 'j'));
  EXPECT_EQ(manager_->ListPage(garbage).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobManagerTest, ReplicasNeedEnoughServers) {
  RegisterCluster();
  v1::JobSpec spec = MlpSpec();
  spec.set_replicas(2);
  const std::string job_id = SubmitOk(spec);
  manager_->Tick();
  v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::PENDING);
  EXPECT_TRUE(Contains(status.reason(), "2 replicas"));
}

// Admission: a job that cannot fit the processes' memory budgets at all is
// refused at submit, naming the numbers; nothing is queued.
TEST_F(JobManagerTest, JobsBeyondEveryMemoryBudgetAreRefusedAtSubmit) {
  RegisterMember(v1::SERVER, kServerAddress, int64_t{4} << 30);
  RegisterMember(v1::WORKER, "", int64_t{4} << 30);
  v1::JobSpec huge_model = MlpSpec(1);
  huge_model.mutable_model()->set_hidden_sizes(0, 65536);
  huge_model.mutable_model()->add_hidden_sizes(65536);
  absl::StatusOr<v1::JobStatus> refused = manager_->Submit(huge_model);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(), "parameters")) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(), "4.0 GiB")) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(), "--memory-budget")) << refused.status();

  v1::JobSpec huge_data = MlpSpec(1);
  huge_data.mutable_data()->set_dataset(v1::DataSpec::SYNTHETIC);
  huge_data.mutable_data()->clear_path();
  huge_data.mutable_data()->set_synthetic_examples(100000000);
  huge_data.mutable_data()->set_synthetic_features(65536);
  huge_data.mutable_data()->set_synthetic_classes(10);
  refused = manager_->Submit(huge_data);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(), "each worker")) << refused.status();
  EXPECT_TRUE(manager_->List().empty()) << "a refused job was queued";
  // One that fits is taken.
  SubmitOk(MlpSpec(1));
}

// A job's dense tensors take at most kMaxJobChunks chunks: --chunk-bytes 4
// cut the demo's MLP into 203,530 chunks (seconds a step, and a shard map
// that passes a message for a model ten times larger). Chunks grow instead,
// within the bound on a chunk's state; a job that would still take more is
// refused naming the numbers.
TEST_F(JobManagerTest, AJobTakesAtMostItsChunkBoundAndGrowsItsChunksToStayWithin) {
  options_.chunk_elems = 1;  // --chunk-bytes 4
  Restart();
  const v1::JobSpec spec = MlpSpec(1);
  std::vector<FakeServers::Setup> setups;
  ASSERT_NO_FATAL_FAILURE(StartOnOneServer(spec, &setups));
  const JobClaims claims = ClaimsOf(spec);
  EXPECT_LE(setups[0].request.chunks_size(), kMaxJobChunks);
  EXPECT_GT(setups[0].request.chunks_size(), kMaxJobChunks / 2) << "cut larger than needed";
  int64_t elements = 0;
  for (const auto& chunk : setups[0].request.chunks()) elements += chunk.length();
  EXPECT_EQ(elements, claims.parameters);

  // Where a chunk's state bounds its size (BSP over 1024 partitions: 4 KiB
  // a parameter), a model of 10^9 parameters would take 600,000 chunks.
  JobClaims huge = claims;
  huge.parameters = 1000000000;
  huge.server_bytes_per_parameter = 4 * (1 + 2 + 1024 + 2);
  const absl::Status refused = CheckChunkCount(huge, 65536);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(Contains(refused.message(), "at most 8192 chunks")) << refused;
  EXPECT_TRUE(CheckChunkCount(claims, 1).ok());
  // Each tensor's short last chunk is left room for: a model of exactly
  // 8192 chunks' worth of parameters in four tensors still fits.
  JobClaims even = claims;
  even.parameters = kMaxJobChunks * 25;
  even.tensors = 4;
  EXPECT_TRUE(CheckChunkCount(even, 1).ok()) << CheckChunkCount(even, 1);
}

// A chunk's whole state (values, Adam's two slots, a BSP buffer per data
// partition, the sum and the previous values) travels as one message when a
// replica is copied: a job with many partitions gets chunks small enough.
TEST_F(JobManagerTest, AJobWithManyPartitionsGetsChunksWhoseStateFitsOneMessage) {
  v1::JobSpec spec = MlpSpec(1);
  spec.set_max_workers(64);
  spec.mutable_data()->set_batch_size(8);  // the fake training set has 1000 examples
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
  std::vector<FakeServers::Setup> setups;
  ASSERT_NO_FATAL_FAILURE(StartOnOneServer(spec, &setups));
  const int64_t state_bytes_per_value = 4 * (1 + 2 + 64 + 2);
  int64_t longest = 0;
  for (const auto& chunk : setups[0].request.chunks()) longest = std::max(longest, chunk.length());
  EXPECT_LE(longest * state_bytes_per_value, kMaxChunkStateBytes);
  EXPECT_GT(longest * state_bytes_per_value, kMaxChunkStateBytes / 2) << "cut smaller than needed";
  // A job with few partitions keeps the configured size.
  EXPECT_EQ(ChunkElemsFor(ClaimsOf(MlpSpec(1)), options_.chunk_elems), options_.chunk_elems);
}

// A job that fits the cluster but not now (another job holds the server's
// memory) waits, saying so, and starts once that job's parameters go.
TEST_F(JobManagerTest, AJobWaitsForServerMemoryOtherJobsHold) {
  // MlpSpec's model: 784*256 + 256 + 256*10 + 10 = 203530 parameters; with
  // SGD, BSP and 1 partition, 16 bytes each: 3.3 MB on the server.
  RegisterMember(v1::SERVER, kServerAddress, 4000000);
  workers_.push_back(RegisterMember(v1::WORKER));
  workers_.push_back(RegisterMember(v1::WORKER));
  const std::string first = SubmitOk(MlpSpec(1));
  const std::string second = SubmitOk(MlpSpec(1));
  manager_->Tick();
  ASSERT_EQ(GetOk(first).state(), v1::RUNNING);
  for (const std::string& w : workers_) {
    if (HeartbeatOk(w).job_id() == first) {
      ASSERT_TRUE(ReportKind(w, first, v1::WorkReport::READY).ok());
    }
  }
  manager_->Tick();
  ASSERT_EQ(GetOk(first).reason(), "training");
  v1::JobStatus waiting = GetOk(second);
  EXPECT_EQ(waiting.state(), v1::PENDING);
  EXPECT_TRUE(Contains(waiting.reason(), "0 of 1 servers with the 3.1 MiB of memory it needs free"))
      << waiting.reason();
  ASSERT_TRUE(manager_->Cancel(first).ok());
  // A cancelled job's parameters are dropped: its claim is gone.
  manager_->Tick();
  EXPECT_EQ(GetOk(second).state(), v1::RUNNING) << GetOk(second).reason();
}

// A job that cannot run on the cluster as it is (more workers than
// registered) does not hold up the jobs queued behind it.
TEST_F(JobManagerTest, AJobThatCannotRunHereDoesNotBlockTheQueue) {
  RegisterCluster();
  v1::JobSpec big = MlpSpec(1024);
  const std::string blocked = SubmitOk(big);
  const std::string small = SubmitOk(MlpSpec(2));
  manager_->Tick();
  v1::JobStatus status = GetOk(blocked);
  EXPECT_EQ(status.state(), v1::PENDING);
  EXPECT_TRUE(Contains(status.reason(), "cannot start on the cluster as it is")) << status.reason();
  EXPECT_TRUE(Contains(status.reason(), "needs 1024 workers")) << status.reason();
  EXPECT_EQ(GetOk(small).state(), v1::RUNNING);
}

// A job waiting for busy workers keeps the queue behind it (first come,
// first served) for max_queue_wait; then a job behind it that fits starts.
TEST_F(JobManagerTest, AJobWaitingForBusyWorkersHoldsTheQueueForABoundedTime) {
  RegisterCluster();
  workers_.push_back(RegisterMember(v1::WORKER));  // three workers
  const std::string running = SubmitOk(MlpSpec(2));
  manager_->Tick();
  ASSERT_EQ(GetOk(running).state(), v1::RUNNING);
  const std::string head = SubmitOk(MlpSpec(2));  // only one worker is idle
  const std::string behind = SubmitOk(MlpSpec(1));
  manager_->Tick();
  EXPECT_EQ(GetOk(head).state(), v1::PENDING);
  EXPECT_EQ(GetOk(behind).state(), v1::PENDING) << "a later job overtook the head before its wait ran out";
  Advance(options_.max_queue_wait + absl::Seconds(1));
  for (const std::string& w : workers_) HeartbeatOk(w);
  HeartbeatOk(server_);
  manager_->Tick();
  EXPECT_EQ(GetOk(head).state(), v1::PENDING);
  EXPECT_TRUE(Contains(GetOk(head).reason(), "jobs queued behind it may start first")) << GetOk(head).reason();
  EXPECT_EQ(GetOk(behind).state(), v1::RUNNING);
}

// Retention: servers keep the newest retain_finished_jobs jobs' parameters;
// older ones are released (DropJob without keeping them) and the job says
// when; past max_finished_records a job is forgotten altogether.
TEST_F(JobManagerTest, FinishedJobsParametersAreReleasedAndOldRecordsForgotten) {
  options_.retain_finished_jobs = 1;
  options_.max_finished_records = 2;
  manager_ = std::make_unique<JobManager>(options_, &servers_, [this] { return now_; }, store_.get());
  RegisterCluster();
  std::vector<std::string> jobs;
  for (int i = 0; i < 3; ++i) {
    const std::string job_id = SubmitOk(MlpSpec());
    manager_->Tick();
    MakeTraining(job_id);
    for (const std::string& w : workers_) ASSERT_TRUE(ReportKind(w, job_id, v1::WorkReport::DONE).ok());
    ASSERT_EQ(GetOk(job_id).state(), v1::SUCCEEDED);
    Advance(absl::Seconds(1));  // distinct end times
    HeartbeatOk(server_);
    for (const std::string& w : workers_) HeartbeatOk(w);
    jobs.push_back(job_id);
  }
  manager_->Tick();
  EXPECT_EQ(GetOk(jobs[2]).parameters_released_unix_ms(), 0) << "the newest job's parameters were released";
  EXPECT_GT(GetOk(jobs[1]).parameters_released_unix_ms(), 0);
  EXPECT_EQ(manager_->Get(jobs[0]).status().code(), absl::StatusCode::kNotFound) << "the oldest was kept";
  bool released = false;
  for (const auto& drop : servers_.drops()) released |= drop.job_id == jobs[1] && !drop.keep_parameters;
  EXPECT_TRUE(released) << "no DropJob released job 2's parameters";
  // The forgotten job is gone from the store too.
  Restart();
  EXPECT_EQ(manager_->Get(jobs[0]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_GT(GetOk(jobs[1]).parameters_released_unix_ms(), 0);
}

// A finished job with replicas keeps its live parameters when one server
// restarts without them: the shards it held are read from their other
// replicas (the map names them), and only the loss of the last holder of a
// shard releases the job's parameters.
TEST_F(JobManagerTest, AFinishedJobsReplicasStandInForAServerThatRestartedWithoutThem) {
  std::string second;
  const std::string job_id = StartReplicatedJob(&second);
  for (const std::string& w : workers_) ASSERT_TRUE(ReportKind(w, job_id, v1::WorkReport::DONE).ok());
  ASSERT_EQ(GetOk(job_id).state(), v1::SUCCEEDED);
  bool primary_somewhere = false;
  const v1::JobStatus done = GetOk(job_id);
  for (const v1::ShardLocation& shard : done.shard_map().shards()) {
    primary_somewhere |= shard.server_id() == server_;
    ASSERT_EQ(shard.backup_ids_size(), 1);
  }
  ASSERT_TRUE(primary_somewhere);

  RegisterAs(v1::SERVER, server_, kServerAddress, {});  // a new process under the same id
  v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.parameters_released_unix_ms(), 0) << "the other replicas hold them";
  for (const v1::ShardLocation& shard : status.shard_map().shards()) {
    EXPECT_EQ(shard.server_id(), second) << "shard " << shard.shard();
    EXPECT_EQ(shard.address(), "127.0.0.1:7002");
    EXPECT_EQ(shard.backup_ids_size(), 0);
  }
  std::string events;
  for (const auto& e : status.events()) absl::StrAppend(&events, e.message(), "\n");
  EXPECT_TRUE(Contains(events, "read from their other replicas")) << events;

  RegisterAs(v1::SERVER, second, "127.0.0.1:7002", {});  // the last holder restarts too
  status = GetOk(job_id);
  EXPECT_GT(status.parameters_released_unix_ms(), 0);
  events.clear();
  for (const auto& e : status.events()) absl::StrAppend(&events, e.message(), "\n");
  EXPECT_TRUE(Contains(events, absl::StrCat("server ", second, " restarted without them"))) << events;
}

// A finished job's live parameters live on its servers: a server that comes
// back without them (a restarted process), or not at all after the
// scheduler restarted, has lost them, and the job says so instead of
// pointing `fulcrum export` at parameters that are gone.
TEST_F(JobManagerTest, AFinishedJobsParametersAreGoneWhenItsServerRestartsWithoutThem) {
  const std::string job_id = StartJob();
  MakeTraining(job_id);
  for (const std::string& w : workers_) ASSERT_TRUE(ReportKind(w, job_id, v1::WorkReport::DONE).ok());
  ASSERT_EQ(GetOk(job_id).state(), v1::SUCCEEDED);
  manager_->Tick();
  RegisterAs(v1::SERVER, server_, kServerAddress, {job_id});  // the same process: it still holds them
  EXPECT_EQ(GetOk(job_id).parameters_released_unix_ms(), 0);
  RegisterAs(v1::SERVER, server_, kServerAddress, {});  // a new process under the same id
  const v1::JobStatus lost = GetOk(job_id);
  EXPECT_GT(lost.parameters_released_unix_ms(), 0);
  EXPECT_EQ(lost.state(), v1::SUCCEEDED);
  std::string events;
  for (const auto& e : lost.events()) absl::StrAppend(&events, e.message(), "\n");
  EXPECT_TRUE(Contains(events, absl::StrCat("server ", server_, " restarted without them"))) << events;

  // After a scheduler restart, a server of a finished job that never comes back.
  const std::string second = SubmitOk(MlpSpec());
  manager_->Tick();
  MakeTraining(second);
  for (const std::string& w : workers_) ASSERT_TRUE(ReportKind(w, second, v1::WorkReport::DONE).ok());
  ASSERT_EQ(GetOk(second).state(), v1::SUCCEEDED);
  Restart();
  for (const std::string& w : workers_) RegisterAs(v1::WORKER, w);
  Advance(3 * options_.lease);
  manager_->Tick();
  EXPECT_GT(GetOk(second).parameters_released_unix_ms(), 0);
}

TEST_F(JobManagerTest, ServerLossPromotesBackupsAndBumpsTheMapVersion) {
  std::string second;
  const std::string job_id = StartReplicatedJob(&second);
  v1::JobStatus status = GetOk(job_id);
  ASSERT_EQ(status.shards_size(), 2);
  for (const auto& shard : status.shards()) {
    ASSERT_EQ(shard.backup_ids_size(), 1);
    EXPECT_NE(shard.backup_ids(0), shard.server_id());
  }
  // Each server got a setup naming itself, with every chunk of the shards it holds.
  EXPECT_EQ(servers_.setups().size(), 2u);
  EXPECT_EQ(status.shard_map().version(), 1);

  // server_ (the first) stops heartbeating.
  Advance(options_.lease / 2);
  HeartbeatOk(second);
  for (const std::string& w : workers_) HeartbeatOk(w, job_id);
  Advance(options_.lease / 2 + absl::Milliseconds(100));
  manager_->Tick();
  status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::RUNNING) << status.reason();
  EXPECT_EQ(status.shard_map().version(), 2);
  for (const auto& shard : status.shards()) {
    EXPECT_EQ(shard.server_id(), second);
    EXPECT_EQ(shard.backup_ids_size(), 0);
  }
  ASSERT_FALSE(servers_.reconfigures().empty());
  EXPECT_EQ(servers_.reconfigures().back().version(), 2);
  EXPECT_EQ(HeartbeatOk(workers_[0], job_id).shard_map().version(), 2);
  // Losing the last replica fails the job, naming the shard.
  Advance(options_.lease + absl::Milliseconds(100));
  for (const std::string& w : workers_) HeartbeatOk(w, job_id);
  manager_->Tick();
  status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_TRUE(Contains(status.reason(), "only replica of shard"));
}

TEST_F(JobManagerTest, RestartedSchedulerRecoversRunningJobs) {
  const std::string job_id = StartJob();
  MakeTraining(job_id);
  const std::vector<int32_t> partitions0 = [&] {
    auto p = HeartbeatOk(workers_[0], job_id).partitions();
    return std::vector<int32_t>(p.begin(), p.end());
  }();
  Restart();
  v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::RUNNING);
  // The server and worker 0 come back under their ids; worker 1 does not.
  const size_t calls = servers_.calls().size();
  RegisterAs(v1::SERVER, server_, kServerAddress, {job_id});
  manager_->Tick();  // the server gets the job's map again (one it may have missed)
  const std::vector<std::string> after = servers_.calls();
  EXPECT_EQ(std::vector<std::string>(after.begin() + static_cast<std::ptrdiff_t>(calls), after.end()),
            std::vector<std::string>{absl::StrCat("Reconfigure ", kServerAddress, " v", status.shard_map().version())});
  RegisterAs(v1::WORKER, workers_[0]);
  v1::Assignment a = HeartbeatOk(workers_[0], job_id);
  EXPECT_EQ(a.job_id(), job_id);
  EXPECT_EQ(a.phase(), v1::Assignment::TRAIN);
  EXPECT_EQ(std::vector<int32_t>(a.partitions().begin(), a.partitions().end()), partitions0);
  // Within the recovery window (two leases) nobody is given up on.
  Advance(options_.lease);
  HeartbeatOk(server_);
  HeartbeatOk(workers_[0], job_id);
  manager_->Tick();
  ASSERT_EQ(GetOk(job_id).workers_size(), 2);
  Advance(options_.lease + absl::Milliseconds(100));
  HeartbeatOk(server_);
  HeartbeatOk(workers_[0], job_id);
  manager_->Tick();
  status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::RUNNING) << status.reason();
  ASSERT_EQ(status.workers_size(), 1);
  EXPECT_EQ(HeartbeatOk(workers_[0], job_id).partitions_size(), 2);  // worker 1's partition moved here
  // New ids do not collide with the old ones.
  const std::string fresh = RegisterMember(v1::WORKER);
  EXPECT_NE(fresh, workers_[0]);
  EXPECT_NE(fresh, workers_[1]);
}

// spec.earlyStopping: the job ends, SUCCEEDED, once `patience` evaluations
// in a row have not improved the metric by more than minDelta; where it
// stands survives a scheduler restart.
TEST_F(JobManagerTest, EarlyStoppingEndsTheJobAfterPatienceEvaluationsWithoutImprovement) {
  RegisterCluster();
  v1::JobSpec spec = MlpSpec();
  spec.mutable_early_stopping()->set_metric(v1::EarlyStoppingSpec::TEST_LOSS);
  spec.mutable_early_stopping()->set_patience(2);
  spec.mutable_early_stopping()->set_min_delta(0.01f);
  const std::string job_id = SubmitOk(spec);
  manager_->Tick();
  MakeTraining(job_id);
  auto eval = [&](int64_t step, double loss) {
    v1::WorkReport report;
    report.set_member_id(workers_[0]);
    report.set_job_id(job_id);
    report.set_kind(v1::WorkReport::EVAL);
    report.set_step(step);
    report.set_epoch(1);
    report.set_test_accuracy(0.5);
    report.set_test_loss(loss);
    return manager_->Report(report);
  };
  ASSERT_TRUE(eval(10, 1.0).ok());
  ASSERT_TRUE(eval(20, 0.5).ok());    // the best
  ASSERT_TRUE(eval(30, 0.495).ok());  // better, but not by more than 0.01: one without improvement
  EXPECT_EQ(GetOk(job_id).state(), v1::RUNNING);
  Restart();
  RegisterCluster();
  ASSERT_TRUE(eval(30, 0.7).ok());  // a replayed step (a resume from a checkpoint): not judged again
  EXPECT_EQ(GetOk(job_id).state(), v1::RUNNING);
  ASSERT_TRUE(eval(40, 0.6).ok());  // the second: the job ends
  const v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::SUCCEEDED) << status.reason();
  EXPECT_TRUE(Contains(status.reason(), "stopped early at step 40: test loss did not improve by more than 0.01 in 2 "
                                        "evaluations (best 0.5000 at step 20)"))
      << status.reason();
}

// The progress shows the evaluation of the furthest step: one of an earlier
// step that arrives later (sent by the worker that evaluated before a
// rebalance moved the evaluation) goes into the history only.
TEST_F(JobManagerTest, AnEvaluationOfAnEarlierStepArrivingLateIsHistoryOnly) {
  RegisterCluster();
  const std::string job_id = SubmitOk(MlpSpec());
  manager_->Tick();
  MakeTraining(job_id);
  auto eval = [&](const std::string& worker, int64_t step, double loss) {
    v1::WorkReport report;
    report.set_member_id(worker);
    report.set_job_id(job_id);
    report.set_kind(v1::WorkReport::EVAL);
    report.set_step(step);
    report.set_epoch(1);
    report.set_test_accuracy(1 - loss);
    report.set_test_loss(loss);
    return manager_->Report(report);
  };
  ASSERT_TRUE(eval(workers_[1], 20, 0.1).ok());
  ASSERT_TRUE(eval(workers_[0], 10, 0.9).ok());
  v1::JobStatus status = GetOk(job_id);
  EXPECT_DOUBLE_EQ(status.progress().test_loss(), 0.1);
  EXPECT_DOUBLE_EQ(status.progress().test_accuracy(), 0.9);
  int evaluations = 0;
  for (const v1::MetricPoint& point : status.history()) evaluations += point.evaluation() ? 1 : 0;
  EXPECT_EQ(evaluations, 2);
  ASSERT_TRUE(eval(workers_[1], 20, 0.2).ok());  // the same step again (a replay): shown
  EXPECT_DOUBLE_EQ(GetOk(job_id).progress().test_loss(), 0.2);
}

}  // namespace
// Found by fulcrum-chaos-bench (seed 6): a server that was a whole backup of
// shards and took a new shard of its own was never promoted while it copied,
// so the loss of the primary it backed up failed the job.
TEST_F(JobManagerTest, AServerLostDuringAHandoverLeavesShardsToTheirWholeBackups) {
  RegisterCluster();
  const std::string b = RegisterMember(v1::SERVER, "127.0.0.1:7002");
  v1::JobSpec spec = MlpSpec();
  spec.set_replicas(2);
  const std::string job_id = SubmitOk(spec);
  manager_->Tick();
  MakeTraining(job_id);
  auto keep_alive = [&](const std::vector<std::string>& servers) {
    for (const std::string& s : servers) HeartbeatOk(s);
    for (const std::string& w : workers_) HeartbeatOk(w, job_id);
  };
  auto lose_lease_of_others = [&](const std::vector<std::string>& staying) {
    Advance(options_.lease / 2);
    keep_alive(staying);
    Advance(options_.lease / 2 + absl::Milliseconds(100));
    keep_alive(staying);
    manager_->Tick();
  };
  // The first server goes: the second leads both shards, with no backup.
  lose_lease_of_others({b});
  ASSERT_EQ(GetOk(job_id).state(), v1::RUNNING) << GetOk(job_id).reason();
  // It comes back empty under its id and becomes the backup of both shards:
  // it leads none.
  RegisterAs(v1::SERVER, server_, kServerAddress);
  for (int i = 0; i < 4; ++i) {
    Advance(absl::Milliseconds(300));
    keep_alive({server_, b});
    manager_->Tick();
  }
  v1::JobStatus status = GetOk(job_id);
  ASSERT_EQ(status.shards_size(), 2);
  for (const auto& shard : status.shards()) {
    ASSERT_EQ(shard.server_id(), b);
    ASSERT_EQ(std::vector<std::string>(shard.backup_ids().begin(), shard.backup_ids().end()),
              std::vector<std::string>{server_});
  }
  // A third server joins and a new shard is set up while every copy fails
  // (its source, the second server, is dying).
  servers_.FailSetups(absl::UnavailableError("copying chunk 0: connection refused"));
  const std::string c = RegisterMember(v1::SERVER, "127.0.0.1:7003");
  keep_alive({server_, b, c});
  manager_->Tick();
  ASSERT_EQ(GetOk(job_id).shard_map().shards_size(), 3);
  // The second server's lease runs out before any copy succeeded: the first
  // holds both its shards whole and takes them over.
  lose_lease_of_others({server_, c});
  status = GetOk(job_id);
  ASSERT_EQ(status.state(), v1::RUNNING) << status.reason();
  for (const auto& chunk : status.shard_map().chunks()) {
    EXPECT_EQ(status.shard_map().shards(chunk.shard()).server_id(), server_) << "chunk " << chunk.chunk_id();
  }
  // Once copies work again the new server restores the replicas (it was not
  // blamed for the abandoned handover).
  servers_.FailSetups(absl::OkStatus());
  for (int i = 0; i < 4; ++i) {
    Advance(absl::Milliseconds(300));
    keep_alive({server_, c});
    manager_->Tick();
  }
  status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::RUNNING) << status.reason();
  for (const auto& shard : status.shards()) {
    EXPECT_EQ(std::vector<std::string>(shard.backup_ids().begin(), shard.backup_ids().end()),
              std::vector<std::string>{c});
  }
}

TEST_F(JobManagerTest, BothReplicasLostAtOnceFailsTheJobNamingTheShard) {
  std::string second;
  const std::string job_id = StartReplicatedJob(&second);
  // Both servers go silent in the same lease period; the workers stay.
  Advance(options_.lease / 2);
  for (const std::string& w : workers_) HeartbeatOk(w, job_id);
  Advance(options_.lease / 2 + absl::Milliseconds(100));
  manager_->Tick();
  v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_TRUE(Contains(status.reason(), "only replica of shard ")) << status.reason();
  EXPECT_TRUE(Contains(status.reason(), "lost its lease")) << status.reason();
}

TEST_F(JobManagerTest, AnIdHeldByALiveMemberIsRefusedUntilItsLeaseExpires) {
  v1::RegisterRequest first;
  first.set_role(v1::WORKER);
  first.set_requested_id("worker-a");
  first.set_incarnation(11);
  first.set_pid(100);
  ASSERT_TRUE(manager_->Register(first).ok());
  v1::RegisterRequest second = first;
  second.set_incarnation(22);
  second.set_pid(200);
  absl::StatusOr<v1::RegisterResponse> refused = manager_->Register(second);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(Contains(refused.status().message(), "worker-a")) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(), "pid 100")) << refused.status();
  // The same process registering again (e.g. after a scheduler restart) is fine.
  EXPECT_TRUE(manager_->Register(first).ok());
  // Once the holder's lease has run out, the id is free for the new process.
  Advance(options_.lease + absl::Milliseconds(1));
  absl::StatusOr<v1::RegisterResponse> taken = manager_->Register(second);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->member_id(), "worker-a");
}

// A server paused past its lease, replaced under its id by a new process,
// then resumed: its heartbeats renew nothing (NOT_FOUND, naming the holder)
// and its leave drains nothing, so the replacement's lease runs out when the
// replacement dies, whatever the old process sends.
TEST_F(JobManagerTest, AReplacedProcessesHeartbeatsAndLeaveAreRefused) {
  v1::RegisterRequest old_process;
  old_process.set_role(v1::SERVER);
  old_process.set_requested_id("server-a");
  old_process.set_address("127.0.0.1:7101");
  old_process.set_incarnation(11);
  old_process.set_pid(100);
  ASSERT_TRUE(manager_->Register(old_process).ok());
  Advance(options_.lease + absl::Milliseconds(1));
  manager_->Tick();  // the old one's lease runs out
  v1::RegisterRequest replacement = old_process;
  replacement.set_address("127.0.0.1:7202");
  replacement.set_incarnation(22);
  replacement.set_pid(200);
  ASSERT_TRUE(manager_->Register(replacement).ok());

  v1::HeartbeatRequest stale;
  stale.set_member_id("server-a");
  stale.set_incarnation(11);
  const absl::Status refused = manager_->Heartbeat(stale).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound) << refused;
  EXPECT_TRUE(Contains(refused.message(), "pid 200")) << refused;
  EXPECT_TRUE(Contains(refused.message(), "replaced")) << refused;
  EXPECT_EQ(manager_->Leave("server-a", 11).code(), absl::StatusCode::kNotFound);
  v1::HeartbeatRequest current = stale;
  current.set_incarnation(22);
  EXPECT_TRUE(manager_->Heartbeat(current).ok());

  // The replacement dies; the old process keeps heartbeating: the lease runs out.
  for (int i = 0; i < 4; ++i) {
    Advance(options_.lease / 3);
    EXPECT_FALSE(manager_->Heartbeat(stale).ok());
    manager_->Tick();
  }
  EXPECT_EQ(manager_->Heartbeat(current).status().code(), absl::StatusCode::kNotFound) << "the lease ran out";
  v1::HeartbeatRequest unchecked = stale;
  unchecked.set_incarnation(0);
  EXPECT_EQ(manager_->Heartbeat(unchecked).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, ServerRejoiningWithAStaleCopyIsToldToDropIt) {
  const std::string job_id = StartJob();
  MakeTraining(job_id);
  // A server that is not among the job's servers (it was failed over while
  // partitioned, say) comes back claiming the job and one nobody knows.
  RegisterAs(v1::SERVER, "server-old", "127.0.0.1:7009", {job_id, "job-gone"});
  manager_->Tick();  // runs the queued calls
  std::set<std::string> dropped;
  for (const auto& drop : servers_.drops()) {
    if (drop.address == "127.0.0.1:7009") {
      dropped.insert(drop.job_id);
      EXPECT_FALSE(drop.keep_parameters);
      EXPECT_TRUE(Contains(drop.reason, "stale")) << drop.reason;
    }
  }
  EXPECT_EQ(dropped, (std::set<std::string>{job_id, "job-gone"}));
  // The job's own server re-registering with the job keeps it.
  RegisterAs(v1::SERVER, server_, kServerAddress, {job_id});
  manager_->Tick();
  for (const auto& drop : servers_.drops()) EXPECT_NE(drop.address, kServerAddress);
  EXPECT_EQ(GetOk(job_id).state(), v1::RUNNING);
}

TEST_F(JobManagerTest, BelowMinWorkersTheJobPausesUntilAWorkerJoins) {
  RegisterCluster();
  v1::JobSpec spec = MlpSpec();
  spec.set_min_workers(2);
  const std::string job_id = SubmitOk(spec);
  manager_->Tick();
  MakeTraining(job_id);
  EXPECT_EQ(HeartbeatOk(workers_[0], job_id).partitions_size(), 1);
  // workers_[1] dies: one ready worker left, below minWorkers.
  Advance(options_.lease / 2);
  HeartbeatOk(server_);
  HeartbeatOk(workers_[0], job_id);
  Advance(options_.lease / 2 + absl::Milliseconds(100));
  HeartbeatOk(server_);
  HeartbeatOk(workers_[0], job_id);
  manager_->Tick();
  v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::RUNNING);
  EXPECT_TRUE(Contains(status.reason(), "paused: waiting for workers")) << status.reason();
  v1::Assignment paused = HeartbeatOk(workers_[0], job_id);
  EXPECT_EQ(paused.phase(), v1::Assignment::TRAIN);
  EXPECT_EQ(paused.partitions_size(), 0) << "a paused job hands out no work";
  // A new worker joins and loads its data: the job resumes with both.
  const std::string joined = RegisterMember(v1::WORKER);
  manager_->Tick();
  ASSERT_TRUE(ReportKind(joined, job_id, v1::WorkReport::READY).ok());
  status = GetOk(job_id);
  EXPECT_FALSE(Contains(status.reason(), "paused")) << status.reason();
  EXPECT_EQ(HeartbeatOk(workers_[0], job_id).partitions_size(), 1);
  EXPECT_EQ(HeartbeatOk(joined, job_id).partitions_size(), 1);
  bool resumed = false;
  for (const auto& event : status.events()) resumed |= Contains(event.message(), "resumed");
  EXPECT_TRUE(resumed);
}

TEST_F(JobManagerTest, AWorkerSlowerThanTheOthersForThreeReportsIsAStraggler) {
  const std::string job_id = StartJob();
  MakeTraining(job_id);
  auto report = [&](const std::string& worker, double step_seconds) {
    v1::WorkReport r;
    r.set_member_id(worker);
    r.set_job_id(job_id);
    r.set_kind(v1::WorkReport::PROGRESS);
    r.set_step(10);
    r.set_step_seconds(step_seconds);
    ASSERT_TRUE(manager_->Report(r).ok());
  };
  auto flagged = [&](const std::string& worker) {
    const v1::JobStatus status = GetOk(job_id);
    for (const auto& w : status.workers()) {
      if (w.worker_id() == worker) return w.straggler();
    }
    return false;
  };
  report(workers_[0], 0.010);
  for (int i = 0; i < 2; ++i) report(workers_[1], 0.050);
  EXPECT_FALSE(flagged(workers_[1])) << "flagged after two slow reports";
  report(workers_[1], 0.050);
  EXPECT_TRUE(flagged(workers_[1]));
  EXPECT_FALSE(flagged(workers_[0]));
  bool event = false;
  const v1::JobStatus status = GetOk(job_id);
  for (const auto& e : status.events()) event |= Contains(e.message(), "straggler");
  EXPECT_TRUE(event);
  // Back within the bound: no longer flagged.
  report(workers_[1], 0.012);
  EXPECT_FALSE(flagged(workers_[1]));
}

// Periodic checkpoints keep their distance in the job's own steps: an ASP
// checkpoint's cut (each partition's lowest step) lies behind the progress
// that queued it, and the next one waits for everySteps past that progress,
// not past the cut (which queued checkpoints back to back).
TEST_F(JobManagerTest, PeriodicCheckpointsAreEveryStepsApartInAnAspJob) {
  std::string job_id;
  ASSERT_NO_FATAL_FAILURE(StartAspClickJob(100000, 100, 10, &job_id));
  ASSERT_GT(GetOk(job_id).progress().total_steps(), 1000);
  servers_.AnswerCheckpointsFor(GetOk(job_id).shard_map());
  auto progress_to = [&](int64_t step) { ProgressTo(job_id, step); };
  ASSERT_NO_FATAL_FAILURE(progress_to(99));
  EXPECT_EQ(GetOk(job_id).checkpoints_size(), 0);
  ASSERT_NO_FATAL_FAILURE(progress_to(150));
  ASSERT_EQ(GetOk(job_id).checkpoints_size(), 1);
  manager_->RunQueuedCheckpoints();
  v1::JobStatus status = GetOk(job_id);
  ASSERT_EQ(status.checkpoints(0).state(), v1::CheckpointInfo::COMPLETE) << status.checkpoints(0).reason();
  ASSERT_LT(status.checkpoints(0).step(), 150)
      << "the fake's cut lies behind the progress, as an ASP cut may";
  ASSERT_NO_FATAL_FAILURE(progress_to(151));
  ASSERT_NO_FATAL_FAILURE(progress_to(249));
  EXPECT_EQ(GetOk(job_id).checkpoints_size(), 1) << "queued before everySteps past the last one";
  ASSERT_NO_FATAL_FAILURE(progress_to(250));
  status = GetOk(job_id);
  ASSERT_EQ(status.checkpoints_size(), 2);
  EXPECT_EQ(status.checkpoints(1).trigger(), "every_steps");
}

// A job keeps at most 100 checkpoint records: past that the oldest failures
// are forgotten, the latest ones stay.
TEST_F(JobManagerTest, TheLatestCheckpointFailuresAreKept) {
  std::string job_id;
  ASSERT_NO_FATAL_FAILURE(StartAspClickJob(1000000, 1, 0, &job_id));
  // The fake refuses every checkpoint (no AnswerCheckpointsFor).
  for (int64_t step = 1; step <= 130; ++step) {
    ASSERT_NO_FATAL_FAILURE(ProgressTo(job_id, step));
    manager_->RunQueuedCheckpoints();
  }
  const v1::JobStatus status = GetOk(job_id);
  ASSERT_EQ(status.checkpoints_size(), 100);
  int64_t last = 0;
  for (const v1::CheckpointInfo& c : status.checkpoints()) {
    EXPECT_EQ(c.state(), v1::CheckpointInfo::FAILED);
    EXPECT_GT(c.id(), last);
    last = c.id();
  }
  EXPECT_GE(status.checkpoints(0).id(), 30) << "the oldest are forgotten first";
  EXPECT_GE(last, 129) << "the latest are kept";
}

// A job resumed from a checkpoint past its own last step (fewer epochs or
// maxSteps than the job that took it) fails saying so when its steps are
// known, instead of training from a step beyond its end; one that ends at
// the checkpoint's step sets up (it evaluates the checkpoint); one in
// another kind of mode (ASP from BSP) is refused at once.
TEST_F(JobManagerTest, AResumeFromACheckpointPastTheJobsLastStepFailsSayingSo) {
  std::string source;
  ASSERT_NO_FATAL_FAILURE(StartCheckpointOne(&source));
  servers_.AnswerCheckpointsFor(GetOk(source).shard_map());
  manager_->RunQueuedCheckpoints();
  v1::JobStatus status = GetOk(source);
  ASSERT_EQ(status.checkpoints_size(), 1);
  ASSERT_EQ(status.checkpoints(0).state(), v1::CheckpointInfo::COMPLETE) << status.checkpoints(0).reason();
  const int64_t cut = status.checkpoints(0).step();
  ASSERT_GE(cut, 2);
  ASSERT_TRUE(manager_->Cancel(source).ok());
  manager_->Tick();

  v1::JobSpec other_mode = MlpSpec();
  other_mode.set_mode(v1::ASP);
  const absl::StatusOr<v1::JobStatus> refused = manager_->Submit(other_mode, source);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(refused.status().message(),
                       "resumeFrom: job " + source + " trained in BSP and this job is ASP"))
      << refused.status();
  // Another optimizer would read the saved slots as its own: refused at once.
  v1::JobSpec other_optimizer = MlpSpec();
  other_optimizer.mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAGRAD);
  const absl::StatusOr<v1::JobStatus> mismatched = manager_->Submit(other_optimizer, source);
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      Contains(mismatched.status().message(), "resumeFrom: the checkpoint's dense optimizer state is"))
      << mismatched.status();

  // Resumed into a job of `steps` steps: its state once its data is counted.
  auto resume_into = [&](int64_t steps, bool softmax = false) {
    v1::JobSpec shorter = MlpSpec();
    shorter.mutable_data()->set_max_steps(steps);
    if (softmax) {  // another model: its tensors are not the checkpoint's
      shorter.mutable_model()->set_kind(v1::ModelSpec::SOFTMAX_REGRESSION);
      shorter.mutable_model()->clear_hidden_sizes();
    }
    absl::StatusOr<v1::JobStatus> resumed = manager_->Submit(shorter, source);
    EXPECT_TRUE(resumed.ok()) << resumed.status();
    if (!resumed.ok()) return v1::JobStatus();
    manager_->Tick();
    for (const std::string& w : workers_)
      EXPECT_TRUE(ReportKind(w, resumed->job_id(), v1::WorkReport::READY).ok());
    manager_->Tick();
    return GetOk(resumed->job_id());
  };
  status = resume_into(cut - 1);
  EXPECT_EQ(status.state(), v1::FAILED) << status.reason();
  EXPECT_TRUE(Contains(status.reason(), absl::StrCat("resumeFrom: checkpoint ", source, "/1 is at step ", cut,
                                                     ", past this job's last step ", cut - 1)))
      << status.reason();
  EXPECT_TRUE(Contains(status.reason(), absl::StrCat("set data.maxSteps to ", cut, " to evaluate it")))
      << status.reason();

  status = resume_into(cut, /*softmax=*/true);
  EXPECT_EQ(status.state(), v1::FAILED) << status.reason();
  EXPECT_TRUE(Contains(status.reason(),
                       "4 tensors saved (layer0.weight, layer0.bias, layer1.weight, layer1.bias), the "
                       "model has 2 (layer0.weight, layer0.bias)"))
      << status.reason();

  status = resume_into(cut);
  EXPECT_NE(status.state(), v1::FAILED) << status.reason();
  EXPECT_EQ(status.state(), v1::RUNNING) << status.reason();
}

TEST_F(JobManagerTest, CheckpointBeingWrittenAtARestartIsFailedAndItsDataDeleted) {
  std::string job_id;
  ASSERT_NO_FATAL_FAILURE(StartCheckpointOne(&job_id));
  v1::JobStatus status = GetOk(job_id);
  ASSERT_EQ(status.checkpoints_size(), 1);
  ASSERT_EQ(status.checkpoints(0).state(), v1::CheckpointInfo::WRITING);

  Restart();
  status = GetOk(job_id);
  ASSERT_EQ(status.checkpoints_size(), 1);
  EXPECT_EQ(status.checkpoints(0).state(), v1::CheckpointInfo::FAILED);
  EXPECT_TRUE(Contains(status.checkpoints(0).reason(), "scheduler restarted")) << status.checkpoints(0).reason();
  RegisterAs(v1::SERVER, server_, kServerAddress, {job_id});
  manager_->Tick();  // runs the queued calls
  const auto deleted = servers_.deleted_checkpoints();
  ASSERT_EQ(deleted.size(), 1u);
  EXPECT_EQ(deleted[0].first, kServerAddress);
  EXPECT_EQ(deleted[0].second, absl::StrCat(job_id, "/1"));
}

// A restore whose setup fails for a reason that passes (a server paused or
// cut off while it set up: UNAVAILABLE) tries the same checkpoint again,
// rather than giving it up as unreadable and failing the job when no older
// one is left; one that fails for the servers' budget fails the job naming
// the budget, without walking back through older checkpoints.
TEST_F(JobManagerTest, ARestoreSetupThatFailsForNowTriesTheSameCheckpointAgain) {
  std::string job_id;
  ASSERT_NO_FATAL_FAILURE(StartCheckpointOne(&job_id));
  servers_.AnswerCheckpointsFor(GetOk(job_id).shard_map());
  manager_->RunQueuedCheckpoints();
  ASSERT_EQ(GetOk(job_id).checkpoints(0).state(), v1::CheckpointInfo::COMPLETE);
  auto restart_from_checkpoint = [&](absl::Status setup) {
    Restart();
    servers_.FailSetups(std::move(setup));
    RegisterAs(v1::SERVER, server_, kServerAddress);  // came back without the job's parameters
    for (const std::string& w : workers_) RegisterAs(v1::WORKER, w);
    manager_->Tick();
    for (const std::string& w : workers_) (void)ReportKind(w, job_id, v1::WorkReport::READY);
    for (int i = 0; i < 3; ++i) manager_->Tick();  // the setup, and what its failure queues
  };
  ASSERT_NO_FATAL_FAILURE(restart_from_checkpoint(absl::UnavailableError(
      "the server at 127.0.0.1:7001 lost its lease while the call was in flight: cut short")));
  v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::RUNNING) << status.reason();
  EXPECT_EQ(status.checkpoints(0).state(), v1::CheckpointInfo::COMPLETE);
  std::string events;
  for (const auto& e : status.events()) absl::StrAppend(&events, e.message(), "\n");
  EXPECT_TRUE(Contains(events, "setting up checkpoint 1 failed for now")) << events;
  EXPECT_FALSE(Contains(events, "cannot be read")) << events;
  servers_.FailSetups(absl::OkStatus());
  manager_->Tick();
  for (const std::string& w : workers_) (void)ReportKind(w, job_id, v1::WorkReport::READY);
  for (int i = 0; i < 3; ++i) manager_->Tick();
  const std::vector<FakeServers::Setup> setups = servers_.setups();
  ASSERT_FALSE(setups.empty());
  EXPECT_EQ(setups.back().request.restore().checkpoint_id(), 1) << "the same checkpoint, set up again";
  EXPECT_NE(GetOk(job_id).state(), v1::FAILED) << GetOk(job_id).reason();

  ASSERT_NO_FATAL_FAILURE(restart_from_checkpoint(absl::ResourceExhaustedError(
      "sparse table embedding does not fit this server: its rows take 9 bytes, beyond the 8 bytes left")));
  status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_TRUE(Contains(status.reason(), "does not fit this server")) << status.reason();
  EXPECT_EQ(status.checkpoints(0).state(), v1::CheckpointInfo::COMPLETE)
      << "nothing is wrong with the checkpoint";
}

// A job going back to its checkpoint on a cluster that lost a worker (it
// ran on the survivor) restarts on the workers there are once they had two
// leases to come back, instead of waiting for numWorkers for good.
TEST_F(JobManagerTest, ARestoreStartsOnTheWorkersThereAreAfterTwoLeases) {
  std::string job_id;
  ASSERT_NO_FATAL_FAILURE(StartCheckpointOne(&job_id));
  servers_.AnswerCheckpointsFor(GetOk(job_id).shard_map());
  manager_->RunQueuedCheckpoints();
  ASSERT_EQ(GetOk(job_id).checkpoints(0).state(), v1::CheckpointInfo::COMPLETE);
  Restart();
  RegisterAs(v1::SERVER, server_, kServerAddress);  // back without the job's parameters
  RegisterAs(v1::WORKER, workers_[0]);              // worker 1 is gone for good
  manager_->Tick();
  EXPECT_EQ(GetOk(job_id).workers_size(), 0) << "waits for its workers first";
  EXPECT_TRUE(Contains(GetOk(job_id).reason(), "needs 2 workers")) << GetOk(job_id).reason();
  for (int i = 0; i < 3; ++i) {
    Advance(options_.lease * 2 / 3);
    HeartbeatOk(server_);
    HeartbeatOk(workers_[0]);
    manager_->Tick();
  }
  const v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.state(), v1::RUNNING) << status.reason();
  ASSERT_EQ(status.workers_size(), 1) << status.reason();
  EXPECT_EQ(status.workers(0).worker_id(), workers_[0]);
}

// The manifest is the commit point, and the job's record catches up after
// it: a scheduler stopped between the two finds the record saying WRITING
// and the manifest stored. That checkpoint is complete; its data stays.
TEST_F(JobManagerTest, CheckpointCommittedJustBeforeARestartIsCompleteAndKept) {
  std::string job_id;
  ASSERT_NO_FATAL_FAILURE(StartCheckpointOne(&job_id));
  ASSERT_EQ(GetOk(job_id).checkpoints(0).state(), v1::CheckpointInfo::WRITING);
  // What the checkpoint thread commits before it tells the manager.
  v1::CheckpointManifest manifest;
  manifest.set_job_id(job_id);
  manifest.mutable_info()->set_id(1);
  manifest.mutable_info()->set_step(2);
  manifest.mutable_info()->set_state(v1::CheckpointInfo::COMPLETE);
  manifest.mutable_info()->set_bytes(1234);
  ASSERT_TRUE(store_->Put(CheckpointManifestKey(job_id, 1), manifest.SerializeAsString()).ok());

  Restart();
  const v1::JobStatus status = GetOk(job_id);
  ASSERT_EQ(status.checkpoints_size(), 1);
  EXPECT_EQ(status.checkpoints(0).state(), v1::CheckpointInfo::COMPLETE) << status.checkpoints(0).reason();
  EXPECT_EQ(status.checkpoints(0).bytes(), 1234);
  auto kept = manager_->GetCheckpoint(job_id, 0);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->info().id(), 1);
  RegisterAs(v1::SERVER, server_, kServerAddress, {job_id});
  manager_->Tick();  // runs the queued calls
  EXPECT_TRUE(servers_.deleted_checkpoints().empty()) << "the committed checkpoint's data was deleted";
}

// A job with sparse tables that a second server joins: the scheduler takes a
// checkpoint to restart the job from over both servers (the buckets of a
// table do not move live). Here the checkpoint fails (this fake has none):
// the job trains on where it was, and the server is not asked again at once.
// A server without room for a share is not asked at all.
TEST_F(JobManagerTest, AServerJoiningAJobWithTablesIsTakenThroughACheckpoint) {
  v1::JobSpec spec = SmallClickSpec(2);
  spec.set_replicas(1);
  RegisterCluster();
  const std::string job_id = SubmitOk(spec);
  manager_->Tick();
  ASSERT_NO_FATAL_FAILURE(MakeTraining(job_id));
  ASSERT_EQ(GetOk(job_id).shard_map().tables_size(), 2);
  ASSERT_EQ(GetOk(job_id).shard_map().shards_size(), 1);

  // A server whose budget is already smaller than a share: not asked.
  const std::string small = RegisterMember(v1::SERVER, "127.0.0.1:7002", /*memory_budget=*/1);
  manager_->Tick();
  v1::JobStatus status = GetOk(job_id);
  EXPECT_EQ(status.checkpoints_size(), 0);
  EXPECT_TRUE(Contains(status.events().rbegin()->message(), small + " does not join: a share of the job takes"))
      << status.events().rbegin()->message();
  ASSERT_TRUE(manager_->Leave(small).ok());

  const std::string newcomer = RegisterMember(v1::SERVER, "127.0.0.1:7003");
  manager_->Tick();
  status = GetOk(job_id);
  ASSERT_EQ(status.checkpoints_size(), 1);
  EXPECT_EQ(status.checkpoints(0).trigger(), "reshard");
  EXPECT_EQ(status.checkpoints(0).state(), v1::CheckpointInfo::WRITING);
  EXPECT_TRUE(Contains(status.events().rbegin()->message(), newcomer + " joins: the job's tables move with checkpoint 1"))
      << status.events().rbegin()->message();
  manager_->Tick();  // one at a time: no second checkpoint while it is written
  EXPECT_EQ(GetOk(job_id).checkpoints_size(), 1);

  manager_->RunQueuedCheckpoints();  // the fake servers refuse it
  status = GetOk(job_id);
  EXPECT_EQ(status.checkpoints(0).state(), v1::CheckpointInfo::FAILED);
  EXPECT_TRUE(Contains(status.events().rbegin()->message(), newcomer + " does not join: checkpoint 1 failed"))
      << status.events().rbegin()->message();
  EXPECT_EQ(status.reason(), "training");
  EXPECT_EQ(status.restores(), 0);
  EXPECT_EQ(status.shard_map().shards_size(), 1);
  manager_->Tick();
  EXPECT_EQ(GetOk(job_id).checkpoints_size(), 1) << "asked again at once";
  EXPECT_TRUE(servers_.drops().empty());
}

// A job's claim on a server follows what the server says it holds of it
// when that is more than the estimate (tables grow with their rows, which no
// spec says beforehand): a job that no longer fits beside it waits, and a
// server joining the job is asked only with room for a share of what the
// job holds. Held bytes no server could report are refused.
TEST_F(JobManagerTest, AServersHeldBytesRaiseItsClaimAndHoldBackWhatNoLongerFits) {
  constexpr int64_t kBudget = int64_t{1} << 30;
  server_ = RegisterMember(v1::SERVER, kServerAddress, kBudget);
  workers_.push_back(RegisterMember(v1::WORKER));
  workers_.push_back(RegisterMember(v1::WORKER));
  v1::JobSpec spec = SmallClickSpec(2);
  spec.set_replicas(1);
  const std::string click = SubmitOk(spec);
  manager_->Tick();
  ASSERT_NO_FATAL_FAILURE(MakeTraining(click));
  auto claimed = [&](const std::string& id) {
    for (const v1::MemberInfo& m : manager_->Members()) {
      if (m.member_id() == id) return m.memory_claimed_bytes();
    }
    return int64_t{-1};
  };
  const int64_t estimate = claimed(server_);
  ASSERT_GT(estimate, 0);
  ASSERT_LT(estimate, kBudget / 4);

  auto heartbeat = [&](const std::map<std::string, int64_t>& held) {
    v1::HeartbeatRequest request;
    request.set_member_id(server_);
    for (const auto& [job, bytes] : held) (*request.mutable_held_bytes())[job] = bytes;
    return manager_->Heartbeat(request).status();
  };
  // Less than the estimate: the estimate stands. A job the scheduler does
  // not know counts for nothing.
  ASSERT_TRUE(heartbeat({{click, estimate / 2}, {"no-such-job", kBudget}}).ok());
  EXPECT_EQ(claimed(server_), estimate);
  // The tables grew to most of the budget.
  const int64_t held = kBudget - (int64_t{1} << 20);
  ASSERT_TRUE(heartbeat({{click, held}}).ok());
  EXPECT_EQ(claimed(server_), held);

  // A server joining the click job must have room for half of what it holds.
  const std::string small = RegisterMember(v1::SERVER, "127.0.0.1:7002", held / 4);
  manager_->Tick();
  v1::JobStatus status = GetOk(click);
  EXPECT_EQ(status.checkpoints_size(), 0);
  EXPECT_TRUE(
      Contains(status.events().rbegin()->message(),
               absl::StrCat(small, " does not join: a share of the job takes ", FormatBytes(held / 2))))
      << status.events().rbegin()->message();
  ASSERT_TRUE(manager_->Leave(small).ok());

  // A second job's claim (a few MB) no longer fits beside it: it waits.
  workers_.push_back(RegisterMember(v1::WORKER));
  const std::string mlp = SubmitOk(MlpSpec(1));
  manager_->Tick();
  status = GetOk(mlp);
  EXPECT_EQ(status.state(), v1::PENDING);
  EXPECT_TRUE(Contains(status.reason(), "0 of 1 servers with the")) << status.reason();

  // The tables shrank (rows expired): the second job starts.
  ASSERT_TRUE(heartbeat({{click, estimate}}).ok());
  manager_->Tick();
  EXPECT_EQ(GetOk(mlp).state(), v1::RUNNING) << GetOk(mlp).reason();

  // Counts no server reports are refused, and renew nothing.
  EXPECT_EQ(heartbeat({{click, -1}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(heartbeat({{click, kMaxHeldBytes + 1}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(heartbeat({{click, std::numeric_limits<int64_t>::max()}}).code(), absl::StatusCode::kInvalidArgument);
  std::map<std::string, int64_t> many;
  for (int i = 0; i <= kMaxHeldJobs; ++i) many[absl::StrCat("job-", i)] = 1;
  EXPECT_EQ(heartbeat(many).code(), absl::StatusCode::kInvalidArgument);
}

// What clients can make the scheduler hold is bounded: jobs not ended and
// members. Past either, RESOURCE_EXHAUSTED naming the flag; a job that ends
// or a member whose lease runs out frees its place, and a member registering
// again under its own id is not a new one.
TEST_F(JobManagerTest, JobsAndMembersPastTheSchedulersBoundsAreRefused) {
  options_.max_active_jobs = 2;
  options_.max_members = 3;
  ASSERT_NO_FATAL_FAILURE(Restart());
  RegisterCluster();
  v1::RegisterRequest fourth;
  fourth.set_role(v1::WORKER);
  absl::StatusOr<v1::RegisterResponse> refused = manager_->Register(fourth);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(), "the cluster has 3 members")) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(), "--max_members")) << refused.status();
  EXPECT_EQ(RegisterAs(v1::SERVER, server_, kServerAddress), server_);  // a restart of the same one

  const std::string first = SubmitOk(MlpSpec());
  SubmitOk(MlpSpec());
  absl::StatusOr<v1::JobStatus> third = manager_->Submit(MlpSpec());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_TRUE(Contains(third.status().message(), "holds 2 jobs that have not ended")) << third.status();
  EXPECT_TRUE(Contains(third.status().message(), "--max_active_jobs")) << third.status();
  ASSERT_TRUE(manager_->Cancel(first).ok());
  SubmitOk(MlpSpec());

  // A worker silent past its lease is gone: its place is free.
  Advance(options_.lease / 2);
  HeartbeatOk(server_);
  HeartbeatOk(workers_[0]);
  Advance(options_.lease / 2 + absl::Milliseconds(100));
  manager_->Tick();
  ASSERT_EQ(manager_->Members().size(), 2u);
  EXPECT_TRUE(manager_->Register(fourth).ok());
}

// A checkpoint records what one copy of the job took on the servers (its
// tables as they had grown), and a job resumed from it is placed by that, not
// by the spec's estimate: refused at submit where the servers' budgets can
// never hold it, waiting while they have no room, placed where they do.
TEST_F(JobManagerTest, AResumeIsPlacedByWhatTheCheckpointTookOnTheServers) {
  constexpr int64_t kBudget = int64_t{1} << 30;
  constexpr int64_t kMiB = int64_t{1} << 20;
  constexpr char kOtherAddress[] = "127.0.0.1:7002";
  const std::string a = RegisterMember(v1::SERVER, kServerAddress, kBudget);
  const std::string b = RegisterMember(v1::SERVER, kOtherAddress, kBudget);
  workers_.push_back(RegisterMember(v1::WORKER));
  workers_.push_back(RegisterMember(v1::WORKER));
  auto heartbeat = [&](const std::string& server, const std::map<std::string, int64_t>& held) {
    v1::HeartbeatRequest request;
    request.set_member_id(server);
    for (const auto& [job, bytes] : held) (*request.mutable_held_bytes())[job] = bytes;
    return manager_->Heartbeat(request).status();
  };
  v1::JobSpec spec = SmallClickSpec(2);
  spec.set_replicas(1);
  spec.mutable_checkpoint()->set_every_steps(1);
  const std::string source = SubmitOk(spec);
  manager_->Tick();
  ASSERT_NO_FATAL_FAILURE(MakeTraining(source));
  ASSERT_EQ(GetOk(source).shard_map().shards_size(), 2);
  // The tables grew to 600 MiB on each server; then a checkpoint.
  ASSERT_TRUE(heartbeat(a, {{source, 600 * kMiB}}).ok());
  ASSERT_TRUE(heartbeat(b, {{source, 600 * kMiB}}).ok());
  v1::WorkReport progress;
  progress.set_member_id(workers_[0]);
  progress.set_job_id(source);
  progress.set_kind(v1::WorkReport::PROGRESS);
  progress.set_step(2);
  ASSERT_TRUE(manager_->Report(progress).ok());
  manager_->Tick();  // queues checkpoint 1
  servers_.AnswerCheckpointsFor(GetOk(source).shard_map());
  manager_->RunQueuedCheckpoints();
  v1::JobStatus status = GetOk(source);
  ASSERT_EQ(status.checkpoints_size(), 1);
  ASSERT_EQ(status.checkpoints(0).state(), v1::CheckpointInfo::COMPLETE) << status.checkpoints(0).reason();
  EXPECT_EQ(status.checkpoints(0).server_bytes(), 1200 * kMiB);
  ASSERT_TRUE(manager_->Cancel(source).ok());
  manager_->Tick();
  ASSERT_TRUE(heartbeat(a, {}).ok());
  ASSERT_TRUE(heartbeat(b, {}).ok());
  v1::JobSpec resumed = SmallClickSpec(2);
  resumed.set_replicas(1);

  // With server a gone, b's 1 GiB can never hold the 1.2 GiB: refused now
  // (the estimate alone, well under 1 MiB, would have been placed there
  // and refused by b's budget mid-restore).
  ASSERT_TRUE(manager_->Leave(a).ok());
  Advance(options_.lease / 2);
  for (const std::string& member : {b, workers_[0], workers_[1]}) ASSERT_TRUE(heartbeat(member, {}).ok());
  Advance(options_.lease / 2 + absl::Milliseconds(100));
  manager_->Tick();  // a's lease ran out: it is gone
  ASSERT_EQ(manager_->Members().size(), 3u);
  absl::StatusOr<v1::JobStatus> refused = manager_->Submit(resumed, source);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(), "resumeFrom: the checkpoint's state took 1.2 GiB"))
      << refused.status();

  // a back (the same id: it holds half the checkpoint), but still holding
  // 500 MiB of the ended job: the share of 600 MiB fits only b, and all of
  // it fits neither.
  v1::RegisterRequest again;
  again.set_role(v1::SERVER);
  again.set_address(kServerAddress);
  again.set_requested_id(a);
  again.set_memory_budget_bytes(kBudget);
  ASSERT_TRUE(manager_->Register(again).ok());
  ASSERT_TRUE(heartbeat(a, {{source, 500 * kMiB}}).ok());
  const std::string job = SubmitOk(resumed, source);
  manager_->Tick();
  for (const std::string& w : workers_) ASSERT_TRUE(ReportKind(w, job, v1::WorkReport::READY).ok());
  manager_->Tick();
  status = GetOk(job);
  EXPECT_NE(status.reason(), "training");
  EXPECT_TRUE(Contains(
      status.reason(),
      absl::StrCat("waiting for a parameter server with room: the job claims ", FormatBytes(1200 * kMiB),
                   " on each (checkpoint ", source, "/1 held ", FormatBytes(1200 * kMiB))))
      << status.reason();

  // Dropped there: placed on both, each claiming its 600 MiB share.
  ASSERT_TRUE(heartbeat(a, {}).ok());
  manager_->Tick();
  status = GetOk(job);
  ASSERT_EQ(status.reason(), "training");
  std::set<std::string> placed;
  for (const v1::ShardLocation& shard : status.shard_map().shards()) placed.insert(shard.server_id());
  EXPECT_EQ(placed, (std::set<std::string>{a, b}));
  for (const v1::MemberInfo& m : manager_->Members()) {
    if (m.member_id() == a || m.member_id() == b) {
      EXPECT_EQ(m.memory_claimed_bytes(), 600 * kMiB) << m.member_id();
    }
  }
}

// A re-shard's restart that a server cannot take part in (here the newcomer
// refuses its setup, as one that died or lost its room would) starts again
// from the same checkpoint without that server, and the job trains on
// where it was; that newcomer is not asked again at once.
TEST_F(JobManagerTest, AReshardRestartThatAServerFailsGoesOnWithoutIt) {
  v1::JobSpec spec = SmallClickSpec(2);
  spec.set_replicas(1);
  RegisterCluster();
  const std::string job_id = SubmitOk(spec);
  manager_->Tick();
  ASSERT_NO_FATAL_FAILURE(MakeTraining(job_id));
  servers_.AnswerCheckpointsFor(GetOk(job_id).shard_map());
  constexpr char kNewcomer[] = "127.0.0.1:7003";
  const std::string newcomer = RegisterMember(v1::SERVER, kNewcomer);
  manager_->Tick();
  ASSERT_EQ(GetOk(job_id).checkpoints_size(), 1);
  servers_.FailSetupsAt(kNewcomer, absl::ResourceExhaustedError("no room left"));
  const size_t setups_before = servers_.setups().size();
  manager_->RunQueuedCheckpoints();  // complete: a restart over both servers
  v1::JobStatus status = GetOk(job_id);
  ASSERT_EQ(status.checkpoints_size(), 1);
  EXPECT_EQ(status.checkpoints(0).state(), v1::CheckpointInfo::COMPLETE) << status.checkpoints(0).reason();
  // The setups: the newcomer's fails, and the job restarts without it (the
  // old server alone, from checkpoint 1) until it trains again.
  std::vector<std::string> reasons;
  for (int tick = 0; tick < 8 && GetOk(job_id).reason() != "training"; ++tick) {
    manager_->Tick();
    reasons.push_back(GetOk(job_id).reason());
    if (reasons.back() != "workers loading data") continue;
    for (const std::string& w : workers_) ReportKind(w, job_id, v1::WorkReport::READY).IgnoreError();
  }
  status = GetOk(job_id);
  ASSERT_EQ(status.state(), v1::RUNNING) << status.reason();
  ASSERT_EQ(status.reason(), "training") << absl::StrJoin(reasons, "; ");
  EXPECT_TRUE(
      Contains(absl::StrJoin(reasons, "; "), "the job restarts from the same checkpoint without " + newcomer))
      << absl::StrJoin(reasons, "; ");
  int newcomer_setups = 0, restores = 0;
  const std::vector<FakeServers::Setup> setups = servers_.setups();
  for (size_t i = setups_before; i < setups.size(); ++i) {
    newcomer_setups += setups[i].address == kNewcomer ? 1 : 0;
    restores += setups[i].request.restore().checkpoint_id() == 1 ? 1 : 0;
  }
  EXPECT_EQ(newcomer_setups, 1);
  EXPECT_GE(restores, 2) << "the first restart's and the second's";
  ASSERT_EQ(status.shard_map().shards_size(), 1);
  EXPECT_EQ(status.shard_map().shards(0).address(), kServerAddress);
  EXPECT_EQ(status.shard_map().tables_size(), 2);
  manager_->Tick();
  EXPECT_EQ(GetOk(job_id).checkpoints_size(), 1) << "the newcomer is not asked again at once";
}

// A server that joins a dense job as a new shard copies its chunks awaiting
// activation, and the scheduler activates it (the map again) only once the
// handover is committed. A copy that fails is never activated: the map goes
// back, and the server had taken no write that going back would lose.
TEST_F(JobManagerTest, ANewShardIsActivatedOnlyOnceItsHandoverIsCommitted) {
  RegisterCluster();
  const std::string job_id = SubmitOk(MlpSpec());
  manager_->Tick();
  ASSERT_NO_FATAL_FAILURE(MakeTraining(job_id));
  ASSERT_EQ(GetOk(job_id).shard_map().shards_size(), 1);
  const int64_t before = GetOk(job_id).shard_map().version();
  const size_t setup_calls = servers_.calls().size();
  RegisterMember(v1::SERVER, "127.0.0.1:7002");
  manager_->Tick();  // the new shard, its copy and its activation
  v1::JobStatus status = GetOk(job_id);
  ASSERT_EQ(status.shard_map().shards_size(), 2);
  const int64_t version = status.shard_map().version();
  EXPECT_EQ(version, before + 1);
  const std::vector<std::string> calls = servers_.calls();
  EXPECT_EQ(std::vector<std::string>(calls.begin() + static_cast<std::ptrdiff_t>(setup_calls), calls.end()),
            (std::vector<std::string>{
                absl::StrCat("Reconfigure ", kServerAddress, " v", version),
                absl::StrCat("SetupJob 127.0.0.1:7002 v", version, " awaiting activation"),
                absl::StrCat("Reconfigure 127.0.0.1:7002 v", version),
                // Committed and saved, the move is told to the server the
                // chunks left, which frees them then (not before: an undone
                // handover gives them back as they are).
                absl::StrCat("FreeMovedChunks ", kServerAddress, " v", version),
            }));
  // The copy names the shard it joins (what the server may hold of it is
  // stale); a job's first setup names none.
  const std::vector<FakeServers::Setup> setups = servers_.setups();
  ASSERT_EQ(setups.back().address, "127.0.0.1:7002");
  EXPECT_TRUE(setups.back().request.has_joined_shard());
  EXPECT_EQ(setups.back().request.joined_shard(), 1);
  EXPECT_FALSE(setups.front().request.has_joined_shard());

  // A third server joins; its copy fails for good (it has no room).
  RegisterMember(v1::SERVER, "127.0.0.1:7003");
  servers_.FailSetups(absl::ResourceExhaustedError("no room"));
  manager_->Tick();
  status = GetOk(job_id);
  EXPECT_EQ(status.shard_map().shards_size(), 2) << "the map went back";
  bool copied = false;
  for (const std::string& call : servers_.calls()) {
    copied |= absl::StartsWith(call, "SetupJob 127.0.0.1:7003") && absl::StrContains(call, "awaiting activation");
    EXPECT_FALSE(absl::StartsWith(call, "Reconfigure 127.0.0.1:7003")) << call;
    EXPECT_FALSE(absl::StartsWith(call, "FreeMovedChunks") &&
                 !absl::EndsWith(call, absl::StrCat(" v", version)))
        << call << ": the undone handover's moves are not committed";
  }
  EXPECT_TRUE(copied) << "the third server was never asked to copy";
}

// The servers a new shard's chunks left are told to free them only once
// the scheduler has saved the commit: one restarted from an older record
// would copy the chunks from them again.
TEST_F(JobManagerTest, MovedChunksAreFreedOnlyOnceTheCommitIsSaved) {
  RegisterCluster();
  const std::string job_id = SubmitOk(MlpSpec());
  manager_->Tick();
  ASSERT_NO_FATAL_FAILURE(MakeTraining(job_id));
  store_->failing = true;
  RegisterMember(v1::SERVER, "127.0.0.1:7002");
  manager_->Tick();  // the new shard, its copy and its activation; the save fails
  const int64_t version = GetOk(job_id).shard_map().version();
  ASSERT_EQ(GetOk(job_id).shard_map().shards_size(), 2);
  auto frees = [&] {
    std::vector<std::string> sent;
    for (const std::string& call : servers_.calls()) {
      if (absl::StartsWith(call, "FreeMovedChunks")) sent.push_back(call);
    }
    return sent;
  };
  EXPECT_TRUE(frees().empty()) << "sent before the commit was saved";
  manager_->Tick();
  EXPECT_TRUE(frees().empty()) << "sent while the store still fails";
  store_->failing = false;
  manager_->Tick();
  EXPECT_EQ(frees(),
            (std::vector<std::string>{absl::StrCat("FreeMovedChunks ", kServerAddress, " v", version)}));
  // The record saved is the committed one (a failed write's records are
  // written again), so a restart resumes no handover.
  ASSERT_NO_FATAL_FAILURE(Restart());
  EXPECT_EQ(GetOk(job_id).shard_map().shards_size(), 2);
  EXPECT_EQ(GetOk(job_id).shard_map().version(), version);
}

// A new shard's handover undone while its copy runs (another replica's lease
// runs out meanwhile), the copy then succeeding: the newcomer is told to
// drop that copy once it is answered (the undo's own DropJob may have come
// before the copy was installed), and it is never activated.
TEST_F(JobManagerTest, ACopyThatSucceedsAfterItsHandoverWasUndoneIsDropped) {
  RegisterCluster();
  const std::string b = RegisterMember(v1::SERVER, "127.0.0.1:7002");
  v1::JobSpec spec = MlpSpec();
  spec.set_replicas(2);
  const std::string job_id = SubmitOk(spec);
  manager_->Tick();
  ASSERT_NO_FATAL_FAILURE(MakeTraining(job_id));
  ASSERT_EQ(GetOk(job_id).shard_map().shards_size(), 2);
  auto keep_alive = [&](const std::vector<std::string>& servers) {
    for (const std::string& s : servers) HeartbeatOk(s);
    for (const std::string& w : workers_) HeartbeatOk(w, job_id);
  };
  const std::string c = RegisterMember(v1::SERVER, "127.0.0.1:7003");
  servers_.DuringNextSetup([&] {
    // While the newcomer copies, the second server's lease runs out.
    Advance(options_.lease / 2);
    keep_alive({server_, c});
    Advance(options_.lease / 2 + absl::Milliseconds(100));
    keep_alive({server_, c});
    manager_->Tick();
  });
  keep_alive({server_, b, c});
  manager_->Tick();  // the new shard's copy (and, inside it, the failover that undoes it)
  manager_->Tick();  // what the copy's answer queued
  v1::JobStatus status = GetOk(job_id);
  ASSERT_EQ(status.state(), v1::RUNNING) << status.reason();
  ASSERT_EQ(status.shard_map().shards_size(), 2) << "the handover was undone";
  // Of the newcomer's calls: the copy's SetupJob, the undo's DropJob, made
  // while the copy ran (here: before it answered), then the DropJob that
  // followed its answer. No activation, and no new copy while it ran.
  std::vector<std::string> newcomer_calls;
  for (const std::string& call : servers_.calls()) {
    if (absl::StrContains(call, "127.0.0.1:7003")) newcomer_calls.push_back(call);
  }
  ASSERT_GE(newcomer_calls.size(), 3u) << absl::StrJoin(newcomer_calls, "; ");
  EXPECT_TRUE(absl::StartsWith(newcomer_calls[0], "DropJob 127.0.0.1:7003")) << absl::StrJoin(newcomer_calls, "; ");
  EXPECT_TRUE(absl::StartsWith(newcomer_calls[1], "SetupJob 127.0.0.1:7003 v2 awaiting activation"))
      << absl::StrJoin(newcomer_calls, "; ");
  EXPECT_TRUE(absl::StartsWith(newcomer_calls[2], "DropJob 127.0.0.1:7003")) << absl::StrJoin(newcomer_calls, "; ");
  for (const std::string& call : newcomer_calls) {
    EXPECT_FALSE(absl::StartsWith(call, "Reconfigure")) << absl::StrJoin(newcomer_calls, "; ");
  }
}

// A server added as a backup of a shard (re-replication after a loss) is
// asked to copy it naming the shard it joins: whatever it may still hold of
// that shard is stale (SetupJobRequest.joined_shard).
TEST_F(JobManagerTest, ABackupsCopyNamesTheShardItJoins) {
  RegisterCluster();
  const std::string b = RegisterMember(v1::SERVER, "127.0.0.1:7002");
  v1::JobSpec spec = MlpSpec();
  spec.set_replicas(2);
  spec.set_num_shards(1);
  const std::string job_id = SubmitOk(spec);
  manager_->Tick();
  ASSERT_NO_FATAL_FAILURE(MakeTraining(job_id));
  ASSERT_EQ(GetOk(job_id).shard_map().shards_size(), 1);
  const std::string c = RegisterMember(v1::SERVER, "127.0.0.1:7003");
  // b's lease runs out: the shard is a replica short, and c joins it.
  for (int half = 0; half < 2; ++half) {
    Advance(options_.lease / 2 + absl::Milliseconds(half * 100));
    HeartbeatOk(server_);
    HeartbeatOk(c);
    for (const std::string& w : workers_) HeartbeatOk(w, job_id);
  }
  manager_->Tick();
  manager_->Tick();
  const v1::ShardLocation shard = GetOk(job_id).shard_map().shards(0);
  ASSERT_EQ(shard.backup_ids_size(), 1);
  EXPECT_EQ(shard.backup_ids(0), c);
  bool named = false;
  for (const FakeServers::Setup& setup : servers_.setups()) {
    if (setup.address != "127.0.0.1:7003") continue;
    EXPECT_FALSE(setup.request.copy_from().empty());
    EXPECT_TRUE(setup.request.has_joined_shard());
    EXPECT_EQ(setup.request.joined_shard(), 0);
    named = true;
  }
  EXPECT_TRUE(named) << "c was never asked to copy the shard";
}

// A new shard's activation that does not get through (the newcomer
// unreachable for a moment) is sent again on later ticks until the server
// takes it: a leader never activated would refuse its shard's writes for good.
TEST_F(JobManagerTest, ANewShardsActivationIsSentAgainUntilItGetsThrough) {
  RegisterCluster();
  const std::string job_id = SubmitOk(MlpSpec());
  manager_->Tick();
  ASSERT_NO_FATAL_FAILURE(MakeTraining(job_id));
  const std::string newcomer = RegisterMember(v1::SERVER, "127.0.0.1:7002");
  auto activations = [&] {
    int n = 0;
    for (const std::string& call : servers_.calls()) n += absl::StartsWith(call, "Reconfigure 127.0.0.1:7002") ? 1 : 0;
    return n;
  };
  auto next_tick = [&] {
    Advance(absl::Milliseconds(600));
    for (const std::string& s : {server_, newcomer}) HeartbeatOk(s);
    for (const std::string& w : workers_) HeartbeatOk(w, job_id);
    manager_->Tick();
  };
  servers_.FailReconfigures(absl::UnavailableError("connection reset"));
  manager_->Tick();  // the copy succeeds, its activation does not
  ASSERT_EQ(GetOk(job_id).shard_map().shards_size(), 2);
  EXPECT_EQ(activations(), 1);
  manager_->Tick();
  EXPECT_EQ(activations(), 1) << "sent again before its 500 ms";
  next_tick();
  EXPECT_EQ(activations(), 2) << "sent again";
  servers_.FailReconfigures(absl::OkStatus());
  next_tick();
  EXPECT_EQ(activations(), 3) << "sent again, and taken";
  for (int i = 0; i < 3; ++i) next_tick();
  EXPECT_EQ(activations(), 3) << "not sent once taken";
  EXPECT_EQ(GetOk(job_id).reason(), "training");
}

}  // namespace fulcrum
