#include "server/parameter_store.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/data_partition.h"
#include "common/param_init.h"
#include "common/tensor_codec.h"
#include "common/test_util.h"
#include "gtest/gtest.h"
#include "server/parameter_service.h"

namespace fulcrum {
namespace {

constexpr uint64_t kSeed = 42;
constexpr int32_t kChunkId = 7;
constexpr int32_t kTensor = 1;
constexpr int64_t kOffset = 100;
constexpr int64_t kLength = 8;
constexpr float kScale = 0.5f;
// A power of two so that lr * g is exact for the small gradients used below.
constexpr float kStoreLr = 0.25f;

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

ChunkConfig TestChunk() {
  ChunkConfig c;
  c.chunk_id = kChunkId;
  c.tensor = kTensor;
  c.offset = kOffset;
  c.length = kLength;
  c.init = InitKind::kUniform;
  c.init_scale = kScale;
  return c;
}

JobShardConfig TestJob(bool synchronous, int32_t num_workers,
                       const std::string& job_id = "job-1") {
  JobShardConfig config;
  config.job_id = job_id;
  config.optimizer.kind = OptimizerKind::kSgd;
  config.lr = kStoreLr;
  config.synchronous = synchronous;
  config.num_partitions = num_workers;
  config.seed = kSeed;
  config.chunks.push_back(TestChunk());
  return config;
}

std::vector<float> InitValues() {
  std::vector<float> v(kLength);
  FillInit(InitKind::kUniform, kScale, kSeed, kTensor, kOffset, kLength,
           v.data());
  return v;
}

std::string Encode(const std::vector<float>& v) {
  std::string bytes;
  EncodeFloats(v.data(), static_cast<int64_t>(v.size()), &bytes);
  return bytes;
}

std::vector<float> Decode(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  EXPECT_TRUE(
      DecodeFloats(bytes, static_cast<int64_t>(v.size()), v.data(), "pull")
          .ok());
  return v;
}

// A gradient of small multiples of 1/8 so every update below is exact.
std::vector<float> Grad(float base) {
  std::vector<float> g(kLength);
  for (int64_t i = 0; i < kLength; ++i) {
    g[i] = base + 0.125f * static_cast<float>(i) - 0.5f;
  }
  return g;
}

PushArgs Args(const std::string& worker, int32_t rank, int64_t seq,
              int64_t step, absl::string_view gradient,
              int32_t chunk_id = kChunkId) {
  PushArgs args;
  args.worker_id = worker;
  args.partition = rank;
  args.seq = seq;
  args.step = step;
  args.chunk_id = chunk_id;
  args.gradient = gradient;
  return args;
}

class ParameterStoreTest : public ::testing::Test {
 protected:
  std::shared_ptr<JobShard> SetUpJob(JobShardConfig config) {
    const std::string job_id = config.job_id;
    EXPECT_TRUE(store_.SetupJob(std::move(config)).ok());
    absl::StatusOr<std::shared_ptr<JobShard>> shard = store_.Find(job_id);
    EXPECT_TRUE(shard.ok()) << shard.status();
    return shard.ok() ? *shard : nullptr;
  }

  // Pulls without waiting; fails the test on error.
  std::vector<float> PullNow(JobShard* shard, int64_t* version) {
    std::string data;
    absl::Status s = shard->Pull(kChunkId, 0, 0, absl::Now(), &data, version);
    EXPECT_TRUE(s.ok()) << s;
    return Decode(data);
  }

  ParameterStore store_;
};

// A copied job is installed only where the server holds none: a second copy
// of the same setup that finished first (and took writes since) is kept,
// and the later one is refused UNAVAILABLE (set up again), not put in its
// place.
TEST_F(ParameterStoreTest, ACopyIsInstalledOnlyWhereTheJobIsNotHeld) {
  auto first = JobShard::Create(TestJob(false, 1));
  auto second = JobShard::Create(TestJob(false, 1));
  ASSERT_TRUE(first.ok() && second.ok());
  const JobShard* installed = first->get();
  ASSERT_TRUE(store_.InstallCopy(*std::move(first)).ok());
  const absl::Status refused = store_.InstallCopy(*std::move(second));
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_NE(refused.message().find("set it up again"), std::string::npos) << refused;
  auto held = store_.Find("job-1");
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(held->get(), installed) << "the first copy was replaced";
}

TEST_F(ParameterStoreTest, InitialValuesMatchFillInitForTheChunkRange) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(/*synchronous=*/true, 2));
  ASSERT_NE(shard, nullptr);
  int64_t version = -1;
  const std::vector<float> values = PullNow(shard.get(), &version);
  EXPECT_EQ(version, 0);
  const std::vector<float> expected = InitValues();
  ASSERT_EQ(values.size(), expected.size());
  for (int64_t i = 0; i < kLength; ++i) {
    EXPECT_EQ(Bits(values[i]), Bits(expected[i])) << "element " << i;
  }
  // The range really is the chunk's: it differs from the tensor's start.
  std::vector<float> from_zero(kLength);
  FillInit(InitKind::kUniform, kScale, kSeed, kTensor, 0, kLength,
           from_zero.data());
  EXPECT_NE(values, from_zero);
}

TEST_F(ParameterStoreTest, ZerosInitIsZero) {
  JobShardConfig config = TestJob(true, 1);
  config.chunks[0].init = InitKind::kZeros;
  std::shared_ptr<JobShard> shard = SetUpJob(std::move(config));
  ASSERT_NE(shard, nullptr);
  int64_t version = -1;
  EXPECT_EQ(PullNow(shard.get(), &version), std::vector<float>(kLength, 0.0f));
}

TEST_F(ParameterStoreTest, AspPushAppliesImmediately) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(/*synchronous=*/false, 2));
  ASSERT_NE(shard, nullptr);
  const std::vector<float> g = Grad(1.0f);
  const std::string bytes = Encode(g);
  absl::StatusOr<PushOutcome> outcome = shard->Push(Args("w0", 0, 1, 0, bytes));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(*outcome, PushOutcome::kApplied);

  int64_t version = -1;
  const std::vector<float> values = PullNow(shard.get(), &version);
  EXPECT_EQ(version, 1);
  const std::vector<float> init = InitValues();
  for (int64_t i = 0; i < kLength; ++i) {
    EXPECT_EQ(values[i], init[i] - kStoreLr * g[i]) << "element " << i;
  }

  // A second worker's push is applied on its own too (no waiting for a step).
  const std::vector<float> g2 = Grad(-2.0f);
  ASSERT_TRUE(shard->Push(Args("w1", 1, 1, 0, Encode(g2))).ok());
  const std::vector<float> values2 = PullNow(shard.get(), &version);
  EXPECT_EQ(version, 2);
  for (int64_t i = 0; i < kLength; ++i) {
    EXPECT_EQ(values2[i], values[i] - kStoreLr * g2[i]) << "element " << i;
  }
}

// A worker that must compute a step some chunks have completed already
// (another one died with its push half sent) reads the values the step
// started from: a BSP chunk keeps them for one step, in its copies too.
TEST_F(ParameterStoreTest, BspChunkGivesTheValuesOfTheStepBeforeOnly) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(/*synchronous=*/true, 1));
  ASSERT_NE(shard, nullptr);
  std::string data;
  int64_t version = -1, clock = -1;
  // Before any step there is only version 0.
  ASSERT_TRUE(shard->Read(kChunkId, v1::WIRE_FP32, &data, &version, &clock, /*exact_version=*/0).ok());
  EXPECT_EQ(Decode(data), InitValues());
  ASSERT_TRUE(shard->Push(Args("w0", 0, 1, 0, Encode(Grad(1.0f)))).ok());
  const std::vector<float> after_one = PullNow(shard.get(), &version);
  ASSERT_EQ(version, 1);
  ASSERT_TRUE(shard->Read(kChunkId, v1::WIRE_FP32, &data, &version, &clock, /*exact_version=*/0).ok());
  EXPECT_EQ(version, 0);
  EXPECT_EQ(Decode(data), InitValues());
  ASSERT_TRUE(shard->Read(kChunkId, v1::WIRE_FP32, &data, &version, &clock, /*exact_version=*/1).ok());
  EXPECT_EQ(version, 1);
  EXPECT_EQ(Decode(data), after_one);
  // A push of the step before is a duplicate there, and leaves both alone.
  absl::StatusOr<PushOutcome> late = shard->Push(Args("w1", 0, 1, 0, Encode(Grad(5.0f))));
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(*late, PushOutcome::kDuplicate);
  ASSERT_TRUE(shard->Push(Args("w0", 0, 2, 1, Encode(Grad(2.0f)))).ok());
  // Two steps on, version 0 is gone; a version not reached yet is refused.
  EXPECT_EQ(shard->Read(kChunkId, v1::WIRE_FP32, &data, &version, &clock, 0).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->Read(kChunkId, v1::WIRE_FP32, &data, &version, &clock, 3).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(shard->Read(kChunkId, v1::WIRE_FP32, &data, &version, &clock, 1).ok());
  EXPECT_EQ(Decode(data), after_one);
  // A replica copied from this one (re-replication) can answer the same.
  absl::StatusOr<ChunkSnapshot> snapshot = shard->Snapshot(kChunkId);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  v1::ChunkState state;
  ToChunkState(*snapshot, kChunkId, &state);
  absl::StatusOr<ChunkSnapshot> copied = FromChunkState(state);
  ASSERT_TRUE(copied.ok()) << copied.status();
  JobShardConfig other = TestJob(true, 1, "job-copy");
  std::shared_ptr<JobShard> copy = SetUpJob(std::move(other));
  ASSERT_NE(copy, nullptr);
  ASSERT_TRUE(copy->Restore(kChunkId, *copied).ok());
  ASSERT_TRUE(copy->Read(kChunkId, v1::WIRE_FP32, &data, &version, &clock, 1).ok());
  EXPECT_EQ(Decode(data), after_one);
}

// A copy whose steps lie past any job's (a corrupt record, a peer's bad
// copy) is refused before it takes, BSP and ASP: such a position would
// make every later push of its partition a silent duplicate.
TEST_F(ParameterStoreTest, ACopyWhoseStepsLiePastAnyJobsIsDataLoss) {
  for (bool synchronous : {true, false}) {
    SCOPED_TRACE(synchronous ? "BSP" : "ASP");
    const std::string id = synchronous ? "job-bsp" : "job-asp";
    std::shared_ptr<JobShard> shard = SetUpJob(TestJob(synchronous, 1, id));
    ASSERT_NE(shard, nullptr);
    ASSERT_TRUE(shard->Push(Args("w0", 0, 1, 0, Encode(Grad(1.0f)))).ok());
    absl::StatusOr<ChunkSnapshot> snapshot = shard->Snapshot(kChunkId);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    std::shared_ptr<JobShard> copy = SetUpJob(TestJob(synchronous, 1, id + "-copy"));
    ASSERT_NE(copy, nullptr);
    std::vector<ChunkSnapshot> bad(1, *snapshot);
    bad[0].version = kMaxJobStep + 2;
    if (!synchronous) {
      ASSERT_FALSE(snapshot->partition_steps.empty());
      for (int64_t step : {std::numeric_limits<int64_t>::max(), int64_t{-1}}) {
        bad.push_back(*snapshot);
        bad.back().partition_steps[0] = step;
      }
    }
    for (const ChunkSnapshot& damaged : bad) {
      EXPECT_EQ(copy->Restore(kChunkId, damaged).code(), absl::StatusCode::kDataLoss);
    }
    EXPECT_TRUE(copy->Restore(kChunkId, *snapshot).ok()) << "the undamaged copy";
  }
}

std::vector<float> LeasedValues(const ValuesLease& lease) {
  std::vector<float> values(lease.size() / sizeof(float));
  std::memcpy(values.data(), lease.bytes(), lease.size());
  return values;
}

// A read that lends the values (a pull answer sending them without a copy)
// sees them unchanged however long it holds them: pushes and restores go
// on, into other memory, and later reads see their results.
TEST_F(ParameterStoreTest, LeasedValuesStayAsTheyWereReadWhileTheChunkMovesOn) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(/*synchronous=*/false, 1));
  ASSERT_NE(shard, nullptr);
  std::string data;
  int64_t version = -1, clock = -1;
  ValuesLease lease;
  ASSERT_TRUE(shard->Read(kChunkId, v1::WIRE_FP32, &data, &version, &clock, -1, &lease).ok());
  ASSERT_FALSE(lease.empty());
  EXPECT_TRUE(data.empty()) << "lent, not copied";
  EXPECT_EQ(LeasedValues(lease), InitValues());
  ASSERT_TRUE(shard->Push(Args("w0", 0, 1, 0, Encode(Grad(1.0f)))).ok());
  ASSERT_TRUE(shard->Push(Args("w0", 0, 2, 1, Encode(Grad(2.0f)))).ok());
  EXPECT_EQ(LeasedValues(lease), InitValues());
  const std::vector<float> after_two = PullNow(shard.get(), &version);
  EXPECT_EQ(version, 2);
  EXPECT_NE(after_two, InitValues());
  // A second lease, then a restore of other state: both leases keep theirs.
  ValuesLease second;
  ASSERT_TRUE(shard->Read(kChunkId, v1::WIRE_FP32, &data, &version, &clock, -1, &second).ok());
  absl::StatusOr<ChunkSnapshot> snapshot = shard->Snapshot(kChunkId);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  snapshot->values.assign(kLength, 7.0f);
  ASSERT_TRUE(shard->Restore(kChunkId, *snapshot).ok());
  EXPECT_EQ(LeasedValues(lease), InitValues());
  EXPECT_EQ(LeasedValues(second), after_two);
  EXPECT_EQ(PullNow(shard.get(), &version), std::vector<float>(kLength, 7.0f));
  // Returned leases: the chunk updates in place again, with the same results.
  lease = ValuesLease();
  second = ValuesLease();
  ASSERT_TRUE(shard->Push(Args("w0", 0, 3, 2, Encode(Grad(1.0f)))).ok());
  const std::vector<float> g = Grad(1.0f);
  const std::vector<float> now = PullNow(shard.get(), &version);
  for (int64_t i = 0; i < kLength; ++i) EXPECT_EQ(now[i], 7.0f - kStoreLr * g[i]) << "element " << i;
  // Other formats are encoded copies, lease or not.
  ASSERT_TRUE(shard->Read(kChunkId, v1::WIRE_BF16, &data, &version, &clock, -1, &lease).ok());
  EXPECT_TRUE(lease.empty());
  EXPECT_EQ(data.size(), static_cast<size_t>(kLength) * 2);
}

// BSP: a lease on the values before the last step (a pull of an exact
// version) keeps them through the next steps, and the values a lease holds
// never change under it whichever buffer the chunk reuses.
TEST_F(ParameterStoreTest, BspLeasesOfBothVersionsOutliveTheSteps) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(/*synchronous=*/true, 1));
  ASSERT_NE(shard, nullptr);
  std::string data;
  int64_t version = -1, clock = -1;
  ASSERT_TRUE(shard->Push(Args("w0", 0, 1, 0, Encode(Grad(1.0f)))).ok());
  const std::vector<float> after_one = PullNow(shard.get(), &version);
  ValuesLease before, current;
  ASSERT_TRUE(shard->Read(kChunkId, v1::WIRE_FP32, &data, &version, &clock, 0, &before).ok());
  ASSERT_TRUE(shard->Read(kChunkId, v1::WIRE_FP32, &data, &version, &clock, 1, &current).ok());
  EXPECT_EQ(LeasedValues(before), InitValues());
  EXPECT_EQ(LeasedValues(current), after_one);
  std::vector<float> expected = after_one;
  for (int64_t step = 1; step < 5; ++step) {
    ASSERT_TRUE(shard->Push(Args("w0", 0, step + 1, step, Encode(Grad(static_cast<float>(step))))).ok());
    const std::vector<float> g = Grad(static_cast<float>(step));
    for (int64_t i = 0; i < kLength; ++i) expected[i] -= kStoreLr * g[i];
    if (!before.empty()) {
      EXPECT_EQ(LeasedValues(before), InitValues()) << "step " << step;
    }
    EXPECT_EQ(LeasedValues(current), after_one) << "step " << step;
    EXPECT_EQ(PullNow(shard.get(), &version), expected) << "step " << step;
    if (step == 2) before = ValuesLease();  // returned halfway: its buffer may be reused
  }
}

TEST_F(ParameterStoreTest, AspChunkKeepsNoOldValues) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(/*synchronous=*/false, 1));
  ASSERT_NE(shard, nullptr);
  ASSERT_TRUE(shard->Push(Args("w0", 0, 1, 0, Encode(Grad(1.0f)))).ok());
  std::string data;
  int64_t version = -1, clock = -1;
  EXPECT_EQ(shard->Read(kChunkId, v1::WIRE_FP32, &data, &version, &clock, 0).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(ParameterStoreTest, BspWaitsForEveryRankThenAppliesTheMean) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(/*synchronous=*/true, 2));
  ASSERT_NE(shard, nullptr);
  const std::vector<float> g0 = Grad(1.0f);
  const std::vector<float> g1 = Grad(3.0f);
  const std::string b0 = Encode(g0);
  const std::string b1 = Encode(g1);

  absl::StatusOr<PushOutcome> first = shard->Push(Args("w0", 0, 1, 0, b0));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, PushOutcome::kBuffered);

  // Not applied yet: the version is unchanged, the values are the initial
  // ones, and waiting for step 1 runs into the deadline.
  int64_t version = -1;
  EXPECT_EQ(PullNow(shard.get(), &version), InitValues());
  EXPECT_EQ(version, 0);
  std::string data;
  absl::Status waited = shard->Pull(kChunkId, 1, 0, absl::Now() + absl::Milliseconds(20), &data, &version);
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;

  absl::StatusOr<PushOutcome> second = shard->Push(Args("w1", 1, 1, 0, b1));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, PushOutcome::kBuffered);

  // Step 1 is complete: a pull for it returns at once.
  data.clear();
  ASSERT_TRUE(
      shard->Pull(kChunkId, 1, 0, absl::InfiniteFuture(), &data, &version).ok());
  EXPECT_EQ(version, 1);
  const std::vector<float> values = Decode(data);
  const std::vector<float> init = InitValues();
  for (int64_t i = 0; i < kLength; ++i) {
    EXPECT_EQ(values[i], init[i] - kStoreLr * ((g0[i] + g1[i]) / 2)) << i;
  }
}

// LAMB over two chunks of one tensor: a whole step waits for the tensor's
// norms, each chunk gives its part of them, and the step applied with their
// sums is LAMB's update of the whole tensor.
TEST_F(ParameterStoreTest, LambStepWaitsForItsTensorsNormsThenAppliesTheWholeTensorsUpdate) {
  JobShardConfig config = TestJob(/*synchronous=*/true, 2);
  config.optimizer.kind = OptimizerKind::kLamb;
  ChunkConfig second = TestChunk();
  second.chunk_id = kChunkId + 1;
  second.offset = kOffset + kLength;
  config.chunks.push_back(second);
  std::shared_ptr<JobShard> shard = SetUpJob(config);
  ASSERT_NE(shard, nullptr);
  const std::vector<float> g0 = Grad(1.0f), g1 = Grad(3.0f);
  for (int32_t chunk : {kChunkId, kChunkId + 1}) {
    ASSERT_TRUE(shard->Push(Args("w0", 0, chunk, 0, Encode(g0), chunk)).ok());
    EXPECT_FALSE(shard->LambReady(chunk, 0)) << "one partition of two is in";
  }
  v1::LambPartial partial;
  int64_t version = -1;
  EXPECT_EQ(shard->LambPartialOf(kChunkId, 0, &partial, &version).code(), absl::StatusCode::kFailedPrecondition);
  // An early norms push is refused: the step is not whole.
  EXPECT_EQ(shard->ApplyLambNorms(kChunkId, 0, {1, 1}).status().code(), absl::StatusCode::kFailedPrecondition);
  for (int32_t chunk : {kChunkId, kChunkId + 1}) {
    ASSERT_TRUE(shard->Push(Args("w1", 1, chunk, 0, Encode(g1), chunk)).ok());
    EXPECT_TRUE(shard->LambReady(chunk, 0));
  }
  // Whole, but not applied: the values and version are the step's start,
  // and the partitions' pushes of it are duplicates.
  std::string values;
  int64_t clock = 0;
  ASSERT_TRUE(shard->Read(kChunkId, v1::WIRE_FP32, &values, &version, &clock).ok());
  EXPECT_EQ(version, 0);
  EXPECT_EQ(Decode(values), InitValues());
  EXPECT_EQ(*shard->Push(Args("w1", 1, 9, 0, Encode(g1))), PushOutcome::kDuplicate);

  // The reference: the whole tensor's mean gradient, norms summed over the
  // two chunks in order, each chunk applied with the sums.
  std::vector<float> mean(kLength);
  for (int64_t i = 0; i < kLength; ++i) mean[i] = (g0[i] + g1[i]) * 0.5f;
  std::vector<float> init2(kLength);
  FillInit(InitKind::kUniform, kScale, kSeed, kTensor, kOffset + kLength, kLength, init2.data());
  const std::vector<std::vector<float>> inits = {InitValues(), init2};
  std::vector<std::vector<float>> zero(2, std::vector<float>(kLength, 0.0f));
  const float* state[2] = {zero[0].data(), zero[1].data()};
  LambNorms sums;
  for (int c = 0; c < 2; ++c) {
    const LambNorms part = LambBlockNorms(config.optimizer, 1, kLength, mean.data(), inits[c].data(), state);
    ASSERT_TRUE(shard->LambPartialOf(kChunkId + c, 0, &partial, &version).ok());
    EXPECT_EQ(version, 0);
    EXPECT_FALSE(partial.settled());
    EXPECT_EQ(partial.weight_sq(), part.weight_sq) << "chunk " << c;
    EXPECT_EQ(partial.update_sq(), part.update_sq) << "chunk " << c;
    sums.weight_sq += partial.weight_sq();
    sums.update_sq += partial.update_sq();
  }
  EXPECT_EQ(shard->ApplyLambNorms(kChunkId, 0, {-1, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->ApplyLambNorms(kChunkId, 0, {std::nan(""), 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (int c = 0; c < 2; ++c) {
    absl::StatusOr<PushOutcome> applied = shard->ApplyLambNorms(kChunkId + c, 0, sums);
    ASSERT_TRUE(applied.ok()) << applied.status();
    EXPECT_EQ(*applied, PushOutcome::kApplied);
    EXPECT_EQ(*shard->ApplyLambNorms(kChunkId + c, 0, sums), PushOutcome::kDuplicate);
    std::vector<float> expected = inits[c];
    std::vector<std::vector<float>> moments(2, std::vector<float>(kLength, 0.0f));
    float* slots[2] = {moments[0].data(), moments[1].data()};
    ApplyLamb(config.optimizer, kStoreLr, 1, kLength, mean.data(), expected.data(), slots, sums);
    values.clear();
    ASSERT_TRUE(shard->Read(kChunkId + c, v1::WIRE_FP32, &values, &version, &clock).ok());
    EXPECT_EQ(version, 1);
    const std::vector<float> got = Decode(values);
    for (int64_t i = 0; i < kLength; ++i) EXPECT_EQ(Bits(got[i]), Bits(expected[i])) << "chunk " << c << " " << i;
    // One step past, the chunk still answers for the step it applied.
    ASSERT_TRUE(shard->LambPartialOf(kChunkId + c, 0, &partial, &version).ok());
    EXPECT_EQ(version, 1);
    EXPECT_FALSE(partial.settled());
    EXPECT_GT(partial.weight_sq(), 0);
  }
  // A copy of the chunk carries the norms of its last step.
  absl::StatusOr<ChunkSnapshot> snapshot = shard->Snapshot(kChunkId);
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->lamb_last.step, 0);
  EXPECT_GT(snapshot->lamb_last.weight_sq, 0);
  v1::ChunkState state_proto;
  ToChunkState(*snapshot, kChunkId, &state_proto);
  absl::StatusOr<ChunkSnapshot> back = FromChunkState(state_proto);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->lamb_last.step, 0);
  EXPECT_EQ(back->lamb_last.update_sq, snapshot->lamb_last.update_sq);
}

// A copy taken while a LAMB step waits for its norms (every partition's
// gradient in) waits for them as well, with the same norms.
TEST_F(ParameterStoreTest, ACopyOfAWaitingLambStepWaitsWithTheSameNorms) {
  JobShardConfig config = TestJob(/*synchronous=*/true, 1);
  config.optimizer.kind = OptimizerKind::kLamb;
  std::shared_ptr<JobShard> shard = SetUpJob(config);
  ASSERT_NE(shard, nullptr);
  ASSERT_TRUE(shard->Push(Args("w0", 0, 1, 0, Encode(Grad(1.0f)))).ok());
  v1::LambPartial original;
  int64_t version = 0;
  ASSERT_TRUE(shard->LambPartialOf(kChunkId, 0, &original, &version).ok());
  absl::StatusOr<ChunkSnapshot> snapshot = shard->Snapshot(kChunkId);
  ASSERT_TRUE(snapshot.ok());
  JobShardConfig lamb_copy = TestJob(true, 1, "job-lamb-copy");
  lamb_copy.optimizer.kind = OptimizerKind::kLamb;
  std::shared_ptr<JobShard> copy = SetUpJob(lamb_copy);
  ASSERT_NE(copy, nullptr);
  ASSERT_TRUE(copy->Restore(kChunkId, *snapshot).ok());
  EXPECT_TRUE(copy->LambReady(kChunkId, 0));
  v1::LambPartial copied;
  ASSERT_TRUE(copy->LambPartialOf(kChunkId, 0, &copied, &version).ok());
  EXPECT_EQ(version, 0);
  EXPECT_EQ(copied.weight_sq(), original.weight_sq());
  EXPECT_EQ(copied.update_sq(), original.update_sq());
  // Two steps on, a chunk says the step is settled.
  const LambNorms norms{original.weight_sq(), original.update_sq()};
  ASSERT_TRUE(shard->ApplyLambNorms(kChunkId, 0, norms).ok());
  ASSERT_TRUE(shard->Push(Args("w0", 0, 2, 1, Encode(Grad(2.0f)))).ok());
  v1::LambPartial next;
  ASSERT_TRUE(shard->LambPartialOf(kChunkId, 1, &next, &version).ok());
  ASSERT_TRUE(shard->ApplyLambNorms(kChunkId, 1, {next.weight_sq(), next.update_sq()}).ok());
  v1::LambPartial old;
  ASSERT_TRUE(shard->LambPartialOf(kChunkId, 0, &old, &version).ok());
  EXPECT_EQ(version, 2);
  EXPECT_TRUE(old.settled());
}

// A worker that gives up a held pull (it cancels the RPC) frees the server
// thread waiting for the step, long before the pull's deadline.
TEST_F(ParameterStoreTest, AWaitingPullEndsOnceItsCallerGivesUp) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(/*synchronous=*/true, 2));
  ASSERT_NE(shard, nullptr);
  int asked = 0;
  auto cancelled = [&asked] { return ++asked > 2; };  // gives up at the third look
  std::string data;
  int64_t version = -1;
  const absl::Time start = absl::Now();
  const absl::Status pulled =
      shard->Pull(kChunkId, 1, 0, absl::Now() + absl::Seconds(60), &data, &version, nullptr, v1::WIRE_FP32, cancelled);
  EXPECT_EQ(pulled.code(), absl::StatusCode::kCancelled) << pulled;
  EXPECT_TRUE(Contains(pulled.message(), "cancelled by the client while waiting for step 1")) << pulled;
  EXPECT_EQ(asked, 3);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "waited for the deadline";
  EXPECT_TRUE(data.empty());
}

TEST_F(ParameterStoreTest, BspSumsInRankOrderRegardlessOfArrivalOrder) {
  // Three ranks whose float sum depends on the order of addition:
  // (1e8 + 1) - 1e8 == 0 but (1e8 - 1e8) + 1 == 1 in float32. (With two
  // ranks a + b == b + a, so order could not show.)
  const std::vector<std::vector<float>> grads = {
      std::vector<float>(kLength, 1e8f),
      std::vector<float>(kLength, 1.0f),
      std::vector<float>(kLength, -1e8f),
  };
  ASSERT_EQ((grads[0][0] + grads[1][0]) + grads[2][0], 0.0f);
  ASSERT_EQ((grads[0][0] + grads[2][0]) + grads[1][0], 1.0f);

  std::vector<int> order = {0, 1, 2};
  std::vector<std::vector<float>> results;
  std::vector<std::vector<int>> orders;
  int job = 0;
  do {
    const std::string job_id = "job-order-" + std::to_string(job++);
    std::shared_ptr<JobShard> shard = SetUpJob(TestJob(true, 3, job_id));
    ASSERT_NE(shard, nullptr);
    std::vector<std::string> bytes;
    for (const auto& g : grads) bytes.push_back(Encode(g));
    for (int rank : order) {
      ASSERT_TRUE(shard
                      ->Push(Args("w" + std::to_string(rank), rank, 1, 0,
                                  bytes[rank]))
                      .ok());
    }
    int64_t version = -1;
    results.push_back(PullNow(shard.get(), &version));
    EXPECT_EQ(version, 1);
    orders.push_back(order);
  } while (std::next_permutation(order.begin(), order.end()));

  // Rank order sums to exactly 0, so the values stay at their initial ones.
  const std::vector<float> init = InitValues();
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_EQ(results[r].size(), init.size());
    for (int64_t i = 0; i < kLength; ++i) {
      EXPECT_EQ(Bits(results[r][i]), Bits(results[0][i]))
          << "arrival order " << orders[r][0] << orders[r][1] << orders[r][2]
          << " element " << i;
      EXPECT_EQ(Bits(results[r][i]), Bits(init[i]));
    }
  }
}

TEST_F(ParameterStoreTest, AspDuplicateIsAcknowledgedNotReapplied) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(false, 1));
  ASSERT_NE(shard, nullptr);
  const std::string bytes = Encode(Grad(1.0f));
  ASSERT_EQ(*shard->Push(Args("w0", 0, 5, 0, bytes)), PushOutcome::kApplied);
  int64_t version = -1;
  const std::vector<float> after_one = PullNow(shard.get(), &version);
  ASSERT_EQ(version, 1);

  absl::StatusOr<PushOutcome> again = shard->Push(Args("w0", 0, 5, 0, bytes));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, PushOutcome::kDuplicate);
  absl::StatusOr<PushOutcome> older = shard->Push(Args("w0", 0, 4, 0, bytes));
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ(*older, PushOutcome::kDuplicate);
  EXPECT_EQ(PullNow(shard.get(), &version), after_one);
  EXPECT_EQ(version, 1);

  // A new seq from the same worker is applied.
  EXPECT_EQ(*shard->Push(Args("w0", 0, 6, 1, bytes)), PushOutcome::kApplied);
  PullNow(shard.get(), &version);
  EXPECT_EQ(version, 2);
}

TEST_F(ParameterStoreTest, BspDuplicateIsAcknowledgedNotReapplied) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(true, 2));
  ASSERT_NE(shard, nullptr);
  const std::vector<float> g0 = Grad(1.0f);
  const std::vector<float> g1 = Grad(3.0f);
  const std::string b0 = Encode(g0);
  const std::string b1 = Encode(g1);

  ASSERT_EQ(*shard->Push(Args("w0", 0, 1, 0, b0)), PushOutcome::kBuffered);
  // The same (worker, seq) again before the step completes: not counted as
  // the second rank's gradient.
  absl::StatusOr<PushOutcome> dup = shard->Push(Args("w0", 0, 1, 0, b0));
  ASSERT_TRUE(dup.ok()) << dup.status();
  EXPECT_EQ(*dup, PushOutcome::kDuplicate);
  EXPECT_EQ(shard->Push(Args("w0", 0, 1, 0, b0)).value(),
            PushOutcome::kDuplicate);
  int64_t version = -1;
  PullNow(shard.get(), &version);
  EXPECT_EQ(version, 0);

  ASSERT_EQ(*shard->Push(Args("w1", 1, 1, 0, b1)), PushOutcome::kBuffered);
  const std::vector<float> after_step = PullNow(shard.get(), &version);
  ASSERT_EQ(version, 1);

  // A retry after the step completed is still a duplicate: it must not open
  // step 2 with a stale gradient.
  absl::StatusOr<PushOutcome> late = shard->Push(Args("w1", 1, 1, 0, b1));
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(*late, PushOutcome::kDuplicate);
  EXPECT_EQ(PullNow(shard.get(), &version), after_step);
  EXPECT_EQ(version, 1);

  const std::vector<float> init = InitValues();
  for (int64_t i = 0; i < kLength; ++i) {
    EXPECT_EQ(after_step[i], init[i] - kStoreLr * ((g0[i] + g1[i]) / 2)) << i;
  }
}

TEST_F(ParameterStoreTest, WrongPayloadSizeIsInvalidArgument) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(false, 1));
  ASSERT_NE(shard, nullptr);
  const std::string short_bytes = Encode(std::vector<float>(kLength - 1, 1.0f));
  absl::StatusOr<PushOutcome> outcome =
      shard->Push(Args("w0", 0, 1, 0, short_bytes));
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(outcome.status().message(), "chunk 7"));
  int64_t version = -1;
  EXPECT_EQ(PullNow(shard.get(), &version), InitValues());
  EXPECT_EQ(version, 0);
}

TEST_F(ParameterStoreTest, NonFiniteGradientIsInvalidArgument) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(false, 1));
  ASSERT_NE(shard, nullptr);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> g = Grad(1.0f);
    g[3] = bad;
    absl::StatusOr<PushOutcome> outcome =
        shard->Push(Args("w0", 0, 1, 0, Encode(g)));
    EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
    EXPECT_TRUE(Contains(outcome.status().message(), "non-finite")) << bad;
  }
  int64_t version = -1;
  EXPECT_EQ(PullNow(shard.get(), &version), InitValues());
  EXPECT_EQ(version, 0);
  // The rejected pushes did not consume seq 1.
  EXPECT_EQ(*shard->Push(Args("w0", 0, 1, 0, Encode(Grad(1.0f)))),
            PushOutcome::kApplied);
}

TEST_F(ParameterStoreTest, PartitionOutOfRangeIsInvalidArgument) {
  for (bool synchronous : {true, false}) {
    std::shared_ptr<JobShard> shard =
        SetUpJob(TestJob(synchronous, 2, synchronous ? "bsp" : "asp"));
    ASSERT_NE(shard, nullptr);
    const std::string bytes = Encode(Grad(1.0f));
    for (int32_t rank : {-1, 2, 100}) {
      absl::StatusOr<PushOutcome> outcome =
          shard->Push(Args("w" + std::to_string(rank), rank, 1, 0, bytes));
      EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument)
          << "rank " << rank << " synchronous " << synchronous;
      EXPECT_TRUE(Contains(outcome.status().message(), "partition"));
    }
  }
}

TEST_F(ParameterStoreTest, BspPushAheadOfVersionIsFailedPrecondition) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(true, 2));
  ASSERT_NE(shard, nullptr);
  absl::StatusOr<PushOutcome> outcome =
      shard->Push(Args("w0", 0, 1, /*step=*/1, Encode(Grad(1.0f))));
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kFailedPrecondition);
  int64_t version = -1;
  PullNow(shard.get(), &version);
  EXPECT_EQ(version, 0);
}

TEST_F(ParameterStoreTest, UnknownChunkIsNotFound) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(true, 1));
  ASSERT_NE(shard, nullptr);
  absl::StatusOr<PushOutcome> outcome =
      shard->Push(Args("w0", 0, 1, 0, Encode(Grad(1.0f)), /*chunk_id=*/99));
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kNotFound);
  std::string data;
  int64_t version = -1;
  absl::Status pulled = shard->Pull(99, 0, 0, absl::Now(), &data, &version);
  EXPECT_EQ(pulled.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(pulled.message(), "99"));
}

TEST_F(ParameterStoreTest, UnknownJobIsNotFound) {
  absl::StatusOr<std::shared_ptr<JobShard>> missing = store_.Find("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing.status().message(), "nope"));
  EXPECT_EQ(store_.num_jobs(), 0u);
}

TEST_F(ParameterStoreTest, SetupAgainReplacesTheJobWithFreshState) {
  auto first = SetUpJob(TestJob(/*synchronous=*/false, 2));
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(first->Push(Args("w", 0, 1, 0, Encode(Grad(1.0f)))).ok());
  // A redone setup (after a scheduler restart) starts from the initial values.
  ASSERT_TRUE(store_.SetupJob(TestJob(/*synchronous=*/true, 3)).ok());
  EXPECT_EQ(store_.num_jobs(), 1u);
  auto second = store_.Find("job-1");
  ASSERT_TRUE(second.ok());
  std::string data;
  int64_t version = -1;
  ASSERT_TRUE((*second)->Pull(kChunkId, 0, 0, absl::Now(), &data, &version).ok());
  EXPECT_EQ(version, 0);
  EXPECT_EQ(Decode(data), InitValues());
  // The replaced state is dropped: pushes to it are refused.
  EXPECT_EQ(first->Push(Args("w", 1, 2, 1, Encode(Grad(1.0f)))).status().code(), absl::StatusCode::kAborted);
}

TEST_F(ParameterStoreTest, SetupRejectsBadConfigs) {
  JobShardConfig no_workers = TestJob(true, 0, "a");
  EXPECT_EQ(store_.SetupJob(no_workers).code(),
            absl::StatusCode::kInvalidArgument);
  JobShardConfig empty_chunk = TestJob(true, 1, "b");
  empty_chunk.chunks[0].length = 0;
  EXPECT_EQ(store_.SetupJob(empty_chunk).code(),
            absl::StatusCode::kInvalidArgument);
  JobShardConfig twice = TestJob(true, 1, "c");
  twice.chunks.push_back(twice.chunks[0]);
  EXPECT_EQ(store_.SetupJob(twice).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.num_jobs(), 0u);
}

TEST_F(ParameterStoreTest, DropJobWakesAWaitingPull) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(true, 2));
  ASSERT_NE(shard, nullptr);
  absl::Status pulled;
  std::thread puller([&] {
    std::string data;
    int64_t version = -1;
    // No deadline: only the drop can end this wait. If the drop happens
    // first the pull returns CANCELLED straight away.
    pulled =
        shard->Pull(kChunkId, 1, 0, absl::InfiniteFuture(), &data, &version);
  });
  store_.DropJob("job-1", "cancelled by user");
  puller.join();
  EXPECT_EQ(pulled.code(), absl::StatusCode::kAborted) << pulled;
  EXPECT_TRUE(Contains(pulled.message(), "cancelled by user"));

  EXPECT_EQ(store_.Find("job-1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.num_jobs(), 0u);
  // Pushes to the dropped shard are refused too.
  EXPECT_EQ(shard->Push(Args("w0", 0, 1, 0, Encode(Grad(1.0f)))).status().code(),
            absl::StatusCode::kAborted);
}

TEST_F(ParameterStoreTest, DropUnknownJobIsANoop) {
  store_.DropJob("nope", "whatever");
  store_.DropJob("nope", "whatever", /*keep_parameters=*/true);
  EXPECT_EQ(store_.num_jobs(), 0u);
}

TEST_F(ParameterStoreTest, DropWithKeepParametersServesPullsRefusesPushes) {
  std::shared_ptr<JobShard> shard = SetUpJob(TestJob(false, 1));
  ASSERT_NE(shard, nullptr);
  const std::vector<float> g = Grad(1.0f);
  ASSERT_EQ(*shard->Push(Args("w0", 0, 1, 0, Encode(g))), PushOutcome::kApplied);
  int64_t version = -1;
  const std::vector<float> final_values = PullNow(shard.get(), &version);
  ASSERT_EQ(version, 1);

  store_.DropJob("job-1", "succeeded", /*keep_parameters=*/true);
  EXPECT_EQ(store_.num_jobs(), 1u);

  absl::StatusOr<std::shared_ptr<JobShard>> kept = store_.Find("job-1");
  ASSERT_TRUE(kept.ok()) << kept.status();
  std::string data;
  ASSERT_TRUE((*kept)->Pull(kChunkId, 1, 0, absl::Now(), &data, &version).ok());
  EXPECT_EQ(version, 1);
  EXPECT_EQ(Decode(data), final_values);

  absl::StatusOr<PushOutcome> pushed =
      (*kept)->Push(Args("w0", 0, 2, 1, Encode(g)));
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(pushed.status().message(), "succeeded"));
  ASSERT_TRUE((*kept)->Pull(kChunkId, 0, 0, absl::Now(), &data, &version).ok());
  EXPECT_EQ(version, 1);
  EXPECT_EQ(Decode(data), final_values);
}

// --- ToJobShardConfig ---

v1::SetupJobRequest BaseRequest() {
  v1::SetupJobRequest request;
  request.set_job_id("job-9");
  request.set_num_partitions(4);
  request.set_total_steps(1000);
  v1::JobSpec* spec = request.mutable_spec();
  spec->set_seed(1234);
  spec->mutable_optimizer()->set_lr(0.05f);
  v1::ChunkSetup* a = request.add_chunks();
  a->set_chunk_id(3);
  a->set_tensor(0);
  a->set_offset(0);
  a->set_length(100);
  a->set_init(v1::ChunkSetup::UNIFORM);
  a->set_init_scale(0.125f);
  v1::ChunkSetup* b = request.add_chunks();
  b->set_chunk_id(4);
  b->set_tensor(1);
  b->set_offset(64);
  b->set_length(10);
  b->set_init(v1::ChunkSetup::ZEROS);
  return request;
}

TEST(ToJobShardConfigTest, CopiesJobChunksAndScalars) {
  const JobShardConfig config = ToJobShardConfig(BaseRequest());
  EXPECT_EQ(config.job_id, "job-9");
  EXPECT_EQ(config.num_partitions, 4);
  EXPECT_EQ(config.seed, 1234u);
  EXPECT_EQ(config.lr, 0.05f);
  EXPECT_EQ(config.schedule.kind, LrScheduleKind::kConstant);
  EXPECT_EQ(config.schedule.total_steps, 1000);
  ASSERT_EQ(config.chunks.size(), 2u);
  EXPECT_EQ(config.chunks[0].chunk_id, 3);
  EXPECT_EQ(config.chunks[0].tensor, 0);
  EXPECT_EQ(config.chunks[0].offset, 0);
  EXPECT_EQ(config.chunks[0].length, 100);
  EXPECT_EQ(config.chunks[0].init, InitKind::kUniform);
  EXPECT_EQ(config.chunks[0].init_scale, 0.125f);
  EXPECT_EQ(config.chunks[1].chunk_id, 4);
  EXPECT_EQ(config.chunks[1].tensor, 1);
  EXPECT_EQ(config.chunks[1].offset, 64);
  EXPECT_EQ(config.chunks[1].length, 10);
  EXPECT_EQ(config.chunks[1].init, InitKind::kZeros);
}

TEST(ToJobShardConfigTest, UnspecifiedInitIsZeros) {
  v1::SetupJobRequest request = BaseRequest();
  request.mutable_chunks(0)->set_init(v1::ChunkSetup::INIT_UNSPECIFIED);
  EXPECT_EQ(ToJobShardConfig(request).chunks[0].init, InitKind::kZeros);
}

TEST(ToJobShardConfigTest, MapsOptimizerKinds) {
  struct Case {
    v1::OptimizerSpec::Kind proto;
    OptimizerKind expected;
  };
  for (const Case& c : {Case{v1::OptimizerSpec::KIND_UNSPECIFIED, OptimizerKind::kSgd},
                        Case{v1::OptimizerSpec::SGD, OptimizerKind::kSgd},
                        Case{v1::OptimizerSpec::ADAM, OptimizerKind::kAdam},
                        Case{v1::OptimizerSpec::ADAMW, OptimizerKind::kAdamW},
                        Case{v1::OptimizerSpec::ADAGRAD, OptimizerKind::kAdagrad},
                        Case{v1::OptimizerSpec::RMSPROP, OptimizerKind::kRmsprop},
                        Case{v1::OptimizerSpec::LAMB, OptimizerKind::kLamb}}) {
    v1::SetupJobRequest request = BaseRequest();
    request.mutable_spec()->mutable_optimizer()->set_kind(c.proto);
    EXPECT_EQ(ToJobShardConfig(request).optimizer.kind, c.expected)
        << v1::OptimizerSpec::Kind_Name(c.proto);
  }
}

// lrScaling LINEAR: rates given for baseBatchSize examples, multiplied by
// the examples one update applies (BSP: every partition's batch; ASP: one).
TEST(ToJobShardConfigTest, LinearLrScalingMultipliesTheRatesByTheUpdatesBatch) {
  v1::SetupJobRequest request = BaseRequest();
  v1::JobSpec* spec = request.mutable_spec();
  spec->mutable_optimizer()->set_lr(0.1f);
  spec->mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::WARMUP_COSINE);
  spec->mutable_lr_schedule()->set_min_lr(0.01f);
  spec->mutable_data()->set_batch_size(32);
  spec->set_num_workers(4);
  spec->set_max_workers(4);
  spec->set_mode(v1::BSP);
  EXPECT_EQ(ToJobShardConfig(request).lr, 0.1f) << "no scaling unless asked";
  spec->mutable_optimizer()->set_lr_scaling(v1::OptimizerSpec::LINEAR);
  spec->mutable_optimizer()->set_base_batch_size(64);
  JobShardConfig bsp = ToJobShardConfig(request);
  EXPECT_EQ(bsp.lr, static_cast<float>(0.1f * 2.0));  // 4 x 32 examples against 64
  EXPECT_EQ(bsp.schedule.min_lr, static_cast<float>(0.01f * 2.0));
  spec->set_mode(v1::ASP);
  EXPECT_EQ(ToJobShardConfig(request).lr, static_cast<float>(0.1f * 0.5));  // one batch of 32 against 64
}

TEST(ToJobShardConfigTest, CopiesOptimizerHyperparameters) {
  v1::SetupJobRequest request = BaseRequest();
  v1::OptimizerSpec* opt = request.mutable_spec()->mutable_optimizer();
  opt->set_kind(v1::OptimizerSpec::SGD);
  opt->set_momentum(0.9f);
  opt->set_nesterov(true);
  opt->set_weight_decay(1e-4f);
  const OptimizerConfig sgd = ToJobShardConfig(request).optimizer;
  EXPECT_EQ(sgd.momentum, 0.9f);
  EXPECT_TRUE(sgd.nesterov);
  EXPECT_EQ(sgd.weight_decay, 1e-4f);

  opt->Clear();
  opt->set_kind(v1::OptimizerSpec::ADAM);
  const OptimizerConfig adam_defaults = ToJobShardConfig(request).optimizer;
  EXPECT_EQ(adam_defaults.beta1, 0.9f);
  EXPECT_EQ(adam_defaults.beta2, 0.999f);
  EXPECT_EQ(adam_defaults.epsilon, 1e-8f);
  opt->set_beta1(0.8f);
  opt->set_beta2(0.95f);
  opt->set_epsilon(1e-6f);
  const OptimizerConfig adam = ToJobShardConfig(request).optimizer;
  EXPECT_EQ(adam.beta1, 0.8f);
  EXPECT_EQ(adam.beta2, 0.95f);
  EXPECT_EQ(adam.epsilon, 1e-6f);
}

TEST(ToJobShardConfigTest, AdagradEpsilonDefaultsTo1em10) {
  v1::SetupJobRequest request = BaseRequest();
  v1::OptimizerSpec* opt = request.mutable_spec()->mutable_optimizer();
  opt->set_kind(v1::OptimizerSpec::ADAGRAD);
  opt->set_initial_accumulator(0.1f);
  const OptimizerConfig defaulted = ToJobShardConfig(request).optimizer;
  EXPECT_EQ(defaulted.epsilon, 1e-10f);
  EXPECT_EQ(defaulted.initial_accumulator, 0.1f);
  opt->set_epsilon(1e-7f);
  EXPECT_EQ(ToJobShardConfig(request).optimizer.epsilon, 1e-7f);
}

TEST(ToJobShardConfigTest, AspIsAsynchronousBspAndDefaultAreSynchronous) {
  v1::SetupJobRequest request = BaseRequest();
  request.mutable_spec()->set_mode(v1::ASP);
  EXPECT_FALSE(ToJobShardConfig(request).synchronous);
  request.mutable_spec()->set_mode(v1::BSP);
  EXPECT_TRUE(ToJobShardConfig(request).synchronous);
  request.mutable_spec()->set_mode(v1::MODE_UNSPECIFIED);
  EXPECT_TRUE(ToJobShardConfig(request).synchronous);
}

TEST(ToJobShardConfigTest, MapsLrSchedule) {
  v1::SetupJobRequest request = BaseRequest();
  v1::LrScheduleSpec* s = request.mutable_spec()->mutable_lr_schedule();
  s->set_kind(v1::LrScheduleSpec::WARMUP_COSINE);
  s->set_warmup_steps(10);
  s->set_min_lr(0.001f);
  LrScheduleConfig cosine = ToJobShardConfig(request).schedule;
  EXPECT_EQ(cosine.kind, LrScheduleKind::kWarmupCosine);
  EXPECT_EQ(cosine.warmup_steps, 10);
  EXPECT_EQ(cosine.min_lr, 0.001f);
  EXPECT_EQ(cosine.total_steps, 1000);

  s->Clear();
  s->set_kind(v1::LrScheduleSpec::STEP_DECAY);
  s->set_step_size(30);
  LrScheduleConfig step = ToJobShardConfig(request).schedule;
  EXPECT_EQ(step.kind, LrScheduleKind::kStepDecay);
  EXPECT_EQ(step.step_size, 30);
  EXPECT_EQ(step.gamma, 0.1f);
  s->set_gamma(0.5f);
  EXPECT_EQ(ToJobShardConfig(request).schedule.gamma, 0.5f);
}

TEST(ToJobShardConfigTest, ResultIsUsableByTheStore) {
  v1::SetupJobRequest request = BaseRequest();
  request.mutable_spec()->set_mode(v1::ASP);
  ParameterStore store;
  ASSERT_TRUE(store.SetupJob(ToJobShardConfig(request)).ok());
  absl::StatusOr<std::shared_ptr<JobShard>> shard = store.Find("job-9");
  ASSERT_TRUE(shard.ok());
  std::string data;
  int64_t version = -1;
  ASSERT_TRUE((*shard)->Pull(3, 0, 0, absl::Now(), &data, &version).ok());
  std::vector<float> expected(100);
  FillInit(InitKind::kUniform, 0.125f, 1234, 0, 0, 100, expected.data());
  EXPECT_EQ(Decode(data), expected);
  ASSERT_TRUE((*shard)->Pull(4, 0, 0, absl::Now(), &data, &version).ok());
  EXPECT_EQ(Decode(data), std::vector<float>(10, 0.0f));
}

TEST_F(ParameterStoreTest, AspPartitionStepIsAppliedOnceWhicheverWorkerSendsIt) {
  auto shard = SetUpJob(TestJob(/*synchronous=*/false, 2));
  const std::string bytes = Encode(Grad(1.0f));
  // Worker a computes partition 1's step 0; after a failover worker b
  // recomputes it: the second is a duplicate, step 1 is new.
  EXPECT_EQ(*shard->Push(Args("a", 1, 1, 0, bytes)), PushOutcome::kApplied);
  EXPECT_EQ(*shard->Push(Args("b", 1, 1, 0, bytes)), PushOutcome::kDuplicate);
  EXPECT_EQ(*shard->Push(Args("b", 1, 2, 1, bytes)), PushOutcome::kApplied);
  // Partition 0 has its own count.
  EXPECT_EQ(*shard->Push(Args("b", 0, 3, 0, bytes)), PushOutcome::kApplied);
}

TEST_F(ParameterStoreTest, SspPullWaitsForTheSlowestPartition) {
  auto shard = SetUpJob(TestJob(/*synchronous=*/false, 2));
  const std::string bytes = Encode(Grad(1.0f));
  std::string data;
  int64_t version = 0, clock = -1;
  // Partition 0 runs two steps ahead; partition 1 has none in.
  ASSERT_TRUE(shard->Push(Args("a", 0, 1, 0, bytes)).ok());
  ASSERT_TRUE(shard->Push(Args("a", 0, 2, 1, bytes)).ok());
  ASSERT_TRUE(shard->Pull(kChunkId, 0, 0, absl::Now(), &data, &version, &clock).ok());
  EXPECT_EQ(clock, 0);
  EXPECT_EQ(version, 2);
  // A pull needing every partition at step 1 waits (here: times out)...
  EXPECT_EQ(shard->Pull(kChunkId, 0, 1, absl::Now() + absl::Milliseconds(20), &data, &version, &clock).code(),
            absl::StatusCode::kDeadlineExceeded);
  // ...until the slow partition catches up.
  ASSERT_TRUE(shard->Push(Args("b", 1, 1, 0, bytes)).ok());
  ASSERT_TRUE(shard->Pull(kChunkId, 0, 1, absl::Now(), &data, &version, &clock).ok());
  EXPECT_EQ(clock, 1);
}

}  // namespace
}  // namespace fulcrum
