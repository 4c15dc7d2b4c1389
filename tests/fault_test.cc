// The faults Kubernetes produces every day, on a live local cluster: a pod
// killed and replaced at once, a paused process, a scheduler that is gone for
// a while, replicated checkpoints. Each run is compared with an undisturbed
// one: bit-identical parameters and every example used once per epoch.
#include <signal.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "tests/click_job.h"
#include "tests/cluster_fixture.h"
#include "tests/live_export.h"

namespace fulcrum {
namespace {

// A BSP job of a few seconds (256 steps an epoch) over 8 chunks of 4 KiB.
v1::JobSpec LongSpec(int epochs) {
  v1::JobSpec spec = SyntheticSpec(v1::BSP, 2, 8, 0);
  spec.mutable_model()->set_hidden_sizes(0, 256);
  spec.mutable_data()->set_epochs(epochs);
  return spec;
}

bool AnyEventHas(const v1::JobStatus& job, const std::string& text) {
  for (const auto& event : job.events()) {
    if (absl::StrContains(event.message(), text)) return true;
  }
  return false;
}

std::string Events(const v1::JobStatus& job) {
  std::string all;
  for (const auto& event : job.events()) absl::StrAppend(&all, "\n  ", event.message());
  return all;
}

// Three servers, two replicas per shard, one shard per server.
class ReplacedServerTest : public ClusterTest {
 protected:
  static void SetUpTestSuite() { StartCluster(3, 2, /*replicas=*/2); }
};

// Issue 13, case 1: a StatefulSet restarts a killed pod at once. The primary
// of shard 0 is killed and a new server joins right away: the new server
// becomes a shard and copies its chunks from their primaries, one of which
// is the dead one. The copy must be retried from the live replica (the
// promoted backup), never fail the job.
TEST_F(ReplacedServerTest, KilledPrimaryReplacedAtOnceLosesNothing) {
  const v1::JobSpec spec = LongSpec(6);
  v1::JobStatus reference;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &reference));
  const std::vector<float> expected = FinalParameters(reference);

  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus running = WaitForStep(*id, 30);
  ASSERT_EQ(running.state(), v1::RUNNING);
  const std::string victim = running.shards(0).server_id();
  ASSERT_TRUE(cluster_->Signal(victim, SIGKILL).ok());
  auto added = cluster_->AddServer();
  ASSERT_TRUE(added.ok()) << added.status();
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason() << Events(done);
  EXPECT_TRUE(AnyEventHas(done, victim)) << "no event names the killed server" << Events(done);
  for (const auto& shard : done.shards()) EXPECT_NE(shard.server_id(), victim);
  ExpectSameParameters(expected, done);
  ExpectEveryExampleUsedOncePerEpoch(done, 4096);
}

// Issue 13, case 2: with two replicas both write every chunk of a
// checkpoint, and the manifest lists both as holders (a restore may read
// from either).
TEST_F(ReplacedServerTest, CheckpointManifestsListEveryReplica) {
  v1::JobSpec spec = LongSpec(3);
  spec.set_num_shards(2);
  spec.mutable_checkpoint()->set_every_steps(40);
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  grpc::ClientContext context;
  SetDeadline(&context, 10);
  v1::GetCheckpointRequest request;
  request.set_job_id(*id);
  v1::CheckpointManifest manifest;
  ASSERT_TRUE(stub_->GetCheckpoint(&context, request, &manifest).ok()) << "no complete checkpoint";
  ASSERT_GT(manifest.chunks_size(), 0);
  for (const auto& chunk : manifest.chunks()) {
    EXPECT_EQ(chunk.server_ids_size(), 2) << "chunk " << chunk.chunk_id() << " lists " << chunk.server_ids_size()
                                          << " holders";
  }
}

// Two servers; workers are added by the test.
class HalfPushTest : public ClusterTest {
 protected:
  static void SetUpTestSuite() { StartCluster(2, 0); }
};

// A worker killed halfway through its push of a BSP step (here by its own
// --exit-mid-push fault, after the last layer's gradients are in and before
// the first layer's are sent): the chunks of the last layer complete the
// step, those of the first still wait for it. The partition goes to a worker
// that joins afterwards and never had that step's parameters; it must
// compute the step from the values the servers kept, not wait forever for a
// step nobody can finish (the chaos bench found it stalled for good).
TEST_F(HalfPushTest, AStepHalfPushedByAKilledWorkerIsFinishedByANewcomer) {
  v1::JobSpec spec = LongSpec(3);
  spec.set_num_workers(1);  // one partition: the newcomer takes it whole
  spec.set_max_workers(1);
  auto doomed = cluster_->AddWorker({"--exit-mid-push=200"});
  ASSERT_TRUE(doomed.ok()) << doomed.status();
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus running = WaitFor(
      *id, [](const v1::JobStatus& s) { return s.state() == v1::RUNNING || Terminal(s.state()); }, absl::Seconds(30));
  ASSERT_EQ(running.state(), v1::RUNNING) << running.reason();
  auto newcomer = cluster_->AddWorker();  // idle until the first one is gone (maxWorkers 1)
  ASSERT_TRUE(newcomer.ok()) << newcomer.status();
  v1::JobStatus done = WaitForEnd(*id, absl::Seconds(90));
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason() << Events(done);
  EXPECT_TRUE(AnyEventHas(done, doomed->id())) << "no event names the killed worker" << Events(done);
  ExpectEveryExampleUsedOncePerEpoch(done, 4096);
  v1::JobStatus reference;  // the same job undisturbed, on the newcomer alone
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &reference));
  ExpectSameParameters(FinalParameters(reference), done);
}

// The same for a BSP click job, whose worker dies after its rows' gradients
// of step 200 are in (the job's one partition: the tables applied the step)
// and before its dense ones are sent. The newcomer computes step 200 again:
// the tables answer its pull with the rows as they were before the step
// (not as the step left them), so its dense gradients, and the whole job,
// are bit-identical to an undisturbed run, tables included.
class ClickHalfPushTest : public HalfPushTest {
 protected:
  static void SetUpTestSuite() { StartCluster(2, 0); }  // no worker left from HalfPushTest
};

TEST_F(ClickHalfPushTest, AStepWhoseRowsWereAppliedIsRecomputedFromTheRowsBeforeIt) {
  v1::JobSpec spec = ClickSpec(v1::ModelSpec::FM, 2);
  spec.set_mode(v1::BSP);
  spec.mutable_data()->set_epochs(1);
  spec.set_num_workers(1);
  spec.set_max_workers(1);
  auto doomed = cluster_->AddWorker({"--exit-mid-push=200"});
  ASSERT_TRUE(doomed.ok()) << doomed.status();
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus running = WaitFor(
      *id, [](const v1::JobStatus& s) { return s.state() == v1::RUNNING || Terminal(s.state()); }, absl::Seconds(30));
  ASSERT_EQ(running.state(), v1::RUNNING) << running.reason();
  auto newcomer = cluster_->AddWorker();
  ASSERT_TRUE(newcomer.ok()) << newcomer.status();
  v1::JobStatus done = WaitForEnd(*id, absl::Seconds(90));
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason() << Events(done);
  EXPECT_TRUE(AnyEventHas(done, doomed->id())) << "no event names the killed worker" << Events(done);
  v1::JobStatus reference;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &reference));
  EXPECT_EQ(done.progress().test_auc(), reference.progress().test_auc());
  const std::map<std::string, SafetensorsTensor> expected =
      LiveExport(reference.job_id(), cluster_->scheduler_address());
  ASSERT_EQ(expected.count("table.embedding.rows"), 1u);
  ExpectSameExport(expected, LiveExport(*id, cluster_->scheduler_address()));
}

// A BSP click job with two replicas of every shard (tables included),
// killed servers and all: it runs undisturbed first (Reference), and a
// disturbed run must end as that one did (ExpectLikeTheReference).
class ReplicatedClickTest : public ClusterTest {
 protected:
  struct Reference {
    v1::JobSpec spec;
    v1::JobStatus status;
    std::map<std::string, SafetensorsTensor> exported;  // read at once: killed servers may hold its buckets
  };
  static void RunReference(int epochs, Reference* reference) {
    reference->spec = ClickSpec(v1::ModelSpec::FM, 2);
    reference->spec.set_mode(v1::BSP);
    reference->spec.mutable_data()->set_epochs(epochs);
    reference->spec.set_replicas(2);
    ASSERT_NO_FATAL_FAILURE(RunToSuccess(reference->spec, &reference->status));
    reference->exported = LiveExport(reference->status.job_id(), cluster_->scheduler_address());
    ASSERT_EQ(reference->exported.count("table.embedding.rows"), 1u);
  }
  // Succeeded without a checkpoint restore, with the reference's AUC,
  // dense tensors and table rows.
  static void ExpectLikeTheReference(const std::string& job_id, const v1::JobStatus& done,
                                     const Reference& reference) {
    ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason() << Events(done);
    EXPECT_FALSE(AnyEventHas(done, "restored from checkpoint")) << Events(done);
    EXPECT_EQ(done.progress().test_auc(), reference.status.progress().test_auc());
    ExpectSameExport(reference.exported, LiveExport(job_id, cluster_->scheduler_address()));
  }
};

// Three servers, two workers.
class ReplicatedTablesTest : public ReplicatedClickTest {
 protected:
  static void SetUpTestSuite() { StartCluster(3, 2, /*replicas=*/2); }
};

// A BSP click job loses the primary of a shard holding table buckets
// (kill -9, mid-job): its backup, which had every push the primary
// acknowledged, takes over without a checkpoint (the job takes none), and
// the job ends bit-identical to an undisturbed run, tables included.
TEST_F(ReplicatedTablesTest, KilledPrimaryOfAClickJobLosesNoRow) {
  Reference reference;
  ASSERT_NO_FATAL_FAILURE(RunReference(/*epochs=*/1, &reference));
  auto id = Submit(reference.spec);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus running = WaitForStep(*id, 150);
  ASSERT_EQ(running.state(), v1::RUNNING) << running.reason();
  ASSERT_GT(running.shard_map().tables_size(), 0);
  const int32_t bucket_shard = running.shard_map().tables(0).bucket_shards(0);
  std::string victim;
  for (const auto& shard : running.shard_map().shards()) {
    if (shard.shard() == bucket_shard) victim = shard.server_id();
  }
  ASSERT_FALSE(victim.empty());
  ASSERT_TRUE(cluster_->Signal(victim, SIGKILL).ok());
  v1::JobStatus done = WaitForEnd(*id, absl::Seconds(120));
  ASSERT_NO_FATAL_FAILURE(ExpectLikeTheReference(*id, done, reference));
  EXPECT_TRUE(AnyEventHas(done, victim)) << "no event names the killed server" << Events(done);
  for (const auto& shard : done.shard_map().shards()) EXPECT_NE(shard.server_id(), victim);
}

// Two servers, two workers, every shard (tables included) on both.
class ReplacedTableServerTest : public ReplicatedClickTest {
 protected:
  static void SetUpTestSuite() { StartCluster(2, 2, /*replicas=*/2); }
};

int CountEvents(const v1::JobStatus& job, const std::string& text) {
  int count = 0;
  for (const auto& event : job.events()) count += absl::StrContains(event.message(), text) ? 1 : 0;
  return count;
}

// The pod holding a click job's tables is killed and a new server joins
// (a StatefulSet replacing it): the newcomer copies each shard's tables
// live from the survivor and becomes its backup. Then the survivor is
// killed too: the newcomer, which holds every shard by then, takes over.
// The job never restores from a checkpoint (it takes none) and ends
// bit-identical to an undisturbed run, tables included.
TEST_F(ReplacedTableServerTest, ANewServerCopiesTheTablesAndSurvivesTheNextKill) {
  Reference reference;
  ASSERT_NO_FATAL_FAILURE(RunReference(/*epochs=*/4, &reference));
  auto id = Submit(reference.spec);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus running = WaitForStep(*id, 100);
  ASSERT_EQ(running.state(), v1::RUNNING) << running.reason();
  const int shards = running.shard_map().shards_size();
  ASSERT_GT(shards, 0);
  const std::string first = running.shard_map().shards(0).server_id();
  ASSERT_TRUE(cluster_->Signal(first, SIGKILL).ok());
  auto added = cluster_->AddServer();
  ASSERT_TRUE(added.ok()) << added.status();
  const std::string newcomer = added->id();
  const std::string copied = newcomer + " holds its copy and replicates";
  v1::JobStatus replicated = WaitFor(
      *id, [&](const v1::JobStatus& s) { return CountEvents(s, copied) >= shards || Terminal(s.state()); },
      absl::Seconds(60));
  ASSERT_EQ(replicated.state(), v1::RUNNING) << replicated.reason() << Events(replicated);
  ASSERT_GE(CountEvents(replicated, copied), shards) << Events(replicated);
  std::string second;
  for (const auto& shard : replicated.shard_map().shards()) {
    if (shard.server_id() != newcomer) second = shard.server_id();
  }
  ASSERT_FALSE(second.empty());
  ASSERT_TRUE(cluster_->Signal(second, SIGKILL).ok());
  v1::JobStatus done = WaitForEnd(*id, absl::Seconds(120));
  ASSERT_NO_FATAL_FAILURE(ExpectLikeTheReference(*id, done, reference));
  for (const auto& shard : done.shard_map().shards()) EXPECT_EQ(shard.server_id(), newcomer);
}

// Two servers, every shard on both.
class StoppedPrimaryTest : public ClusterTest {
 protected:
  static void SetUpTestSuite() { StartCluster(2, 2, /*replicas=*/2); }
};

// Issue 13, case 9: a primary paused (SIGSTOP, as a node under memory
// pressure or a debugger would) for far longer than its lease is failed over
// like a dead one: the job makes progress while it is still stopped, and
// ends with the parameters of an undisturbed run.
TEST_F(StoppedPrimaryTest, StoppedPrimaryIsFailedOverWhileStillStopped) {
  v1::JobSpec spec = LongSpec(6);
  spec.set_num_shards(1);
  v1::JobStatus reference;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess(spec, &reference));
  const std::vector<float> expected = FinalParameters(reference);

  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus running = WaitForStep(*id, 30);
  ASSERT_EQ(running.state(), v1::RUNNING);
  const std::string victim = running.shards(0).server_id();
  ASSERT_TRUE(cluster_->Signal(victim, SIGSTOP).ok());
  const int64_t stopped_at = running.progress().step();
  absl::SleepFor(absl::Seconds(8));  // the pause itself, as in the report (the lease is 1.5 s)
  grpc::ClientContext context;
  v1::GetJobRequest get;
  get.set_job_id(*id);
  v1::JobStatus moved;
  ASSERT_TRUE(stub_->GetJob(&context, get, &moved).ok());
  ASSERT_TRUE(cluster_->Signal(victim, SIGCONT).ok());
  // It was failed over and training went on while it was still stopped (a
  // request it held must not stall the job until that request's deadline).
  EXPECT_NE(moved.shards(0).server_id(), victim) << "the stopped primary still leads";
  EXPECT_GT(moved.progress().step(), stopped_at + 40)
      << "no progress during the 8 s the primary was stopped" << Events(moved);
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  ExpectSameParameters(expected, done);
  ExpectEveryExampleUsedOncePerEpoch(done, 4096);
}

// `fulcrum checkpoint` asked while a primary is paused: the scheduler cuts
// short its calls to the paused server once its lease runs out (instead of
// waiting out their deadline), the failed try is taken again after the
// failover, and the checkpoint is COMPLETE while the server is still
// stopped. Resumed, the server comes back and the job ends.
TEST_F(StoppedPrimaryTest, ACheckpointAskedWhileAPrimaryIsStoppedIsTakenAfterItsFailover) {
  v1::JobSpec spec = LongSpec(6);
  spec.set_num_shards(1);
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  const v1::JobStatus running = WaitForStep(*id, 30);
  ASSERT_EQ(running.state(), v1::RUNNING);
  const std::string victim = running.shards(0).server_id();
  ASSERT_TRUE(cluster_->Signal(victim, SIGSTOP).ok());
  grpc::ClientContext context;
  SetDeadline(&context, 60);  // its calls' own deadline is 90 s
  v1::CheckpointJobRequest request;
  request.set_job_id(*id);
  v1::CheckpointInfo info;
  const grpc::Status asked = stub_->CheckpointJob(&context, request, &info);
  grpc::ClientContext get_context;
  v1::GetJobRequest get;
  get.set_job_id(*id);
  v1::JobStatus after;
  const grpc::Status got = stub_->GetJob(&get_context, get, &after);
  ASSERT_TRUE(cluster_->Signal(victim, SIGCONT).ok());
  ASSERT_TRUE(asked.ok()) << asked.error_message() << Events(after);
  EXPECT_EQ(info.state(), v1::CheckpointInfo::COMPLETE) << info.reason() << Events(after);
  ASSERT_TRUE(got.ok()) << got.error_message();
  EXPECT_NE(after.shards(0).server_id(), victim) << "the stopped primary still leads";
  const v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  ExpectEveryExampleUsedOncePerEpoch(done, 4096);
}

// Issue 13, case 10: the scheduler is gone for several seconds (long enough
// for clients' reconnect backoff to grow) and comes back on its state: every
// live server registers again in time, so none is failed over.
TEST_F(StoppedPrimaryTest, SchedulerDownForSecondsFailsOverNoLiveServer) {
  v1::JobSpec spec = LongSpec(6);
  spec.set_num_shards(1);
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus running = WaitForStep(*id, 30);
  ASSERT_EQ(running.state(), v1::RUNNING);
  ASSERT_TRUE(cluster_->Signal("scheduler", SIGKILL).ok());
  absl::SleepFor(absl::Seconds(6));  // the outage itself
  absl::StatusOr<v1::LocalProcess> restarted;
  for (int attempt = 0; attempt < 100; ++attempt) {
    restarted = cluster_->RestartScheduler();
    if (restarted.ok() || restarted.status().code() != absl::StatusCode::kFailedPrecondition) break;
    absl::SleepFor(absl::Milliseconds(20));  // until the killed process is reaped
  }
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  stub_ = v1::JobService::NewStub(MakeChannel(cluster_->scheduler_address()));
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.failovers(), 0) << Events(done);
  EXPECT_FALSE(AnyEventHas(done, "did not come back")) << Events(done);
}

// The scheduler paused (SIGSTOP: a node starved of CPU, a debugger) for just
// under a lease: it heard no heartbeat meanwhile, and that time counts
// against nobody's lease. Before, every member whose last heartbeat came a
// little before the pause was declared dead the moment it resumed, and the
// job lost its servers at once.
TEST_F(StoppedPrimaryTest, SchedulerPausedForAlmostALeaseLosesNoMember) {
  v1::JobSpec spec = LongSpec(3);
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus running = WaitForStep(*id, 30);
  ASSERT_EQ(running.state(), v1::RUNNING);
  ASSERT_TRUE(cluster_->Signal("scheduler", SIGSTOP).ok());
  absl::SleepFor(absl::Milliseconds(1400));  // the pause itself; the cluster's lease is 1.5 s
  ASSERT_TRUE(cluster_->Signal("scheduler", SIGCONT).ok());
  v1::JobStatus done = WaitForEnd(*id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.failovers(), 0) << Events(done);
  EXPECT_FALSE(AnyEventHas(done, "lost")) << Events(done);
}

}  // namespace
}  // namespace fulcrum
