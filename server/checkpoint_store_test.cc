#include "server/checkpoint_store.h"

#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/kv_store.h"
#include "common/test_util.h"
#include "gtest/gtest.h"
#include "common/sync.h"

namespace fulcrum {
namespace {

constexpr char kJob[] = "job-1";

ChunkSnapshot TestSnapshot(float base) {
  ChunkSnapshot s;
  s.values = {base, -0.0f, std::numeric_limits<float>::infinity(), 1e-30f, base + 1};
  s.optimizer_state = {{0.5f, 0.25f, 0.125f, 1, 2}, {base, base, base, base, base}};
  s.version = 17;
  s.pending = {{}, {1, 2, 3, 4, 5}, {}};
  s.watermarks = {{"worker-a", 41}, {"worker-b", -1}, {"", 0}};
  s.partition_steps = {16, 17, std::numeric_limits<int64_t>::max()};
  s.examples_seen = 1 << 20;
  s.examples_digest = 0xFEDCBA9876543210ULL;
  return s;
}

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  if (!values.empty()) std::memcpy(bits.data(), values.data(), values.size() * 4);
  return bits;
}

std::vector<std::vector<uint32_t>> Bits(const std::vector<std::vector<float>>& arrays) {
  std::vector<std::vector<uint32_t>> bits;
  for (const auto& array : arrays) bits.push_back(Bits(array));
  return bits;
}

// Field by field, floats bit for bit.
void ExpectSameSnapshot(const ChunkSnapshot& expected, const ChunkSnapshot& actual) {
  EXPECT_EQ(Bits(expected.values), Bits(actual.values));
  EXPECT_EQ(Bits(expected.optimizer_state), Bits(actual.optimizer_state));
  EXPECT_EQ(expected.version, actual.version);
  EXPECT_EQ(Bits(expected.pending), Bits(actual.pending));
  EXPECT_EQ(expected.watermarks, actual.watermarks);
  EXPECT_EQ(expected.partition_steps, actual.partition_steps);
  EXPECT_EQ(expected.examples_seen, actual.examples_seen);
  EXPECT_EQ(expected.examples_digest, actual.examples_digest);
}

std::vector<std::pair<int32_t, ChunkSnapshot>> TestChunks(std::vector<int32_t> ids, float base = 1) {
  std::vector<std::pair<int32_t, ChunkSnapshot>> chunks;
  for (int32_t id : ids) chunks.emplace_back(id, TestSnapshot(base + id));
  return chunks;
}

// Forwards to another store; its writes can be made to fail (a full disk) or
// to wait for a release.
class FaultyKvStore final : public KvStore {
 public:
  explicit FaultyKvStore(KvStore* base) : base_(base) {}

  absl::Status Write(std::vector<std::pair<std::string, std::string>> puts,
                     const std::vector<std::string>& deletes) override {
    if (hold_ != nullptr) hold_->WaitForNotification();
    {
      MutexLock lock(&mu_);
      if (fail_writes_) return absl::UnavailableError("RocksDB write: IO error: No space left on device");
    }
    return base_->Write(std::move(puts), deletes);
  }

  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(const std::string& prefix) override {
    return base_->Scan(prefix);
  }

  void set_fail_writes(bool fail) {
    MutexLock lock(&mu_);
    fail_writes_ = fail;
  }
  // Writes wait until `hold` is notified. Set before the store is shared.
  void set_hold(Notification* hold) { hold_ = hold; }

 private:
  KvStore* const base_;
  Notification* hold_ = nullptr;
  Mutex mu_;  // guards fail_writes_
  bool fail_writes_ ABSL_GUARDED_BY(mu_) = false;
};

// A fresh temporary folder, removed with its contents.
class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "/checkpoint_store_test_XXXXXX";
    path_ = mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---------------------------------------------------------------- encoding

TEST(CheckpointEncodingTest, RoundTripsEveryField) {
  ChunkSnapshot snapshot = TestSnapshot(3);
  absl::StatusOr<ChunkSnapshot> decoded = DecodeChunkSnapshot(EncodeChunkSnapshot(snapshot));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSameSnapshot(snapshot, *decoded);
}

TEST(CheckpointEncodingTest, RoundTripsAnEmptySnapshot) {
  absl::StatusOr<ChunkSnapshot> decoded = DecodeChunkSnapshot(EncodeChunkSnapshot(ChunkSnapshot()));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSameSnapshot(ChunkSnapshot(), *decoded);
}

// A table bucket's state rides after the dense fields; a dense chunk's
// payload is what it was before tables existed.
TEST(CheckpointEncodingTest, RoundTripsATableBucketsStateAndLeavesDenseChunksAsTheyWere) {
  ChunkSnapshot bucket;
  bucket.version = 12;
  bucket.partition_steps = {3, 4};
  bucket.table_state = std::string("\x08\0\0\0state bytes\0\xff", 17);
  absl::StatusOr<ChunkSnapshot> decoded = DecodeChunkSnapshot(EncodeChunkSnapshot(bucket));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->table_state, bucket.table_state);
  EXPECT_EQ(decoded->partition_steps, bucket.partition_steps);
  ChunkSnapshot dense = bucket;
  dense.table_state.clear();
  EXPECT_EQ(EncodeChunkSnapshot(bucket).size(), EncodeChunkSnapshot(dense).size() + 8 + 17);
  EXPECT_TRUE(DecodeChunkSnapshot(EncodeChunkSnapshot(dense))->table_state.empty());
}

// Partition steps are written as distances from the lowest, in as few bytes
// as the widest needs: a BSP capture's equal steps take 17 bytes whatever
// the partitions, and records written with an i64 a step still read.
TEST(CheckpointEncodingTest, PartitionStepsTakeTheBytesTheirSpreadNeedsAndOldRecordsStillRead) {
  const int64_t big = int64_t{1} << 40;
  const std::vector<std::pair<std::vector<int64_t>, size_t>> cases = {
      {{}, 8},
      {std::vector<int64_t>(1024, 77), 17},
      {{5, 5, 260, 9}, 17 + 4 * 1},
      {{big, big + 65535, big + 3}, 17 + 3 * 2},
      {{0, 65536, 1}, 17 + 3 * 4},
      {{-3, big, INT64_MAX, INT64_MIN}, 17 + 4 * 8},
  };
  for (const auto& [steps, bytes] : cases) {
    ChunkSnapshot snapshot = TestSnapshot(2);
    snapshot.partition_steps = steps;
    const std::string payload = EncodeChunkSnapshot(snapshot);
    ChunkSnapshot none = TestSnapshot(2);
    none.partition_steps.clear();
    EXPECT_EQ(payload.size(), EncodeChunkSnapshot(none).size() - 8 + bytes) << steps.size() << " steps";
    absl::StatusOr<ChunkSnapshot> decoded = DecodeChunkSnapshot(payload);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ExpectSameSnapshot(snapshot, *decoded);
  }

  // As written before: u64 count, then an i64 a step.
  ChunkSnapshot old = TestSnapshot(2);
  old.partition_steps.clear();
  std::string payload = EncodeChunkSnapshot(old);
  payload.resize(payload.size() - 8);
  const std::vector<int64_t> steps = {9, -1, int64_t{1} << 50};
  auto put = [&payload](uint64_t v) {
    for (int i = 0; i < 8; ++i) payload.push_back(static_cast<char>(v >> (8 * i)));
  };
  put(steps.size());
  for (int64_t step : steps) put(static_cast<uint64_t>(step));
  absl::StatusOr<ChunkSnapshot> decoded = DecodeChunkSnapshot(payload);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->partition_steps, steps);
}

TEST(CheckpointEncodingTest, BadCompactPartitionStepsAreDataLossWithoutAllocating) {
  ChunkSnapshot snapshot;
  snapshot.partition_steps = {4, 6};  // width 1
  const std::string good = EncodeChunkSnapshot(snapshot);
  const size_t at = good.size() - (8 + 8 + 1 + 2);  // the steps' count
  auto with = [&](size_t offset, const std::string& bytes) {
    std::string payload = good;
    payload.replace(offset, bytes.size(), bytes);
    return DecodeChunkSnapshot(payload).status();
  };
  const std::string flag_only("\0\0\0\0\0\0\0\x80", 8);           // count 0
  const std::string huge("\xff\xff\xff\xff\xff\xff\xff\xff", 8);  // count 2^63 - 1
  const std::string too_many("\x01\x04\0\0\0\0\0\x80", 8);        // 1025 partitions
  for (const std::string& count : {flag_only, huge, too_many}) {
    absl::Status status = with(at, count);
    EXPECT_TRUE(absl::IsDataLoss(status)) << status;
    EXPECT_TRUE(Contains(status.message(), "partition_steps claims")) << status;
  }
  absl::Status width = with(at + 16, std::string("\x03", 1));
  EXPECT_TRUE(absl::IsDataLoss(width)) << width;
  EXPECT_TRUE(Contains(width.message(), "width 3")) << width;
  absl::Status wider = with(at + 16, std::string("\x08", 1));  // 16 bytes of distances where 2 follow
  EXPECT_TRUE(absl::IsDataLoss(wider)) << wider;
}

TEST(CheckpointEncodingTest, TruncatedOrTrailingBytesAreDataLoss) {
  const std::string payload = EncodeChunkSnapshot(TestSnapshot(3));
  for (size_t size = 0; size < payload.size(); ++size) {
    absl::StatusOr<ChunkSnapshot> decoded = DecodeChunkSnapshot(payload.substr(0, size));
    EXPECT_TRUE(absl::IsDataLoss(decoded.status())) << "prefix of " << size << " bytes: " << decoded.status();
  }
  absl::StatusOr<ChunkSnapshot> trailing = DecodeChunkSnapshot(payload + "x");
  EXPECT_TRUE(absl::IsDataLoss(trailing.status())) << trailing.status();
}

TEST(CheckpointEncodingTest, HugeCountIsDataLossWithoutAllocating) {
  std::string payload = EncodeChunkSnapshot(ChunkSnapshot());
  // The values count sits after version, examples_seen and examples_digest.
  std::memset(payload.data() + 24, 0xFF, 8);
  absl::StatusOr<ChunkSnapshot> decoded = DecodeChunkSnapshot(payload);
  EXPECT_TRUE(absl::IsDataLoss(decoded.status())) << decoded.status();
  EXPECT_TRUE(Contains(decoded.status().message(), "values"));
}

TEST(CheckpointEncodingTest, GarbageIsDataLoss) {
  std::mt19937 rng(42);
  for (int i = 0; i < 2000; ++i) {
    std::string garbage(rng() % 200, '\0');
    for (char& c : garbage) c = static_cast<char>(rng());
    absl::StatusOr<ChunkSnapshot> decoded = DecodeChunkSnapshot(garbage);
    EXPECT_TRUE(absl::IsDataLoss(decoded.status())) << decoded.status();
    absl::StatusOr<ChunkSnapshot> record = DecodeChunkRecord(garbage);
    EXPECT_TRUE(absl::IsDataLoss(record.status())) << record.status();
  }
}

TEST(CheckpointEncodingTest, RecordVerifiesHeaderAndChecksum) {
  uint32_t checksum = 0;
  const std::string record = EncodeChunkRecord(TestSnapshot(3), &checksum);
  absl::StatusOr<uint32_t> verified = VerifyChunkRecord(record);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(*verified, checksum);
  absl::StatusOr<ChunkSnapshot> decoded = DecodeChunkRecord(record);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSameSnapshot(TestSnapshot(3), *decoded);

  struct Damage {
    size_t offset;
    const char* message;
  };
  // magic, format version, stored checksum, payload size, payload
  for (Damage damage : {Damage{0, "magic"}, Damage{4, "format version"}, Damage{8, "checksum"},
                        Damage{12, "payload bytes"}, Damage{record.size() - 1, "checksum"}}) {
    std::string bad = record;
    bad[damage.offset] ^= 0x01;
    absl::StatusOr<uint32_t> status = VerifyChunkRecord(bad);
    EXPECT_TRUE(absl::IsDataLoss(status.status())) << damage.offset << ": " << status.status();
    EXPECT_TRUE(Contains(status.status().message(), damage.message));
  }
  EXPECT_TRUE(absl::IsDataLoss(VerifyChunkRecord(record.substr(0, 10)).status()));
  EXPECT_TRUE(absl::IsDataLoss(VerifyChunkRecord(record.substr(0, record.size() - 1)).status()));
}

// ---------------------------------------------------------------- store, every KvStore

enum class StoreKind { kMemory, kRocksDb };

class CheckpointStoreTest : public ::testing::TestWithParam<StoreKind> {
 protected:
  void SetUp() override {
    if (GetParam() == StoreKind::kMemory) {
      kv_ = NewMemoryStore();
    } else {
      ASSERT_FALSE(dir_.path().empty());
      absl::StatusOr<std::unique_ptr<KvStore>> kv = OpenRocksDbStore(dir_.path());
      ASSERT_TRUE(kv.ok()) << kv.status();
      kv_ = std::move(*kv);
    }
    faulty_ = std::make_unique<FaultyKvStore>(kv_.get());
    store_ = std::make_unique<CheckpointStore>(faulty_.get());
  }

  std::vector<CheckpointStore::ChunkRecordInfo> MustWrite(const std::string& job_id, int64_t checkpoint_id,
                                                          const std::vector<int32_t>& chunk_ids,
                                                          float base = 1) {
    absl::StatusOr<std::vector<CheckpointStore::ChunkRecordInfo>> infos =
        store_->Write(job_id, checkpoint_id, TestChunks(chunk_ids, base));
    EXPECT_TRUE(infos.ok()) << infos.status();
    return infos.ok() ? *infos : std::vector<CheckpointStore::ChunkRecordInfo>();
  }

  std::vector<int64_t> MustList(const std::string& job_id) {
    absl::StatusOr<std::vector<int64_t>> ids = store_->List(job_id);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : std::vector<int64_t>();
  }

  TempDir dir_;
  std::unique_ptr<KvStore> kv_;
  std::unique_ptr<FaultyKvStore> faulty_;
  std::unique_ptr<CheckpointStore> store_;
};

TEST_P(CheckpointStoreTest, WriteThenReadRoundTrips) {
  std::vector<CheckpointStore::ChunkRecordInfo> infos = MustWrite(kJob, 5, {3, 1, 2});
  ASSERT_EQ(infos.size(), 3u);
  for (const auto& info : infos) {
    absl::StatusOr<ChunkSnapshot> snapshot = store_->Read(kJob, 5, info.chunk_id, info.checksum);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    ExpectSameSnapshot(TestSnapshot(1 + info.chunk_id), *snapshot);

    absl::StatusOr<std::string> raw = store_->ReadRaw(kJob, 5, info.chunk_id);
    ASSERT_TRUE(raw.ok()) << raw.status();
    EXPECT_EQ(static_cast<int64_t>(raw->size()), info.bytes);
    absl::StatusOr<uint32_t> checksum = VerifyChunkRecord(*raw);
    ASSERT_TRUE(checksum.ok()) << checksum.status();
    EXPECT_EQ(*checksum, info.checksum);
  }
  EXPECT_EQ(infos[0].chunk_id, 3);  // in the order given
  absl::StatusOr<std::vector<int32_t>> chunk_ids = store_->Chunks(kJob, 5);
  ASSERT_TRUE(chunk_ids.ok()) << chunk_ids.status();
  EXPECT_EQ(*chunk_ids, (std::vector<int32_t>{1, 2, 3}));
}

TEST_P(CheckpointStoreTest, UsesTheDocumentedKeyLayout) {
  MustWrite(kJob, 5, {3});
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> entries = kv_->Scan("ckpt/");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].first, "ckpt/job-1/00000000000000000005/0000000003");
}

TEST_P(CheckpointStoreTest, ChecksumOtherThanTheManifestsIsDataLoss) {
  std::vector<CheckpointStore::ChunkRecordInfo> infos = MustWrite(kJob, 5, {3});
  ASSERT_EQ(infos.size(), 1u);
  absl::StatusOr<ChunkSnapshot> snapshot = store_->Read(kJob, 5, 3, infos[0].checksum + 1);
  EXPECT_TRUE(absl::IsDataLoss(snapshot.status())) << snapshot.status();
  EXPECT_TRUE(Contains(snapshot.status().message(), "chunk 3 of checkpoint 5 of job \"job-1\""));
}

TEST_P(CheckpointStoreTest, FlippedByteIsDataLossNamingJobCheckpointAndChunk) {
  MustWrite(kJob, 5, {3, 4});
  absl::StatusOr<std::string> raw = store_->ReadRaw(kJob, 5, 3);
  ASSERT_TRUE(raw.ok()) << raw.status();
  std::string damaged = *raw;
  damaged[damaged.size() / 2] ^= 0x40;
  ASSERT_TRUE(kv_->Put("ckpt/job-1/00000000000000000005/0000000003", damaged).ok());

  absl::StatusOr<ChunkSnapshot> snapshot = store_->Read(kJob, 5, 3);
  EXPECT_TRUE(absl::IsDataLoss(snapshot.status())) << snapshot.status();
  EXPECT_TRUE(Contains(snapshot.status().message(), "chunk 3"));
  EXPECT_TRUE(Contains(snapshot.status().message(), "checkpoint 5"));
  EXPECT_TRUE(Contains(snapshot.status().message(), "job-1"));
  EXPECT_TRUE(absl::IsDataLoss(store_->ReadRaw(kJob, 5, 3).status()));
  EXPECT_TRUE(store_->Read(kJob, 5, 4).ok());  // the other chunk is intact
}

TEST_P(CheckpointStoreTest, MissingChunkOrCheckpointIsNotFound) {
  MustWrite(kJob, 5, {3});
  absl::StatusOr<ChunkSnapshot> chunk = store_->Read(kJob, 5, 4);
  EXPECT_TRUE(absl::IsNotFound(chunk.status())) << chunk.status();
  EXPECT_TRUE(Contains(chunk.status().message(), "chunk 4 of checkpoint 5 of job \"job-1\""));
  absl::StatusOr<ChunkSnapshot> checkpoint = store_->Read(kJob, 6, 3);
  EXPECT_TRUE(absl::IsNotFound(checkpoint.status())) << checkpoint.status();
  EXPECT_TRUE(absl::IsNotFound(store_->ReadRaw("job-2", 5, 3).status()));
  absl::StatusOr<std::vector<int32_t>> chunks = store_->Chunks(kJob, 6);
  EXPECT_TRUE(absl::IsNotFound(chunks.status())) << chunks.status();
  EXPECT_TRUE(Contains(chunks.status().message(), "checkpoint 6 of job \"job-1\""));
}

TEST_P(CheckpointStoreTest, ListIsAscendingAndPerJob) {
  MustWrite(kJob, 10, {0});
  MustWrite(kJob, 2, {0});
  MustWrite(kJob, 100, {0});
  MustWrite("job-1-b", 7, {0});  // a job id that extends another
  EXPECT_EQ(MustList(kJob), (std::vector<int64_t>{2, 10, 100}));
  EXPECT_EQ(MustList("job-1-b"), (std::vector<int64_t>{7}));
  EXPECT_TRUE(MustList("job-3").empty());
}

TEST_P(CheckpointStoreTest, CheckpointWithoutChunksIsListed) {
  MustWrite(kJob, 4, {});
  EXPECT_EQ(MustList(kJob), (std::vector<int64_t>{4}));
  absl::StatusOr<std::vector<int32_t>> chunks = store_->Chunks(kJob, 4);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  EXPECT_TRUE(chunks->empty());
}

TEST_P(CheckpointStoreTest, DeleteRemovesOnlyThatCheckpoint) {
  MustWrite(kJob, 1, {0, 1});
  MustWrite(kJob, 2, {0, 1});
  MustWrite("job-2", 1, {0});
  ASSERT_TRUE(store_->Delete(kJob, 1).ok());

  EXPECT_EQ(MustList(kJob), (std::vector<int64_t>{2}));
  EXPECT_TRUE(absl::IsNotFound(store_->Read(kJob, 1, 0).status()));
  EXPECT_TRUE(absl::IsNotFound(store_->Read(kJob, 1, 1).status()));
  EXPECT_TRUE(store_->Read(kJob, 2, 1).ok());
  EXPECT_TRUE(store_->Read("job-2", 1, 0).ok());
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> left = kv_->Scan("ckpt/job-1/");
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->size(), 2u);
  EXPECT_TRUE(store_->Delete(kJob, 1).ok());  // already gone
}

TEST_P(CheckpointStoreTest, DeleteJobRemovesOnlyThatJob) {
  MustWrite(kJob, 1, {0, 1});
  MustWrite(kJob, 2, {0});
  MustWrite("job-1-b", 1, {0});
  ASSERT_TRUE(store_->DeleteJob(kJob).ok());
  EXPECT_TRUE(MustList(kJob).empty());
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> left = kv_->Scan("ckpt/job-1/");
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty());
  EXPECT_TRUE(store_->Read("job-1-b", 1, 0).ok());
}

TEST_P(CheckpointStoreTest, RewriteReplacesTheWholeCheckpoint) {
  MustWrite(kJob, 5, {1, 2, 3});
  MustWrite(kJob, 5, {1, 4}, /*base=*/10);
  absl::StatusOr<std::vector<int32_t>> chunks = store_->Chunks(kJob, 5);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  EXPECT_EQ(*chunks, (std::vector<int32_t>{1, 4}));
  EXPECT_TRUE(absl::IsNotFound(store_->Read(kJob, 5, 3).status()));
  absl::StatusOr<ChunkSnapshot> snapshot = store_->Read(kJob, 5, 1);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ExpectSameSnapshot(TestSnapshot(11), *snapshot);
}

TEST_P(CheckpointStoreTest, RejectsBadIds) {
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Write("job/1", 1, TestChunks({0})).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Write("", 1, TestChunks({0})).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Write(kJob, -1, TestChunks({0})).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Write(kJob, 1, TestChunks({-2})).status()));
  absl::StatusOr<std::vector<CheckpointStore::ChunkRecordInfo>> twice =
      store_->Write(kJob, 1, TestChunks({0, 0}));
  EXPECT_TRUE(absl::IsInvalidArgument(twice.status())) << twice.status();
  EXPECT_TRUE(Contains(twice.status().message(), "chunk 0 is given twice"));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Read("a/b", 1, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->List("a/b").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->DeleteJob("a/b")));
  EXPECT_TRUE(MustList(kJob).empty());
}

TEST_P(CheckpointStoreTest, FailedWriteKeepsThePreviousCheckpoint) {
  MustWrite(kJob, 1, {0, 1});
  faulty_->set_fail_writes(true);
  absl::StatusOr<std::vector<CheckpointStore::ChunkRecordInfo>> failed =
      store_->Write(kJob, 2, TestChunks({0, 1}));
  EXPECT_TRUE(absl::IsUnavailable(failed.status())) << failed.status();
  EXPECT_TRUE(Contains(failed.status().message(), "checkpoint 2 of job \"job-1\""));
  EXPECT_TRUE(Contains(failed.status().message(), "No space left on device"));
  // A failed rewrite of the same id leaves it as it was too.
  EXPECT_TRUE(absl::IsUnavailable(store_->Write(kJob, 1, TestChunks({0}, /*base=*/10)).status()));
  faulty_->set_fail_writes(false);

  EXPECT_EQ(MustList(kJob), (std::vector<int64_t>{1}));
  for (int32_t chunk_id : {0, 1}) {
    absl::StatusOr<ChunkSnapshot> snapshot = store_->Read(kJob, 1, chunk_id);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    ExpectSameSnapshot(TestSnapshot(1 + chunk_id), *snapshot);
  }
}

INSTANTIATE_TEST_SUITE_P(CheckpointEveryKvStore, CheckpointStoreTest,
                         ::testing::Values(StoreKind::kMemory, StoreKind::kRocksDb),
                         [](const ::testing::TestParamInfo<StoreKind>& info) {
                           return info.param == StoreKind::kMemory ? "Memory" : "RocksDb";
                         });

// A checkpoint's batch is flushed to its file before the write returns:
// RocksDB's memtable does not keep a copy of it after the write (while the
// server no longer counts it against its budget). Small writes stay in the
// memtable.
TEST(CheckpointStoreRocksDbTest, AWriteLeavesNoCopyInTheMemtable) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  absl::StatusOr<std::unique_ptr<KvStore>> kv = OpenRocksDbStore(dir.path());
  ASSERT_TRUE(kv.ok()) << kv.status();
  ASSERT_TRUE((*kv)->Put("small", "x").ok());
  const int64_t small = (*kv)->BufferedBytes();
  EXPECT_GT(small, 0) << "a small write stays in the memtable";
  const std::string value(size_t{8} << 20, 'v');  // past the 1 MiB memtable
  ASSERT_TRUE((*kv)->Put("large", value).ok());
  EXPECT_LT((*kv)->BufferedBytes(), int64_t{1} << 20) << "an 8 MiB write left its copy in memory";
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> read = (*kv)->Scan("large");
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 1u);
  EXPECT_EQ(read->front().second, value);
}

TEST(CheckpointStoreRocksDbTest, SurvivesReopening) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  std::vector<CheckpointStore::ChunkRecordInfo> infos;
  {
    absl::StatusOr<std::unique_ptr<KvStore>> kv = OpenRocksDbStore(dir.path());
    ASSERT_TRUE(kv.ok()) << kv.status();
    CheckpointStore store(kv->get());
    absl::StatusOr<std::vector<CheckpointStore::ChunkRecordInfo>> written =
        store.Write(kJob, 9, TestChunks({0, 5}));
    ASSERT_TRUE(written.ok()) << written.status();
    infos = *written;
  }
  absl::StatusOr<std::unique_ptr<KvStore>> kv = OpenRocksDbStore(dir.path());
  ASSERT_TRUE(kv.ok()) << kv.status();
  CheckpointStore store(kv->get());
  absl::StatusOr<std::vector<int64_t>> ids = store.List(kJob);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int64_t>{9}));
  for (const auto& info : infos) {
    absl::StatusOr<ChunkSnapshot> snapshot = store.Read(kJob, 9, info.chunk_id, info.checksum);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    ExpectSameSnapshot(TestSnapshot(1 + info.chunk_id), *snapshot);
  }
}

// ---------------------------------------------------------------- writer

// What the writer's `done` callbacks saw.
class DoneLog {
 public:
  CheckpointWriter::Done For(int64_t checkpoint_id) {
    return [this, checkpoint_id](absl::StatusOr<std::vector<CheckpointStore::ChunkRecordInfo>> result) {
      MutexLock lock(&mu_);
      ids_.push_back(checkpoint_id);
      statuses_.push_back(result.status());
      on_caller_thread_ = on_caller_thread_ || std::this_thread::get_id() == caller_;
    };
  }
  std::vector<int64_t> ids() {
    MutexLock lock(&mu_);
    return ids_;
  }
  std::vector<absl::Status> statuses() {
    MutexLock lock(&mu_);
    return statuses_;
  }
  bool on_caller_thread() {
    MutexLock lock(&mu_);
    return on_caller_thread_;
  }

 private:
  const std::thread::id caller_ = std::this_thread::get_id();
  Mutex mu_;  // guards the members below
  std::vector<int64_t> ids_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> statuses_ ABSL_GUARDED_BY(mu_);
  bool on_caller_thread_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(CheckpointWriterTest, RunsQueuedWritesInOrderOnItsThread) {
  std::unique_ptr<KvStore> kv = NewMemoryStore();
  FaultyKvStore held(kv.get());
  Notification release;
  held.set_hold(&release);
  CheckpointStore store(&held);
  DoneLog log;
  CheckpointWriter writer(&store);
  for (int64_t id : {3, 1, 2}) writer.Enqueue(kJob, id, TestChunks({0, 1}), log.For(id));
  EXPECT_TRUE(log.ids().empty());  // Enqueue returned while the first write is held
  release.Notify();
  writer.Stop();

  EXPECT_EQ(log.ids(), (std::vector<int64_t>{3, 1, 2}));
  for (const absl::Status& status : log.statuses()) EXPECT_TRUE(status.ok()) << status;
  EXPECT_FALSE(log.on_caller_thread());
  absl::StatusOr<std::vector<int64_t>> ids = store.List(kJob);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int64_t>{1, 2, 3}));
}

TEST(CheckpointWriterTest, StopDrainsTheQueue) {
  std::unique_ptr<KvStore> kv = NewMemoryStore();
  CheckpointStore store(kv.get());
  DoneLog log;
  {
    CheckpointWriter writer(&store);
    for (int64_t id = 0; id < 20; ++id) writer.Enqueue(kJob, id, TestChunks({0}), log.For(id));
  }  // the destructor stops the writer
  EXPECT_EQ(log.ids().size(), 20u);
  absl::StatusOr<std::vector<int64_t>> ids = store.List(kJob);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->size(), 20u);
}

TEST(CheckpointWriterTest, PassesWriteErrorsToDone) {
  std::unique_ptr<KvStore> kv = NewMemoryStore();
  FaultyKvStore full(kv.get());
  full.set_fail_writes(true);
  CheckpointStore store(&full);
  DoneLog log;
  CheckpointWriter writer(&store);
  writer.Enqueue(kJob, 1, TestChunks({0}), log.For(1));
  writer.Stop();
  ASSERT_EQ(log.statuses().size(), 1u);
  EXPECT_TRUE(absl::IsUnavailable(log.statuses()[0])) << log.statuses()[0];
}

TEST(CheckpointWriterTest, EnqueueAfterStopFailsAtOnce) {
  std::unique_ptr<KvStore> kv = NewMemoryStore();
  CheckpointStore store(kv.get());
  DoneLog log;
  CheckpointWriter writer(&store);
  writer.Stop();
  writer.Stop();  // idempotent
  writer.Enqueue(kJob, 1, TestChunks({0}), log.For(1));
  ASSERT_EQ(log.statuses().size(), 1u);
  EXPECT_TRUE(absl::IsFailedPrecondition(log.statuses()[0])) << log.statuses()[0];
  absl::StatusOr<std::vector<int64_t>> ids = store.List(kJob);
  ASSERT_TRUE(ids.ok());
  EXPECT_TRUE(ids->empty());
}

}  // namespace
}  // namespace fulcrum
