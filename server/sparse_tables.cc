#include "server/sparse_tables.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/shard_map.h"
#include "common/status_macros.h"
#include "common/table_spec.h"

namespace fulcrum {

absl::StatusOr<std::unique_ptr<SparseTables>> SparseTables::Create(std::vector<SparseTableSetup> tables,
                                                                   const std::set<int32_t>& held_shards,
                                                                   int32_t num_partitions,
                                                                   std::function<int64_t()> room) {
  // Checked once over every held shard (also when it holds no bucket).
  RETURN_IF_ERROR(SparseShard::Create(tables, {}, num_partitions).status());
  std::unique_ptr<SparseTables> all(new SparseTables(std::move(tables), num_partitions, std::move(room)));
  for (int32_t shard : held_shards) {
    absl::StatusOr<std::unique_ptr<SparseShard>> one = all->NewShard(shard);
    if (absl::IsFailedPrecondition(one.status())) continue;  // no bucket of it
    if (!one.ok()) return one.status();
    MutexLock lock(&all->mu_);
    all->shards_.emplace(shard, *std::move(one));
  }
  return all;
}

SparseTables::SparseTables(std::vector<SparseTableSetup> tables, int32_t num_partitions,
                           std::function<int64_t()> room)
    : tables_(std::move(tables)),
      num_partitions_(num_partitions),
      room_(std::move(room)),
      has_sync_(std::any_of(tables_.begin(), tables_.end(), [](const auto& t) { return t.synchronous; })),
      has_async_(std::any_of(tables_.begin(), tables_.end(), [](const auto& t) { return !t.synchronous; })) {}

int32_t SparseTables::dim(int32_t table) const {
  if (table < 0 || table >= num_tables()) return 0;
  return tables_[static_cast<size_t>(table)].config.dim;
}

bool SparseTables::HasBuckets(int32_t shard) const {
  return std::any_of(tables_.begin(), tables_.end(), [&](const SparseTableSetup& table) {
    return std::count(table.bucket_shards.begin(), table.bucket_shards.end(), shard) > 0;
  });
}

absl::StatusOr<std::unique_ptr<SparseShard>> SparseTables::NewShard(int32_t shard) const {
  if (!HasBuckets(shard)) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", shard, " holds no bucket of the job's tables"));
  }
  return SparseShard::Create(tables_, {shard}, num_partitions_, room_, aside_);
}

absl::Status SparseTables::AddShard(int32_t shard, std::unique_ptr<SparseShard> tables) {
  if (tables == nullptr || tables->bucket_shards() != std::vector<int32_t>{shard}) {
    return absl::FailedPreconditionError(absl::StrCat("the tables added as shard ", shard, " are not that shard's"));
  }
  // Built aside until now: its rows count in bytes() from here on.
  tables->ReleaseAside();
  MutexLock lock(&mu_);
  if (!shards_.emplace(shard, std::move(tables)).second) {
    return absl::FailedPreconditionError(absl::StrCat("this server holds shard ", shard, "'s tables already"));
  }
  return absl::OkStatus();
}

void SparseTables::Installed() {
  for (const std::shared_ptr<SparseShard>& shard : All()) shard->ReleaseAside();
}

std::vector<std::shared_ptr<SparseShard>> SparseTables::DropShards(const std::set<int32_t>& drop) {
  std::vector<std::shared_ptr<SparseShard>> dropped;
  MutexLock lock(&mu_);
  for (int32_t shard : drop) {
    auto it = shards_.find(shard);
    if (it == shards_.end()) continue;
    dropped.push_back(std::move(it->second));
    shards_.erase(it);
  }
  return dropped;
}

std::vector<std::shared_ptr<SparseShard>> SparseTables::DropShardsExcept(const std::set<int32_t>& keep) {
  std::vector<std::shared_ptr<SparseShard>> dropped;
  MutexLock lock(&mu_);
  for (auto it = shards_.begin(); it != shards_.end();) {
    if (keep.count(it->first) > 0) {
      ++it;
      continue;
    }
    dropped.push_back(std::move(it->second));
    it = shards_.erase(it);
  }
  return dropped;
}

bool SparseTables::Holds(int32_t shard) const { return Find(shard) != nullptr; }

std::shared_ptr<SparseShard> SparseTables::Find(int32_t shard) const {
  MutexLock lock(&mu_);
  auto it = shards_.find(shard);
  return it == shards_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<SparseShard>> SparseTables::All(const std::set<int32_t>* shards) const {
  MutexLock lock(&mu_);
  std::vector<std::shared_ptr<SparseShard>> all;
  for (const auto& [shard, tables] : shards_) {
    if (shards == nullptr || shards->count(shard) > 0) all.push_back(tables);
  }
  return all;
}

absl::StatusOr<int32_t> SparseTables::OnlyShard() const {
  MutexLock lock(&mu_);
  if (shards_.size() == 1) return shards_.begin()->first;
  return absl::InvalidArgumentError(absl::StrCat("sparse push names no shard, and this server holds buckets of ",
                                                 shards_.size(), " shards of the job (set SparsePushRequest.shard)"));
}

int32_t SparseTables::ShardOfKey(int32_t table, uint64_t key) const {
  const SparseTableSetup& setup = tables_[static_cast<size_t>(table)];
  return setup.bucket_shards[static_cast<size_t>(BucketOf(key, static_cast<int32_t>(setup.bucket_shards.size())))];
}

absl::Status SparseTables::PullSplit(
    int32_t table, absl::Span<const uint64_t> keys, float* out,
    const std::function<absl::Status(SparseShard&, absl::Span<const uint64_t>, float*)>& pull) const {
  if (table < 0 || table >= num_tables()) {
    return absl::InvalidArgumentError(absl::StrCat("the job has no sparse table ", table));
  }
  if (keys.empty()) return absl::OkStatus();
  const std::vector<std::shared_ptr<SparseShard>> all = All();
  if (all.empty()) {
    return absl::AbortedError(absl::StrCat("key ", keys.front(), " of table ", tables_[static_cast<size_t>(table)].config.name,
                                           ": this server holds no bucket of the job's tables (refresh the shard map)"));
  }
  if (all.size() == 1) return pull(*all.front(), keys, out);  // it checks the keys' buckets itself
  // A worker's request is of one shard: the first key's shard answers it
  // whole (checking every key's bucket as it reads it). Only when it
  // refuses a key (ABORTED) are the keys split by shard.
  if (std::shared_ptr<SparseShard> first = Find(ShardOfKey(table, keys.front())); first != nullptr) {
    absl::Status pulled = pull(*first, keys, out);
    if (!absl::IsAborted(pulled)) return pulled;
  }
  // By shard: the keys and where their rows go.
  const auto dim = static_cast<size_t>(this->dim(table));
  std::map<int32_t, std::vector<uint32_t>> positions;
  for (size_t i = 0; i < keys.size(); ++i) positions[ShardOfKey(table, keys[i])].push_back(static_cast<uint32_t>(i));
  std::vector<uint64_t> part;
  std::vector<float> rows;
  for (const auto& [shard, at] : positions) {
    std::shared_ptr<SparseShard> tables = Find(shard);
    part.clear();
    for (uint32_t i : at) part.push_back(keys[i]);
    rows.resize(part.size() * dim);
    RETURN_IF_ERROR(pull(tables != nullptr ? *tables : *all.front(), part, rows.data()));
    for (size_t j = 0; j < at.size(); ++j) {
      std::memcpy(out + static_cast<size_t>(at[j]) * dim, rows.data() + j * dim, dim * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::Status SparseTables::Pull(int32_t table, absl::Span<const uint64_t> keys, float* out) const {
  return PullSplit(table, keys, out, [table](SparseShard& shard, absl::Span<const uint64_t> k, float* o) {
    return shard.Pull(table, k, o);
  });
}

absl::Status SparseTables::PullAtStep(int32_t table, absl::Span<const uint64_t> keys, int64_t step,
                                      float* out) const {
  return PullSplit(table, keys, out, [table, step](SparseShard& shard, absl::Span<const uint64_t> k, float* o) {
    return shard.PullAtStep(table, k, step, o);
  });
}

absl::Status SparseTables::NotHeld(int32_t shard) const {
  // A shard of no bucket never will be (INVALID_ARGUMENT: retrying cannot
  // help); one of buckets is on its way (a copy not added yet).
  if (!HasBuckets(shard)) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", shard, " holds no bucket of the job's tables"));
  }
  return absl::UnavailableError(
      absl::StrCat("shard ", shard, "'s tables are not held here yet (being copied to this server): retry"));
}

absl::Status SparseTables::Validate(const SparsePushArgs& args) const {
  std::shared_ptr<SparseShard> shard = Find(args.shard);
  if (shard == nullptr) return NotHeld(args.shard);
  return shard->Validate(args);
}

absl::StatusOr<SparsePushOutcome> SparseTables::Push(const SparsePushArgs& args) {
  std::shared_ptr<SparseShard> shard = Find(args.shard);
  if (shard == nullptr) return NotHeld(args.shard);
  return shard->Push(args);
}

std::vector<std::pair<int32_t, ChunkSnapshot>> SparseTables::Capture() const {
  std::vector<std::pair<int32_t, ChunkSnapshot>> captured;
  for (const std::shared_ptr<SparseShard>& shard : All()) {
    for (auto& bucket : shard->Capture()) captured.push_back(std::move(bucket));
  }
  std::sort(captured.begin(), captured.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return captured;
}

absl::Status SparseTables::ArmCapture(int64_t checkpoint_id, int64_t at_step, const IncrementalBase& base,
                                      const std::set<int32_t>* shards) {
  const std::vector<std::shared_ptr<SparseShard>> all = All(shards);
  for (size_t i = 0; i < all.size(); ++i) {
    if (absl::Status armed = all[i]->ArmCapture(checkpoint_id, at_step, base); !armed.ok()) {
      for (size_t j = 0; j < i; ++j) all[j]->Disarm(checkpoint_id);
      return armed;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<int32_t, ChunkSnapshot>>> SparseTables::TakeCapture(
    int64_t checkpoint_id, absl::Time deadline, const std::set<int32_t>* shards) {
  std::vector<std::pair<int32_t, ChunkSnapshot>> captured;
  const std::vector<std::shared_ptr<SparseShard>> all = All(shards);
  for (size_t i = 0; i < all.size(); ++i) {
    auto taken = all[i]->TakeCapture(checkpoint_id, deadline);
    if (!taken.ok()) {
      for (size_t j = i + 1; j < all.size(); ++j) all[j]->Disarm(checkpoint_id);
      return taken.status();
    }
    for (auto& bucket : *taken) captured.push_back(std::move(bucket));
  }
  return captured;
}

void SparseTables::Disarm(int64_t checkpoint_id) {
  for (const std::shared_ptr<SparseShard>& shard : All()) shard->Disarm(checkpoint_id);
}

absl::StatusOr<ChunkSnapshot> SparseTables::CaptureBucket(int32_t chunk_id) const {
  for (const std::shared_ptr<SparseShard>& shard : All()) {
    if (shard->ShardOfBucket(chunk_id) >= 0) return shard->CaptureBucket(chunk_id);
  }
  return absl::NotFoundError(absl::StrCat("chunk ", chunk_id, " is no table bucket held here"));
}

absl::StatusOr<ChunkSnapshot> SparseTables::CaptureShardState(int32_t shard) const {
  std::shared_ptr<SparseShard> tables = Find(shard);
  if (tables == nullptr) return absl::NotFoundError(absl::StrCat("this server holds no bucket of shard ", shard));
  return tables->CaptureShardState(shard);
}

std::vector<int32_t> SparseTables::chunk_ids() const {
  std::vector<int32_t> ids;
  for (const std::shared_ptr<SparseShard>& shard : All()) {
    for (int32_t id : shard->chunk_ids()) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

absl::Status SparseTables::Restore(int32_t chunk_id, const ChunkSnapshot& snapshot,
                                   std::optional<int64_t> repartitioned_at) {
  for (const std::shared_ptr<SparseShard>& shard : All()) {
    if (shard->ShardOfBucket(chunk_id) >= 0) return shard->Restore(chunk_id, snapshot, repartitioned_at);
  }
  return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk_id, " is no table bucket held here"));
}

absl::Status SparseTables::ApplyRestoredChanges(int32_t chunk_id, const std::string& changes) {
  for (const std::shared_ptr<SparseShard>& shard : All()) {
    if (shard->ShardOfBucket(chunk_id) >= 0) return shard->ApplyRestoredChanges(chunk_id, changes);
  }
  return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk_id, " is no table bucket held here"));
}

void SparseTables::MarkRestored(int32_t chunk_id, int64_t checkpoint_id) {
  for (const std::shared_ptr<SparseShard>& shard : All()) {
    if (shard->ShardOfBucket(chunk_id) >= 0) shard->MarkRestored(chunk_id, checkpoint_id);
  }
}

void SparseTables::Freeze(const std::string& reason) {
  for (const std::shared_ptr<SparseShard>& shard : All()) shard->Freeze(reason);
}

std::vector<SparseTableStats> SparseTables::Stats() const {
  std::vector<SparseTableStats> stats(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t) stats[t].name = tables_[t].config.name;
  for (const std::shared_ptr<SparseShard>& shard : All()) {
    const std::vector<SparseTableStats> one = shard->Stats();
    for (size_t t = 0; t < one.size() && t < stats.size(); ++t) {
      stats[t].rows += one[t].rows;
      stats[t].bytes += one[t].bytes;
      stats[t].admissions += one[t].admissions;
      stats[t].expiries += one[t].expiries;
    }
  }
  return stats;
}

int64_t SparseTables::bytes() const {
  int64_t total = 0;
  for (const std::shared_ptr<SparseShard>& shard : All()) total += shard->bytes();
  return total;
}

}  // namespace fulcrum
