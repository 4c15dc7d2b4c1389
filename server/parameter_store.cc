#include "server/parameter_store.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/data_partition.h"
#include "common/finite.h"
#include "common/memory_budget.h"
#include "common/status_macros.h"
#include "common/sync.h"
#include "common/tensor_codec.h"

namespace fulcrum {

ValuesLease::ValuesLease(std::shared_ptr<ChunkValues> values) : values_(std::move(values)) {
  values_->leases.fetch_add(1, std::memory_order_relaxed);  // under the chunk's lock, which writers take
}

ValuesLease& ValuesLease::operator=(ValuesLease&& other) noexcept {
  if (this != &other) {
    Return();
    values_ = std::move(other.values_);
  }
  return *this;
}

void ValuesLease::Return() {
  if (values_ == nullptr) return;
  // Release: the reads of whoever sent the values come before a writer
  // that sees no lease left (its acquire load in WritableValuesLocked).
  values_->leases.fetch_sub(1, std::memory_order_release);
  values_.reset();
}

ChunkValues::~ChunkValues() {
  if (orphaned != nullptr) orphaned->fetch_sub(orphaned_bytes);
}

namespace {

bool Leased(const ChunkValues& values) { return values.leases.load(std::memory_order_acquire) != 0; }

// A chunk lets go of `values`: if pull answers still send them, their bytes
// count in `orphaned` (when set) until the last answer drops them.
void LetGo(std::shared_ptr<ChunkValues> values, const std::shared_ptr<std::atomic<int64_t>>& orphaned) {
  if (values == nullptr || orphaned == nullptr || !Leased(*values)) return;
  // Only this chunk's reference and the leases' remain, and a lease that
  // drops the last one runs ~ChunkValues after `values` here lets go.
  values->orphaned_bytes = static_cast<int64_t>(values->data.size() * sizeof(float));
  orphaned->fetch_add(values->orphaned_bytes);
  values->orphaned = orphaned;
}

}  // namespace

Chunk::Chunk(const ChunkConfig& config, const JobShardConfig& job) : config_(config), job_(job) {
  MutexLock lock(&mu_);
  values_ = std::make_shared<ChunkValues>();
  values_->data.resize(config.length);
  FillInit(config.init, config.init_scale, job.seed, static_cast<uint32_t>(config.tensor),
           config.offset, config.length, values_->data.data());
  state_.assign(OptimizerStateSlots(job.optimizer), std::vector<float>(config.length, 0.0f));
  std::vector<float*> slots;
  for (auto& slot : state_) slots.push_back(slot.data());
  InitOptimizerState(job.optimizer, config.length, slots.data());
  if (job.synchronous) {
    pending_.resize(job.num_partitions);
  } else {
    partition_steps_.assign(job.num_partitions, 0);
  }
}

Chunk::~Chunk() {
  MutexLock lock(&mu_);
  LetGo(std::move(values_), job_.orphaned_values);
  LetGo(std::move(previous_), job_.orphaned_values);
}

absl::Status Chunk::DroppedError() const {
  // ABORTED, not CANCELLED: for a job that goes on elsewhere (this copy was
  // replaced or found stale) the caller's answer is to refresh its shard map.
  return absl::AbortedError(absl::StrCat("job ", job_.job_id, " was stopped on this server: ", dropped_reason_,
                                         " (refresh the shard map)"));
}

int64_t Chunk::version() const {
  MutexLock lock(&mu_);
  return version_;
}

absl::Status Chunk::CheckPush(const PushArgs& args) const {
  if (!dropped_reason_.empty()) {
    return DroppedError();
  }
  if (!frozen_reason_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_.job_id, " takes no more pushes: ", frozen_reason_));
  }
  if (args.partition < 0 || args.partition >= job_.num_partitions) {
    return absl::InvalidArgumentError(absl::StrCat("push for partition ", args.partition, " out of range [0, ",
                                                   job_.num_partitions, ") for job ", job_.job_id));
  }
  if (job_.synchronous && args.step > version_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push for step ", args.step, " to chunk ", config_.chunk_id, " of job ", job_.job_id,
        " which is at step ", version_, ": pull the current parameters first"));
  }
  return absl::OkStatus();
}

namespace {

// InvalidArgument naming the first non-finite value of a decoded gradient.
absl::Status CheckFinite(const PushArgs& args, const float* grad, const ChunkConfig& config,
                         const std::string& job_id) {
  const int64_t i = FirstNonFinite(grad, config.length);
  if (i < 0) return absl::OkStatus();
  const bool fp16_overflow = args.format == v1::WIRE_FP16 && std::isinf(grad[i]);
  return absl::InvalidArgumentError(absl::StrCat(
      "push from worker ", args.worker_id, " to chunk ", config.chunk_id, " of job ", job_id,
      " has a non-finite gradient (", grad[i], ") at element ", i,
      fp16_overflow ? ": beyond fp16's range (wireFormat WIRE_FP16); use WIRE_BF16 or lower optimizer.lr"
                    : ": the model diverged; lower optimizer.lr"));
}

absl::Status DecodeGradient(const PushArgs& args, const ChunkConfig& config, const std::string& job_id,
                            std::vector<float>* grad) {
  grad->resize(config.length);
  RETURN_IF_ERROR(DecodeValues(args.format, args.gradient, config.length, grad->data(),
                               absl::StrCat("push to chunk ", config.chunk_id, " of job ", job_id)));
  return CheckFinite(args, grad->data(), config, job_id);
}

}  // namespace

absl::Status Chunk::Validate(const PushArgs& args) const {
  if (args.values != nullptr) {
    RETURN_IF_ERROR(CheckFinite(args, args.values, config_, job_.job_id));
  } else {
    std::vector<float> grad;
    RETURN_IF_ERROR(DecodeGradient(args, config_, job_.job_id, &grad));
  }
  MutexLock lock(&mu_);
  return CheckPush(args);
}

absl::StatusOr<PushOutcome> Chunk::Push(const PushArgs& args) {
  // Decode and validate outside the lock (it is the expensive part), unless
  // the caller passed values Validate checked.
  std::vector<float> decoded;
  const float* grad = args.values;
  if (grad == nullptr) {
    RETURN_IF_ERROR(DecodeGradient(args, config_, job_.job_id, &decoded));
    grad = decoded.data();
  }
  MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckPush(args));
  auto mark = watermarks_.find(args.worker_id);
  if (mark != watermarks_.end() && args.seq <= mark->second) return PushOutcome::kDuplicate;
  if (job_.synchronous && (args.step < version_ || !pending_[args.partition].empty())) {
    return PushOutcome::kDuplicate;  // this partition's gradient for the step is already in
  }
  if (!job_.synchronous && args.step < partition_steps_[args.partition]) {
    return PushOutcome::kDuplicate;  // another worker already sent this partition's step
  }
  watermarks_[args.worker_id] = args.seq;
  examples_seen_ += args.examples;
  examples_digest_ += args.examples_digest;
  if (!job_.synchronous) {
    partition_steps_[args.partition] = args.step + 1;
    ApplyLocked(grad, args.step);
    return PushOutcome::kApplied;
  }
  // Into the buffer the partition had (its capacity stays between steps).
  pending_[args.partition].assign(grad, grad + config_.length);
  ++pending_count_;
  MaybeCompleteStepLocked();
  return PushOutcome::kBuffered;
}

void Chunk::SumPendingLocked() {
  // Sum in partition order, never arrival order, so a seeded BSP job is
  // bit-for-bit reproducible.
  scratch_.assign(config_.length, 0.0f);
  for (const auto& gradient : pending_) {
    for (int64_t i = 0; i < config_.length; ++i) scratch_[i] += gradient[i];
  }
  const float scale = 1.0f / static_cast<float>(job_.num_partitions);
  for (float& g : scratch_) g *= scale;
}

void Chunk::KeepPreviousLocked() {
  // The values before this step become previous_ as they are (pull answers
  // may be sending them); the step is applied to a copy, in the buffer the
  // step before used unless a pull still sends from that one.
  std::shared_ptr<ChunkValues> next;
  if (previous_ != nullptr && !Leased(*previous_)) {
    next = std::move(previous_);
  } else {
    LetGo(std::move(previous_), job_.orphaned_values);
    next = std::make_shared<ChunkValues>();
  }
  next->data.assign(values_->data.begin(), values_->data.end());
  previous_ = std::exchange(values_, std::move(next));
}

void Chunk::MaybeCompleteStepLocked() {
  if (pending_count_ < job_.num_partitions || lamb_waiting_) return;
  SumPendingLocked();
  if (lamb()) {
    // The first half of a LAMB step: this chunk's norms, then wait for the
    // tensor's (ApplyLambNorms). The gradients stay in pending_, so a copy
    // or a snapshot of the chunk holds the step.
    std::vector<const float*> slots;
    for (const auto& slot : state_) slots.push_back(slot.data());
    lamb_partial_ = LambBlockNorms(job_.optimizer, version_ + 1, config_.length, scratch_.data(),
                                   values_->data.data(), slots.data());
    lamb_waiting_ = true;
    ChangedLocked();
    return;
  }
  ApplyStepLocked(nullptr);
}

void Chunk::ApplyStepLocked(const LambNorms* lamb) {
  for (auto& gradient : pending_) gradient.clear();
  pending_count_ = 0;
  KeepPreviousLocked();
  ApplyLocked(scratch_.data(), version_, lamb);
}

absl::Status Chunk::NotLambError() const {
  return absl::FailedPreconditionError(
      absl::StrCat("chunk ", config_.chunk_id, " of job ", job_.job_id, " does not run LAMB in BSP"));
}

bool Chunk::LambReady(int64_t step) const {
  MutexLock lock(&mu_);
  // Not LAMB: answered at once (LambPartialOf says why), not held.
  return !lamb() || version_ > step || (version_ == step && lamb_waiting_) || !dropped_reason_.empty() ||
         !frozen_reason_.empty();
}

absl::Status Chunk::LambPartialOf(int64_t step, v1::LambPartial* partial, int64_t* version) const {
  MutexLock lock(&mu_);
  if (!dropped_reason_.empty()) return DroppedError();
  *version = version_;
  partial->set_step(step);
  if (!lamb()) return NotLambError();
  if (version_ >= step + 2) {
    partial->set_settled(true);
    return absl::OkStatus();
  }
  if (version_ == step && lamb_waiting_) {
    partial->set_weight_sq(lamb_partial_.weight_sq);
    partial->set_update_sq(lamb_partial_.update_sq);
    return absl::OkStatus();
  }
  if (version_ == step + 1 && lamb_last_.step == step) {
    partial->set_weight_sq(lamb_last_.weight_sq);
    partial->set_update_sq(lamb_last_.update_sq);
    return absl::OkStatus();
  }
  if (version_ == step + 1) {
    // Applied, its norms not kept: restored from a checkpoint cut at this
    // version, where every chunk of the job was cut at once, so no chunk of
    // its tensor waits for the step.
    partial->set_settled(true);
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "chunk ", config_.chunk_id, " of job ", job_.job_id, " is at version ", version_,
      " and has not every partition's gradient of step ", step,
      frozen_reason_.empty() ? "" : absl::StrCat(" (the job takes no more pushes: ", frozen_reason_, ")")));
}

absl::StatusOr<PushOutcome> Chunk::ApplyLambNorms(int64_t step, const LambNorms& tensor) {
  RETURN_IF_ERROR(CheckLambNorms(tensor, absl::StrCat("for chunk ", config_.chunk_id, " of job ", job_.job_id)));
  MutexLock lock(&mu_);
  if (!dropped_reason_.empty()) return DroppedError();
  if (!lamb()) return NotLambError();
  if (version_ > step) return PushOutcome::kDuplicate;
  if (!frozen_reason_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_.job_id, " takes no more pushes: ", frozen_reason_));
  }
  if (version_ < step || !lamb_waiting_) {
    return absl::FailedPreconditionError(absl::StrCat("LAMB norms of step ", step, " for chunk ", config_.chunk_id,
                                                      " of job ", job_.job_id, " which is at step ", version_,
                                                      " without every partition's gradient of it"));
  }
  lamb_waiting_ = false;
  lamb_last_ = {step, lamb_partial_.weight_sq, lamb_partial_.update_sq};
  ApplyStepLocked(&tensor);
  return PushOutcome::kApplied;
}

float* Chunk::WritableValuesLocked() {
  if (Leased(*values_)) {
    auto copy = std::make_shared<ChunkValues>();
    copy->data = values_->data;
    LetGo(std::exchange(values_, std::move(copy)), job_.orphaned_values);
  }
  return values_->data.data();
}

void Chunk::ApplyLocked(const float* grad, int64_t lr_step, const LambNorms* lamb) {
  float lr = LearningRate(job_.schedule, job_.lr, lr_step);
  std::vector<float*> slots;
  for (auto& slot : state_) slots.push_back(slot.data());
  ++version_;
  const absl::Time start = job_.observe_apply ? absl::Now() : absl::InfinitePast();
  if (lamb != nullptr) {
    ApplyLamb(job_.optimizer, lr, version_, config_.length, grad, WritableValuesLocked(), slots.data(), *lamb);
  } else {
    ApplyOptimizer(job_.optimizer, lr, version_, config_.length, grad, WritableValuesLocked(), slots.data());
  }
  if (job_.observe_apply) job_.observe_apply(absl::ToDoubleSeconds(absl::Now() - start));
  if (!captures_.empty()) CaptureLocked();
  ChangedLocked();
}

int64_t Chunk::MinClockLocked() const {
  if (partition_steps_.empty()) return version_;
  return *std::min_element(partition_steps_.begin(), partition_steps_.end());
}

absl::Status Chunk::Pull(int64_t min_version, int64_t min_clock, absl::Time deadline, std::string* data,
                         int64_t* version, int64_t* clock, v1::WireFormat format,
                         const std::function<bool()>& cancelled) {
  // How often a waiting pull asks whether its caller gave up.
  constexpr absl::Duration kCancelCheck = absl::Milliseconds(50);
  MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ReadyLocked(min_version, min_clock); };
  while (!ready()) {
    if (cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat("pull of chunk ", config_.chunk_id, " of job ", job_.job_id,
                                               ": cancelled by the client while waiting for step ",
                                               std::max(min_version, min_clock)));
    }
    const absl::Time until = cancelled ? std::min(deadline, absl::Now() + kCancelCheck) : deadline;
    if (updated_.WaitWithDeadline(&mu_, until) && until == deadline && !ready()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "pull of chunk ", config_.chunk_id, " of job ", job_.job_id, " waited for step ", std::max(min_version, min_clock),
          " but the chunk is at step ", version_, ", its slowest partition at ", MinClockLocked(),
          " (a worker is missing?)"));
    }
  }
  if (!dropped_reason_.empty()) {
    return DroppedError();
  }
  EncodeValues(format, values_->data.data(), config_.length, data);
  *version = version_;
  if (clock != nullptr) *clock = MinClockLocked();
  return absl::OkStatus();
}

bool Chunk::ReadyLocked(int64_t min_version, int64_t min_clock) const {
  return (version_ >= min_version && MinClockLocked() >= min_clock) || !dropped_reason_.empty() ||
         !frozen_reason_.empty();
}

bool Chunk::Ready(int64_t min_version, int64_t min_clock) const {
  MutexLock lock(&mu_);
  return ReadyLocked(min_version, min_clock);
}

absl::Status Chunk::Read(v1::WireFormat format, std::string* data, int64_t* version, int64_t* clock,
                         int64_t exact_version, ValuesLease* lease) const {
  MutexLock lock(&mu_);
  if (!dropped_reason_.empty()) return DroppedError();
  const std::shared_ptr<ChunkValues>* values = &values_;
  if (exact_version >= 0 && exact_version != version_) {
    if (!job_.synchronous || exact_version != version_ - 1 || previous_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", config_.chunk_id, " of job ", job_.job_id, " is at version ", version_,
                       ": it cannot give the values of version ", exact_version,
                       job_.synchronous ? " (it keeps only the last step's)" : " (an ASP/SSP job keeps no old values)"));
    }
    values = &previous_;
  }
#ifdef ABSL_IS_LITTLE_ENDIAN
  const bool as_they_are = WireBytes(format) == 4;  // float32: the values' own bytes
#else
  const bool as_they_are = false;
#endif
  if (lease != nullptr && as_they_are) {
    *lease = ValuesLease(*values);
    data->clear();
  } else {
    EncodeValues(format, (*values)->data.data(), config_.length, data);
  }
  *version = exact_version >= 0 ? exact_version : version_;
  *clock = MinClockLocked();
  return absl::OkStatus();
}

void Chunk::ChangedLocked() {
  updated_.SignalAll();
  if (job_.on_change) job_.on_change();
}

ChunkSnapshot Chunk::Snapshot() const {
  MutexLock lock(&mu_);
  return SnapshotLocked();
}

ChunkSnapshot Chunk::SnapshotLocked() const {
  ChunkSnapshot snapshot;
  snapshot.values = values_->data;
  snapshot.optimizer_state = state_;
  snapshot.version = version_;
  snapshot.pending = pending_;
  if (previous_ != nullptr) snapshot.previous_values = previous_->data;
  // In writer order: a hash map iterates in an order that differs from
  // process to process, and replicas of a chunk must encode (and checksum)
  // the same state the same way.
  snapshot.watermarks.assign(watermarks_.begin(), watermarks_.end());
  std::sort(snapshot.watermarks.begin(), snapshot.watermarks.end());
  snapshot.partition_steps = partition_steps_;
  snapshot.examples_seen = examples_seen_;
  snapshot.examples_digest = examples_digest_;
  snapshot.lamb_last = lamb_last_;
  return snapshot;
}

absl::Status Chunk::Restore(const ChunkSnapshot& snapshot) {
  MutexLock lock(&mu_);
  bool fits = snapshot.values.size() == values_->data.size() && snapshot.optimizer_state.size() == state_.size() &&
              snapshot.pending.size() == pending_.size() && snapshot.partition_steps.size() == partition_steps_.size();
  for (size_t i = 0; fits && i < state_.size(); ++i) fits = snapshot.optimizer_state[i].size() == state_[i].size();
  fits = fits && (snapshot.previous_values.empty() || snapshot.previous_values.size() == values_->data.size());
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", config_.chunk_id, " of job ", job_.job_id,
                                                   ": the copied state does not match its shape"));
  }
  // A position past any job's (a corrupt record, a peer's bad copy) would
  // make every later push of its partition a silent duplicate.
  if (!IsStepPosition(snapshot.version) ||
      !std::all_of(snapshot.partition_steps.begin(), snapshot.partition_steps.end(), IsStepPosition)) {
    return absl::DataLossError(absl::StrCat("chunk ", config_.chunk_id, " of job ", job_.job_id,
                                            ": the copied state has a step outside [0, ", kMaxJobStep + 1,
                                            "]"));
  }
  // New buffers: pull answers may still be sending the old ones.
  LetGo(std::exchange(values_, std::make_shared<ChunkValues>()), job_.orphaned_values);
  values_->data = snapshot.values;
  state_ = snapshot.optimizer_state;
  version_ = snapshot.version;
  pending_ = snapshot.pending;
  LetGo(std::exchange(previous_, nullptr), job_.orphaned_values);
  if (!snapshot.previous_values.empty()) {
    previous_ = std::make_shared<ChunkValues>();
    previous_->data = snapshot.previous_values;
  }
  pending_count_ = 0;
  for (const auto& p : pending_) pending_count_ += p.empty() ? 0 : 1;
  lamb_waiting_ = false;
  lamb_last_ = snapshot.lamb_last;
  watermarks_.clear();
  for (const auto& [worker, seq] : snapshot.watermarks) watermarks_[worker] = seq;
  partition_steps_ = snapshot.partition_steps;
  examples_seen_ = snapshot.examples_seen;
  examples_digest_ = snapshot.examples_digest;
  if (lamb()) MaybeCompleteStepLocked();  // a whole step waits for its norms again
  ChangedLocked();
  return absl::OkStatus();
}

absl::Status Chunk::RestoreCheckpoint(ChunkSnapshot snapshot, bool repartition, int64_t version,
                                      int64_t partition_step) {
  if (repartition) {
    MutexLock lock(&mu_);
    snapshot.pending.assign(pending_.size(), {});
    snapshot.partition_steps.assign(partition_steps_.size(), partition_step);
    snapshot.version = version;
  }
  return Restore(snapshot);
}

void Chunk::CaptureLocked() {
  for (auto& [id, capture] : captures_) {
    if (!capture.taken && capture.at_version == version_) {
      capture.snapshot = SnapshotLocked();
      capture.taken = true;
      updated_.SignalAll();
    }
  }
}

absl::Status Chunk::ArmCapture(int64_t checkpoint_id, int64_t at_version) {
  MutexLock lock(&mu_);
  if (at_version > 0 && version_ > at_version) {
    return absl::AbortedError(absl::StrCat("chunk ", config_.chunk_id, " of job ", job_.job_id, " is at version ",
                                           version_, ", past the checkpoint's ", at_version));
  }
  Capture& capture = captures_[checkpoint_id];
  capture.at_version = at_version == 0 ? version_ : at_version;
  capture.taken = false;
  CaptureLocked();
  return absl::OkStatus();
}

absl::StatusOr<ChunkSnapshot> Chunk::TakeCapture(int64_t checkpoint_id, absl::Time deadline) {
  MutexLock lock(&mu_);
  auto it = captures_.find(checkpoint_id);
  if (it == captures_.end()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint ", checkpoint_id, " armed on chunk ", config_.chunk_id));
  }
  while (!it->second.taken && dropped_reason_.empty()) {
    if (updated_.WaitWithDeadline(&mu_, deadline) && !it->second.taken) {
      int64_t at = it->second.at_version;
      captures_.erase(it);
      return absl::DeadlineExceededError(absl::StrCat("checkpoint ", checkpoint_id, ": chunk ", config_.chunk_id,
                                                      " of job ", job_.job_id, " did not reach version ", at,
                                                      " (it is at ", version_, ")"));
    }
  }
  if (!it->second.taken) {
    captures_.erase(it);
    return DroppedError();
  }
  ChunkSnapshot snapshot = std::move(it->second.snapshot);
  captures_.erase(it);
  return snapshot;
}

void Chunk::Disarm(int64_t checkpoint_id) {
  MutexLock lock(&mu_);
  captures_.erase(checkpoint_id);
}

void Chunk::Freeze(const std::string& reason) {
  MutexLock lock(&mu_);
  frozen_reason_ = reason.empty() ? "finished" : reason;
  ChangedLocked();
}

void Chunk::Drop(const std::string& reason) {
  MutexLock lock(&mu_);
  dropped_reason_ = reason.empty() ? "dropped" : reason;
  ChangedLocked();
}

JobShard::JobShard(JobShardConfig config) : config_(std::move(config)) {}

// The Chunk, its values' shared blocks and its node in the job's map.
static_assert(sizeof(Chunk) + 2 * sizeof(ChunkValues) + 128 <= JobShard::kChunkFixedBytes);
static_assert(sizeof(JobShard) <= JobShard::kJobFixedBytes / 4);

namespace {

// The arrays a chunk of `job` holds: values, optimizer slots and (BSP) a
// gradient buffer per data partition, a sum and the previous step's values.
int64_t ChunkArrays(const JobShardConfig& job) {
  int64_t copies = 1 + OptimizerStateSlots(job.optimizer);
  if (job.synchronous) copies += std::max(0, job.num_partitions) + 2;
  return copies;
}

}  // namespace

int64_t JobShard::ChunkStateBytes(int64_t length, const JobShardConfig& job) {
  const int64_t copies = ChunkArrays(job);
  // A setup's sizes are checked against budgets before its chunks are
  // validated (Create): a length out of range counts as nothing (Create
  // refuses it) or as everything, never as an overflowed product.
  const int64_t per_value = copies * static_cast<int64_t>(sizeof(float));
  if (length <= 0) return 0;
  if (length > std::numeric_limits<int64_t>::max() / per_value) return std::numeric_limits<int64_t>::max();
  return length * per_value;
}

int64_t JobShard::ChunkBytes(int64_t length, const JobShardConfig& job) {
  const int64_t state = ChunkStateBytes(length, job);
  if (state == 0) return 0;
  const int64_t fixed = kChunkFixedBytes + ChunkArrays(job) * kArrayFixedBytes;
  return state > std::numeric_limits<int64_t>::max() - fixed ? std::numeric_limits<int64_t>::max()
                                                             : state + fixed;
}

int64_t JobShard::ConfigBytes(const JobShardConfig& config) {
  int64_t bytes = kJobFixedBytes + SparseShard::EmptyBytes(config.tables, config.table_shards);
  for (const ChunkConfig& chunk : config.chunks) {
    const int64_t more = ChunkBytes(chunk.length, config);
    if (more > std::numeric_limits<int64_t>::max() - bytes) return std::numeric_limits<int64_t>::max();
    bytes += more;
  }
  return bytes;
}

int64_t JobShard::bytes() const {
  MutexLock lock(&chunks_mu_);
  int64_t bytes = kJobFixedBytes;
  for (const auto& [id, chunk] : chunks_) bytes += ChunkBytes(chunk->length(), config_);
  if (sparse_ != nullptr) bytes += sparse_->bytes();
  return bytes;
}

absl::StatusOr<std::unique_ptr<JobShard>> JobShard::Create(JobShardConfig config) {
  if (config.num_partitions < 1 || config.num_partitions > kMaxPartitions) {
    return absl::InvalidArgumentError(absl::StrCat("job ", config.job_id, ": num_partitions must be in [1, ",
                                                   kMaxPartitions, "] (got ", config.num_partitions, ")"));
  }
  for (const ChunkConfig& chunk : config.chunks) {
    if (chunk.length <= 0 || chunk.length > kMaxChunkElements) {
      return absl::InvalidArgumentError(absl::StrCat("job ", config.job_id, ": chunk ", chunk.chunk_id, " has length ",
                                                     chunk.length, " (must be in [1, ", kMaxChunkElements, "])"));
    }
  }
  try {  // an allocation that fails fails the setup, not the process
    return CreateChunks(std::move(config));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory allocating the job's chunks on this server");
  }
}

absl::StatusOr<std::unique_ptr<JobShard>> JobShard::CreateChunks(JobShardConfig config) {
  std::unique_ptr<JobShard> shard(new JobShard(std::move(config)));
  if (!shard->config_.tables.empty()) {
    ASSIGN_OR_RETURN(shard->sparse_, SparseTables::Create(shard->config_.tables, shard->config_.table_shards,
                                                          shard->config_.num_partitions, shard->config_.tables_room));
  }
  for (const ChunkConfig& chunk : shard->config_.chunks) {
    {
      MutexLock lock(&shard->roles_mu_);
      shard->shard_of_[chunk.chunk_id] = chunk.shard;
    }
    auto [it, inserted] =
        [&] {
          MutexLock lock(&shard->chunks_mu_);
          auto emplaced =
              shard->chunks_.emplace(chunk.chunk_id, std::make_shared<Chunk>(chunk, shard->config_));
          if (emplaced.second) shard->index_[chunk.chunk_id] = emplaced.first->second;
          return emplaced;
        }();
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("job ", shard->config_.job_id, ": chunk ", chunk.chunk_id, " listed twice"));
    }
  }
  return shard;
}

absl::StatusOr<std::shared_ptr<Chunk>> JobShard::Find(int32_t chunk_id) const {
  MutexLock lock(&chunks_mu_);
  if (copying_.count(chunk_id) > 0) {
    return absl::UnavailableError(absl::StrCat("chunk ", chunk_id, " of job ", config_.job_id,
                                               " is being copied to this server: retry"));
  }
  auto it = index_.find(chunk_id);
  if (it == index_.end()) {
    MutexLock roles_lock(&roles_mu_);
    if (auto moved = shard_of_.find(chunk_id); moved != shard_of_.end()) {  // freed once it moved
      return absl::AbortedError(absl::StrCat("chunk ", chunk_id, " of job ", config_.job_id,
                                             " moved to shard ", moved->second, ": refresh the shard map"));
    }
    return absl::NotFoundError(absl::StrCat("chunk ", chunk_id, " of job ", config_.job_id,
                                            " is not on this server (stale shard map?)"));
  }
  return it->second;
}

absl::StatusOr<PushOutcome> JobShard::Push(const PushArgs& args) {
  ASSIGN_OR_RETURN(std::shared_ptr<Chunk> chunk, Find(args.chunk_id));
  return chunk->Push(args);
}

absl::Status JobShard::Pull(int32_t chunk_id, int64_t min_version, int64_t min_clock, absl::Time deadline,
                            std::string* data, int64_t* version, int64_t* clock, v1::WireFormat format,
                            const std::function<bool()>& cancelled) {
  ASSIGN_OR_RETURN(std::shared_ptr<Chunk> chunk, Find(chunk_id));
  return chunk->Pull(min_version, min_clock, deadline, data, version, clock, format, cancelled);
}

int64_t JobShard::ChunkLength(int32_t chunk_id) const {
  absl::StatusOr<std::shared_ptr<Chunk>> chunk = Find(chunk_id);
  return chunk.ok() ? (*chunk)->length() : 0;
}

absl::StatusOr<int32_t> JobShard::ChunkTensor(int32_t chunk_id) const {
  ASSIGN_OR_RETURN(std::shared_ptr<Chunk> chunk, Find(chunk_id));
  return chunk->tensor();
}

bool JobShard::LambReady(int32_t chunk_id, int64_t step) const {
  absl::StatusOr<std::shared_ptr<Chunk>> chunk = Find(chunk_id);
  return !chunk.ok() || (*chunk)->LambReady(step);
}

absl::Status JobShard::LambPartialOf(int32_t chunk_id, int64_t step, v1::LambPartial* partial,
                                     int64_t* version) const {
  ASSIGN_OR_RETURN(std::shared_ptr<Chunk> chunk, Find(chunk_id));
  return chunk->LambPartialOf(step, partial, version);
}

absl::StatusOr<PushOutcome> JobShard::ApplyLambNorms(int32_t chunk_id, int64_t step, const LambNorms& tensor) {
  ASSIGN_OR_RETURN(std::shared_ptr<Chunk> chunk, Find(chunk_id));
  return chunk->ApplyLambNorms(step, tensor);
}

bool JobShard::Ready(int32_t chunk_id, int64_t min_version, int64_t min_clock) const {
  absl::StatusOr<std::shared_ptr<Chunk>> chunk = Find(chunk_id);
  return !chunk.ok() || (*chunk)->Ready(min_version, min_clock);
}

absl::Status JobShard::Read(int32_t chunk_id, v1::WireFormat format, std::string* data, int64_t* version,
                            int64_t* clock, int64_t exact_version, ValuesLease* lease) const {
  ASSIGN_OR_RETURN(std::shared_ptr<Chunk> chunk, Find(chunk_id));
  return chunk->Read(format, data, version, clock, exact_version, lease);
}

absl::StatusOr<ChunkSnapshot> JobShard::Snapshot(int32_t chunk_id) const {
  ASSIGN_OR_RETURN(std::shared_ptr<Chunk> chunk, Find(chunk_id));
  return chunk->Snapshot();
}

absl::Status JobShard::Restore(int32_t chunk_id, const ChunkSnapshot& snapshot) {
  ASSIGN_OR_RETURN(std::shared_ptr<Chunk> chunk, Find(chunk_id));
  return chunk->Restore(snapshot);
}

void JobShard::BeginCopy(const std::vector<int32_t>& chunk_ids) {
  MutexLock lock(&chunks_mu_);
  copying_.insert(chunk_ids.begin(), chunk_ids.end());
}

absl::Status JobShard::AdoptChunks(const std::vector<ChunkConfig>& chunks,
                                   const std::vector<ChunkSnapshot>& snapshots) {
  if (chunks.size() != snapshots.size()) return absl::InvalidArgumentError("AdoptChunks: one snapshot per chunk");
  for (size_t i = 0; i < chunks.size(); ++i) {
    std::shared_ptr<Chunk> chunk;
    {
      MutexLock lock(&chunks_mu_);
      auto& slot = chunks_[chunks[i].chunk_id];
      if (slot == nullptr) slot = std::make_shared<Chunk>(chunks[i], config_);
      chunk = slot;
      index_[chunks[i].chunk_id] = chunk;
    }
    {
      MutexLock lock(&roles_mu_);
      shard_of_[chunks[i].chunk_id] = chunks[i].shard;
    }
    RETURN_IF_ERROR(chunk->Restore(snapshots[i]));
    MutexLock lock(&chunks_mu_);
    copying_.erase(chunks[i].chunk_id);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<int32_t, ChunkSnapshot>>> JobShard::CaptureAll(int64_t checkpoint_id,
                                                                                    int64_t at_version,
                                                                                    absl::Time deadline,
                                                                                    const IncrementalBase& base) {
  std::optional<std::set<int32_t>> held;  // nullopt: never configured, every shard
  std::vector<std::pair<int32_t, std::shared_ptr<Chunk>>> chunks;
  {
    MutexLock lock(&chunks_mu_);
    MutexLock roles_lock(&roles_mu_);
    held = ShardsWithARoleLocked();
    for (const auto& [id, chunk] : chunks_) {
      auto shard = shard_of_.find(id);
      if (held.has_value() && (shard == shard_of_.end() || held->count(shard->second) == 0)) continue;
      chunks.emplace_back(id, chunk);
    }
  }
  const std::set<int32_t>* table_shards = held.has_value() ? &*held : nullptr;
  auto disarm = [&] {
    for (auto& [id, chunk] : chunks) chunk->Disarm(checkpoint_id);
    if (sparse_ != nullptr) sparse_->Disarm(checkpoint_id);
  };
  for (auto& [id, chunk] : chunks) {
    if (absl::Status armed = chunk->ArmCapture(checkpoint_id, at_version); !armed.ok()) {
      disarm();
      return armed;
    }
  }
  // Synchronous tables are cut at the same step as the chunks; asynchronous
  // ones once the chunks are (every push of the steps before the cut is in).
  if (sparse_ != nullptr) {
    if (absl::Status armed = sparse_->ArmCapture(checkpoint_id, at_version, base, table_shards);
        !armed.ok()) {
      disarm();
      return armed;
    }
  }
  std::vector<std::pair<int32_t, ChunkSnapshot>> snapshots;
  for (auto& [id, chunk] : chunks) {
    absl::StatusOr<ChunkSnapshot> snapshot = chunk->TakeCapture(checkpoint_id, deadline);
    if (!snapshot.ok()) {
      disarm();
      return snapshot.status();
    }
    snapshots.emplace_back(id, *std::move(snapshot));
  }
  if (sparse_ != nullptr) {
    absl::StatusOr<std::vector<std::pair<int32_t, ChunkSnapshot>>> tables =
        sparse_->TakeCapture(checkpoint_id, deadline, table_shards);
    if (!tables.ok()) {
      disarm();
      return tables.status();
    }
    for (auto& bucket : *tables) snapshots.push_back(std::move(bucket));
  }
  return snapshots;
}

std::pair<int64_t, int64_t> JobShard::VersionRange() const {
  MutexLock lock(&chunks_mu_);
  if (chunks_.empty()) return {0, 0};
  int64_t low = INT64_MAX, high = 0;
  for (const auto& [id, chunk] : chunks_) {
    int64_t v = chunk->version();
    low = std::min(low, v);
    high = std::max(high, v);
  }
  return {low, high};
}

absl::Status JobShard::RestoreCheckpoint(int32_t chunk_id, ChunkSnapshot snapshot, bool repartition,
                                         int64_t version, int64_t partition_step) {
  ASSIGN_OR_RETURN(std::shared_ptr<Chunk> chunk, Find(chunk_id));
  return chunk->RestoreCheckpoint(std::move(snapshot), repartition, version, partition_step);
}

std::vector<int32_t> JobShard::chunk_ids() const {
  std::vector<int32_t> ids;
  MutexLock lock(&chunks_mu_);
  for (const auto& [id, chunk] : chunks_) ids.push_back(id);
  return ids;
}

absl::Status JobShard::Validate(const PushArgs& args) {
  ASSIGN_OR_RETURN(std::shared_ptr<Chunk> chunk, Find(args.chunk_id));
  return chunk->Validate(args);
}

absl::Status JobShard::Configure(int64_t version, std::map<int32_t, ShardRole> roles,
                                 std::map<int32_t, int32_t> chunk_shards) {
  {
    MutexLock lock(&roles_mu_);
    if (version < map_version_) {
      return absl::FailedPreconditionError(absl::StrCat("job ", config_.job_id, ": shard map version ",
                                                        version, " is older than the one held (",
                                                        map_version_, ")"));
    }
    map_version_ = version;
    roles_ = std::move(roles);
    configured_ = true;
    for (const auto& [chunk, shard] : chunk_shards) {
      auto it = shard_of_.find(chunk);
      if (it != shard_of_.end()) it->second = shard;
    }
  }
  DropTablesWithoutRole();
  return absl::OkStatus();
}

int64_t JobShard::FreeChunksWithoutRole(int64_t map_version) {
  // Out of the maps first (a request that holds one finishes with it, and
  // its memory goes with the last such request), then dropped: a pull
  // waiting on one ends ABORTED at once. Not while a copy runs into this
  // job (AdoptCopies: a chunk it adopted is in no shard of this server's
  // until its Configure), and only under the map the caller read.
  std::vector<std::shared_ptr<Chunk>> freed;
  {
    MutexLock adopting(&adopt_mu_);
    MutexLock lock(&chunks_mu_);
    MutexLock roles_lock(&roles_mu_);
    const std::optional<std::set<int32_t>> held = ShardsWithARoleLocked();
    if (!held.has_value() || map_version != map_version_) return 0;
    for (auto it = chunks_.begin(); it != chunks_.end();) {
      auto shard = shard_of_.find(it->first);
      if (shard == shard_of_.end() || held->count(shard->second) > 0 || copying_.count(it->first) > 0) {
        ++it;
        continue;
      }
      index_.erase(it->first);
      freed.push_back(std::move(it->second));
      it = chunks_.erase(it);
    }
  }
  int64_t bytes = 0;
  for (const std::shared_ptr<Chunk>& chunk : freed) {
    bytes += ChunkBytes(chunk->length(), config_);
    chunk->Drop("the chunk moved to another shard");
  }
  if (!freed.empty()) {
    FLOG(INFO) << "job " << config_.job_id << ": freed " << freed.size()
               << " chunk(s) moved to other shards (" << bytes << " bytes)";
  }
  return bytes;
}

void JobShard::DropTablesWithoutRole() {
  if (sparse_ == nullptr) return;
  std::vector<std::shared_ptr<SparseShard>> dropped;
  {
    // The roles read and the drop at once: a Configure between them could
    // give back a role whose tables this then drops.
    MutexLock lock(&roles_mu_);
    const std::optional<std::set<int32_t>> held = ShardsWithARoleLocked();
    if (!held.has_value()) return;
    dropped = sparse_->DropShardsExcept(*held);
  }
  FreezeDropped(dropped, "this server no longer holds");
}

void JobShard::DropTables(const std::set<int32_t>& shards, const std::string& why) {
  if (sparse_ == nullptr) return;
  FreezeDropped(sparse_->DropShards(shards), why);
}

void JobShard::FreezeDropped(const std::vector<std::shared_ptr<SparseShard>>& dropped,
                             const std::string& why) {
  // Out of the tables, no Configure gives them back: frozen (which waits
  // for a push in progress, whose room check takes the store's locks) and
  // freed outside every lock, when the last request holding one ends.
  for (const std::shared_ptr<SparseShard>& shard : dropped) {
    shard->Freeze(absl::StrCat("this server was taken out of the shard's group (job ", config_.job_id, ")"));
  }
  if (!dropped.empty()) {
    FLOG(INFO) << "job " << config_.job_id << ": dropped the tables of " << dropped.size() << " shard(s) "
               << why;
  }
}

int64_t JobShard::map_version() const {
  MutexLock lock(&roles_mu_);
  return map_version_;
}

absl::StatusOr<JobShard::ShardRole> JobShard::RoleOf(int32_t chunk_id) const {
  const int32_t one[] = {chunk_id};
  ASSIGN_OR_RETURN(ChunkRoles roles, RolesOf(one));
  return std::move(roles.roles.begin()->second);
}

absl::StatusOr<JobShard::ChunkRoles> JobShard::RolesOf(absl::Span<const int32_t> chunk_ids) const {
  ChunkRoles out;
  out.shard_of.reserve(chunk_ids.size());
  MutexLock lock(&roles_mu_);
  for (int32_t chunk_id : chunk_ids) {
    auto shard = shard_of_.find(chunk_id);
    if (shard == shard_of_.end()) {
      return absl::NotFoundError(absl::StrCat("chunk ", chunk_id, " of job ", config_.job_id,
                                              " is not on this server (stale shard map?)"));
    }
    out.shard_of.push_back(shard->second);
    if (out.roles.count(shard->second) > 0) continue;
    auto role = roles_.find(shard->second);
    if (role == roles_.end()) {
      if (!configured_) {  // never configured: a lone replica
        out.roles.emplace(shard->second, ShardRole{/*primary=*/true, {}});
        continue;
      }
      return absl::AbortedError(absl::StrCat("chunk ", chunk_id, " of job ", config_.job_id,
                                             " moved to shard ", shard->second,
                                             ", which this server does not hold: refresh the map"));
    }
    out.roles.emplace(shard->second, role->second);
  }
  return out;
}

std::optional<std::set<int32_t>> JobShard::ShardsWithARoleLocked() const {
  if (!configured_) return std::nullopt;
  std::set<int32_t> shards;
  for (const auto& [shard, role] : roles_) shards.insert(shard);
  return shards;
}

absl::StatusOr<JobShard::ShardRole> JobShard::RoleOfShard(int32_t shard) const {
  MutexLock lock(&roles_mu_);
  auto role = roles_.find(shard);
  if (role == roles_.end()) {
    if (!configured_) return ShardRole{/*primary=*/true, {}};  // never configured: a lone replica
    return absl::AbortedError(absl::StrCat("shard ", shard, " of job ", config_.job_id,
                                           " is not held by this server in shard map version ", map_version_,
                                           ": refresh the map"));
  }
  return role->second;
}

void JobShard::Drop(const std::string& reason) {
  if (sparse_ != nullptr) sparse_->Freeze(reason);
  MutexLock lock(&chunks_mu_);
  for (auto& [id, chunk] : chunks_) chunk->Drop(reason);
}

void JobShard::Freeze(const std::string& reason) {
  if (sparse_ != nullptr) sparse_->Freeze(reason);
  MutexLock lock(&chunks_mu_);
  for (auto& [id, chunk] : chunks_) chunk->Freeze(reason);
}

absl::Status ParameterStore::CheckFits(const std::string& job_id, int64_t more_bytes, bool replacing) const {
  if (memory_budget_ <= 0) return absl::OkStatus();
  int64_t held = transient_.load();
  {
    MutexLock lock(&mu_);
    for (const auto& [id, shard] : jobs_) {
      if (!(replacing && id == job_id)) held += shard->bytes();
    }
  }
  if (held + more_bytes <= memory_budget_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "job ", job_id, " needs ", FormatBytes(more_bytes), " on this server, which holds ", FormatBytes(held),
      " of other jobs within a memory budget of ", FormatBytes(memory_budget_), " (fulcrum-server --memory-budget)"));
}

int64_t ParameterStore::bytes() const {
  MutexLock lock(&mu_);
  return BytesLocked();
}

int64_t ParameterStore::BytesLocked() const {
  int64_t bytes = transient_.load();
  for (const auto& [id, shard] : jobs_) bytes += shard->bytes();
  return bytes;
}

absl::StatusOr<std::unique_ptr<ParameterStore::TransientHold>> ParameterStore::HoldTransient(
    int64_t bytes, const std::string& what) {
  MutexLock lock(&mu_);  // holds are added one at a time, each checked against the others
  const int64_t held = BytesLocked();
  if (memory_budget_ > 0 && held + bytes > memory_budget_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " needs ", FormatBytes(bytes), " while it is written, beyond the ",
                     FormatBytes(std::max<int64_t>(0, memory_budget_ - held)),
                     " left of this server's memory budget of ", FormatBytes(memory_budget_),
                     " (fulcrum-server --memory-budget; a checkpoint holds up to three times the "
                     "state it writes until it is stored)"));
  }
  transient_ += bytes;
  return std::make_unique<TransientHold>(this, bytes);
}

absl::Status ParameterStore::SetupJob(JobShardConfig config) {
  // Initializing the chunks can take a while; do it outside the lock. A
  // setup of a job already here (the scheduler redoing an interrupted setup)
  // replaces it: nothing has trained on it yet.
  RETURN_IF_ERROR(CheckFits(config.job_id, JobShard::ConfigBytes(config), /*replacing=*/true));
  ASSIGN_OR_RETURN(std::unique_ptr<JobShard> shard, JobShard::Create(std::move(config)));
  Install(std::move(shard));
  return absl::OkStatus();
}

void ParameterStore::Install(std::unique_ptr<JobShard> shard) {
  std::string job_id = shard->config().job_id;
  std::shared_ptr<JobShard> old;
  {
    MutexLock lock(&mu_);
    auto& slot = jobs_[job_id];
    old = std::move(slot);
    slot = std::move(shard);
  }
  if (old != nullptr) old->Drop("replaced by a fresh copy of the job's state");
}

absl::Status ParameterStore::InstallCopy(std::unique_ptr<JobShard> shard) {
  const std::string job_id = shard->config().job_id;
  MutexLock lock(&mu_);
  std::shared_ptr<JobShard>& slot = jobs_[job_id];
  if (slot != nullptr) {
    return absl::UnavailableError(absl::StrCat("job ", job_id,
                                               " was set up on this server while its state was copied here "
                                               "(another copy of the same setup): set it up again"));
  }
  slot = std::move(shard);
  return absl::OkStatus();
}

bool ParameterStore::DropJob(const std::string& job_id, const std::string& reason,
                             bool keep_parameters, int64_t map_version) {
  std::shared_ptr<JobShard> shard;
  {
    MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return true;
    if (map_version > 0 && it->second->map_version() > map_version) return false;
    shard = it->second;
    if (!keep_parameters) jobs_.erase(it);
  }
  if (keep_parameters) {
    shard->Freeze(reason);
  } else {
    shard->Drop(reason);
  }
  return true;
}

absl::StatusOr<std::shared_ptr<JobShard>> ParameterStore::Find(const std::string& job_id) const {
  MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " is not set up on this server"));
  }
  return it->second;
}

std::vector<std::string> ParameterStore::JobIds() const {
  MutexLock lock(&mu_);
  std::vector<std::string> ids;
  for (const auto& [id, shard] : jobs_) ids.push_back(id);
  return ids;
}

std::map<std::string, int64_t> ParameterStore::JobBytes() const {
  MutexLock lock(&mu_);
  std::map<std::string, int64_t> bytes;
  for (const auto& [id, shard] : jobs_) bytes[id] = shard->bytes();
  return bytes;
}

size_t ParameterStore::num_jobs() const {
  MutexLock lock(&mu_);
  return jobs_.size();
}

}  // namespace fulcrum
