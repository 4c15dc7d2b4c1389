#include "server/sparse_shard.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/data_partition.h"
#include "common/shard_map.h"
#include "common/status_macros.h"
#include "common/table_spec.h"
#include "common/tensor_codec.h"
#include "fulcrum/v1/parameter.pb.h"

namespace fulcrum {
namespace {

// The keys of one bucket in one request, and where their rows are: spans
// into the request when its keys come grouped by bucket (workers send them
// so), else copies.
struct BucketPart {
  int32_t bucket = 0;
  absl::Span<const uint64_t> keys;
  const float* grads = nullptr;  // pushes
  std::vector<uint32_t> positions;  // pulls from a copy: where each key's row goes
  std::vector<uint64_t> key_copy;
  std::vector<float> grad_copy;
};

// The order that sorts `keys` by bucket, then ascending (each bucket's
// keys one run), as a step's keys and its undo are kept; `bucket_of` gets
// each key's bucket.
std::vector<uint32_t> BucketOrder(absl::Span<const uint64_t> keys, int32_t buckets,
                                  std::vector<int32_t>* bucket_of) {
  bucket_of->resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) (*bucket_of)[i] = BucketOf(keys[i], buckets);
  std::vector<uint32_t> order(keys.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&keys, &of = *bucket_of](uint32_t a, uint32_t b) {
    return of[a] != of[b] ? of[a] < of[b] : keys[a] < keys[b];
  });
  return order;
}

// Splits `keys` (with `grads` rows of `dim`, when given) by bucket. Runs of
// one bucket become parts without copying when no bucket has two runs.
std::vector<BucketPart> SplitByBucket(absl::Span<const uint64_t> keys, const float* grads, int32_t dim,
                                      int32_t buckets) {
  std::vector<int32_t> bucket_of(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) bucket_of[i] = BucketOf(keys[i], buckets);
  std::vector<BucketPart> parts;
  std::vector<bool> seen(static_cast<size_t>(buckets), false);
  bool grouped = true;
  for (size_t i = 0; i < keys.size();) {
    size_t end = i + 1;
    while (end < keys.size() && bucket_of[end] == bucket_of[i]) ++end;
    if (seen[static_cast<size_t>(bucket_of[i])]) grouped = false;
    seen[static_cast<size_t>(bucket_of[i])] = true;
    BucketPart part;
    part.bucket = bucket_of[i];
    part.keys = keys.subspan(i, end - i);
    if (grads != nullptr) part.grads = grads + i * static_cast<size_t>(dim);
    part.positions.resize(end - i);
    std::iota(part.positions.begin(), part.positions.end(), static_cast<uint32_t>(i));
    parts.push_back(std::move(part));
    i = end;
  }
  if (grouped) return parts;
  // Regroup: one part per bucket, keys in their order within it.
  std::vector<BucketPart> regrouped(static_cast<size_t>(buckets));
  for (size_t i = 0; i < keys.size(); ++i) {
    BucketPart& part = regrouped[static_cast<size_t>(bucket_of[i])];
    part.positions.push_back(static_cast<uint32_t>(i));
    part.key_copy.push_back(keys[i]);
    if (grads != nullptr) {
      const float* row = grads + i * static_cast<size_t>(dim);
      part.grad_copy.insert(part.grad_copy.end(), row, row + dim);
    }
  }
  parts.clear();
  for (int32_t b = 0; b < buckets; ++b) {
    BucketPart& part = regrouped[static_cast<size_t>(b)];
    if (part.key_copy.empty()) continue;
    part.bucket = b;
    part.keys = part.key_copy;
    if (grads != nullptr) part.grads = part.grad_copy.data();
    parts.push_back(std::move(part));
  }
  return parts;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SparseShard>> SparseShard::Create(std::vector<SparseTableSetup> tables,
                                                                 const std::set<int32_t>& held_shards,
                                                                 int32_t num_partitions,
                                                                 std::function<int64_t()> room,
                                                                 std::shared_ptr<std::atomic<int64_t>> aside) {
  if (num_partitions < 1) return absl::InvalidArgumentError("sparse tables need at least one data partition");
  if (tables.size() > static_cast<size_t>(kMaxTables)) {
    return absl::InvalidArgumentError(absl::StrCat("a job has at most ", kMaxTables, " sparse tables (got ",
                                                   tables.size(), ")"));
  }
  std::vector<Table> built;
  for (size_t t = 0; t < tables.size(); ++t) {
    SparseTableSetup& setup = tables[t];
    setup.config.memory_budget = 0;
    setup.config.table_index = static_cast<uint32_t>(t);
    if (absl::Status valid = ValidateSparseTableConfig(setup.config); !valid.ok()) return valid;
    if (setup.bucket_shards.empty() || setup.bucket_shards.size() > static_cast<size_t>(kMaxTableBuckets)) {
      return absl::InvalidArgumentError(absl::StrCat("table ", setup.config.name, " has ", setup.bucket_shards.size(),
                                                     " buckets; it must have 1 to ", kMaxTableBuckets));
    }
    Table table;
    for (int32_t shard : setup.bucket_shards) {
      if (held_shards.count(shard) == 0) {
        table.buckets.push_back(nullptr);
        continue;
      }
      absl::StatusOr<std::unique_ptr<SparseTable>> bucket = SparseTable::Create(setup.config);
      if (!bucket.ok()) return bucket.status();
      table.buckets.push_back(*std::move(bucket));
    }
    table.setup = std::move(setup);
    built.push_back(std::move(table));
  }
  return std::unique_ptr<SparseShard>(new SparseShard(
      std::move(built), held_shards, num_partitions, std::move(room),
      aside != nullptr ? std::move(aside) : std::make_shared<std::atomic<int64_t>>(0)));
}

std::vector<int32_t> SparseShard::BucketShardsOf(const std::vector<Table>& tables, const std::set<int32_t>& held) {
  std::set<int32_t> shards;
  for (const Table& table : tables) {
    for (int32_t shard : table.setup.bucket_shards) {
      if (held.count(shard) > 0) shards.insert(shard);
    }
  }
  return std::vector<int32_t>(shards.begin(), shards.end());
}

SparseShard::SparseShard(std::vector<Table> tables, std::set<int32_t> held_shards, int32_t num_partitions,
                         std::function<int64_t()> room, std::shared_ptr<std::atomic<int64_t>> aside)
    : tables_(std::move(tables)),
      held_shards_(std::move(held_shards)),
      bucket_shards_(BucketShardsOf(tables_, held_shards_)),
      num_partitions_(num_partitions),
      room_(std::move(room)),
      aside_(std::move(aside)),
      has_sync_(std::any_of(tables_.begin(), tables_.end(), [](const Table& t) { return t.setup.synchronous; })),
      has_async_(std::any_of(tables_.begin(), tables_.end(), [](const Table& t) { return !t.setup.synchronous; })),
      holds_sync_(std::any_of(tables_.begin(), tables_.end(),
                              [](const Table& t) {
                                return t.setup.synchronous &&
                                       std::any_of(t.buckets.begin(), t.buckets.end(),
                                                   [](const auto& bucket) { return bucket != nullptr; });
                              })),
      applied_(static_cast<size_t>(num_partitions), std::vector<Applied>(bucket_shards_.size())),
      restored_(static_cast<size_t>(num_partitions), 0),
      changes_(bucket_shards_.size(), 0),
      gather_(static_cast<size_t>(num_partitions)),
      undo_(tables_.size()) {
  for (PartitionGather& partition : gather_) partition.shards.resize(bucket_shards_.size());
}

int64_t SparseShard::EmptyBytes(const std::vector<SparseTableSetup>& tables, const std::set<int32_t>& held_shards) {
  int64_t buckets = 0;
  for (const SparseTableSetup& table : tables) {
    for (int32_t shard : table.bucket_shards) buckets += held_shards.count(shard);
  }
  return buckets * SparseTable::EmptyBytes();
}

int32_t SparseShard::dim(int32_t table) const {
  if (table < 0 || table >= num_tables()) return 0;
  return tables_[static_cast<size_t>(table)].setup.config.dim;
}

absl::StatusOr<SparseTable*> SparseShard::BucketFor(const Table& table, uint64_t key) const {
  const auto buckets = static_cast<int32_t>(table.buckets.size());
  const int32_t bucket = BucketOf(key, buckets);
  SparseTable* held = table.buckets[static_cast<size_t>(bucket)].get();
  if (held == nullptr) {
    return absl::AbortedError(absl::StrCat("key ", key, " of table ", table.setup.config.name, " is in bucket ",
                                           bucket, " of shard ", table.setup.bucket_shards[static_cast<size_t>(bucket)],
                                           ", which this server does not hold (refresh the shard map)"));
  }
  return held;
}

absl::StatusOr<SparseTable*> SparseShard::BucketOfShard(const Table& table, uint64_t key, int32_t shard) const {
  absl::StatusOr<SparseTable*> bucket = BucketFor(table, key);
  if (!bucket.ok()) return bucket;
  const int32_t b = BucketOf(key, static_cast<int32_t>(table.buckets.size()));
  const int32_t of = table.setup.bucket_shards[static_cast<size_t>(b)];
  if (of != shard) {
    return absl::AbortedError(absl::StrCat("key ", key, " of table ", table.setup.config.name, " is in bucket ", b,
                                           " of shard ", of, ", not of shard ", shard,
                                           " that the push names (refresh the shard map)"));
  }
  return bucket;
}

absl::StatusOr<size_t> SparseShard::SlotOf(int32_t named) const {
  if (named < 0) {
    if (bucket_shards_.size() == 1) return 0;
    return absl::InvalidArgumentError(absl::StrCat("sparse push names no shard, and this server holds buckets of ",
                                                   bucket_shards_.size(),
                                                   " shards of the job (set SparsePushRequest.shard)"));
  }
  auto it = std::lower_bound(bucket_shards_.begin(), bucket_shards_.end(), named);
  if (it != bucket_shards_.end() && *it == named) return static_cast<size_t>(it - bucket_shards_.begin());
  if (held_shards_.count(named) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse push to shard ", named, ", which holds no bucket of the job's tables"));
  }
  return absl::AbortedError(absl::StrCat("sparse push to shard ", named,
                                         ", which this server does not hold (refresh the shard map)"));
}

absl::Status SparseShard::Validate(const SparsePushArgs& args) const {
  if (absl::Status valid = CheckPushArgs(args); !valid.ok()) return valid;
  absl::StatusOr<size_t> slot = SlotOf(args.shard);
  if (!slot.ok()) return slot.status();
  const int32_t shard = bucket_shards_[*slot];
  for (const SparseRows& rows : args.tables) {
    const Table& table = tables_[static_cast<size_t>(rows.table)];
    for (BucketPart& part : SplitByBucket(rows.keys, rows.grads, table.setup.config.dim,
                                          static_cast<int32_t>(table.buckets.size()))) {
      absl::StatusOr<SparseTable*> bucket = BucketOfShard(table, part.keys.front(), shard);
      if (!bucket.ok()) return bucket.status();
      if (absl::Status checked = (*bucket)->CheckPush(part.keys, part.grads); !checked.ok()) return checked;
    }
  }
  return absl::OkStatus();
}

absl::Status SparseShard::Pull(int32_t table, absl::Span<const uint64_t> keys, float* out) const {
  if (table < 0 || table >= num_tables()) {
    return absl::InvalidArgumentError(absl::StrCat("the job has no sparse table ", table));
  }
  const Table& t = tables_[static_cast<size_t>(table)];
  const int32_t dim = t.setup.config.dim;
  std::vector<BucketPart> parts = SplitByBucket(keys, nullptr, dim, static_cast<int32_t>(t.buckets.size()));
  std::vector<float> rows;
  for (const BucketPart& part : parts) {
    absl::StatusOr<SparseTable*> bucket = BucketFor(t, part.keys.front());
    if (!bucket.ok()) return bucket.status();
    if (part.key_copy.empty()) {  // a run of the request: its rows go straight to their place
      (*bucket)->Pull(part.keys, out + static_cast<size_t>(part.positions.front()) * dim);
      continue;
    }
    rows.resize(part.keys.size() * static_cast<size_t>(dim));
    (*bucket)->Pull(part.keys, rows.data());
    for (size_t i = 0; i < part.positions.size(); ++i) {
      std::memcpy(out + static_cast<size_t>(part.positions[i]) * dim, rows.data() + i * dim,
                  static_cast<size_t>(dim) * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::Status SparseShard::PullAtStep(int32_t table, absl::Span<const uint64_t> keys, int64_t step,
                                     float* out) const {
  if (step < 0 || step > kMaxSparseStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse pull of step ", step, " (steps are in [0, ", kMaxSparseStep, "])"));
  }
  if (table < 0 || table >= num_tables() || !tables_[static_cast<size_t>(table)].setup.synchronous) {
    return Pull(table, keys, out);
  }
  ReaderMutexLock lock(&push_mu_);  // no step applies meanwhile
  if (step > sync_step_) {
    return absl::UnavailableError(absl::StrCat("sparse pull of step ", step, ": the synchronous tables gather step ",
                                               sync_step_, " here (retry once it is whole)"));
  }
  if (step < sync_step_ && step != undo_step_) {
    return absl::AbortedError(absl::StrCat("sparse pull of step ", step, ": the synchronous tables are at step ",
                                           sync_step_, " and keep the rows of step ", sync_step_ - 1, " at most"));
  }
  if (absl::Status pulled = Pull(table, keys, out); !pulled.ok()) return pulled;
  if (step == sync_step_) return absl::OkStatus();
  // The step was applied: the keys it changed read as they were before it.
  const Table& t = tables_[static_cast<size_t>(table)];
  const Undo& undo = undo_[static_cast<size_t>(table)];
  const auto dim = static_cast<size_t>(t.setup.config.dim);
  const auto buckets = static_cast<int32_t>(t.buckets.size());
  auto before = [buckets](uint64_t a, uint64_t b) {
    const int32_t ba = BucketOf(a, buckets), bb = BucketOf(b, buckets);
    return ba != bb ? ba < bb : a < b;
  };
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = std::lower_bound(undo.keys.begin(), undo.keys.end(), keys[i], before);
    if (it == undo.keys.end() || *it != keys[i]) continue;
    const auto at = static_cast<size_t>(it - undo.keys.begin());
    std::memcpy(out + i * dim, undo.rows.data() + at * dim, dim * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status SparseShard::CheckPushArgs(const SparsePushArgs& args) const {
  if (args.partition < 0 || args.partition >= num_partitions_) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse push from partition ", args.partition, "; the job has ", num_partitions_));
  }
  if (args.step < 0 || args.step > kMaxSparseStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse push of step ", args.step, " (steps are in [0, ", kMaxSparseStep, "])"));
  }
  if (args.part < 0 || args.part >= kMaxPushParts) {
    return absl::InvalidArgumentError(absl::StrCat("sparse push of step ", args.step, " part ", args.part,
                                                   " (parts are in [0, ", kMaxPushParts - 1, "])"));
  }
  if (args.parts < 0 || args.parts > kMaxPushParts || (args.parts > 0 && args.part >= args.parts) ||
      (has_sync_ && args.parts == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse push part ", args.part, " of ", args.parts, " requests (the job's synchronous tables need the ",
        "number of requests of a partition's step, in [1, ", kMaxPushParts, "], above the part)"));
  }
  std::set<int32_t> named;
  for (const SparseRows& rows : args.tables) {
    if (rows.table < 0 || rows.table >= num_tables()) {
      return absl::InvalidArgumentError(absl::StrCat("the job has no sparse table ", rows.table));
    }
    if (!named.insert(rows.table).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse push names table ", tables_[static_cast<size_t>(rows.table)].setup.config.name,
                       " twice"));
    }
    if (rows.grads == nullptr && !rows.keys.empty()) return absl::InvalidArgumentError("sparse push without rows");
  }
  return absl::OkStatus();
}

// What the "table is full" errors add: where the rest of the budget went
// and what makes room.
constexpr char kFullHint[] =
    " (the server's other jobs hold the rest, finished ones too until retention releases them: "
    "fulcrum-scheduler --retain-finished-jobs and --retain-finished-for; add servers, raise --memory-budget, "
    "or "
    "set admitAfter/expireAfter)";

absl::StatusOr<SparsePushOutcome> SparseShard::Push(const SparsePushArgs& args) {
  if (absl::Status valid = CheckPushArgs(args); !valid.ok()) return valid;
  absl::StatusOr<size_t> slot = SlotOf(args.shard);
  if (!slot.ok()) return slot.status();
  const int32_t shard = bucket_shards_[*slot];
  struct Planned {
    const Table* table;
    SparseTable* bucket;
    BucketPart part;
  };
  MutexLock lock(&push_mu_);
  if (!frozen_reason_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("sparse tables take no pushes: ", frozen_reason_));
  }
  Applied& applied = applied_[static_cast<size_t>(args.partition)][*slot];
  PartitionGather& gather = gather_[static_cast<size_t>(args.partition)];
  ShardGather& shard_gather = gather.shards[*slot];
  if (has_sync_) {
    if (args.step < sync_step_ || (args.step == sync_step_ && shard_gather.seen.count(args.part) > 0)) {
      return SparsePushOutcome::kDuplicate;
    }
    if (args.step > sync_step_) {
      return absl::AbortedError(absl::StrCat("sparse push of partition ", args.partition, "'s step ", args.step,
                                             " arrived while this server gathers step ", sync_step_,
                                             " of the synchronous tables (run the step again)"));
    }
    if (shard_gather.parts != 0 && shard_gather.parts != args.parts) {
      return absl::InvalidArgumentError(absl::StrCat("sparse push of partition ", args.partition, "'s step ",
                                                     args.step, " says it takes ", args.parts,
                                                     " requests to shard ", shard, "; an earlier part said ",
                                                     shard_gather.parts));
    }
  } else if (args.step < applied.step || (args.step == applied.step && applied.parts.count(args.part) > 0)) {
    return SparsePushOutcome::kDuplicate;
  }
  // Check everything first: a push is applied whole or not at all.
  std::vector<Planned> plan;
  int64_t growth = 0;
  std::string grown_tables;
  int64_t growth_at_most = 0;
  std::vector<Gathered> gathered;  // synchronous tables' rows, kept for the step
  int64_t gathered_bytes = 0;
  for (const SparseRows& rows : args.tables) {
    const Table& table = tables_[static_cast<size_t>(rows.table)];
    const int32_t dim = table.setup.config.dim;
    for (BucketPart& part : SplitByBucket(rows.keys, rows.grads, dim, static_cast<int32_t>(table.buckets.size()))) {
      absl::StatusOr<SparseTable*> bucket = BucketOfShard(table, part.keys.front(), shard);
      if (!bucket.ok()) return bucket.status();
      if (table.setup.synchronous) {
        if (absl::Status checked = (*bucket)->CheckPush(part.keys, part.grads); !checked.ok()) return checked;
        continue;
      }
      if (const std::vector<int64_t>* floor = FloorOfLocked(rows.table, part.bucket);
          floor != nullptr && args.step < (*floor)[static_cast<size_t>(args.partition)]) {
        continue;  // in its rows
      }
      if (absl::Status checked = (*bucket)->CheckPush(part.keys, part.grads); !checked.ok()) return checked;
      if ((*bucket)->rows() + static_cast<int64_t>(part.keys.size()) > SparseTable::kMaxRows) {
        // It may pass the row limit: the bucket's own check says.
        if (absl::StatusOr<int64_t> after = (*bucket)->BytesAfterCheckedPush(part.keys); !after.ok()) {
          return after.status();
        }
      }
      if (room_) growth_at_most += (*bucket)->BytesAfterAtMost(part.keys.size()) - (*bucket)->bytes();
      plan.push_back(Planned{&table, *bucket, std::move(part)});
    }
    if (table.setup.synchronous && !rows.keys.empty()) {
      Gathered kept{rows.table, std::vector<uint64_t>(rows.keys.begin(), rows.keys.end()),
                    std::vector<float>(rows.grads, rows.grads + rows.keys.size() * static_cast<size_t>(dim))};
      gathered_bytes += static_cast<int64_t>(kept.keys.size() * sizeof(uint64_t) + kept.grads.size() * sizeof(float));
      gathered.push_back(std::move(kept));
    }
  }
  // The rows a push adds are counted only when it might not fit (and the
  // room, which reads the whole store, only when it may add any).
  const int64_t room = room_ && (growth_at_most > 0 || gathered_bytes > 0) ? room_() : 0;
  if (room_ && gathered_bytes > 0 && gathered_bytes > room) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the synchronous tables' step ", args.step, " does not fit this server: its gathered pushes take ",
        held_bytes_.load(), " bytes and this one ", gathered_bytes, ", beyond the ", std::max<int64_t>(0, room),
        " bytes left in the server's memory budget (add servers, raise --memory-budget or lower data.batchSize)"));
  }
  if (room_ && growth_at_most > 0 && growth_at_most + gathered_bytes > room) {
    for (const Planned& planned : plan) {
      absl::StatusOr<int64_t> after = planned.bucket->BytesAfterCheckedPush(planned.part.keys);
      if (!after.ok()) return after.status();
      const int64_t more = *after - planned.bucket->bytes();
      const std::string& name = planned.table->setup.config.name;
      if (more > 0 && grown_tables.find(name) == std::string::npos) {
        absl::StrAppend(&grown_tables, grown_tables.empty() ? "" : ", ", name);
      }
      growth += std::max<int64_t>(0, more);
    }
    if (growth > 0 && growth + gathered_bytes > room) {  // a push that adds nothing passes (room may be below 0)
      return absl::ResourceExhaustedError(
          absl::StrCat("sparse table ", grown_tables, " is full on this server: the job's tables take ",
                       bytes(), " bytes and this push would add ", growth + gathered_bytes, ", beyond the ",
                       std::max<int64_t>(0, room), " bytes left in the server's memory budget", kFullHint));
    }
  }
  ++changes_[*slot];
  // Synchronous tables: the push joins its step; when it completes the step,
  // the step must apply before any of the push does.
  std::optional<GatheredStep> step;
  if (has_sync_) {
    const size_t kept_before = gather.rows.size();
    for (Gathered& kept : gathered) gather.rows.push_back(std::move(kept));
    // The partition is whole here once every shard holding buckets here
    // has all its parts.
    const bool shard_whole = static_cast<int32_t>(shard_gather.seen.size()) + 1 == args.parts;
    const bool whole = shard_whole && gather.whole_shards + 1 == static_cast<int32_t>(bucket_shards_.size());
    if (whole && whole_partitions_ + 1 == num_partitions_) {
      absl::StatusOr<GatheredStep> summed = SumGatheredStepLocked();
      if (!summed.ok()) {
        gather.rows.erase(gather.rows.begin() + static_cast<std::ptrdiff_t>(kept_before), gather.rows.end());
        return summed.status();
      }
      step = *std::move(summed);
    }
    shard_gather.parts = args.parts;
    shard_gather.seen.insert(args.part);
    if (shard_whole) ++gather.whole_shards;
    gather.bytes += gathered_bytes;
    held_bytes_ += gathered_bytes;
    if (whole) ++whole_partitions_;
  }
  for (const Planned& planned : plan) {
    if (absl::Status pushed = planned.bucket->PushChecked(args.step, planned.part.keys, planned.part.grads);
        !pushed.ok()) {
      return pushed;  // cannot happen after the checks above, with pushes serialized
    }
  }
  if (args.step > applied.step) {
    applied.step = args.step;
    applied.parts.clear();
    applied.expected = 0;
  }
  applied.parts.insert(args.part);
  if (applied.expected == 0) applied.expected = args.parts;
  now_ = std::max(now_, args.step);
  if (step.has_value()) ApplyGatheredStepLocked(*std::move(step));
  MaybeExpireLocked(now_);
  return SparsePushOutcome::kApplied;
}

absl::StatusOr<SparseShard::GatheredStep> SparseShard::SumGatheredStepLocked() const {
  GatheredStep step;
  step.keys.resize(tables_.size());
  step.grads.resize(tables_.size());
  const float scale = 1.0f / static_cast<float>(num_partitions_);
  int64_t growth = 0;
  std::string grown_tables;
  for (size_t t = 0; t < tables_.size(); ++t) {
    const Table& table = tables_[t];
    if (!table.setup.synchronous) continue;
    const auto dim = static_cast<size_t>(table.setup.config.dim);
    const auto buckets = static_cast<int32_t>(table.buckets.size());
    // Sum in partition order, never arrival order (a key is in at most one
    // part of a partition's step), as the dense chunks do.
    absl::flat_hash_map<uint64_t, uint32_t> index;
    std::vector<uint64_t> keys;
    std::vector<float> sums;
    for (const PartitionGather& partition : gather_) {
      for (const Gathered& rows : partition.rows) {
        if (rows.table != static_cast<int32_t>(t)) continue;
        for (size_t i = 0; i < rows.keys.size(); ++i) {
          auto [it, fresh] = index.try_emplace(rows.keys[i], static_cast<uint32_t>(keys.size()));
          if (fresh) {
            keys.push_back(rows.keys[i]);
            sums.resize(sums.size() + dim, 0.0f);
          }
          float* sum = sums.data() + static_cast<size_t>(it->second) * dim;
          const float* grad = rows.grads.data() + i * dim;
          for (size_t d = 0; d < dim; ++d) sum[d] += grad[d];
        }
      }
    }
    std::vector<int32_t> bucket_of;
    const std::vector<uint32_t> order = BucketOrder(keys, buckets, &bucket_of);
    std::vector<uint64_t>& sorted_keys = step.keys[t];
    std::vector<float>& grads = step.grads[t];
    sorted_keys.resize(keys.size());
    grads.resize(sums.size());
    for (size_t i = 0; i < order.size(); ++i) {
      sorted_keys[i] = keys[order[i]];
      const float* sum = sums.data() + static_cast<size_t>(order[i]) * dim;
      for (size_t d = 0; d < dim; ++d) grads[i * dim + d] = sum[d] * scale;
    }
    for (size_t begin = 0; begin < order.size();) {
      size_t end = begin + 1;
      while (end < order.size() && bucket_of[order[end]] == bucket_of[order[begin]]) ++end;
      SparseTable* bucket = table.buckets[static_cast<size_t>(bucket_of[order[begin]])].get();
      const absl::Span<const uint64_t> run(sorted_keys.data() + begin, end - begin);
      // Finite parts may sum to an infinite one.
      if (absl::Status checked = bucket->CheckPush(run, grads.data() + begin * dim); !checked.ok()) {
        return absl::Status(checked.code(), absl::StrCat("the summed gradients of step ", sync_step_, ": ",
                                                         checked.message()));
      }
      absl::StatusOr<int64_t> after = bucket->BytesAfterCheckedPush(run);
      if (!after.ok()) return after.status();
      if (*after > bucket->bytes()) {
        growth += *after - bucket->bytes();
        if (grown_tables.find(table.setup.config.name) == std::string::npos) {
          absl::StrAppend(&grown_tables, grown_tables.empty() ? "" : ", ", table.setup.config.name);
        }
      }
      step.pieces.push_back(StepPiece{static_cast<int32_t>(t), bucket, begin, end});
      begin = end;
    }
  }
  // The rows it adds, and the undo of the rows it changes; the gathered
  // pushes it frees (they count in the room now).
  int64_t undo = 0;
  for (const auto& grads : step.grads) undo += static_cast<int64_t>(grads.size() * sizeof(float));
  const int64_t freed = held_bytes_.load();
  if (room_ && growth + undo > freed) {
    const int64_t room = room_() + freed;
    if (growth + undo > room) {
      return absl::ResourceExhaustedError(
          absl::StrCat("sparse table ", grown_tables.empty() ? std::string("state") : grown_tables,
                       " is full on this server: the job's tables take ", bytes(), " bytes and step ",
                       sync_step_, " would add ", growth + undo, ", beyond the ", std::max<int64_t>(0, room),
                       " bytes left in the server's memory budget", kFullHint));
    }
  }
  return step;
}

void SparseShard::ApplyGatheredStepLocked(GatheredStep step) {
  int64_t undo_bytes = 0;
  for (size_t t = 0; t < tables_.size(); ++t) {
    Undo& undo = undo_[t];
    undo.keys = std::move(step.keys[t]);
    undo.rows.resize(step.grads[t].size());
    undo_bytes += static_cast<int64_t>(undo.rows.size() * sizeof(float));
  }
  for (const StepPiece& piece : step.pieces) {
    Undo& undo = undo_[static_cast<size_t>(piece.table)];
    const auto dim = static_cast<size_t>(tables_[static_cast<size_t>(piece.table)].setup.config.dim);
    const absl::Span<const uint64_t> run(undo.keys.data() + piece.begin, piece.end - piece.begin);
    piece.bucket->Pull(run, undo.rows.data() + piece.begin * dim);  // as re-runs of the step read them
    // Cannot fail: checked whole by SumGatheredStepLocked, pushes serialized.
    (void)piece.bucket->PushChecked(sync_step_, run, step.grads[static_cast<size_t>(piece.table)].data() + piece.begin * dim);
  }
  for (PartitionGather& partition : gather_) {
    partition = PartitionGather();
    partition.shards.resize(bucket_shards_.size());
  }
  whole_partitions_ = 0;
  undo_step_ = sync_step_;
  undo_bytes += ExpireSynchronousLocked(sync_step_);
  held_bytes_ = undo_bytes;
  now_ = std::max(now_, sync_step_);
  ++sync_step_;
  for (int64_t& changes : changes_) ++changes;
  if (armed_.has_value() && !armed_->taken && armed_->at_step == sync_step_) {
    SnapshotTablesLocked(/*synchronous=*/true, CaptureOf{armed_->checkpoint_id, &armed_->base}, &armed_->snapshots);
    armed_->taken = true;
    captured_cv_.SignalAll();
  }
}

int64_t SparseShard::ExpiryPeriodLocked(bool synchronous) const {
  int64_t shortest = 0;
  for (const Table& table : tables_) {
    const int64_t after = table.setup.config.expire_after;
    if (table.setup.synchronous == synchronous && after > 0)
      shortest = shortest == 0 ? after : std::min(shortest, after);
  }
  // Rows live at most a quarter of their lifetime past it.
  return shortest == 0 ? 0 : std::max<int64_t>(1, shortest / 4);
}

int64_t SparseShard::ExpireSynchronousLocked(int64_t step) {
  const int64_t period = ExpiryPeriodLocked(/*synchronous=*/true);
  if (period == 0 || step % period != 0) return 0;
  int64_t bytes = 0;
  for (size_t t = 0; t < tables_.size(); ++t) {
    const Table& table = tables_[t];
    if (!table.setup.synchronous || table.setup.config.expire_after <= 0) continue;
    const auto dim = static_cast<size_t>(table.setup.config.dim);
    Undo& undo = undo_[t];
    const size_t before = undo.keys.size();
    for (const auto& bucket : table.buckets) {
      if (bucket != nullptr) bucket->Expire(step, &undo.keys, &undo.rows);
    }
    if (undo.keys.size() == before) continue;
    // Back into the undo's order, as PullAtStep looks keys up; no dropped
    // row is one the step pushed (it was pushed at `step`).
    std::vector<int32_t> bucket_of;
    Undo sorted;
    sorted.keys.reserve(undo.keys.size());
    sorted.rows.reserve(undo.rows.size());
    for (uint32_t i : BucketOrder(undo.keys, static_cast<int32_t>(table.buckets.size()), &bucket_of)) {
      sorted.keys.push_back(undo.keys[i]);
      sorted.rows.insert(sorted.rows.end(), undo.rows.begin() + static_cast<std::ptrdiff_t>(i * dim),
                         undo.rows.begin() + static_cast<std::ptrdiff_t>((i + 1) * dim));
    }
    undo = std::move(sorted);
    bytes += static_cast<int64_t>((undo.keys.size() - before) * (sizeof(uint64_t) + dim * sizeof(float)));
  }
  return bytes;
}

void SparseShard::MaybeExpireLocked(int64_t now) {
  if (now < next_expiry_) return;
  for (int64_t& changes : changes_) ++changes;
  for (const Table& table : tables_) {
    if (table.setup.synchronous || table.setup.config.expire_after <= 0) continue;
    for (const auto& bucket : table.buckets) {
      if (bucket != nullptr) bucket->Expire(now);
    }
  }
  const int64_t period = ExpiryPeriodLocked(/*synchronous=*/false);
  next_expiry_ = period == 0 ? std::numeric_limits<int64_t>::max() : now + period;
}

std::vector<int32_t> SparseShard::chunk_ids() const {
  std::vector<int32_t> ids;
  for (size_t t = 0; t < tables_.size(); ++t) {
    for (size_t b = 0; b < tables_[t].buckets.size(); ++b) {
      if (tables_[t].buckets[b] != nullptr) ids.push_back(TableChunkId(static_cast<int32_t>(t), static_cast<int32_t>(b)));
    }
  }
  return ids;
}

std::vector<std::vector<int64_t>> SparseShard::CapturePositionsLocked() const {
  std::vector<std::vector<int64_t>> positions(bucket_shards_.size(),
                                              std::vector<int64_t>(applied_.size(), 0));
  for (size_t p = 0; p < applied_.size(); ++p) {
    for (size_t slot = 0; slot < bucket_shards_.size(); ++slot) {
      // The last step pushed to the shard runs again while it may have more
      // parts to come; once all are in, the partition goes on after it (its
      // dense chunks say the same), so a resumed job applies it once.
      const Applied& applied = applied_[p][slot];
      const bool whole =
          applied.expected > 0 && static_cast<int32_t>(applied.parts.size()) == applied.expected;
      positions[slot][p] = std::max<int64_t>(0, whole ? applied.step + 1 : applied.step);
    }
  }
  return positions;
}

SparseTable* SparseShard::HeldBucket(int32_t chunk_id) const {
  if (chunk_id < kTableChunkBase) return nullptr;
  const auto [t, b] = TableBucketOf(chunk_id);
  if (t >= num_tables() || b >= static_cast<int32_t>(tables_[static_cast<size_t>(t)].buckets.size())) return nullptr;
  return tables_[static_cast<size_t>(t)].buckets[static_cast<size_t>(b)].get();
}

absl::StatusOr<ChunkSnapshot> SparseShard::CaptureBucket(int32_t chunk_id) const {
  SparseTable* bucket = HeldBucket(chunk_id);
  if (bucket == nullptr) {
    return absl::NotFoundError(absl::StrCat("chunk ", chunk_id, " is no table bucket held here"));
  }
  const Table& table = tables_[static_cast<size_t>(TableBucketOf(chunk_id).table)];
  MutexLock lock(&push_mu_);  // between pushes
  ChunkSnapshot snapshot = SnapshotLocked(table, chunk_id, *bucket, CapturePositionsLocked(), CaptureOf());
  absl::StatusOr<size_t> slot = SlotOf(ShardOfBucket(chunk_id));
  if (slot.ok()) snapshot.table_changes = changes_[*slot];
  return snapshot;
}

int32_t SparseShard::ShardOfBucket(int32_t chunk_id) const {
  if (HeldBucket(chunk_id) == nullptr) return -1;
  const auto [t, b] = TableBucketOf(chunk_id);
  return tables_[static_cast<size_t>(t)].setup.bucket_shards[static_cast<size_t>(b)];
}

namespace {

std::string KeyBytes(const uint64_t* keys, size_t n) {
  std::string bytes(n * sizeof(uint64_t), '\0');
  for (size_t i = 0; i < n; ++i) absl::little_endian::Store64(bytes.data() + i * sizeof(uint64_t), keys[i]);
  return bytes;
}

std::vector<uint64_t> KeysOf(const std::string& bytes) {
  std::vector<uint64_t> keys(bytes.size() / sizeof(uint64_t));
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = absl::little_endian::Load64(bytes.data() + i * sizeof(uint64_t));
  return keys;
}

}  // namespace

absl::StatusOr<ChunkSnapshot> SparseShard::CaptureShardState(int32_t shard) const {
  auto it = std::lower_bound(bucket_shards_.begin(), bucket_shards_.end(), shard);
  if (it == bucket_shards_.end() || *it != shard) {
    return absl::NotFoundError(absl::StrCat("this server holds no bucket of shard ", shard));
  }
  const auto slot = static_cast<size_t>(it - bucket_shards_.begin());
  auto of_shard = [&](int32_t table, uint64_t key) {
    const Table& t = tables_[static_cast<size_t>(table)];
    return t.setup.bucket_shards[static_cast<size_t>(BucketOf(key, static_cast<int32_t>(t.buckets.size())))] == shard;
  };
  // Rows of `keys` (width `dim`) whose keys are of the shard.
  auto rows_of_shard = [&](int32_t table, int32_t partition, const std::vector<uint64_t>& keys,
                           const std::vector<float>& values, v1::TableShardState::Rows* rows) {
    const auto dim = static_cast<size_t>(tables_[static_cast<size_t>(table)].setup.config.dim);
    std::vector<uint64_t> kept_keys;
    std::vector<float> kept;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!of_shard(table, keys[i])) continue;
      kept_keys.push_back(keys[i]);
      kept.insert(kept.end(), values.begin() + static_cast<std::ptrdiff_t>(i * dim),
                  values.begin() + static_cast<std::ptrdiff_t>((i + 1) * dim));
    }
    rows->set_table(table);
    rows->set_partition(partition);
    rows->set_keys(KeyBytes(kept_keys.data(), kept_keys.size()));
    EncodeFloats(kept.data(), static_cast<int64_t>(kept.size()), rows->mutable_values());
  };
  v1::TableShardState state;
  MutexLock lock(&push_mu_);  // between pushes: the bookkeeping of one moment
  state.set_shard(shard);
  state.set_sync_step(sync_step_);
  state.set_now(now_);
  state.set_next_expiry(next_expiry_);
  state.set_undo_step(undo_step_);
  for (int64_t step : restored_) state.add_restored(step);
  for (size_t p = 0; p < applied_.size(); ++p) {
    v1::TableShardState::Partition* partition = state.add_partitions();
    partition->set_applied_step(applied_[p][slot].step);
    for (int32_t part : applied_[p][slot].parts) partition->add_applied_parts(part);
    partition->set_applied_parts_expected(applied_[p][slot].expected);
    const ShardGather& gathered = gather_[p].shards[slot];
    partition->set_parts(gathered.parts);
    for (int32_t part : gathered.seen) partition->add_seen(part);
    for (const Gathered& rows : gather_[p].rows) {
      rows_of_shard(rows.table, static_cast<int32_t>(p), rows.keys, rows.grads, state.add_gathered());
    }
  }
  for (size_t t = 0; t < undo_.size(); ++t) {
    rows_of_shard(static_cast<int32_t>(t), 0, undo_[t].keys, undo_[t].rows, state.add_undo());
  }
  // One entry per distinct floor, naming the buckets that share it.
  absl::flat_hash_map<const std::vector<int64_t>*, v1::TableShardState::Floors*> entry_of;
  for (size_t t = 0; !floors_.empty() && t < tables_.size(); ++t) {
    for (size_t b = 0; b < tables_[t].buckets.size(); ++b) {
      const std::vector<int64_t>* floor = floors_[t][b].get();
      if (floor == nullptr || tables_[t].setup.bucket_shards[b] != shard) continue;
      v1::TableShardState::Floors*& floors = entry_of[floor];
      if (floors == nullptr) {
        floors = state.add_floors();
        floors->mutable_steps()->Assign(floor->begin(), floor->end());
      }
      floors->add_chunk_ids(TableChunkId(static_cast<int32_t>(t), static_cast<int32_t>(b)));
    }
  }
  ChunkSnapshot snapshot;
  snapshot.version = sync_step_;
  snapshot.table_changes = changes_[slot];
  state.SerializeToString(&snapshot.table_state);
  return snapshot;
}

absl::Status SparseShard::ApplyBucketChangesLocked(int32_t chunk_id, const std::string& changes) {
  SparseTable* bucket = HeldBucket(chunk_id);
  if (bucket == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk_id, " is no table bucket held here"));
  }
  const int64_t before = bucket->bytes();
  absl::Status applied = bucket->ApplyChanges(changes);
  const int64_t growth = bucket->bytes() - before;
  if (applied.ok() && room_ && *aside_ + growth > room_()) {
    applied = absl::ResourceExhaustedError(absl::StrCat(
        "sparse table ", bucket->config().name, " does not fit this server: its rows take ", *aside_ + growth,
        " bytes by chunk ", chunk_id, ", beyond the ", std::max<int64_t>(0, room_()),
        " bytes left in the server's memory budget (use more servers, or raise --memory-budget)"));
  }
  if (!applied.ok()) {
    bucket->Clear();
    ReturnAside(before - bucket->bytes());
    return applied;
  }
  if (growth >= 0) {
    AddAside(growth);
  } else {
    ReturnAside(-growth);
  }
  return absl::OkStatus();
}

absl::Status SparseShard::LoadBucketLocked(int32_t chunk_id, const std::string& table_state) {
  if (HeldBucket(chunk_id) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk_id, " is no table bucket held here"));
  }
  const auto [t, b] = TableBucketOf(chunk_id);
  const Table& table = tables_[static_cast<size_t>(t)];
  SparseTable* bucket = table.buckets[static_cast<size_t>(b)].get();
  const int64_t before = bucket->bytes();
  bucket->Clear();
  const int64_t emptied = before - bucket->bytes();
  ReturnAside(emptied);
  if (absl::Status loaded = bucket->LoadState(table_state); !loaded.ok()) return loaded;
  // A shard is restored (or copied) aside, before it is installed: the room
  // does not shrink as its buckets load, so their growth is summed here.
  const int64_t growth = bucket->bytes() - (before - emptied);
  if (room_ && *aside_ + growth > room_()) {
    const int64_t room = room_();
    bucket->Clear();
    return absl::ResourceExhaustedError(absl::StrCat(
        "sparse table ", table.setup.config.name, " does not fit this server: its rows take ",
        *aside_ + growth, " bytes by bucket ", b, ", beyond the ", std::max<int64_t>(0, room),
        " bytes left in the server's memory budget (use more servers, or raise --memory-budget)"));
  }
  AddAside(growth);
  return absl::OkStatus();
}

void SparseShard::AddAside(int64_t bytes) {
  aside_added_ += bytes;
  *aside_ += bytes;
}

void SparseShard::ReturnAside(int64_t bytes) {
  int64_t added = aside_added_.load();
  int64_t back = 0;
  do {
    back = std::min(added, std::max<int64_t>(0, bytes));
  } while (!aside_added_.compare_exchange_weak(added, added - back));
  *aside_ -= back;
}

void SparseShard::ReleaseAside() { ReturnAside(aside_added_.load()); }

SparseShard::~SparseShard() { ReleaseAside(); }

absl::Status SparseShard::AdoptBucket(int32_t chunk_id, const std::string& table_state) {
  MutexLock lock(&push_mu_);
  return LoadBucketLocked(chunk_id, table_state);
}

namespace {

// The steps and part numbers of a copied shard state, within what a shard
// can hold (a peer's corrupt or hostile state would otherwise skip every
// later push, or overflow a step's arithmetic).
absl::Status CheckShardStateSteps(const v1::TableShardState& state) {
  constexpr int64_t kHighest = kMaxSparseStep + 1;  // a position is the step after
  std::string bad;
  auto check = [&bad](const char* what, int64_t value, int64_t lowest, int64_t highest) {
    if (bad.empty() && (value < lowest || value > highest)) {
      bad = absl::StrCat(what, " ", value, " is outside [", lowest, ", ", highest, "]");
    }
  };
  check("sync_step", state.sync_step(), 0, kHighest);
  check("now", state.now(), 0, kHighest);
  check("undo_step", state.undo_step(), -1, kHighest);
  if (state.next_expiry() != std::numeric_limits<int64_t>::max()) {  // max: no expiry
    check("next_expiry", state.next_expiry(), 0, 2 * kHighest);
  }
  for (int64_t step : state.restored()) check("a restored step", step, 0, kHighest);
  for (const v1::TableShardState::Partition& partition : state.partitions()) {
    check("an applied step", partition.applied_step(), -1, kMaxSparseStep);
    check("an applied part count", partition.applied_parts_expected(), 0, kMaxPushParts);
    check("a part count", partition.parts(), 0, kMaxPushParts);
    check("a partition's applied parts", partition.applied_parts_size(), 0, kMaxPushParts);
    check("a partition's parts seen", partition.seen_size(), 0, kMaxPushParts);
    for (int32_t part : partition.applied_parts()) check("an applied part", part, 0, kMaxPushParts - 1);
    for (int32_t part : partition.seen()) check("a part seen", part, 0, kMaxPushParts - 1);
  }
  for (const v1::TableShardState::Floors& floors : state.floors()) {
    for (int64_t step : floors.steps()) check("a floor", step, 0, kHighest);
  }
  if (bad.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("shard ", state.shard(), "'s table state: ", bad));
}

}  // namespace

absl::Status SparseShard::AdoptShardState(const std::string& serialized) {
  v1::TableShardState state;
  if (!state.ParseFromString(serialized)) return absl::DataLossError("a shard's table state does not parse");
  if (bucket_shards_.size() != 1 || bucket_shards_[0] != state.shard()) {
    return absl::FailedPreconditionError(absl::StrCat("a copy of shard ", state.shard(),
                                                      "'s tables goes to a server holding buckets of that shard "
                                                      "only (this one holds ", bucket_shards_.size(), ")"));
  }
  if (state.partitions_size() != num_partitions_ || state.restored_size() != num_partitions_) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", state.shard(), "'s table state has ",
                                                   state.partitions_size(), " partitions; the job has ",
                                                   num_partitions_));
  }
  RETURN_IF_ERROR(CheckShardStateSteps(state));
  // Rows of the state, checked against the job's tables.
  auto rows_of = [&](const v1::TableShardState::Rows& rows, std::vector<uint64_t>* keys,
                     std::vector<float>* values) -> absl::Status {
    if (rows.table() < 0 || rows.table() >= num_tables() || rows.partition() < 0 ||
        rows.partition() >= num_partitions_ || rows.keys().size() % sizeof(uint64_t) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", state.shard(), "'s table state names table ",
                                                     rows.table(), " partition ", rows.partition()));
    }
    *keys = KeysOf(rows.keys());
    values->resize(keys->size() * static_cast<size_t>(dim(rows.table())));
    return DecodeFloats(rows.values(), static_cast<int64_t>(values->size()), values->data(),
                        absl::StrCat("shard ", state.shard(), "'s table state: rows of table ", rows.table()));
  };
  MutexLock lock(&push_mu_);
  sync_step_ = state.sync_step();
  now_ = state.now();
  next_expiry_ = state.next_expiry();
  undo_step_ = state.undo_step();
  restored_.assign(state.restored().begin(), state.restored().end());
  int64_t held = 0;
  whole_partitions_ = 0;
  for (int p = 0; p < num_partitions_; ++p) {
    const v1::TableShardState::Partition& partition = state.partitions(p);
    Applied& applied = applied_[static_cast<size_t>(p)][0];
    applied.step = partition.applied_step();
    applied.parts = std::set<int32_t>(partition.applied_parts().begin(), partition.applied_parts().end());
    applied.expected = partition.applied_parts_expected();
    PartitionGather& gather = gather_[static_cast<size_t>(p)];
    gather = PartitionGather();
    gather.shards.resize(1);
    gather.shards[0].parts = partition.parts();
    gather.shards[0].seen = std::set<int32_t>(partition.seen().begin(), partition.seen().end());
    if (partition.parts() > 0 && static_cast<int32_t>(gather.shards[0].seen.size()) == partition.parts()) {
      gather.whole_shards = 1;
      ++whole_partitions_;
    }
  }
  for (const v1::TableShardState::Rows& rows : state.gathered()) {
    Gathered kept{rows.table(), {}, {}};
    RETURN_IF_ERROR(rows_of(rows, &kept.keys, &kept.grads));
    if (kept.keys.empty()) continue;
    const auto bytes = static_cast<int64_t>(kept.keys.size() * sizeof(uint64_t) + kept.grads.size() * sizeof(float));
    PartitionGather& gather = gather_[static_cast<size_t>(rows.partition())];
    gather.bytes += bytes;
    held += bytes;
    gather.rows.push_back(std::move(kept));
  }
  for (Undo& undo : undo_) undo = Undo();
  for (const v1::TableShardState::Rows& rows : state.undo()) {
    Undo& undo = undo_[static_cast<size_t>(std::clamp(rows.table(), 0, num_tables() - 1))];
    RETURN_IF_ERROR(rows_of(rows, &undo.keys, &undo.rows));
    held += static_cast<int64_t>(undo.rows.size() * sizeof(float));
  }
  held_bytes_ = held;
  for (const v1::TableShardState::Floors& floors : state.floors()) {
    // A state written before floors were shared names one chunk in chunk_id.
    const bool single = floors.chunk_ids().empty();
    for (int i = 0; i < (single ? 1 : floors.chunk_ids_size()); ++i) {
      const int32_t chunk_id = single ? floors.chunk_id() : floors.chunk_ids(i);
      if (HeldBucket(chunk_id) == nullptr || floors.steps_size() != num_partitions_) {
        return absl::InvalidArgumentError(
            absl::StrCat("shard ", state.shard(), "'s table state has floors of chunk ", chunk_id, " (",
                         floors.steps_size(), " steps; the job has ", num_partitions_, " partitions)"));
      }
      SetFloorLocked(chunk_id, absl::MakeConstSpan(floors.steps().data(), floors.steps().size()));
    }
  }
  // A step whose every part was in at the source applies here now: no push
  // of it is coming.
  if (has_sync_ && whole_partitions_ == num_partitions_) {
    absl::StatusOr<GatheredStep> summed = SumGatheredStepLocked();
    if (!summed.ok()) return summed.status();
    ApplyGatheredStepLocked(*std::move(summed));
  }
  return absl::OkStatus();
}

ChunkSnapshot SparseShard::SnapshotLocked(const Table& table, int32_t chunk_id, SparseTable& bucket,
                                          const std::vector<std::vector<int64_t>>& positions,
                                          CaptureOf of) const {
  ChunkSnapshot snapshot;
  if (table.setup.synchronous) {
    // Every step before the one being gathered is in; that one runs again.
    snapshot.version = sync_step_;
    snapshot.partition_steps.assign(static_cast<size_t>(num_partitions_), sync_step_);
  } else {
    snapshot.version = now_;
    const auto [t, b] = TableBucketOf(chunk_id);
    absl::StatusOr<size_t> slot = SlotOf(table.setup.bucket_shards[static_cast<size_t>(b)]);
    snapshot.partition_steps = slot.ok() ? positions[*slot] : std::vector<int64_t>(applied_.size(), 0);
    // A restored bucket holds every step before its own floor (a restore
    // onto other servers brings buckets of different captures together).
    const std::vector<int64_t>* floor = FloorOfLocked(t, b);
    const std::vector<int64_t>& below = floor != nullptr ? *floor : restored_;
    for (size_t p = 0; p < snapshot.partition_steps.size() && p < below.size(); ++p) {
      snapshot.partition_steps[p] = std::max(snapshot.partition_steps[p], below[p]);
    }
  }
  if (of.checkpoint_id > 0) {
    const int64_t base = of.base == nullptr ? 0 : of.base->checkpoint_id;
    const bool stored = of.base != nullptr && of.base->chunks.count(chunk_id) > 0;
    snapshot.table_base = bucket.AppendCheckpointState(of.checkpoint_id, base, stored, &snapshot.table_state);
  } else {
    bucket.AppendState(&snapshot.table_state);
  }
  return snapshot;
}

void SparseShard::SnapshotTablesLocked(bool synchronous, CaptureOf of,
                                       std::vector<std::pair<int32_t, ChunkSnapshot>>* out) const {
  const std::vector<std::vector<int64_t>> positions = CapturePositionsLocked();
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (tables_[t].setup.synchronous != synchronous) continue;
    for (size_t b = 0; b < tables_[t].buckets.size(); ++b) {
      SparseTable* bucket = tables_[t].buckets[b].get();
      if (bucket == nullptr) continue;
      const int32_t chunk_id = TableChunkId(static_cast<int32_t>(t), static_cast<int32_t>(b));
      out->emplace_back(chunk_id, SnapshotLocked(tables_[t], chunk_id, *bucket, positions, of));
    }
  }
}

std::vector<std::pair<int32_t, ChunkSnapshot>> SparseShard::Capture() const {
  MutexLock lock(&push_mu_);  // between pushes: every bucket at the same point
  std::vector<std::pair<int32_t, ChunkSnapshot>> captured;
  SnapshotTablesLocked(/*synchronous=*/true, CaptureOf(), &captured);
  SnapshotTablesLocked(/*synchronous=*/false, CaptureOf(), &captured);
  std::sort(captured.begin(), captured.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return captured;
}

absl::Status SparseShard::ArmCapture(int64_t checkpoint_id, int64_t at_step, IncrementalBase base) {
  MutexLock lock(&push_mu_);
  Armed armed;
  armed.checkpoint_id = checkpoint_id;
  armed.base = std::move(base);
  armed.at_step = at_step == 0 ? sync_step_ : at_step;
  if (holds_sync_ && armed.at_step < sync_step_) {
    return absl::AbortedError(absl::StrCat("the synchronous sparse tables are at step ", sync_step_,
                                           ", past the checkpoint's ", armed.at_step));
  }
  if (!holds_sync_ || armed.at_step == sync_step_) {  // nothing synchronous here to wait for
    SnapshotTablesLocked(/*synchronous=*/true, CaptureOf{checkpoint_id, &armed.base}, &armed.snapshots);
    armed.taken = true;
  }
  armed_ = std::move(armed);
  captured_cv_.SignalAll();  // a capture armed before gives up
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<int32_t, ChunkSnapshot>>> SparseShard::TakeCapture(int64_t checkpoint_id,
                                                                                       absl::Time deadline) {
  MutexLock lock(&push_mu_);
  while (armed_.has_value() && armed_->checkpoint_id == checkpoint_id && !armed_->taken && frozen_reason_.empty()) {
    if (captured_cv_.WaitWithDeadline(&push_mu_, deadline)) break;
  }
  if (!armed_.has_value() || armed_->checkpoint_id != checkpoint_id) {
    return absl::AbortedError(absl::StrCat("checkpoint ", checkpoint_id,
                                           ": another capture of the sparse tables was armed since"));
  }
  if (!armed_->taken) {
    const int64_t at = armed_->at_step;
    armed_.reset();
    return absl::DeadlineExceededError(absl::StrCat("checkpoint ", checkpoint_id,
                                                    ": the synchronous sparse tables did not reach step ", at,
                                                    " (they are at ", sync_step_, ")"));
  }
  std::vector<std::pair<int32_t, ChunkSnapshot>> captured = std::move(armed_->snapshots);
  const IncrementalBase base = std::move(armed_->base);
  armed_.reset();
  SnapshotTablesLocked(/*synchronous=*/false, CaptureOf{checkpoint_id, &base}, &captured);  // the asynchronous ones as they are now
  return captured;
}

void SparseShard::Disarm(int64_t checkpoint_id) {
  MutexLock lock(&push_mu_);
  if (armed_.has_value() && armed_->checkpoint_id == checkpoint_id) armed_.reset();
}

size_t SparseShard::FloorHash::operator()(absl::Span<const int64_t> steps) const {
  return absl::Hash<absl::Span<const int64_t>>{}(steps);
}

void SparseShard::SetFloorLocked(int32_t chunk_id, absl::Span<const int64_t> steps) {
  if (floors_.empty()) {
    floors_.resize(tables_.size());
    for (size_t i = 0; i < tables_.size(); ++i) floors_[i].resize(tables_[i].buckets.size());
  }
  auto found = distinct_floors_.find(steps);
  if (found == distinct_floors_.end()) {
    found = distinct_floors_.insert(std::make_shared<const std::vector<int64_t>>(steps.begin(), steps.end()))
                .first;
  }
  const auto [t, b] = TableBucketOf(chunk_id);
  floors_[static_cast<size_t>(t)][static_cast<size_t>(b)] = *found;
}

const std::vector<int64_t>* SparseShard::FloorOfLocked(int32_t table, int32_t bucket) const {
  if (floors_.empty()) return nullptr;
  return floors_[static_cast<size_t>(table)][static_cast<size_t>(bucket)].get();
}

absl::Status SparseShard::ApplyRestoredChanges(int32_t chunk_id, const std::string& changes) {
  MutexLock lock(&push_mu_);
  return ApplyBucketChangesLocked(chunk_id, changes);
}

void SparseShard::MarkRestored(int32_t chunk_id, int64_t checkpoint_id) {
  MutexLock lock(&push_mu_);
  if (SparseTable* bucket = HeldBucket(chunk_id); bucket != nullptr) bucket->MarkCheckpoint(checkpoint_id);
}

absl::Status SparseShard::Restore(int32_t chunk_id, const ChunkSnapshot& snapshot,
                                  std::optional<int64_t> repartitioned_at) {
  if (HeldBucket(chunk_id) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk_id, " is no table bucket held here"));
  }
  const auto [t, b] = TableBucketOf(chunk_id);
  if (!repartitioned_at.has_value() && snapshot.partition_steps.size() != static_cast<size_t>(num_partitions_)) {
    return absl::InvalidArgumentError(absl::StrCat("table bucket chunk ", chunk_id, " has steps of ",
                                                   snapshot.partition_steps.size(), " partitions; the job has ",
                                                   num_partitions_));
  }
  // A capture's position is the step after its last (IsStepPosition).
  if (!IsStepPosition(snapshot.version) ||
      (repartitioned_at.has_value() && !IsStepPosition(*repartitioned_at)) ||
      !std::all_of(snapshot.partition_steps.begin(), snapshot.partition_steps.end(), IsStepPosition)) {
    return absl::DataLossError(
        absl::StrCat("table bucket chunk ", chunk_id, " has a step outside [0, ", kMaxSparseStep + 1, "]"));
  }
  const Table& table = tables_[static_cast<size_t>(t)];
  MutexLock lock(&push_mu_);
  RETURN_IF_ERROR(LoadBucketLocked(chunk_id, snapshot.table_state));
  if (table.setup.synchronous) {
    int64_t at = repartitioned_at.value_or(0);
    for (int64_t step : snapshot.partition_steps) at = std::max(at, step);
    sync_step_ = std::max(sync_step_, at);
  }
  for (size_t p = 0; p < restored_.size(); ++p) {
    restored_[p] = std::max(restored_[p], repartitioned_at.value_or(snapshot.partition_steps[p]));
  }
  if (!repartitioned_at.has_value()) SetFloorLocked(chunk_id, snapshot.partition_steps);
  now_ = std::max(now_, snapshot.version);
  return absl::OkStatus();
}

void SparseShard::Freeze(const std::string& reason) {
  MutexLock lock(&push_mu_);
  frozen_reason_ = reason.empty() ? "frozen" : reason;
  captured_cv_.SignalAll();
}

std::vector<SparseTableStats> SparseShard::Stats() const {
  std::vector<SparseTableStats> stats;
  for (const Table& table : tables_) {
    SparseTableStats s;
    s.name = table.setup.config.name;
    for (const auto& bucket : table.buckets) {
      if (bucket == nullptr) continue;
      s.rows += bucket->rows();
      s.bytes += bucket->bytes();
      s.admissions += bucket->admissions();
      s.expiries += bucket->expiries();
    }
    stats.push_back(std::move(s));
  }
  return stats;
}

int64_t SparseShard::bytes() const {
  int64_t total = held_bytes_.load();
  for (const Table& table : tables_) {
    for (const auto& bucket : table.buckets) {
      if (bucket != nullptr) total += bucket->bytes();
    }
  }
  return total;
}

}  // namespace fulcrum
