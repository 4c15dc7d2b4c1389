// The sparse tables' RPCs: SparsePull and SparsePush over a job's
// SparseShard. Keys and rows travel as raw little-endian bytes; each request
// is bounded (keys, and the answer's bytes) before any work is done.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <set>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/table_spec.h"
#include "common/tensor_codec.h"
#include "server/parameter_service.h"

namespace fulcrum {
namespace {

SparseOptimizerConfig ToSparseOptimizer(const v1::SparseOptimizerSpec& spec) {
  SparseOptimizerConfig config;
  switch (spec.kind()) {
    case v1::SparseOptimizerSpec::SGD:
      config.kind = SparseOptimizerKind::kSgd;
      break;
    case v1::SparseOptimizerSpec::FTRL:
      config.kind = SparseOptimizerKind::kFtrl;
      break;
    case v1::SparseOptimizerSpec::ADAM:
      config.kind = SparseOptimizerKind::kAdam;
      config.epsilon = 1e-8f;
      break;
    default:
      config.kind = SparseOptimizerKind::kAdagrad;
      break;
  }
  // 0: not set. A negative or NaN rate is the table's to refuse.
  config.lr = spec.lr() != 0 ? spec.lr() : kDefaultTableLr;
  if (spec.has_epsilon()) config.epsilon = spec.epsilon();
  config.initial_accumulator = spec.initial_accumulator();
  if (spec.has_beta1()) config.beta1 = spec.beta1();
  if (spec.has_beta2()) config.beta2 = spec.beta2();
  config.l1 = spec.l1();
  config.l2 = spec.l2();
  if (spec.has_beta()) config.beta = spec.beta();
  return config;
}

// Keys from their little-endian bytes: read in place on a little-endian
// host when aligned, else decoded into *copy.
absl::Span<const uint64_t> KeysIn(const std::string& bytes, std::vector<uint64_t>* copy) {
  const size_t n = bytes.size() / sizeof(uint64_t);
  if (absl::little_endian::IsLittleEndian() &&
      reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint64_t) == 0) {
    return absl::Span<const uint64_t>(reinterpret_cast<const uint64_t*>(bytes.data()), n);
  }
  copy->resize(n);
  for (size_t i = 0; i < n; ++i) (*copy)[i] = absl::little_endian::Load64(bytes.data() + i * sizeof(uint64_t));
  return *copy;
}

// The floats of little-endian bytes, in place (null: not on this host, or
// not aligned; decode them instead).
const float* FloatsIn(absl::string_view bytes) {
  if (!absl::little_endian::IsLittleEndian() || reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) != 0) {
    return nullptr;
  }
  return reinterpret_cast<const float*>(bytes.data());
}

// The checks every sparse request passes: the job's tables are here, the
// map is this server's, each table named once, keys whole uint64s.
absl::Status CheckSparseRequest(const std::string& job_id, const JobShard& shard, int64_t map_version,
                                const google::protobuf::RepeatedPtrField<v1::SparseKeys>& tables) {
  const SparseTables* sparse = shard.sparse();
  if (sparse == nullptr) return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " has no sparse tables"));
  if (map_version < shard.map_version()) {
    return absl::AbortedError(absl::StrCat("job ", job_id, ": request made with shard map version ", map_version,
                                           ", this server is at ", shard.map_version(), ": refresh the map"));
  }
  std::set<int32_t> seen;
  int64_t answer_bytes = 0;
  for (const v1::SparseKeys& table : tables) {
    if (sparse->dim(table.table()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("job ", job_id, " has no sparse table ", table.table()));
    }
    if (!seen.insert(table.table()).second) {
      return absl::InvalidArgumentError(absl::StrCat("job ", job_id, ": request names table ", table.table(), " twice"));
    }
    if (table.keys().size() % sizeof(uint64_t) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("job ", job_id, ": table ", table.table(), "'s keys take ",
                                                     table.keys().size(), " bytes, not a whole number of uint64s"));
    }
    answer_bytes += static_cast<int64_t>(table.keys().size() / sizeof(uint64_t)) * sparse->dim(table.table()) *
                    static_cast<int64_t>(sizeof(float));
  }
  if (answer_bytes > kMaxPullBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job_id, ": sparse request of ", answer_bytes,
                                                   " bytes of rows; at most ", kMaxPullBytes,
                                                   " (split its keys into several requests)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<SparseTableSetup> TableSetupsOf(const v1::JobSpec& spec, const v1::ShardMap& map) {
  // As the dense chunks read the mode (parameter_service.cc).
  const bool bsp = spec.mode() == v1::BSP || spec.mode() == v1::MODE_UNSPECIFIED;
  std::map<std::string, const v1::TableSpec*> by_name;
  for (const v1::TableSpec& named : spec.model().tables())
    by_name[named.name()] = &named;  // the last of a name
  std::vector<SparseTableSetup> setups;
  for (const v1::TableLayout& layout : map.tables()) {
    auto named = by_name.find(layout.name());
    const v1::TableSpec table = named == by_name.end() ? v1::TableSpec() : *named->second;
    SparseTableSetup setup;
    setup.config.name = layout.name();
    setup.config.dim = layout.dim();
    setup.config.optimizer = ToSparseOptimizer(table.optimizer());
    const float scale = table.has_init_scale() ? table.init_scale() : DefaultTableInitScale(layout.name());
    setup.config.init = scale > 0 ? InitKind::kUniform : InitKind::kZeros;
    setup.config.init_scale = scale;
    setup.config.seed = spec.seed();
    setup.config.admit_after = table.admit_after();
    setup.config.expire_after = table.expire_after();
    setup.bucket_shards.assign(layout.bucket_shards().begin(), layout.bucket_shards().end());
    setup.synchronous = bsp && table.consistency() != v1::TableSpec::ASYNC;
    setups.push_back(std::move(setup));
  }
  return setups;
}

absl::Status ParameterServiceImpl::HandleSparsePull(const grpc::ByteBuffer& bytes, grpc::ByteBuffer* response) {
  v1::SparsePullRequest request;
  RETURN_IF_ERROR(ParseMessage(bytes, &request));
  return AnswerSparsePull(request, response);
}

absl::Status ParameterServiceImpl::AnswerSparsePull(const v1::SparsePullRequest& request,
                                                    grpc::ByteBuffer* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<JobShard> shard, store_->Find(request.job_id()));
  RETURN_IF_ERROR(CheckSparseRequest(request.job_id(), *shard, request.map_version(), request.tables()));
  if (request.has_step())
    RETURN_IF_ERROR(CheckJobStep(request.job_id(), *shard, request.step(), "sparse pull"));
  std::vector<uint64_t> copied;
  int64_t keys_pulled = 0;
  // Each table's rows are pulled straight into a slice of their own, which
  // gRPC sends as it is.
  PayloadWriter answer(v1::SparsePullResponse(), v1::SparsePullResponse::kTablesFieldNumber);
  for (const v1::SparseKeys& table : request.tables()) {
    const absl::Span<const uint64_t> keys = KeysIn(table.keys(), &copied);
    const size_t n = keys.size() * static_cast<size_t>(shard->sparse()->dim(table.table()));
    char* out = nullptr;
    grpc::Slice rows = NewPayloadSlice(n * sizeof(float), &out);
    auto* values = reinterpret_cast<float*>(out);
    RETURN_IF_ERROR(request.has_step() ? shard->sparse()->PullAtStep(table.table(), keys, request.step(), values)
                                       : shard->sparse()->Pull(table.table(), keys, values));
#ifdef ABSL_IS_BIG_ENDIAN
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, values + i, sizeof(bits));
      absl::little_endian::Store32(out + i * sizeof(bits), bits);
    }
#endif
    v1::SparseKeys part;
    part.set_table(table.table());
    answer.AddPart(part, {std::move(rows)});
    keys_pulled += static_cast<int64_t>(keys.size());
  }
  *response = answer.Finish();
  sparse_keys_pulled_->Increment(static_cast<double>(keys_pulled));
  return absl::OkStatus();
}

namespace {

// gRPC's SparsePull: gives back the bytes the call held once gRPC is done
// with it (its answer sent or dropped).
class SparsePullReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit SparsePullReactor(std::atomic<int64_t>* held) : held_(held) {}
  // Set before Finish; read once the call is done.
  int64_t reserved = 0;
  bool finished = false;

  void OnDone() override {
    held_->fetch_sub(reserved);
    delete this;
  }

 private:
  std::atomic<int64_t>* const held_;
};

}  // namespace

grpc::ServerUnaryReactor* ParameterServiceImpl::SparsePull(grpc::CallbackServerContext* /*context*/,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  auto* reactor = new SparsePullReactor(&pull_bytes_in_flight_);
  const auto received = static_cast<int64_t>(request->Length());
  // Out of memory is answered, never escapes: escaping, it would end the
  // process on the pool's thread, gRPC's callback wrapper would answer it
  // as an unknown method, and the call's bytes would stay counted.
  auto out_of_memory = [](const std::string& job_id) {
    return absl::ResourceExhaustedError(absl::StrCat("job ", job_id, ": out of memory for a sparse pull"));
  };
  // The request and the answer live until the reactor finishes.
  auto answer = [this, reactor, response, received, out_of_memory](const v1::SparsePullRequest& pull) {
    absl::Status status;
    try {
      status = AnswerSparsePull(pull, response);
      if (status.ok()) {
        const auto sent = static_cast<int64_t>(response->Length());
        status = ReservePull(sent, "answer");
        if (status.ok()) reactor->reserved += sent;
      }
    } catch (const std::bad_alloc&) {
      status = out_of_memory(pull.job_id());
    }
    if (!status.ok()) response->Clear();
    reactor->finished = true;
    reactor->Finish(
        Finish("SparsePull", status, received, status.ok() ? static_cast<int64_t>(response->Length()) : 0));
  };
  // The request's bytes, and its parsed copy, as many again.
  if (absl::Status reserved = ReservePull(2 * received, "request"); !reserved.ok()) {
    reactor->Finish(Finish("SparsePull", reserved, received, 0));
    return reactor;
  }
  reactor->reserved = 2 * received;
  try {
    auto pull = std::make_shared<v1::SparsePullRequest>();
    if (absl::Status parsed = ParseMessage(*request, pull.get()); !parsed.ok()) {
      reactor->finished = true;
      reactor->Finish(Finish("SparsePull", parsed, received, 0));
    } else if (!pull->has_step()) {
      answer(*pull);  // reads the rows as they are: only brief locks
    } else {
      sparse_step_pulls_->Post([pull, answer] { answer(*pull); });
    }
  } catch (const std::bad_alloc&) {
    if (!reactor->finished) {
      reactor->Finish(
          ToGrpcStatus(absl::ResourceExhaustedError("out of memory for a sparse pull's request")));
    }
  }
  return reactor;
}

absl::Status ParameterServiceImpl::HandleSparsePush(const grpc::ByteBuffer& bytes, bool from_worker,
                                                    v1::SparsePushResponse* response) {
  // The fields but the gradients parsed (each table's keys into `request`);
  // the gradients stay in the received slices.
  v1::SparsePushRequest request;
  SparsePayloadReader received;
  RETURN_IF_ERROR(received.Parse(bytes, v1::SparsePushRequest::kTablesFieldNumber, &request));
  for (int i = 0; i < received.chunks(); ++i) request.add_tables()->Swap(received.mutable_chunk(i));
  ReaderMutexLock writes(&writes_mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<JobShard> shard, store_->Find(request.job_id()));
  RETURN_IF_ERROR(CheckSparseRequest(request.job_id(), *shard, request.map_version(), request.tables()));
  RETURN_IF_ERROR(CheckJobStep(request.job_id(), *shard, request.step(), "sparse push"));
  SparseTables& sparse = *shard->sparse();
  // Fencing as for the dense chunks: the lease, the map, this server's role
  // in the request's shard (whose tables it may still be copying: then
  // Validate and Push answer UNAVAILABLE).
  ASSIGN_OR_RETURN(const int32_t shard_id,
                   request.has_shard() ? absl::StatusOr<int32_t>(request.shard()) : sparse.OnlyShard());
  RETURN_IF_ERROR(
      replicator_->CheckSparseWrite(*shard, request.job_id(), request.map_version(), shard_id, from_worker));
  // Keys are read in place in the parsed request on an aligned
  // little-endian host (else from copies); gradients where they arrived
  // when they lie in one slice, else from one copy into pooled memory.
  std::vector<std::vector<uint64_t>> key_copies(static_cast<size_t>(request.tables_size()));
  std::vector<FloatBufferPool::Buffer> grad_copies(static_cast<size_t>(request.tables_size()));
  std::string scratch;
  SparsePushArgs args;
  args.partition = request.partition();
  args.shard = shard_id;
  args.step = request.step();
  args.part = request.part();
  args.parts = request.parts();
  int64_t rows = 0;
  for (int i = 0; i < request.tables_size(); ++i) {
    const v1::SparseKeys& table = request.tables(i);
    const absl::Span<const uint64_t> keys = KeysIn(table.keys(), &key_copies[static_cast<size_t>(i)]);
    const auto expected = static_cast<int64_t>(keys.size()) * shard->sparse()->dim(table.table());
    if (received.payload_size(i) != expected * static_cast<int64_t>(sizeof(float))) {
      return absl::InvalidArgumentError(absl::StrCat("job ", request.job_id(), ": gradients of ", keys.size(),
                                                     " keys of table ", table.table(), " take ",
                                                     received.payload_size(i), " bytes, expected ", expected * 4));
    }
    const std::optional<absl::string_view> in_place = received.PayloadView(i);
    const float* grads = in_place.has_value() ? FloatsIn(*in_place) : nullptr;
    if (grads == nullptr && expected > 0) {  // copied once, into memory an earlier push used
      FloatBufferPool::Buffer& copy = grad_copies[static_cast<size_t>(i)];
      copy = gradients_.Acquire(expected);
      RETURN_IF_ERROR(received.DecodePayload(i, v1::WIRE_FP32, expected, copy.data(), "gradients", &scratch));
      grads = copy.data();
    }
    args.tables.push_back(SparseRows{table.table(), keys, grads});
    rows += static_cast<int64_t>(keys.size());
  }
  // A primary with backups: checked whole first (a bad push reaches no
  // replica), then on every backup before it is applied here, so an
  // acknowledged push survives the primary's death; retries are safe, since
  // every replica applies a (partition, step, shard, part) once. Pushes of
  // asynchronous tables go out one at a time from forward to apply, so the
  // replicas apply them in one order (the synchronous ones sum each step in
  // partition order anyway).
  ASSIGN_OR_RETURN(const JobShard::ShardRole role, shard->RoleOfShard(shard_id));
  const bool forwards = from_worker && !role.backup_addresses.empty();
  if (forwards) RETURN_IF_ERROR(sparse.Validate(args));
  MutexLockMaybe order(forwards && sparse.has_asynchronous() ? &shard->sparse_replication_order() : nullptr);
  if (forwards) RETURN_IF_ERROR(replicator_->ForwardSparse(*shard, shard_id, request.job_id(), bytes));
  ASSIGN_OR_RETURN(SparsePushOutcome outcome, sparse.Push(args));
  response->set_duplicate(outcome == SparsePushOutcome::kDuplicate);
  response->set_rows(rows);
  if (outcome == SparsePushOutcome::kApplied) {
    sparse_keys_pushed_->Increment(static_cast<double>(rows));
    table_gauges_->Update(request.job_id(), *shard->sparse());
  }
  return absl::OkStatus();
}

absl::Status ParameterServiceImpl::KeepCaptureLocked(LiveCapture capture) {
  const absl::Time now = absl::Now();
  const auto size = static_cast<int64_t>(capture.snapshot->table_state.size());
  int64_t limit = kKeptCaptureBytes;
  if (store_->memory_budget() > 0) limit = std::min(limit, store_->memory_budget() - store_->bytes());
  // Newest first, what stays: captures not too old, within the count and the bytes.
  std::vector<LiveCapture> kept;
  int64_t kept_bytes = size;
  for (auto it = captures_.rbegin(); it != captures_.rend(); ++it) {
    const auto bytes = static_cast<int64_t>(it->snapshot->table_state.size());
    if (now - it->taken > kKeptCaptureTime || kept.size() + 1 >= kKeptCaptures || kept_bytes + bytes > limit) break;
    kept_bytes += bytes;
    kept.push_back(std::move(*it));
  }
  captures_.assign(std::make_move_iterator(kept.rbegin()), std::make_move_iterator(kept.rend()));
  if (size > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", capture.job_id, ": table chunk ", capture.chunk_id, "'s state takes ", size,
        " bytes, more than this server can keep to send in slices (", std::max<int64_t>(0, limit),
        " bytes: at most ", kKeptCaptureBytes, ", within what its memory budget has left)"));
  }
  captures_.push_back(std::move(capture));
  return absl::OkStatus();
}

absl::Status ParameterServiceImpl::CopyTableBucket(const v1::CopyChunkRequest& request, v1::ChunkState* response) {
  // What a capture is kept under: the bucket's chunk id, or (a shard's
  // bookkeeping) -1 - the shard.
  const int32_t key = request.has_table_shard() ? -1 - request.table_shard() : request.chunk_id();
  std::shared_ptr<const ChunkSnapshot> snapshot;
  uint64_t capture = 0;
  if (request.table_state_offset() > 0) {
    MutexLock lock(&captures_mu_);
    for (const LiveCapture& kept : captures_) {
      if (kept.job_id == request.job_id() && kept.chunk_id == key && kept.id == request.capture() &&
          absl::Now() - kept.taken <= kKeptCaptureTime) {
        snapshot = kept.snapshot;
        capture = kept.id;
      }
    }
    if (snapshot == nullptr) {
      return absl::AbortedError(absl::StrCat("job ", request.job_id(), ": capture ", request.capture(),
                                             " of table chunk ", request.chunk_id(),
                                             " is no longer kept here: copy the bucket again from offset 0"));
    }
  } else {
    ASSIGN_OR_RETURN(std::shared_ptr<JobShard> shard, store_->Find(request.job_id()));
    if (shard->sparse() == nullptr) {
      return absl::NotFoundError(absl::StrCat("job ", request.job_id(), " has no sparse tables here"));
    }
    if (request.has_table_shard() && !shard->sparse()->Holds(request.table_shard())) {
      return absl::NotFoundError(absl::StrCat("job ", request.job_id(), ": this server holds no bucket of shard ",
                                              request.table_shard()));
    }
    {
      MutexLock lock(&captures_mu_);
      if (captures_in_progress_ >= kCapturesAtOnce) {
        return absl::AbortedError(absl::StrCat("job ", request.job_id(), ": ", kCapturesAtOnce,
                                               " table buckets are being captured here already: try again"));
      }
      ++captures_in_progress_;
    }
    absl::StatusOr<ChunkSnapshot> captured = request.has_table_shard()
                                                 ? shard->sparse()->CaptureShardState(request.table_shard())
                                                 : shard->sparse()->CaptureBucket(request.chunk_id());
    MutexLock lock(&captures_mu_);
    --captures_in_progress_;
    if (!captured.ok()) return captured.status();
    snapshot = std::make_shared<const ChunkSnapshot>(*std::move(captured));
    capture = next_capture_++;
    if (snapshot->table_state.size() > kTableStateSlice) {
      RETURN_IF_ERROR(KeepCaptureLocked(LiveCapture{request.job_id(), key, capture, absl::Now(), snapshot}));
    }
  }
  ASSIGN_OR_RETURN(const bool last, AnswerTableStateSlice(*snapshot, request.chunk_id(), request.table_state_offset(),
                                                         request.has_table_shard() ? "shard's table state" : "bucket",
                                                         response));
  response->set_capture(capture);
  if (last) {
    MutexLock lock(&captures_mu_);  // its last slice: not kept any longer
    captures_.erase(std::remove_if(captures_.begin(), captures_.end(),
                                   [&](const LiveCapture& kept) { return kept.snapshot == snapshot; }),
                    captures_.end());
  }
  return absl::OkStatus();
}

}  // namespace fulcrum
