// Checkpoints, multi-process on loopback: whole-cluster kill -9 and resume,
// a server killed while a checkpoint is written, a corrupt stored chunk,
// resuming onto another topology, and export to safetensors.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/safetensors.h"
#include "common/kv_store.h"
#include "tests/click_job.h"
#include "tests/cluster_fixture.h"
#include "tests/live_export.h"

namespace fulcrum {
namespace {

constexpr int64_t kExamples = 4096;  // SyntheticSpec's training set

class CheckpointTest : public ClusterTest {
 protected:
  // One replica per shard: losing a server loses its shards, so only a
  // checkpoint can save the job.
  static void SetUpTestSuite() { StartCluster(2, 2, /*replicas=*/1); }

  // A seeded BSP job of a few seconds (3072 steps).
  static v1::JobSpec Spec(int64_t every_steps) {
    v1::JobSpec spec = SyntheticSpec(v1::BSP, 2, 2, 0);
    spec.mutable_model()->set_hidden_sizes(0, 64);
    spec.mutable_data()->set_epochs(3);
    spec.mutable_checkpoint()->set_every_steps(every_steps);
    spec.mutable_checkpoint()->set_keep_last(3);
    return spec;
  }

  // The parameters of the job run without any disturbance (checkpoints do
  // not change them), computed once per suite.
  static const std::vector<float>& Reference() {
    static const std::vector<float>* reference = [] {
      auto id = Submit(Spec(0));
      EXPECT_TRUE(id.ok()) << id.status();
      v1::JobStatus done = WaitForEnd(*id);
      EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
      return new std::vector<float>(FinalParameters(done));
    }();
    return *reference;
  }

  // For comparing accuracies: a bigger test set (3276 examples) and a model
  // trained to convergence, so that run-to-run rounding differences do not
  // move the accuracy by more than a fraction of a point.
  static v1::JobSpec AccuracySpec(int workers, int batch) {
    v1::JobSpec spec = Spec(0);
    spec.set_num_workers(workers);
    spec.mutable_data()->set_batch_size(batch);
    spec.mutable_data()->set_synthetic_examples(16384);
    spec.mutable_data()->set_epochs(3);
    spec.mutable_optimizer()->set_lr(0.05f);
    return spec;
  }

  static int Complete(const v1::JobStatus& job) {
    int n = 0;
    for (const auto& c : job.checkpoints()) n += c.state() == v1::CheckpointInfo::COMPLETE ? 1 : 0;
    return n;
  }

  static v1::JobStatus WaitForCheckpoints(const std::string& id, int n) {
    return WaitFor(
        id, [n](const v1::JobStatus& s) { return Complete(s) >= n || Terminal(s.state()); }, absl::Seconds(60));
  }

  static std::string Describe(const google::protobuf::RepeatedPtrField<v1::CheckpointInfo>& checkpoints) {
    std::string out;
    for (const v1::CheckpointInfo& c : checkpoints) {
      absl::StrAppend(&out, "\n  ", c.id(), " ", v1::CheckpointInfo::State_Name(c.state()), " step ", c.step(),
                      " base ", c.base_id(), " chain ", c.chain(), " ", c.bytes(), " bytes ", c.reason());
    }
    return out;
  }

  // The checkpoint the job was restored from, per its events (0: none).
  static int64_t RestoredFrom(const v1::JobStatus& job) {
    int64_t id = 0;
    for (const auto& e : job.events()) {
      long long n = 0;
      if (std::sscanf(e.message().c_str(), "restored from checkpoint %lld", &n) == 1) id = n;
    }
    return id;
  }

  // A server that holds dense chunks of the job (the last such shard's).
  static std::string AServerWithChunks(const v1::JobStatus& job) {
    std::string server;
    for (const auto& shard : job.shards()) {
      if (shard.chunks() > 0) server = shard.server_id();
    }
    return server;
  }

  static const v1::CheckpointInfo* Info(const v1::JobStatus& job, int64_t id) {
    for (const auto& c : job.checkpoints()) {
      if (c.id() == id) return &c;
    }
    return nullptr;
  }

  // Kills server `victim` -9 and starts it again on its volume, as
  // Kubernetes restarts a pod.
  static void KillAndRestartServer(const std::string& victim) {
    ASSERT_TRUE(cluster_->Signal(victim, SIGKILL).ok());
    absl::StatusOr<v1::LocalProcess> restarted;
    for (absl::Time deadline = absl::Now() + absl::Seconds(10); absl::Now() < deadline;) {
      restarted = cluster_->RestartServer(victim);  // FAILED_PRECONDITION until the killed one is gone
      if (restarted.ok() || restarted.status().code() != absl::StatusCode::kFailedPrecondition) break;
    }
    ASSERT_TRUE(restarted.ok()) << restarted.status();
  }

  // Runs `spec` (with checkpoints), kills -9 every process after its first
  // checkpoint and starts the cluster again on the same folders: the job
  // must resume from a checkpoint and end with `expected`, every example
  // used once per epoch.
  static void ExpectWholeClusterKillResumesTo(const v1::JobSpec& spec, const std::vector<float>& expected) {
    auto id = Submit(spec);
    ASSERT_TRUE(id.ok()) << id.status();
    v1::JobStatus running = WaitForCheckpoints(*id, 1);
    ASSERT_EQ(running.state(), v1::RUNNING) << "the job ended before a checkpoint: " << running.reason();

    KillAndRestartWholeCluster();

    v1::JobStatus done = WaitForEnd(*id);
    ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
    EXPECT_GT(RestoredFrom(done), 0) << "no event says the job was restored";
    ExpectEveryExampleUsedOncePerEpoch(done, kExamples);
    ExpectSameParameters(expected, done);
  }

  static absl::StatusOr<v1::CheckpointInfo> CheckpointNow(const std::string& job_id) {
    grpc::ClientContext context;
    SetDeadline(&context, 120);
    v1::CheckpointJobRequest request;
    request.set_job_id(job_id);
    v1::CheckpointInfo info;
    absl::Status status = FromGrpcStatus(stub_->CheckpointJob(&context, request, &info));
    if (!status.ok()) return status;
    return info;
  }
};

// Kill -9 every process mid-job and start the cluster again on the same
// folders: the job resumes from its latest complete checkpoint and ends with
// the parameters of an uninterrupted run, every example used once per epoch.
TEST_F(CheckpointTest, WholeClusterKillResumesBitIdentical) {
  ExpectWholeClusterKillResumesTo(Spec(300), Reference());
}

// The same with LAMB: a checkpoint cuts every chunk after a step applied
// (never between a step's gradients and its norms), and the resumed job
// settles its steps as before; it ends bit-identical to an undisturbed run.
TEST_F(CheckpointTest, LambJobResumesBitIdenticalAfterAWholeClusterKill) {
  auto lamb = [](int64_t every_steps) {
    v1::JobSpec spec = Spec(every_steps);
    spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::LAMB);
    spec.mutable_optimizer()->set_lr(0.01f);
    spec.mutable_optimizer()->set_momentum(0);
    spec.mutable_optimizer()->set_weight_decay(0.01f);
    return spec;
  };
  v1::JobStatus reference;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(lamb(0), &reference));
  ExpectWholeClusterKillResumesTo(lamb(300), FinalParameters(reference));
}

// A flipped byte in a stored chunk of the latest checkpoint: the restore
// detects it, names the chunk and the checkpoint, marks it CORRUPT and falls
// back to the previous one; the result is still the uninterrupted run's.
TEST_F(CheckpointTest, CorruptChunkIsDetectedAndThePreviousCheckpointUsed) {
  const std::vector<float> expected = Reference();
  auto id = Submit(Spec(200));
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus running = WaitForCheckpoints(*id, 2);
  ASSERT_EQ(running.state(), v1::RUNNING) << running.reason();

  // Everything down; then read the latest committed manifest from the
  // scheduler's store and damage one of its chunks where it is stored.
  stub_.reset();
  cluster_.reset();
  v1::CheckpointManifest latest;
  {
    auto scheduler = OpenRocksDbStore(options_.dir + "/scheduler-state");
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    auto manifests = (*scheduler)->Scan(absl::StrCat("ckpt/", *id, "/"));
    ASSERT_TRUE(manifests.ok()) << manifests.status();
    ASSERT_GE(manifests->size(), 2u);
    ASSERT_TRUE(latest.ParseFromString(manifests->back().second));
  }
  ASSERT_GT(latest.chunks_size(), 0);
  const v1::CheckpointChunk& victim = latest.chunks(latest.chunks_size() - 1);
  {
    auto server = OpenRocksDbStore(absl::StrCat(options_.dir, "/state/", victim.server_ids(0)));
    ASSERT_TRUE(server.ok()) << server.status();
    const std::string key = absl::StrFormat("ckpt/%s/%020d/%010d", *id, latest.info().id(), victim.chunk_id());
    auto records = (*server)->Scan(key);
    ASSERT_TRUE(records.ok()) << records.status();
    ASSERT_EQ(records->size(), 1u) << "no stored record " << key;
    std::string damaged = records->front().second;
    damaged[damaged.size() / 2] ^= 0x5a;
    ASSERT_TRUE((*server)->Put(key, damaged).ok());
  }
  auto cluster = LocalCluster::Start(options_);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  cluster_ = std::move(*cluster);
  stub_ = v1::JobService::NewStub(MakeChannel(cluster_->scheduler_address()));

  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  const v1::CheckpointInfo* bad = Info(done, latest.info().id());
  ASSERT_NE(bad, nullptr);
  EXPECT_EQ(bad->state(), v1::CheckpointInfo::CORRUPT);
  EXPECT_NE(bad->reason().find(absl::StrCat("chunk ", victim.chunk_id())), std::string::npos) << bad->reason();
  EXPECT_NE(bad->reason().find(absl::StrCat("checkpoint ", latest.info().id())), std::string::npos) << bad->reason();
  const int64_t from = RestoredFrom(done);
  EXPECT_GT(from, 0);
  EXPECT_LT(from, latest.info().id()) << "restored from the corrupt checkpoint";
  ExpectEveryExampleUsedOncePerEpoch(done, kExamples);
  ExpectSameParameters(expected, done);
}

// A click job's tables are in its checkpoints. Every process killed after
// the first checkpoint: the job resumes from it and still comes within the
// FM margin of the best AUC. Then a job resumed from that checkpoint onto one
// shard, with no step left to train, evaluates the checkpointed model
// itself: its AUC is a trained model's (fresh tables, with no dense
// features here, would score about 0.5).
TEST_F(CheckpointTest, ClickJobTablesSurviveAWholeClusterKillAndMoveToOneShard) {
  v1::JobSpec spec = ClickSpec(v1::ModelSpec::FM, 2);
  spec.mutable_data()->mutable_synthetic_ctr()->set_dense(0);
  spec.mutable_checkpoint()->set_keep_last(10);
  const double best = BestAuc(spec);
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  // Checkpoints once most ids were seen: the first whole, a later one
  // storing the tables' rows changed since the one before. A bucket whose
  // rows nearly all changed is stored whole (no larger), and with 400 ids a
  // cut that lands many steps after the one before (a loaded machine) finds
  // that in every bucket: the checkpoint is then rightly whole, and the next
  // one chains on it. Five tries at most.
  ASSERT_EQ(WaitForStep(*id, 250).state(), v1::RUNNING);
  absl::StatusOr<v1::CheckpointInfo> before = CheckpointNow(*id);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->state(), v1::CheckpointInfo::COMPLETE) << before->reason();
  EXPECT_EQ(before->base_id(), 0) << "the job's first checkpoint is whole";
  v1::CheckpointInfo incremental;
  for (int attempt = 0; attempt < 5 && incremental.base_id() == 0; ++attempt) {
    const absl::StatusOr<v1::CheckpointInfo> taken = CheckpointNow(*id);
    ASSERT_TRUE(taken.ok()) << taken.status();
    ASSERT_EQ(taken->state(), v1::CheckpointInfo::COMPLETE) << taken->reason();
    if (taken->base_id() != 0) {
      ASSERT_EQ(taken->base_id(), before->id()) << "incremental on the one before";
      incremental = *taken;
    } else {
      std::cerr << "checkpoint " << taken->id() << " (step " << taken->step() << ", after step "
                << before->step() << ") was stored whole: every bucket's rows changed\n";
      before = taken;
    }
  }
  ASSERT_NE(incremental.base_id(), 0) << "no incremental checkpoint in 5 tries";
  // What its tables took in the servers' memory (their heartbeats): a
  // restore is placed by it.
  EXPECT_GT(incremental.server_bytes(), 0);

  KillAndRestartWholeCluster();
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_GT(RestoredFrom(done), 0) << "no event says the job was restored";
  ASSERT_TRUE(done.progress().has_test_auc());
  EXPECT_GE(done.progress().test_auc(), best - 0.045) << "best reachable " << best;

  v1::JobSpec moved = spec;
  moved.clear_checkpoint();
  moved.set_num_shards(1);
  moved.mutable_data()->set_max_steps(incremental.step());
  const std::string from = absl::StrCat(*id, "/", incremental.id());
  {
    // Keys hash by the checkpoint's bucket count: a spec asking for another
    // is refused at submit, naming it (it used to be ignored).
    const int32_t saved = done.shard_map().tables(1).buckets();
    v1::JobSpec rebucketed = moved;
    rebucketed.mutable_model()->mutable_tables(1)->set_buckets(saved * 2);
    const absl::StatusOr<std::string> refused = Submit(rebucketed, from);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
    EXPECT_NE(refused.status().message().find(absl::StrCat("leave buckets unset or set it to ", saved)),
              std::string::npos)
        << refused.status();
  }
  const absl::StatusOr<std::string> submitted = Submit(moved, from);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  v1::JobStatus resumed = WaitForEnd(*submitted);
  ASSERT_EQ(resumed.state(), v1::SUCCEEDED) << resumed.reason();
  EXPECT_EQ(resumed.shards_size(), 1);
  ASSERT_EQ(resumed.shard_map().tables_size(), 2);
  EXPECT_EQ(resumed.shard_map().tables(1).buckets(), done.shard_map().tables(1).buckets())
      << "the checkpoint's buckets, not one shard's default";
  ASSERT_TRUE(resumed.progress().has_test_auc());
  std::cerr << "test AUC of checkpoint " << incremental.id() << " (step " << incremental.step()
            << "): " << resumed.progress().test_auc() << "; final " << done.progress().test_auc() << "; best "
            << best << "\n";
  EXPECT_GE(resumed.progress().test_auc(), best - 0.08) << "the tables did not come back";

  // Its export holds every table: ids ascending, one row of `dim` values each.
  const std::string file = MakeTempDir() + "/click.safetensors";
  auto [rc, out] = RunCli(absl::StrCat("export ", *id, " --checkpoint ", incremental.id(), " -o ", file, " --scheduler ",
                                       cluster_->scheduler_address()));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("table embedding ("), std::string::npos) << out;
  auto tensors = ReadSafetensorsFile(file);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::map<std::string, const SafetensorsTensor*> named;
  for (const SafetensorsTensor& t : *tensors) named[t.name] = &t;
  for (const auto& [table, dim] : {std::pair<std::string, int64_t>{"linear", 1}, {"embedding", 4}}) {
    SCOPED_TRACE(table);
    const SafetensorsTensor* ids = named[absl::StrCat("table.", table, ".ids")];
    const SafetensorsTensor* rows = named[absl::StrCat("table.", table, ".rows")];
    ASSERT_NE(ids, nullptr);
    ASSERT_NE(rows, nullptr);
    ASSERT_EQ(ids->dtype, SafetensorsTensor::Dtype::kU64);
    // 4 fields of 100 ids: nearly all seen by step 250.
    EXPECT_GT(ids->u64.size(), 350u);
    EXPECT_LE(ids->u64.size(), 400u);
    EXPECT_TRUE(std::is_sorted(ids->u64.begin(), ids->u64.end()));
    EXPECT_EQ(std::adjacent_find(ids->u64.begin(), ids->u64.end()), ids->u64.end()) << "an id twice";
    EXPECT_EQ(rows->shape, (std::vector<int64_t>{static_cast<int64_t>(ids->u64.size()), dim}));
    float largest = 0;
    for (float v : rows->data) largest = std::max(largest, std::abs(v));
    EXPECT_GT(largest, 0.1f) << "trained rows, not their initial values";
  }

  // The job resumed from that checkpoint trained no step: its live export
  // (every bucket copied from the one server now holding it) is the
  // checkpoint's, tables and dense tensors alike.
  const std::string live = MakeTempDir() + "/live.safetensors";
  auto [live_rc, live_out] = RunCli(
      absl::StrCat("export ", *submitted, " -o ", live, " --scheduler ", cluster_->scheduler_address()));
  ASSERT_EQ(live_rc, 0) << live_out;
  EXPECT_NE(live_out.find("table embedding ("), std::string::npos) << live_out;
  auto live_tensors = ReadSafetensorsFile(live);
  ASSERT_TRUE(live_tensors.ok()) << live_tensors.status();
  ASSERT_EQ(live_tensors->size(), tensors->size());
  for (const SafetensorsTensor& t : *live_tensors) {
    SCOPED_TRACE(t.name);
    ASSERT_NE(named[t.name], nullptr);
    EXPECT_EQ(t.shape, named[t.name]->shape);
    EXPECT_EQ(t.u64, named[t.name]->u64);
    EXPECT_EQ(t.data, named[t.name]->data);
  }
}

// A BSP click job whose rows expire (expireAfter) comes out bit-identical
// whoever computes its two data partitions. Rows used to expire when the
// first push of a step came, so a partition that pulled the step's rows
// after the other's push read some as new (986 of 2434 rows differed
// between two runs of one spec); they now expire between steps.
TEST_F(CheckpointTest, BspClickJobWithExpiringRowsIsBitIdenticalWhoeverComputesThePartitions) {
  v1::JobSpec spec = ClickSpec(v1::ModelSpec::FM, 2);
  spec.set_mode(v1::BSP);
  spec.mutable_data()->set_epochs(1);
  spec.mutable_data()->mutable_synthetic_ctr()->set_vocabulary(5000);  // Zipf: a long tail of rare ids
  spec.mutable_data()->mutable_synthetic_ctr()->set_zipf_exponent(1.2);
  spec.set_max_workers(2);
  for (v1::TableSpec& table : *spec.mutable_model()->mutable_tables()) table.set_expire_after(8);
  v1::JobStatus two;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &two));
  const std::map<std::string, SafetensorsTensor> expected =
      LiveExport(two.job_id(), cluster_->scheduler_address());
  EXPECT_GT(ServersTableTotal(cluster_->file(), "expired_rows", two.job_id(), "embedding"), 100)
      << "rows expired";
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "two workers again" : "one worker");
    v1::JobSpec again = spec;
    if (round == 1) again.set_num_workers(1);
    v1::JobStatus done;
    ASSERT_NO_FATAL_FAILURE(RunToSuccess(again, &done));
    ExpectSameExport(expected, LiveExport(done.job_id(), cluster_->scheduler_address()));
  }
}

// A BSP click job: its tables are synchronous (each step summed over the
// data partitions in their order and applied once whole). The dense tensors
// and every table row come out bit-identical to an undisturbed run
//  - whichever workers compute the partitions (one worker computing both);
//  - after one server is killed -9 mid-job and started again on its volume
//    (as Kubernetes restarts a pod): the job resumes from its checkpoint, a
//    cut at one step for the tables as for the dense tensors;
//  - after a worker is killed -9 mid-job: its partition moves to the other;
//  - after every process is killed -9 and the cluster started again.
// And the model learns.
TEST_F(CheckpointTest, BspClickJobIsBitIdenticalAcrossWorkersAndKills) {
  v1::JobSpec spec = ClickSpec(v1::ModelSpec::FM, 2);
  spec.set_mode(v1::BSP);
  spec.mutable_data()->set_epochs(1);
  spec.set_max_workers(2);  // 2 data partitions whoever computes them
  v1::JobStatus reference;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &reference));
  ASSERT_TRUE(reference.progress().has_test_auc());
  EXPECT_GE(reference.progress().test_auc(), BestAuc(spec) - 0.06) << "it learned";
  const std::map<std::string, SafetensorsTensor> expected =
      LiveExport(reference.job_id(), cluster_->scheduler_address());
  ASSERT_EQ(expected.count("table.embedding.rows"), 1u);
  EXPECT_GT(expected.at("table.embedding.ids").u64.size(), 350u) << "4 fields of 100 ids, nearly all seen";
  std::cerr << "BSP click job: " << reference.progress().total_steps() << " steps, test AUC "
            << reference.progress().test_auc() << " (best " << BestAuc(spec) << ")\n";
  {
    SCOPED_TRACE("one worker");
    v1::JobSpec one_worker = spec;
    one_worker.set_num_workers(1);
    v1::JobStatus alone;
    ASSERT_NO_FATAL_FAILURE(RunToSuccess(one_worker, &alone));
    ExpectSameExport(expected, LiveExport(alone.job_id(), cluster_->scheduler_address()));
  }
  v1::JobSpec checkpointed = spec;
  checkpointed.mutable_checkpoint()->set_every_steps(100);
  checkpointed.mutable_checkpoint()->set_keep_last(3);
  {
    SCOPED_TRACE("a server killed and restarted");
    auto id = Submit(checkpointed);
    ASSERT_TRUE(id.ok()) << id.status();
    const v1::JobStatus running = WaitForCheckpoints(*id, 1);
    ASSERT_EQ(running.state(), v1::RUNNING) << "the job ended before a checkpoint: " << running.reason();
    ASSERT_FALSE(running.shards().empty());
    ASSERT_NO_FATAL_FAILURE(KillAndRestartServer(running.shards(0).server_id()));
    const v1::JobStatus done = WaitForEnd(*id);
    ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
    EXPECT_GT(RestoredFrom(done), 0) << "the job did not restart from a checkpoint";
    ExpectSameExport(expected, LiveExport(*id, cluster_->scheduler_address()));
  }
  {
    SCOPED_TRACE("a worker killed");
    auto id = Submit(spec);
    ASSERT_TRUE(id.ok()) << id.status();
    const v1::JobStatus running = WaitForStep(*id, 100);
    ASSERT_EQ(running.state(), v1::RUNNING) << "the job ended before the kill: " << running.reason();
    ASSERT_EQ(running.workers_size(), 2);
    ASSERT_TRUE(cluster_->Signal(running.workers(1).worker_id(), SIGKILL).ok());
    const v1::JobStatus done = WaitForEnd(*id);
    ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
    EXPECT_EQ(done.workers_size(), 1);
    ExpectSameExport(expected, LiveExport(*id, cluster_->scheduler_address()));
  }
  {
    // From a checkpoint whose tables are stored incrementally (the rows
    // changed since the one before), with retention keeping only the last
    // checkpoint and so also the one it builds on.
    SCOPED_TRACE("every process killed and started again");
    v1::JobSpec manual = checkpointed;
    manual.set_num_workers(1);  // the worker killed above is gone until the restart
    manual.mutable_checkpoint()->set_every_steps(0);
    manual.mutable_checkpoint()->set_keep_last(1);
    auto id = Submit(manual);
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_EQ(WaitForStep(*id, 20).state(), v1::RUNNING);
    const absl::StatusOr<v1::CheckpointInfo> whole = CheckpointNow(*id);
    ASSERT_TRUE(whole.ok()) << whole.status();
    ASSERT_EQ(whole->state(), v1::CheckpointInfo::COMPLETE) << whole->reason();
    EXPECT_EQ(whole->base_id(), 0) << "the first checkpoint is whole";
    const absl::StatusOr<v1::CheckpointInfo> latest = CheckpointNow(*id);
    ASSERT_TRUE(latest.ok()) << latest.status();
    ASSERT_EQ(latest->state(), v1::CheckpointInfo::COMPLETE) << latest->reason();
    EXPECT_EQ(latest->base_id(), whole->id()) << "the next stores the tables' changes since it";
    EXPECT_EQ(latest->chain(), 1);
    const v1::JobStatus running = WaitFor(*id, [](const v1::JobStatus&) { return true; }, absl::Seconds(10));
    ASSERT_EQ(running.state(), v1::RUNNING) << "the job ended before the kill: " << running.reason();
    EXPECT_NE(Info(running, whole->id()), nullptr)
        << "retention keeps the checkpoint the last builds on: " << Describe(running.checkpoints());
    KillAndRestartWholeCluster();  // also brings the killed worker back for the tests after this one
    const v1::JobStatus done = WaitForEnd(*id);
    ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
    EXPECT_EQ(RestoredFrom(done), latest->id()) << "restored from the incremental checkpoint";
    ExpectSameExport(expected, LiveExport(*id, cluster_->scheduler_address()));
  }
}

// One server of a click job (one replica) killed -9 and started again on its
// volume, as Kubernetes restarts a pod: the job restores its tables and
// dense tensors from the latest checkpoint (buckets of both servers) and
// still reaches the FM margin of the best AUC.
TEST_F(CheckpointTest, ClickJobServerKilledAndRestartedResumesFromItsCheckpoint) {
  v1::JobSpec spec = ClickSpec(v1::ModelSpec::FM, 2);
  spec.mutable_checkpoint()->set_every_steps(200);
  const double best = BestAuc(spec);
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  const v1::JobStatus running = WaitForCheckpoints(*id, 1);
  ASSERT_EQ(running.state(), v1::RUNNING) << "the job ended before a checkpoint: " << running.reason();
  ASSERT_FALSE(running.shards().empty());
  const std::string victim = running.shards(0).server_id();
  ASSERT_NO_FATAL_FAILURE(KillAndRestartServer(victim));

  const v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_GT(RestoredFrom(done), 0) << "the job did not restart from a checkpoint";
  ASSERT_TRUE(done.progress().has_test_auc());
  EXPECT_GE(done.progress().test_auc(), best - 0.045) << "best reachable " << best;
}

// A server killed while a checkpoint is being written, and started again on
// its volume (as Kubernetes restarts a pod): that checkpoint is never
// committed (or had completed just before the kill), the job restarts from a
// complete one, and the result is unchanged.
TEST_F(CheckpointTest, ServerKilledWhileACheckpointIsWrittenKeepsThePreviousOne) {
  const std::vector<float> expected = Reference();
  v1::JobSpec spec = Spec(100);
  spec.mutable_checkpoint()->set_keep_last(1000);  // every checkpoint stays listed
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_EQ(WaitForCheckpoints(*id, 1).state(), v1::RUNNING);
  v1::JobStatus writing = WaitFor(
      *id,
      [](const v1::JobStatus& s) {
        return Terminal(s.state()) ||
               (!s.checkpoints().empty() && s.checkpoints().rbegin()->state() == v1::CheckpointInfo::WRITING);
      },
      absl::Seconds(60));
  ASSERT_EQ(writing.state(), v1::RUNNING);
  const int64_t in_flight = writing.checkpoints().rbegin()->id();
  const std::string victim = AServerWithChunks(writing);
  ASSERT_FALSE(victim.empty());
  ASSERT_NO_FATAL_FAILURE(KillAndRestartServer(victim));

  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  const int64_t from = RestoredFrom(done);
  ASSERT_GT(from, 0) << "the job did not restart from a checkpoint";
  const v1::CheckpointInfo* used = Info(done, from);
  ASSERT_NE(used, nullptr);
  EXPECT_EQ(used->state(), v1::CheckpointInfo::COMPLETE);
  const v1::CheckpointInfo* cut = Info(done, in_flight);
  if (cut != nullptr && cut->state() != v1::CheckpointInfo::COMPLETE) {
    EXPECT_EQ(cut->state(), v1::CheckpointInfo::FAILED) << cut->reason();
    EXPECT_LT(from, in_flight);
  }
  ExpectEveryExampleUsedOncePerEpoch(done, kExamples);
  ExpectSameParameters(expected, done);
}

// `fulcrum checkpoint` asked right after a server holding the job is killed
// -9 and started again (a pod restarted at once): the first try meets the
// dead or restarted server, the request waits for the job to recover (here a
// restore, one replica a shard) and takes the checkpoint then, instead of
// failing at once; the job still ends with the undisturbed parameters.
TEST_F(CheckpointTest, CheckpointAskedAsAServerIsKilledWaitsForTheJobToRecover) {
  const std::vector<float> expected = Reference();
  v1::JobSpec spec = Spec(100);
  spec.mutable_checkpoint()->set_keep_last(1000);  // every checkpoint stays listed
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  const v1::JobStatus running = WaitForCheckpoints(*id, 1);
  ASSERT_EQ(running.state(), v1::RUNNING) << "the job ended before a checkpoint: " << running.reason();
  const std::string victim = AServerWithChunks(running);
  ASSERT_FALSE(victim.empty());
  ASSERT_NO_FATAL_FAILURE(KillAndRestartServer(victim));

  const absl::StatusOr<v1::CheckpointInfo> taken = CheckpointNow(*id);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->state(), v1::CheckpointInfo::COMPLETE) << taken->reason();
  EXPECT_EQ(taken->trigger(), "manual");

  const v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_GT(RestoredFrom(done), 0) << "the job did not restart from a checkpoint";
  ExpectEveryExampleUsedOncePerEpoch(done, kExamples);
  ExpectSameParameters(expected, done);
}

// `fulcrum checkpoint` mid-job, then a new job resumed from it on another
// number of workers and servers reaches the accuracy of an uninterrupted run;
// the checkpoint exported to safetensors holds the parameters after its step.
TEST_F(CheckpointTest, ResumeOnAnotherTopologyAndExport) {
  auto first = Submit(AccuracySpec(2, 4));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(WaitForStep(*first, 1500).state(), v1::RUNNING);
  auto [rc, out] = RunCli(absl::StrCat("checkpoint ", *first, " -o json --scheduler ", cluster_->scheduler_address()));
  ASSERT_EQ(rc, 0) << out;
  v1::JobStatus status = WaitFor(*first, [](const v1::JobStatus& s) { return Complete(s) >= 1; }, absl::Seconds(10));
  ASSERT_EQ(Complete(status), 1);
  const v1::CheckpointInfo taken = *status.checkpoints().rbegin();
  ASSERT_GT(taken.step(), 0);

  // Export the checkpoint and compare with a job stopped at the same step.
  const std::string dir = MakeTempDir();
  const std::string file = dir + "/checkpoint.safetensors";
  auto [export_rc, export_out] = RunCli(absl::StrCat("export ", *first, " --checkpoint ", taken.id(), " -o ", file,
                                                     " --scheduler ", cluster_->scheduler_address()));
  ASSERT_EQ(export_rc, 0) << export_out;
  {
    grpc::ClientContext context;
    v1::CancelJobRequest cancel;
    cancel.set_job_id(*first);
    v1::JobStatus cancelled;
    ASSERT_TRUE(stub_->CancelJob(&context, cancel, &cancelled).ok());
  }
  v1::JobSpec until = AccuracySpec(2, 4);
  until.mutable_data()->set_max_steps(taken.step());
  auto stopped = Submit(until);
  ASSERT_TRUE(stopped.ok());
  v1::JobStatus stopped_done = WaitForEnd(*stopped);
  ASSERT_EQ(stopped_done.state(), v1::SUCCEEDED) << stopped_done.reason();
  std::map<std::string, std::string> metadata;
  auto tensors = ReadSafetensorsFile(file, &metadata);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::vector<float> exported;
  for (const auto& t : *tensors) exported.insert(exported.end(), t.data.begin(), t.data.end());
  std::vector<float> at_step = FinalParameters(stopped_done);
  ASSERT_EQ(exported.size(), at_step.size());
  EXPECT_EQ(0, std::memcmp(exported.data(), at_step.data(), exported.size() * sizeof(float)))
      << DescribeDifference(at_step, exported);
  EXPECT_EQ(metadata["fulcrum.checkpoint"], absl::StrCat(taken.id()));
  ASSERT_EQ(tensors->size(), static_cast<size_t>(stopped_done.shard_map().tensors_size()));
  for (int t = 0; t < stopped_done.shard_map().tensors_size(); ++t) {
    EXPECT_EQ((*tensors)[t].name, stopped_done.shard_map().tensors(t).name());
  }

  // Resume on one worker (same global batch) and one shard.
  v1::JobSpec moved = AccuracySpec(1, 8);
  moved.set_num_shards(1);
  const absl::StatusOr<std::string> submitted = Submit(moved, absl::StrCat(*first, "/", taken.id()));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  v1::JobStatus resumed = WaitForEnd(*submitted);
  ASSERT_EQ(resumed.state(), v1::SUCCEEDED) << resumed.reason();
  EXPECT_EQ(resumed.resumed_from(), absl::StrCat(*first, "/", taken.id()));
  EXPECT_EQ(resumed.shards_size(), 1);

  v1::JobStatus reference_done;  // the uninterrupted run's accuracy
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(AccuracySpec(2, 4), &reference_done));
  std::cerr << "test accuracy: resumed on 1 worker and 1 shard " << resumed.progress().test_accuracy()
            << ", uninterrupted " << reference_done.progress().test_accuracy() << "\n";
  EXPECT_NEAR(resumed.progress().test_accuracy(), reference_done.progress().test_accuracy(), 0.003)
      << "resumed " << resumed.progress().test_accuracy() << " vs uninterrupted "
      << reference_done.progress().test_accuracy();

  // The live parameters of a finished job export too, and read back equal.
  const std::string live = dir + "/final.safetensors";
  auto [live_rc, live_out] =
      RunCli(absl::StrCat("export ", reference_done.job_id(), " -o ", live, " --scheduler ", cluster_->scheduler_address()));
  ASSERT_EQ(live_rc, 0) << live_out;
  auto final_tensors = ReadSafetensorsFile(live);
  ASSERT_TRUE(final_tensors.ok()) << final_tensors.status();
  std::vector<float> flat;
  for (const auto& t : *final_tensors) flat.insert(flat.end(), t.data.begin(), t.data.end());
  std::vector<float> final_params = FinalParameters(reference_done);
  ASSERT_EQ(flat.size(), final_params.size());
  EXPECT_EQ(0, std::memcmp(flat.data(), final_params.data(), flat.size() * sizeof(float)));

  // And numpy reads the same values, where it is installed.
  const std::string python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  if (std::system((python + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0) {
    const std::string script = dir + "/check.py";
    FILE* f = std::fopen(script.c_str(), "w");
    std::fputs(
        "import json, struct, sys\nimport numpy as np\n"
        "b = open(sys.argv[1], 'rb').read()\nn = struct.unpack('<Q', b[:8])[0]\nh = json.loads(b[8:8 + n])\n"
        "total = 0.0\ncount = 0\n"
        "for name, t in h.items():\n"
        "    if name == '__metadata__': continue\n"
        "    s, e = t['data_offsets']\n"
        "    a = np.frombuffer(b[8 + n + s:8 + n + e], dtype='<f4').reshape(t['shape'])\n"
        "    total += float(a.astype(np.float64).sum())\n    count += a.size\n"
        "print(count, repr(total))\n",
        f);
    std::fclose(f);
    FILE* pipe = popen((python + " " + script + " " + live).c_str(), "r");
    long long count = 0;
    double total = 0;
    ASSERT_EQ(std::fscanf(pipe, "%lld %lf", &count, &total), 2);
    pclose(pipe);
    double expected_total = 0;
    for (float v : final_params) expected_total += v;
    EXPECT_EQ(count, static_cast<long long>(final_params.size()));
    EXPECT_NEAR(total, expected_total, 1e-6 * (1 + std::abs(expected_total)));
  }
}

// A checkpoint of another model: the new job fails before training, naming
// the mismatch.
TEST_F(CheckpointTest, ResumeWithAnotherModelFailsNamingTheMismatch) {
  auto source = Submit(Spec(300));
  ASSERT_TRUE(source.ok()) << source.status();
  v1::JobStatus done = WaitForEnd(*source);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  ASSERT_GT(Complete(done), 0);
  v1::JobSpec other = Spec(0);
  other.mutable_model()->set_hidden_sizes(0, 32);
  const absl::StatusOr<std::string> submitted = Submit(other, *source);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  v1::JobStatus failed = WaitForEnd(*submitted);
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_NE(failed.reason().find("does not fit"), std::string::npos) << failed.reason();
  EXPECT_NE(failed.reason().find("layer0.weight"), std::string::npos) << failed.reason();
}

// The servers' data folders are gone when the cluster comes back: the
// restore cannot read any checkpoint and the job fails, naming the
// checkpoint and the chunk; nothing crashes or hangs.
TEST_F(CheckpointTest, LostDataFoldersFailTheRestoreClearly) {
  auto id = Submit(Spec(300));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_EQ(WaitForCheckpoints(*id, 1).state(), v1::RUNNING);
  stub_.reset();
  cluster_.reset();
  ASSERT_EQ(std::system(absl::StrCat("rm -rf '", options_.dir, "/state'").c_str()), 0);
  auto cluster = LocalCluster::Start(options_);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  cluster_ = std::move(*cluster);
  stub_ = v1::JobService::NewStub(MakeChannel(cluster_->scheduler_address()));
  v1::JobStatus done = WaitForEnd(*id);
  EXPECT_EQ(done.state(), v1::FAILED);
  EXPECT_NE(done.reason().find("checkpoint"), std::string::npos) << done.reason();
  EXPECT_NE(done.reason().find("chunk"), std::string::npos) << done.reason();
}

// Bad input: an unknown job, an unknown checkpoint, a bad id, a job that is
// not training: clear errors, nothing started.
TEST_F(CheckpointTest, BadCheckpointRequestsAreRefusedClearly) {
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(0);
  request.set_resume_from("job-nope");
  v1::SubmitJobResponse response;
  grpc::Status status = stub_->SubmitJob(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();

  auto done = Submit(Spec(0));
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(WaitForEnd(*done).state(), v1::SUCCEEDED);
  for (const std::string& from : {absl::StrCat(*done, "/7"), absl::StrCat(*done, "/x"), *done}) {
    grpc::ClientContext c;
    request.set_resume_from(from);
    grpc::Status s = stub_->SubmitJob(&c, request, &response);
    EXPECT_TRUE(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
                s.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
        << from << ": " << s.error_message();
  }
  auto info = CheckpointNow(*done);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kFailedPrecondition) << info.status();
  auto [rc, out] = RunCli(absl::StrCat("export ", *done, " --checkpoint 3 -o /nonexistent/x.safetensors --scheduler ",
                                       cluster_->scheduler_address()));
  EXPECT_NE(rc, 0);
}

// `fulcrum export -o` writes a regular file (a new one, or one it replaces
// whole); it refuses a FIFO, a symbolic link or a folder at the path before
// asking for the parameters, naming what is there, and leaves it as it was.
// (It used to rename its file over whatever was there: as root, -o /dev/full
// replaced the device with a plain file.)
TEST_F(CheckpointTest, ExportReplacesOnlyARegularFile) {
  auto done = Submit(Spec(0));
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(WaitForEnd(*done).state(), v1::SUCCEEDED);
  const std::string dir = MakeTempDir();
  auto export_to = [&](const std::string& path) {
    return RunCommand(absl::StrCat(DefaultBinDir(), "/fulcrum export ", *done, " -o ", path, " --scheduler ",
                                   cluster_->scheduler_address(), " 2>&1"));
  };
  const std::string fifo = dir + "/fifo", link = dir + "/link", target = dir + "/target",
                    folder = dir + "/folder";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::ofstream(target) << "kept";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  ASSERT_EQ(mkdir(folder.c_str(), 0700), 0);
  for (const auto& [path, what] :
       {std::pair{fifo, "a FIFO"}, std::pair{link, "a symbolic link"}, std::pair{folder, "a folder"}}) {
    auto [rc, out] = export_to(path);
    EXPECT_NE(rc, 0) << path;
    EXPECT_NE(out.find(absl::StrCat("will not write ", path, ": it is ", what)), std::string::npos) << out;
  }
  struct stat info {};
  ASSERT_EQ(lstat(fifo.c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode)) << "the FIFO was replaced";
  ASSERT_EQ(lstat(link.c_str(), &info), 0);
  EXPECT_TRUE(S_ISLNK(info.st_mode)) << "the link was replaced";
  std::ifstream kept(target);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(kept)), std::istreambuf_iterator<char>()), "kept");
  // A regular file is replaced whole.
  auto [rc, out] = export_to(target);
  EXPECT_EQ(rc, 0) << out;
  ASSERT_EQ(lstat(target.c_str(), &info), 0);
  EXPECT_GT(info.st_size, 100) << "the file was not replaced by the export";
}

// A cancelled job's servers drop its parameters: exporting it says so and
// names the checkpoints to export instead (it used to fail pulling a chunk,
// "not set up on this server"), and `fulcrum get` says where they went.
TEST_F(CheckpointTest, ExportOfACancelledJobPointsToItsCheckpoints) {
  v1::JobSpec spec = Spec(20);
  spec.mutable_data()->set_epochs(50);
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  const v1::JobStatus running = WaitForCheckpoints(*id, 1);
  ASSERT_EQ(running.state(), v1::RUNNING) << running.reason();
  const std::string scheduler = absl::StrCat(" --scheduler ", cluster_->scheduler_address());
  ASSERT_EQ(RunCli(absl::StrCat("cancel ", *id, scheduler)).first, 0);
  const v1::JobStatus cancelled = WaitForEnd(*id);
  ASSERT_EQ(cancelled.state(), v1::CANCELLED);
  int64_t complete = 0;
  for (const auto& c : cancelled.checkpoints()) {
    if (c.state() == v1::CheckpointInfo::COMPLETE) complete = c.id();
  }
  ASSERT_GT(complete, 0);
  const std::string file = MakeTempDir() + "/cancelled.safetensors";
  auto [rc, out] =
      RunCommand(absl::StrCat(DefaultBinDir(), "/fulcrum export ", *id, " -o ", file, scheduler, " 2>&1"));
  EXPECT_NE(rc, 0);
  for (const std::string& part : {absl::StrCat("job ", *id, " (CANCELLED) holds no live parameters"),
                                  std::string("export one of its checkpoints instead (--checkpoint ")}) {
    EXPECT_NE(out.find(part), std::string::npos) << part << " in " << out;
  }
  auto [get_rc, get_out] = RunCli(absl::StrCat("get ", *id, scheduler));
  EXPECT_NE(get_out.find("Parameters: dropped by the servers when the job ended"), std::string::npos)
      << get_out;
  auto [from_rc, from_out] =
      RunCli(absl::StrCat("export ", *id, " --checkpoint ", complete, " -o ", file, scheduler));
  EXPECT_EQ(from_rc, 0) << from_out;
}

// A finished job with replicas: its primary killed, `fulcrum export` reads
// the shards from their backups (it failed pulling from the dead primary);
// the primary restarted without the parameters, the scheduler points the
// map at the backups instead of calling the parameters gone. The export is
// the same, bit for bit, each time.
class ReplicatedExportTest : public CheckpointTest {
 protected:
  static void SetUpTestSuite() { StartCluster(2, 1, /*replicas=*/2); }
};

TEST_F(ReplicatedExportTest, AFinishedJobIsExportedFromItsBackupsWhenAPrimaryIsGone) {
  v1::JobSpec spec = ClickSpec(v1::ModelSpec::FM, 2);
  spec.set_num_workers(1);
  spec.set_replicas(2);
  v1::JobStatus done;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &done));
  const std::map<std::string, SafetensorsTensor> expected =
      LiveExport(done.job_id(), cluster_->scheduler_address());
  ASSERT_FALSE(expected.empty());
  ASSERT_GE(done.shard_map().shards_size(), 1);
  const std::string primary = done.shard_map().shards(0).server_id();
  ASSERT_EQ(done.shard_map().shards(0).backup_ids_size(), 1);
  ASSERT_TRUE(cluster_->Signal(primary, SIGKILL).ok());
  {
    SCOPED_TRACE("primary dead");
    ExpectSameExport(expected, LiveExport(done.job_id(), cluster_->scheduler_address()));
  }
  auto restarted = cluster_->RestartServer(primary);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  // The restarted server registers without the job: polled until the map moves.
  v1::JobStatus moved;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(50))) {
    grpc::ClientContext context;
    SetDeadline(&context, 5);
    v1::GetJobRequest request;
    request.set_job_id(done.job_id());
    ASSERT_TRUE(stub_->GetJob(&context, request, &moved).ok());
    if (moved.shard_map().shards_size() > 0 && moved.shard_map().shards(0).server_id() != primary) break;
  }
  ASSERT_NE(moved.shard_map().shards(0).server_id(), primary) << "the map still names the restarted primary";
  EXPECT_EQ(moved.parameters_released_unix_ms(), 0) << "the backups hold them";
  SCOPED_TRACE("primary restarted without them");
  ExpectSameExport(expected, LiveExport(done.job_id(), cluster_->scheduler_address()));
}

// A server joining a dense BSP job takes a share of the chunks live; the
// servers they moved from keep no part in the job's checkpoints after that
// (a chunk left behind never reaches a later cut), so the checkpoints taken
// after the join complete, with the newcomer holding its chunks.
class DenseJoinTest : public CheckpointTest {
 protected:
  static void SetUpTestSuite() { StartCluster(2, 2, /*replicas=*/1); }
};

TEST_F(DenseJoinTest, CheckpointsAfterALiveJoinComplete) {
  v1::JobSpec spec = Spec(/*every_steps=*/200);
  spec.mutable_model()->set_hidden_sizes(0, 256);  // 8 chunks of 4 KiB
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  const v1::JobStatus running = WaitForStep(*id, 50);
  ASSERT_EQ(running.state(), v1::RUNNING) << running.reason();
  ASSERT_EQ(running.shards_size(), 2);
  auto added = cluster_->AddServer();
  ASSERT_TRUE(added.ok()) << added.status();
  const v1::JobStatus joined = WaitFor(
      *id, [](const v1::JobStatus& s) { return s.shards_size() == 3 || Terminal(s.state()); },
      absl::Seconds(60));
  ASSERT_EQ(joined.state(), v1::RUNNING) << "the job ended before the join: " << joined.reason();
  ASSERT_EQ(joined.shards_size(), 3) << "the new server did not join";
  const int64_t join_step = joined.progress().step();
  auto after_join = [join_step](const v1::JobStatus& s) {
    for (const auto& c : s.checkpoints()) {
      if (c.state() == v1::CheckpointInfo::COMPLETE && c.step() > join_step) return true;
    }
    return false;
  };
  const v1::JobStatus checkpointed = WaitFor(
      *id, [&](const v1::JobStatus& s) { return after_join(s) || Terminal(s.state()); }, absl::Seconds(90));
  EXPECT_TRUE(after_join(checkpointed)) << "no checkpoint after the join at step " << join_step
                                        << " completed:" << Describe(checkpointed.checkpoints());
  const v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
}

// A server joining a job with sparse tables: the job takes a checkpoint and
// starts again from it over three servers, where every table's buckets are
// spread over all three (the newcomer leads a shard), and it ends with the
// model of the same job run without the join, bit for bit (BSP).
class TableJoinTest : public CheckpointTest {
 protected:
  static void SetUpTestSuite() { StartCluster(2, 2, /*replicas=*/1); }
};

TEST_F(TableJoinTest, AddedServerTakesBucketsOfEveryTableThroughACheckpoint) {
  v1::JobSpec spec = ClickSpec(v1::ModelSpec::FM, 2);
  spec.set_mode(v1::BSP);
  v1::JobStatus reference;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &reference));
  ASSERT_EQ(reference.shards_size(), 2);
  const std::map<std::string, SafetensorsTensor> expected =
      LiveExport(reference.job_id(), cluster_->scheduler_address());

  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  const v1::JobStatus running = WaitForStep(*id, 50);
  ASSERT_EQ(running.state(), v1::RUNNING) << "the job ended before the join: " << running.reason();
  auto added = cluster_->AddServer();
  ASSERT_TRUE(added.ok()) << added.status();
  const v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  std::string events;
  int64_t joined_ms = 0, training_again_ms = 0;
  for (const auto& e : done.events()) {
    absl::StrAppend(&events, "\n  ", e.message());
    if (joined_ms == 0 && e.message().find(added->id() + " joins") != std::string::npos) joined_ms = e.time_unix_ms();
    if (joined_ms > 0 && e.message().rfind("training with", 0) == 0) training_again_ms = e.time_unix_ms();
  }
  std::cerr << "joined to training again on three servers: " << training_again_ms - joined_ms << " ms" << events
            << "\n";
  ASSERT_EQ(done.shards_size(), 3) << "the new server did not join:" << events;
  EXPECT_GT(RestoredFrom(done), 0) << "the job did not restart from a checkpoint:" << events;
  bool leads = false;
  for (const auto& shard : done.shards()) leads |= shard.server_id() == added->id();
  EXPECT_TRUE(leads) << added->id() << " leads no shard";
  ASSERT_EQ(done.shard_map().tables_size(), 2);
  for (const v1::TableLayout& table : done.shard_map().tables()) {
    std::set<int32_t> shards(table.bucket_shards().begin(), table.bucket_shards().end());
    EXPECT_EQ(shards.size(), 3u) << "table " << table.name() << " is not spread over the three shards";
  }
  ExpectSameExport(expected, LiveExport(*id, cluster_->scheduler_address()));
}

// A server joining an asynchronous job that evaluates all the time: the
// restart drops the job on the servers while the evaluator pulls rows for
// its test set, which must be taken as the server change it is (the
// evaluation runs again), not as the job's failure.
TEST_F(TableJoinTest, AJoinWhileTheJobEvaluatesFailsNothing) {
  v1::JobSpec spec = ClickSpec(v1::ModelSpec::FM, 2);
  spec.mutable_data()->mutable_synthetic_ctr()->set_examples(200000);  // a test set of 40,000
  spec.mutable_data()->set_max_steps(400);
  spec.mutable_data()->set_eval_every_steps(10);  // most of the job's time is evaluation
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  const v1::JobStatus running = WaitForStep(*id, 30);
  ASSERT_EQ(running.state(), v1::RUNNING) << "the job ended before the join: " << running.reason();
  auto added = cluster_->AddServer();
  ASSERT_TRUE(added.ok()) << added.status();
  const v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_GT(RestoredFrom(done), 0) << "the job did not restart from a checkpoint";
  bool leads = false;
  for (const auto& shard : done.shards()) leads |= shard.server_id() == added->id();
  EXPECT_TRUE(leads) << added->id() << " leads no shard";
  EXPECT_GT(done.history_size(), 10) << "the job evaluated as it trained";
  // An asynchronous job's export is at its step (its chunks count every
  // partition's pushes).
  const std::string file = MakeTempDir() + "/asp.safetensors";
  auto [rc, out] =
      RunCli(absl::StrCat("export ", *id, " -o ", file, " --scheduler ", cluster_->scheduler_address()));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(absl::StrCat("step ", done.progress().total_steps(), "\n")), std::string::npos) << out;
  // `fulcrum get` shows the evaluations' AUC in the history.
  auto [get_rc, get_out] = RunCli(absl::StrCat("get ", *id, " --scheduler ", cluster_->scheduler_address()));
  ASSERT_EQ(get_rc, 0) << get_out;
  EXPECT_NE(get_out.find("TEST_LOSS  TEST_AUC"), std::string::npos) << get_out;
  EXPECT_NE(get_out.find(absl::StrFormat("%.4f", done.history(done.history_size() - 1).test_auc())),
            std::string::npos)
      << get_out;
}

}  // namespace
}  // namespace fulcrum
