#include "server/parameter_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/lr_scaling.h"
#include "common/memory_budget.h"
#include "common/payload_wire.h"
#include "common/quote.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/sync.h"
#include "common/table_spec.h"
#include "common/tensor_codec.h"

namespace fulcrum {
namespace {

// The per-request part of a push; the caller fills chunk_id and gradient.
PushArgs PushArgsOf(const v1::PushRequest& request) {
  PushArgs args;
  args.worker_id = request.worker_id();
  args.partition = request.partition();
  args.seq = request.seq();
  args.step = request.step();
  args.examples = request.examples();
  args.examples_digest = request.examples_digest();
  return args;
}

// Decoded gradients kept for reuse between pushes: about ten full requests.
constexpr int64_t kPooledGradientBytes = 64 << 20;

// Longest a pull waits for a BSP step when the client set no tighter deadline.
constexpr absl::Duration kMaxPullWait = absl::Seconds(120);

OptimizerConfig ToOptimizerConfig(const v1::OptimizerSpec& spec) {
  OptimizerConfig config;
  switch (spec.kind()) {
    case v1::OptimizerSpec::ADAM: config.kind = OptimizerKind::kAdam; break;
    case v1::OptimizerSpec::ADAMW: config.kind = OptimizerKind::kAdamW; break;
    case v1::OptimizerSpec::ADAGRAD: config.kind = OptimizerKind::kAdagrad; break;
    case v1::OptimizerSpec::RMSPROP: config.kind = OptimizerKind::kRmsprop; break;
    case v1::OptimizerSpec::LAMB: config.kind = OptimizerKind::kLamb; break;
    default: config.kind = OptimizerKind::kSgd; break;
  }
  config.momentum = spec.momentum();
  config.nesterov = spec.nesterov();
  config.weight_decay = spec.weight_decay();
  if (spec.has_beta1()) config.beta1 = spec.beta1();
  if (spec.has_beta2()) config.beta2 = spec.beta2();
  if (spec.has_epsilon()) {
    config.epsilon = spec.epsilon();
  } else if (config.kind == OptimizerKind::kAdagrad) {
    config.epsilon = 1e-10f;
  } else if (config.kind == OptimizerKind::kLamb) {
    config.epsilon = 1e-6f;  // the LAMB paper's
  }
  config.initial_accumulator = spec.initial_accumulator();
  if (spec.has_alpha()) config.alpha = spec.alpha();
  config.centered = spec.centered();
  return config;
}

LrScheduleConfig ToScheduleConfig(const v1::LrScheduleSpec& spec, int64_t total_steps) {
  LrScheduleConfig config;
  switch (spec.kind()) {
    case v1::LrScheduleSpec::WARMUP_COSINE: config.kind = LrScheduleKind::kWarmupCosine; break;
    case v1::LrScheduleSpec::STEP_DECAY: config.kind = LrScheduleKind::kStepDecay; break;
    default: config.kind = LrScheduleKind::kConstant; break;
  }
  config.warmup_steps = spec.warmup_steps();
  config.total_steps = total_steps;
  config.min_lr = spec.min_lr();
  config.step_size = spec.step_size();
  config.gamma = spec.gamma() > 0 ? spec.gamma() : 0.1f;
  return config;
}

absl::Time PullDeadline(const grpc::CallbackServerContext& context) {
  absl::Time cap = absl::Now() + kMaxPullWait;
  auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return cap;
  return std::min(cap, absl::FromChrono(deadline));
}

}  // namespace

absl::Status CheckJobStep(const std::string& job_id, const JobShard& shard, int64_t step, const char* what) {
  const int64_t total = shard.config().schedule.total_steps;
  if (step < 0 || (total > 0 && step > total)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", job_id, ": ", what, " of step ", step,
                     total > 0 ? absl::StrCat("; the job's steps are in [0, ", total, "]")
                               : std::string("; steps are >= 0")));
  }
  return absl::OkStatus();
}

JobShardConfig ToJobShardConfig(const v1::SetupJobRequest& request) {
  JobShardConfig config;
  config.job_id = request.job_id();
  config.server_id = request.server_id();
  config.optimizer = ToOptimizerConfig(request.spec().optimizer());
  // lrScaling LINEAR: the rates the spec gives are for its base batch.
  const double scale = LrScale(request.spec());
  config.lr = static_cast<float>(request.spec().optimizer().lr() * scale);
  config.schedule = ToScheduleConfig(request.spec().lr_schedule(), request.total_steps());
  config.schedule.min_lr = static_cast<float>(config.schedule.min_lr * scale);
  config.synchronous = request.spec().mode() == v1::BSP || request.spec().mode() == v1::MODE_UNSPECIFIED;
  config.num_partitions = request.num_partitions();
  config.seed = request.spec().seed();
  for (const v1::ChunkSetup& chunk : request.chunks()) {
    ChunkConfig c;
    c.chunk_id = chunk.chunk_id();
    c.shard = chunk.shard();
    c.tensor = chunk.tensor();
    c.offset = chunk.offset();
    c.length = chunk.length();
    c.init = chunk.init() == v1::ChunkSetup::UNIFORM ? InitKind::kUniform : InitKind::kZeros;
    c.init_scale = chunk.init_scale();
    config.chunks.push_back(c);
  }
  config.tables = TableSetupsOf(request.spec(), request.shard_map());
  // Every shard this server is a replica of (primary or backup).
  for (const auto& [shard, role] : RolesFor(request.shard_map(), request.server_id())) config.table_shards.insert(shard);
  return config;
}

std::map<int32_t, int32_t> ChunkShards(const v1::ShardMap& map) {
  std::map<int32_t, int32_t> shards;
  for (const v1::ChunkLocation& chunk : map.chunks()) shards[chunk.chunk_id()] = chunk.shard();
  return shards;
}

std::map<int32_t, JobShard::ShardRole> RolesFor(const v1::ShardMap& map, const std::string& server_id) {
  std::map<int32_t, JobShard::ShardRole> roles;
  for (const v1::ShardLocation& shard : map.shards()) {
    if (shard.server_id() == server_id) {
      JobShard::ShardRole& role = roles[shard.shard()];
      role.primary = true;
      role.backup_addresses.assign(shard.backup_addresses().begin(), shard.backup_addresses().end());
    } else if (std::count(shard.backup_ids().begin(), shard.backup_ids().end(), server_id) > 0) {
      roles[shard.shard()].primary = false;
    }
  }
  return roles;
}

namespace {

// A chunk's whole state travels as one message (CopyChunk, ReadCheckpoint):
// a setup whose chunks could not be copied or restored is refused up front.
absl::Status CheckChunkStatesFit(const v1::SetupJobRequest& request, const JobShardConfig& config) {
  for (const ChunkConfig& chunk : config.chunks) {
    const int64_t bytes = JobShard::ChunkStateBytes(chunk.length, config);
    if (bytes > kMaxChunkStateBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job ", request.job_id(), ": chunk ", chunk.chunk_id, " of ", chunk.length, " values would hold ", bytes,
          " bytes of state (values, optimizer state, BSP buffers for ", config.num_partitions,
          " partitions), more than the ", kMaxChunkStateBytes, " one copy message carries: cut smaller chunks"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

JobShardConfig ParameterServiceImpl::ConfigFor(const v1::SetupJobRequest& request) {
  JobShardConfig config = ToJobShardConfig(request);
  config.orphaned_values = orphaned_values_;
  config.observe_apply = [histogram = optimizer_seconds_](double seconds) { histogram->Observe(seconds); };
  config.on_change = [held = held_pulls_.get()] { held->Poke(); };
  return config;
}

ParameterServiceImpl::~ParameterServiceImpl() {
  sparse_step_pulls_->Stop();  // answers what is queued while every member is alive
  if (writer_ != nullptr) writer_->Stop();
}

ParameterServiceImpl::ParameterServiceImpl(ParameterStore* store, MetricsEndpoint* metrics,
                                           std::function<bool()> lease_valid, CheckpointStore* checkpoints)
    : store_(store),
      metrics_(metrics),
      gradients_(kPooledGradientBytes),
      checkpoints_(checkpoints) {
  // Push and Replicate as raw bytes on the sync threads: gRPC's "streamed
  // unary" handler (one request, one answer; an ordinary unary call on the
  // wire) is the sync API's only way to a method's ByteBuffer.
  using RawHandler = grpc::internal::StreamedUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>;
  const google::protobuf::ServiceDescriptor* service =
      v1::PushRequest::descriptor()->file()->FindServiceByName("ParameterService");
  for (bool from_worker : {true, false}) {
    MarkMethodStreamed(service->FindMethodByName(from_worker ? "Push" : "Replicate")->index(),
                       new RawHandler([this, from_worker](grpc::ServerContext* context, RawStream* stream) {
                         return ServeRaw(context, stream, from_worker ? "Push" : "Replicate",
                                         [&](const grpc::ByteBuffer& request, grpc::ByteBuffer* answer) {
                                           v1::PushResponse response;
                                           RETURN_IF_ERROR(HandlePush(request, from_worker, &response));
                                           *answer = SerializeMessage(response);
                                           return absl::OkStatus();
                                         });
                       }));
    const char* sparse = from_worker ? "SparsePush" : "SparseReplicate";
    MarkMethodStreamed(
        service->FindMethodByName(sparse)->index(),
        new RawHandler([this, from_worker, sparse](grpc::ServerContext* context, RawStream* stream) {
          return ServeRaw(context, stream, sparse,
                          [&](const grpc::ByteBuffer& request, grpc::ByteBuffer* answer) {
                            v1::SparsePushResponse response;
                            RETURN_IF_ERROR(HandleSparsePush(request, from_worker, &response));
                            *answer = SerializeMessage(response);
                            return absl::OkStatus();
                          });
        }));
  }
  if (checkpoints_ != nullptr) writer_ = std::make_unique<CheckpointWriter>(checkpoints_);
  HeldPulls::Options held;
  held.threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 2u, 8u));
  held_pulls_ = std::make_unique<HeldPulls>(held);
  sparse_step_pulls_ = std::make_unique<ThreadPool>(held.threads);
  auto& registry = metrics_->registry();
  request_watch_.set_counter(&CallsCancelled(&registry, "request"));
  updates_applied_ = &prometheus::BuildCounter()
                          .Name("fulcrum_server_gradients_accepted_total")
                          .Help("Chunk gradients accepted (applied or buffered for a BSP step)")
                          .Register(registry)
                          .Add({});
  duplicates_ = &prometheus::BuildCounter()
                     .Name("fulcrum_server_duplicate_pushes_total")
                     .Help("Chunk pushes acknowledged as duplicates of an earlier (worker, seq)")
                     .Register(registry)
                     .Add({});
  Replicator::Options replication;
  replication.lease_valid = std::move(lease_valid);
  replication.refused = &prometheus::BuildCounter()
                  .Name("fulcrum_server_writes_refused_total")
                  .Help("Pushes and replications refused by fencing (no lease, or an older shard map)")
                  .Register(registry)
                  .Add({});
  jobs_ = &prometheus::BuildGauge()
               .Name("fulcrum_server_jobs")
               .Help("Jobs with state on this server")
               .Register(registry)
               .Add({});
  optimizer_seconds_ = &prometheus::BuildHistogram()
                            .Name("fulcrum_server_optimizer_apply_seconds")
                            .Help("Time of one optimizer update of one chunk")
                            .Register(registry)
                            .Add({}, DurationBuckets());
  replication.replication_seconds = &prometheus::BuildHistogram()
                              .Name("fulcrum_server_replication_seconds")
                              .Help("Time a primary waits for its backups to take a push (replication lag)")
                              .Register(registry)
                              .Add({}, DurationBuckets());
  checkpoint_bytes_ = &prometheus::BuildCounter()
                           .Name("fulcrum_server_checkpoint_written_bytes_total")
                           .Help("Checkpoint bytes written to this server's store")
                           .Register(registry)
                           .Add({});
  checkpoint_seconds_ = &prometheus::BuildHistogram()
                             .Name("fulcrum_server_checkpoint_write_seconds")
                             .Help("Time from a checkpoint's snapshot to its data being durable on this server")
                             .Register(registry)
                             .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60});
  table_gauges_ = std::make_unique<TableGauges>(&registry);
  sparse_keys_pulled_ = &prometheus::BuildCounter()
                            .Name("fulcrum_server_sparse_keys_pulled_total")
                            .Help("Keys of sparse tables whose rows this server answered")
                            .Register(registry)
                            .Add({});
  sparse_keys_pushed_ = &prometheus::BuildCounter()
                            .Name("fulcrum_server_sparse_keys_pushed_total")
                            .Help("Rows of sparse tables updated by pushes this server applied")
                            .Register(registry)
                            .Add({});
  replicator_ = std::make_unique<Replicator>(&peers_, std::move(replication));
}

grpc::Status ParameterServiceImpl::Finish(const char* method, const absl::Status& status,
                                          int64_t received, int64_t sent) {
  metrics_->CountBytes(method, received, sent);  // calls themselves: grpc_server_* (interceptor)
  if (IsServerBusy(status)) {
    // Many, each sent again, and counted in grpc_server_handled_total.
    FLOG(DEBUG) << method << ": " << status;
  } else if (!status.ok() && status.code() != absl::StatusCode::kCancelled) {
    FLOG(WARNING) << method << ": " << status;
  }
  return ToGrpcStatus(status);
}

absl::Status ParameterServiceImpl::SetupFresh(const v1::SetupJobRequest& request, JobShardConfig config) {
  // A job that already trained here is never replaced by a setup: that would
  // silently reset its parameters under its workers. The scheduler drops a
  // copy it wants replaced first.
  if (auto existing = store_->Find(request.job_id()); existing.ok()) {
    const int64_t version = (*existing)->VersionRange().second;
    if (version > 0) {
      return absl::AlreadyExistsError(absl::StrCat("job ", request.job_id(), " is already set up on this server and "
                                                   "has trained (", version, " updates): drop it first (DropJob)"));
    }
  }
  RETURN_IF_ERROR(store_->CheckFits(request.job_id(), JobShard::ConfigBytes(config), /*replacing=*/true));
  if (store_->memory_budget() > 0 && !config.tables.empty()) {
    // The tables grow as keys come: they may take what the budget has left.
    config.tables_room = [store = store_] { return store->memory_budget() - store->bytes(); };
  }
  // Fresh state, or a checkpoint's: built aside, installed when whole.
  ASSIGN_OR_RETURN(std::unique_ptr<JobShard> shard, JobShard::Create(std::move(config)));
  if (request.has_restore()) RETURN_IF_ERROR(RestoreChunks(shard.get(), request.restore()));
  RETURN_IF_ERROR(shard->Configure(request.shard_map().version(), RolesFor(request.shard_map(), request.server_id())));
  if (shard->sparse() != nullptr) shard->sparse()->Installed();
  store_->Install(std::move(shard));
  return absl::OkStatus();
}

absl::Status ParameterServiceImpl::SetupCopies(const v1::SetupJobRequest& request, JobShardConfig config,
                                               const std::map<int32_t, std::string>& sources) {
  // Chunks copied from their primaries (a new backup, or chunks moving to a
  // new shard); tables from the primary of their shard.
  if (store_->memory_budget() > 0 && !config.tables.empty()) {
    config.tables_room = [store = store_] { return store->memory_budget() - store->bytes(); };
  }
  // A new shard's leader waits for the scheduler's word before it takes
  // writes (SetupJobRequest.await_activation): under the version before the
  // map's, every write of the map's version is refused as "not received yet".
  const int64_t version = request.shard_map().version() - (request.await_activation() ? 1 : 0);
  return replicator_->AdoptCopies(
      store_, std::move(config), version, RolesFor(request.shard_map(), request.server_id()),
      ChunkShards(request.shard_map()), request.copy_from(), sources,
      request.has_joined_shard() ? std::optional<int32_t>(request.joined_shard()) : std::nullopt);
}

grpc::Status ParameterServiceImpl::SetupJob(grpc::ServerContext*, const v1::SetupJobRequest* request,
                                            v1::SetupJobResponse*) {
  std::map<int32_t, std::string> sources;
  for (const v1::ChunkSetup& chunk : request->chunks()) {
    if (!chunk.copy_from().empty()) sources[chunk.chunk_id()] = chunk.copy_from();
  }
  absl::Status status;
  // Bounded before anything is built from them.
  for (const auto& [field, count] :
       {std::pair<const char*, int>{"shard_map.tables", request->shard_map().tables_size()},
        {"spec.model.tables", request->spec().model().tables_size()}}) {
    if (count > kMaxTables) {
      return ToGrpcStatus(
          absl::InvalidArgumentError(absl::StrCat("job ", request->job_id(), ": ", field, " lists ", count,
                                                  " tables; a job has at most ", kMaxTables)));
    }
  }
  try {  // an allocation that fails fails the setup, not the process
    JobShardConfig config = ConfigFor(*request);
    status = CheckChunkStatesFit(*request, config);
    if (status.ok() && !config.tables.empty() && !sources.empty()) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "job ", request->job_id(), " has sparse tables, whose shards do not move to joining servers yet"));
    }
    if (status.ok()) {
      status = request->copy_from().empty() && sources.empty() ? SetupFresh(*request, std::move(config))
                                                               : SetupCopies(*request, std::move(config), sources);
    }
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError(absl::StrCat("job ", request->job_id(), ": out of memory setting it up"));
  }
  if (status.ok()) {
    FLOG(INFO) << "job " << request->job_id() << ": holding " << request->chunks_size()
               << " chunks, " << request->num_partitions() << " data partitions";
  }
  jobs_->Set(static_cast<double>(store_->num_jobs()));
  return Finish("SetupJob", status, request->ByteSizeLong(), 0);
}

grpc::Status ParameterServiceImpl::DropJob(grpc::ServerContext* /*context*/, const v1::DropJobRequest* request,
                                           v1::DropJobResponse*) {
  if (!store_->DropJob(request->job_id(), request->reason(), request->keep_parameters(), request->map_version())) {
    FLOG(INFO) << "job " << request->job_id() << ": kept (a DropJob of shard map version " << request->map_version()
               << " came after a newer setup)";
  } else {
    FLOG(INFO) << "job " << request->job_id() << ": " << (request->keep_parameters() ? "finished" : "dropped")
               << " (" << Quote(request->reason()) << ")";
  }
  jobs_->Set(static_cast<double>(store_->num_jobs()));
  if (!request->keep_parameters()) {
    table_gauges_->Remove(request->job_id());
    MutexLock lock(&captures_mu_);
    captures_.erase(std::remove_if(captures_.begin(), captures_.end(),
                                   [&](const LiveCapture& kept) { return kept.job_id == request->job_id(); }),
                    captures_.end());
  } else if (auto kept = store_->Find(request->job_id()); kept.ok() && (*kept)->sparse() != nullptr) {
    table_gauges_->Update(request->job_id(), *(*kept)->sparse(), /*force=*/true);  // the final figures
  }
  ReleaseFreedMemory();
  return Finish("DropJob", absl::OkStatus(), request->ByteSizeLong(), 0);
}

// --- GrpcReplicaPeers ------------------------------------------------------------

namespace {

class GrpcForward final : public ReplicaPeers::Forward {
 public:
  ~GrpcForward() override { done_.WaitForNotification(); }  // gRPC holds our members until it has answered
  void Cancel() override { context_.TryCancel(); }
  absl::Status Wait() override {
    done_.WaitForNotification();
    return FromGrpcStatus(status_);
  }

 private:
  friend class fulcrum::GrpcReplicaPeers;
  grpc::ClientContext context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  grpc::Status status_;
  Notification done_;
};

}  // namespace

GrpcReplicaPeers::Peer& GrpcReplicaPeers::At(const std::string& address) {
  MutexLock lock(&mu_);
  Peer& peer = peers_[address];
  if (peer.stub == nullptr) {
    std::shared_ptr<grpc::Channel> channel = MakeChannel(address);
    peer.stub = v1::ParameterService::NewStub(channel);
    peer.raw = std::make_unique<grpc::GenericStub>(channel);
  }
  return peer;
}

std::unique_ptr<ReplicaPeers::Forward> GrpcReplicaPeers::Replicate(const std::string& address, Method method,
                                                                    grpc::ByteBuffer request, absl::Duration timeout) {
  static const std::string* const kReplicate =
      new std::string(absl::StrCat("/", v1::ParameterService::service_full_name(), "/Replicate"));
  static const std::string* const kSparseReplicate =
      new std::string(absl::StrCat("/", v1::ParameterService::service_full_name(), "/SparseReplicate"));
  auto forward = std::make_unique<GrpcForward>();
  SetDeadline(&forward->context_, absl::ToDoubleSeconds(timeout));
  forward->request_ = std::move(request);
  GrpcForward* raw = forward.get();
  At(address).raw->UnaryCall(&raw->context_, method == Method::kReplicate ? *kReplicate : *kSparseReplicate,
                             grpc::StubOptions(), &raw->request_, &raw->response_,
                             [raw](grpc::Status status) {
                               raw->status_ = std::move(status);
                               raw->done_.Notify();
                             });
  return forward;
}

absl::StatusOr<v1::ChunkState> GrpcReplicaPeers::CopyChunk(const std::string& address,
                                                           const v1::CopyChunkRequest& request, absl::Duration timeout) {
  v1::ChunkState state;
  grpc::ClientContext context;
  SetDeadline(&context, absl::ToDoubleSeconds(timeout));
  const absl::Status status = FromGrpcStatus(Stub(address)->CopyChunk(&context, request, &state));
  // A busy source: a copy that failed for now (RESOURCE_EXHAUSTED would
  // read as a copy that does not fit here).
  if (IsServerBusy(status))
    return absl::UnavailableError(absl::StrCat(address, " is busy: ", status.message()));
  RETURN_IF_ERROR(status);
  return state;
}

absl::Status ParameterServiceImpl::HandlePush(const grpc::ByteBuffer& request, bool from_worker,
                                              v1::PushResponse* response) {
  ReaderMutexLock writes(&writes_mu_);
  v1::PushRequest header;  // every field but the chunks
  PayloadReader chunks;
  RETURN_IF_ERROR(chunks.Parse(request, v1::PushRequest::kChunksFieldNumber, &header));
  ASSIGN_OR_RETURN(std::shared_ptr<JobShard> shard, store_->Find(header.job_id()));
  RETURN_IF_ERROR(replicator_->CheckWrite(*shard, header, chunks, /*as_primary=*/from_worker));
  RETURN_IF_ERROR(CheckJobStep(header.job_id(), *shard, header.step(), "push"));
  if (header.lamb_norms_size() > 0) return HandleLambNorms(*shard, header, chunks, from_worker, response);
  // Validate everything first: a bad push must reach no replica. Each
  // gradient is decoded once, from the received bytes into a pooled buffer,
  // and applied from there.
  PushArgs args = PushArgsOf(header);
  std::vector<FloatBufferPool::Buffer> decoded(static_cast<size_t>(chunks.chunks()));
  std::string scratch;
  for (int i = 0; i < chunks.chunks(); ++i) {
    args.chunk_id = chunks.chunk(i).chunk_id();
    args.format = chunks.chunk(i).format();
    const int64_t length = shard->ChunkLength(args.chunk_id);
    if (length == 0) {  // not held (yet): Validate says why
      args.values = nullptr;
      args.gradient = chunks.ContiguousPayload(i, &scratch);
      RETURN_IF_ERROR(shard->Validate(args));
      continue;
    }
    decoded[i] = gradients_.Acquire(length);
    RETURN_IF_ERROR(chunks.DecodePayload(i, args.format, length, decoded[i].data(),
                                         absl::StrCat("push to chunk ", args.chunk_id, " of job ", header.job_id()),
                                         &scratch));
    args.values = decoded[i].data();
    RETURN_IF_ERROR(shard->Validate(args));
  }
  // Backups have it before the primary applies and acknowledges it, so an
  // acknowledged update survives the primary's death. Retries are safe: every
  // replica deduplicates.
  // ASP/SSP: one push at a time from forward to apply (see replication_order),
  // on the primary only: its backups get the pushes in that order, and a
  // backup taking the lock could wait for a push it forwards itself (two
  // servers each primary of a shard the other backs).
  MutexLockMaybe order(shard->config().synchronous || !from_worker ? nullptr : &shard->replication_order());
  if (from_worker) RETURN_IF_ERROR(replicator_->Forward(*shard, header, chunks));
  for (int i = 0; i < chunks.chunks(); ++i) {
    args.chunk_id = chunks.chunk(i).chunk_id();
    args.format = chunks.chunk(i).format();
    args.values = decoded[i].data();
    if (args.values == nullptr) args.gradient = chunks.ContiguousPayload(i, &scratch);
    ASSIGN_OR_RETURN(PushOutcome outcome, shard->Push(args));
    CountOutcome(outcome, response);
  }
  return absl::OkStatus();
}

void ParameterServiceImpl::CountOutcome(PushOutcome outcome, v1::PushResponse* response) {
  if (outcome == PushOutcome::kDuplicate) {
    response->set_duplicates(response->duplicates() + 1);
    duplicates_->Increment();
  } else {
    response->set_applied(response->applied() + 1);
    updates_applied_->Increment();
  }
}

absl::Status ParameterServiceImpl::HandleLambNorms(JobShard& shard, const v1::PushRequest& header,
                                                   const PayloadReader& chunks, bool from_worker,
                                                   v1::PushResponse* response) {
  // Validate everything first, as for gradients: a bad push reaches no replica.
  if (!shard.config().synchronous || shard.config().optimizer.kind != OptimizerKind::kLamb) {
    return absl::FailedPreconditionError(absl::StrCat("job ", header.job_id(),
                                                      " does not run LAMB in BSP: a push of LAMB norms has "
                                                      "nothing to apply"));
  }
  // Its step is one of the job's (CheckJobStep, in HandlePush).
  std::map<int32_t, LambNorms> norms;
  for (const v1::LambNorm& norm : header.lamb_norms()) {
    const LambNorms sums{norm.weight_sq(), norm.update_sq()};
    RETURN_IF_ERROR(CheckLambNorms(sums, absl::StrCat("of tensor ", norm.tensor(), " of job ", header.job_id())));
    if (!norms.emplace(norm.tensor(), sums).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("job ", header.job_id(), ": LAMB norms list tensor ", norm.tensor(), " more than once"));
    }
  }
  std::vector<std::pair<int32_t, LambNorms>> applies;
  for (int i = 0; i < chunks.chunks(); ++i) {
    const int32_t chunk_id = chunks.chunk(i).chunk_id();
    if (chunks.payload_size(i) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("job ", header.job_id(), ": a push of LAMB norms carries no ",
                                                     "gradients, but chunk ", chunk_id, " has ",
                                                     chunks.payload_size(i), " bytes"));
    }
    ASSIGN_OR_RETURN(const int32_t tensor, shard.ChunkTensor(chunk_id));
    auto it = norms.find(tensor);
    if (it == norms.end()) {
      return absl::InvalidArgumentError(absl::StrCat("job ", header.job_id(), ": push of LAMB norms names chunk ",
                                                     chunk_id, " but no norms of its tensor ", tensor));
    }
    applies.emplace_back(chunk_id, it->second);
  }
  if (from_worker) RETURN_IF_ERROR(replicator_->Forward(shard, header, chunks));
  for (const auto& [chunk_id, tensor] : applies) {
    ASSIGN_OR_RETURN(PushOutcome outcome, shard.ApplyLambNorms(chunk_id, header.step(), tensor));
    CountOutcome(outcome, response);
  }
  return absl::OkStatus();
}

grpc::Status ParameterServiceImpl::ServeRaw(
    grpc::ServerContext* context, RawStream* stream, const char* method,
    absl::FunctionRef<absl::Status(const grpc::ByteBuffer&, grpc::ByteBuffer*)> handle) {
  grpc::ByteBuffer request;
  bool read = false;
  {
    CallWatch::Scope watched(&request_watch_, context);  // the request has its wait to come
    read = stream->Read(&request);
  }
  // Cancelled by the watch as the request came: not handled (its caller
  // sees CANCELLED, so an applied push would be sent again as unknown).
  if (!read || context->IsCancelled()) {
    return Finish(method, absl::CancelledError("the call ended before its request"), 0, 0);
  }
  const auto received = static_cast<int64_t>(request.Length());
  grpc::ByteBuffer answer;
  absl::Status status = handle(request, &answer);
  int64_t sent = 0;
  if (status.ok()) {
    sent = static_cast<int64_t>(answer.Length());
    // Sent with the status, in one batch (as a unary answer is).
    stream->WriteLast(answer, grpc::WriteOptions());
  }
  return Finish(method, status, received, sent);
}

grpc::Status ParameterServiceImpl::Reconfigure(grpc::ServerContext* /*context*/, const v1::ReconfigureRequest* request,
                                               v1::ReconfigureResponse*) {
  if (auto held = store_->Find(request->job_id());
      held.ok() && request->shard_map().version() > (*held)->map_version()) {
    // The roles change: forwards to backups still in flight (one that
    // stopped would hold them, and this call behind them, to their deadline)
    // are cancelled; their pushes fail and are retried on the new map.
    replicator_->CancelForwards(request->job_id());
  }
  auto shard = store_->Find(request->job_id());
  if (!shard.ok()) return Finish("Reconfigure", shard.status(), request->ByteSizeLong(), 0);
  absl::Status status;
  {
    MutexLock writes(&writes_mu_);
    status = (*shard)->Configure(request->shard_map().version(),
                                 RolesFor(request->shard_map(), (*shard)->config().server_id),
                                 ChunkShards(request->shard_map()));
  }
  if (status.ok()) {
    FLOG(INFO) << "job " << request->job_id() << ": shard map version " << request->shard_map().version();
    // The roles do not change here (Configure did, above): the chunks freed
    // are ones no write may reach, and their memory goes outside the lock.
    if (request->moves_committed()) (*shard)->FreeChunksWithoutRole(request->shard_map().version());
  }
  return Finish("Reconfigure", status, request->ByteSizeLong(), 0);
}

grpc::Status ParameterServiceImpl::CopyChunk(grpc::ServerContext* /*context*/, const v1::CopyChunkRequest* request,
                                             v1::ChunkState* response) {
  if (request->chunk_id() >= kTableChunkBase || request->has_table_shard()) {
    const absl::Status status = CopyTableBucket(*request, response);
    return Finish("CopyChunk", status, request->ByteSizeLong(), status.ok() ? response->ByteSizeLong() : 0);
  }
  auto shard = store_->Find(request->job_id());
  if (!shard.ok()) return Finish("CopyChunk", shard.status(), request->ByteSizeLong(), 0);
  absl::StatusOr<ChunkSnapshot> snapshot = (*shard)->Snapshot(request->chunk_id());
  if (!snapshot.ok()) return Finish("CopyChunk", snapshot.status(), request->ByteSizeLong(), 0);
  ToChunkState(*snapshot, request->chunk_id(), response);
  return Finish("CopyChunk", absl::OkStatus(), request->ByteSizeLong(), response->ByteSizeLong());
}

absl::Status ParameterServiceImpl::CheckPull(const JobShard& shard, const v1::PullRequest& request) const {
  if (request.map_version() < shard.map_version()) {
    return absl::AbortedError(absl::StrCat("job ", request.job_id(), ": pull made with shard map version ",
                                           request.map_version(), ", this server is at ", shard.map_version(),
                                           ": refresh the map"));
  }
  if (request.has_lamb_step()) {
    RETURN_IF_ERROR(CheckJobStep(request.job_id(), shard, request.lamb_step(), "pull of LAMB norms"));
  }
  const int bytes_per_value = WireBytes(request.format());
  if (bytes_per_value == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job ", request.job_id(), ": pull asks for ",
        IsCompressedWire(request.format())
            ? absl::StrCat("wire format ", WireFormatName(request.format()), ", a push encoding of compressed gradients")
            : absl::StrCat("unknown wire format ", static_cast<int>(request.format())),
        "; pulls take WIRE_FP32, WIRE_BF16, WIRE_FP16"));
  }
  // Every chunk once, and a response that fits a message: the work and
  // memory one request can cause are those of one bounded answer.
  if (std::optional<int32_t> twice =
          ListedTwice(std::vector<int32_t>(request.chunk_ids().begin(), request.chunk_ids().end()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", request.job_id(), ": pull lists chunk ", *twice, " more than once"));
  }
  int64_t bytes = 0;
  for (int32_t chunk_id : request.chunk_ids()) bytes += shard.ChunkLength(chunk_id) * bytes_per_value;
  if (bytes > kMaxPullBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job ", request.job_id(), ": pull of ", request.chunk_ids_size(),
                                                   " chunks asks for ", bytes, " bytes in one response; at most ",
                                                   kMaxPullBytes, " (split it into several pulls)"));
  }
  return absl::OkStatus();
}

namespace {

// A chunk's values lent to gRPC: the lease ends when gRPC drops the slice.
grpc::Slice LeaseSlice(ValuesLease lease) {
  if (lease.empty() || lease.size() == 0) return grpc::Slice();
  auto* held = new ValuesLease(std::move(lease));
  return grpc::Slice(const_cast<char*>(held->bytes()), held->size(),
                     [](void* lent) { delete static_cast<ValuesLease*>(lent); }, held);
}

// One Pull call: answered at once when its chunks are there, else held
// (HeldPulls) until they are, its deadline passes or its caller cancels.
class PendingPull final : public HeldPull {
 public:
  PendingPull(std::shared_ptr<JobShard> shard, const v1::PullRequest& request, v1::PullResponse* response,
              std::vector<grpc::Slice>* lent, absl::Time deadline, std::function<void(const absl::Status&)> finish)
      : shard_(std::move(shard)),
        chunk_ids_(request.chunk_ids().begin(), request.chunk_ids().end()),
        min_version_(request.min_version()),
        min_clock_(request.min_clock()),
        exact_version_(request.exact_version() ? request.min_version() : -1),
        lamb_step_(request.has_lamb_step() ? request.lamb_step() : -1),
        format_(request.format()),
        response_(response),
        lent_(lent),
        deadline_(deadline),
        finish_(std::move(finish)) {}

  // A chunk's version, clock and LAMB step only go up, so a chunk found
  // ready stays so: each check goes on from the first chunk not ready at the
  // last one, and a pull of many chunks costs one look at each over all the
  // rounds it waits, not one each round. (Complete reads them all anyway.)
  bool Ready() override {
    for (; ready_ < chunk_ids_.size(); ++ready_) {
      const int32_t chunk_id = chunk_ids_[ready_];
      const bool ready =
          lamb_step_ >= 0 ? shard_->LambReady(chunk_id, lamb_step_) : shard_->Ready(chunk_id, min_version_, min_clock_);
      if (!ready) return false;
    }
    return true;
  }

  void Complete() override {
    if (lamb_step_ >= 0) return CompleteLamb();
    for (int32_t chunk_id : chunk_ids_) {
      v1::ChunkData* chunk = response_->add_chunks();
      chunk->set_chunk_id(chunk_id);
      chunk->set_format(format_);
      int64_t version = 0, clock = 0;
      ValuesLease lease;
      absl::Status read = shard_->Read(chunk_id, format_, chunk->mutable_data(), &version, &clock, exact_version_,
                                       lent_ != nullptr ? &lease : nullptr);
      if (!read.ok()) {
        response_->Clear();
        if (lent_ != nullptr) lent_->clear();
        return Fail(read);
      }
      chunk->set_version(version);
      chunk->set_clock(clock);
      if (lent_ != nullptr) lent_->push_back(LeaseSlice(std::move(lease)));
    }
    End(absl::OkStatus());
  }

  // The chunks' squared norms of LAMB step lamb_step_, no values.
  void CompleteLamb() {
    for (int32_t chunk_id : chunk_ids_) {
      v1::ChunkData* chunk = response_->add_chunks();
      chunk->set_chunk_id(chunk_id);
      int64_t version = 0;
      absl::Status read = shard_->LambPartialOf(chunk_id, lamb_step_, chunk->mutable_lamb(), &version);
      if (!read.ok()) {
        response_->Clear();
        if (lent_ != nullptr) lent_->clear();
        return Fail(read);
      }
      chunk->set_version(version);
      if (lent_ != nullptr) lent_->push_back(grpc::Slice());
    }
    End(absl::OkStatus());
  }

  void Fail(const absl::Status& status) override {
    if (absl::IsDeadlineExceeded(status)) {
      return End(absl::DeadlineExceededError(absl::StrCat("pull of ", chunk_ids_.size(), " chunks of job ",
                                                          shard_->config().job_id, " waited for step ",
                                                          lamb_step_ >= 0 ? lamb_step_ : std::max(min_version_, min_clock_),
                                                          lamb_step_ >= 0 ? " (LAMB norms)" : "", ": ",
                                                          status.message())));
    }
    End(status);
  }

  absl::Time deadline() const override { return deadline_; }
  bool cancelled() const override { return cancelled_.load(); }
  void Cancel() { cancelled_ = true; }

 private:
  void End(const absl::Status& status) {
    if (!ended_.exchange(true)) finish_(status);
  }

  const std::shared_ptr<JobShard> shard_;
  const std::vector<int32_t> chunk_ids_;
  const int64_t min_version_;
  const int64_t min_clock_;
  const int64_t exact_version_;  // -1: the latest values
  const int64_t lamb_step_;      // -1: values; else the chunks' LAMB norms of that step
  const v1::WireFormat format_;
  v1::PullResponse* const response_;  // gRPC's, valid until the call is done
  std::vector<grpc::Slice>* const lent_;  // optional, as long as response_
  const absl::Time deadline_;
  const std::function<void(const absl::Status&)> finish_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> ended_{false};
  size_t ready_ = 0;  // chunk_ids_[0, ready_) were ready (Ready's thread only)
};

// gRPC's Pull: HandlePull's answer, or the cancellation of the call.
class PullReactor final : public grpc::ServerUnaryReactor {
 public:
  const std::shared_ptr<ParameterServiceImpl::PullHandle> handle =
      std::make_shared<ParameterServiceImpl::PullHandle>();

  void OnCancel() override { handle->Cancel(); }
  void OnDone() override { delete this; }
};

}  // namespace

absl::StatusOr<std::shared_ptr<HeldPull>> ParameterServiceImpl::StartPull(const v1::PullRequest& request,
                                                                           v1::PullResponse* response,
                                                                           absl::Time deadline,
                                                                           std::function<void(const absl::Status&)> finish,
                                                                           std::vector<grpc::Slice>* lent) {
  ASSIGN_OR_RETURN(std::shared_ptr<JobShard> shard, store_->Find(request.job_id()));
  RETURN_IF_ERROR(CheckPull(*shard, request));
  auto pull = std::make_shared<PendingPull>(std::move(shard), request, response, lent, deadline, std::move(finish));
  if (pull->Ready()) {  // the common case: no waiting, answered on this thread
    pull->Complete();
    return nullptr;
  }
  return pull;
}

void ParameterServiceImpl::PullHandle::Attach(std::shared_ptr<HeldPull> pull, HeldPulls* held) {
  MutexLock lock(&mu_);
  pull_ = std::move(pull);
  held_ = held;
  if (cancelled_) static_cast<PendingPull*>(pull_.get())->Cancel();  // the caller gave up before it was held
}

void ParameterServiceImpl::PullHandle::Detach() {
  std::shared_ptr<HeldPull> pull;  // let go of outside the lock
  MutexLock lock(&mu_);
  pull = std::move(pull_);
}

void ParameterServiceImpl::PullHandle::Cancel() {
  MutexLock lock(&mu_);
  cancelled_ = true;
  if (pull_ != nullptr) {
    static_cast<PendingPull*>(pull_.get())->Cancel();
    held_->Poke();
  }
}

ParameterServiceImpl::PullHandle::~PullHandle() {
  if (counted_ != nullptr) counted_->fetch_sub(reserved_.load());
}

absl::Status ParameterServiceImpl::PullHandle::Reserve(ParameterServiceImpl* service, int64_t bytes,
                                                       const char* what) {
  RETURN_IF_ERROR(service->ReservePull(bytes, what));
  counted_ = &service->pull_bytes_in_flight_;
  reserved_ += bytes;
  return absl::OkStatus();
}

absl::Status ParameterServiceImpl::ReservePull(int64_t bytes, const char* what) {
  const int64_t most = max_pull_bytes_in_flight_.load();
  int64_t held = pull_bytes_in_flight_.load();
  do {
    const int64_t orphaned = orphaned_values_->load();
    if (held + orphaned + bytes > most) {
      return absl::ResourceExhaustedError(absl::StrCat(
          kServerBusy, ": pulls in flight hold ", held + orphaned,
          " bytes (their requests and answers waiting for their callers to read them",
          orphaned > 0 ? absl::StrCat(", with ", orphaned, " bytes of older values such answers still send")
                       : "",
          "), at most ", most, " with this pull's ", bytes, " bytes of ", what, ": send it again later"));
    }
  } while (!pull_bytes_in_flight_.compare_exchange_weak(held, held + bytes));
  return absl::OkStatus();
}

void ParameterServiceImpl::HandlePull(const grpc::ByteBuffer& request, absl::Time deadline,
                                      const std::shared_ptr<PullHandle>& handle,
                                      std::function<void(const absl::Status&, grpc::ByteBuffer)> done) {
  struct Call {
    v1::PullRequest request;
    v1::PullResponse answer;  // filled by the pull, then moved into the response's slices
    std::vector<grpc::Slice> lent;  // float32 values sent from the chunks' own memory
  };
  const int64_t received = static_cast<int64_t>(request.Length());
  // The request's bytes, and its parsed copy, as many again: a held pull
  // keeps both until it is answered.
  if (absl::Status reserved = handle->Reserve(this, 2 * received, "request"); !reserved.ok()) {
    (void)Finish("Pull", reserved, received, 0);
    return done(reserved, grpc::ByteBuffer());
  }
  auto call = std::make_shared<Call>();
  // `handle` outlives `finish`: its owner drops it once `done` answered.
  auto finish = [this, call, received, handle = handle.get(), done = std::move(done)](absl::Status status) {
    grpc::ByteBuffer response;
    if (status.ok()) {
      int64_t lent = 0;
      for (const grpc::Slice& slice : call->lent) lent += static_cast<int64_t>(slice.size());
      response = SerializeMovingPayloads(&call->answer, std::move(call->lent));
      // Lent values are the chunks' own memory (counted as orphaned_values_
      // once a chunk lets go of them); the rest is the answer's.
      status = handle->Reserve(this, static_cast<int64_t>(response.Length()) - lent, "answer");
      if (!status.ok()) response.Clear();
    }
    // Whoever answered holds the pull until this returns; the handle lives
    // until the answer is sent, and must not keep the job's shard that long.
    handle->Detach();
    (void)Finish("Pull", status, received, static_cast<int64_t>(response.Length()));
    done(status, std::move(response));
  };
  if (absl::Status parsed = ParseMessage(request, &call->request); !parsed.ok()) return finish(parsed);
  // Its chunk ids as parsed and as the pull keeps them, 4 bytes each where
  // the wire may take 1.
  if (absl::Status ids =
          handle->Reserve(this, 8 * int64_t{call->request.chunk_ids_size()}, "request's chunk ids");
      !ids.ok()) {
    return finish(ids);
  }
  absl::StatusOr<std::shared_ptr<HeldPull>> pull =
      StartPull(call->request, &call->answer, std::min(deadline, absl::Now() + kMaxPullWait), finish, &call->lent);
  if (!pull.ok()) return finish(pull.status());
  if (*pull == nullptr) return;  // answered
  handle->Attach(*pull, held_pulls_.get());
  if (absl::Status held = held_pulls_->Hold(*pull); !held.ok()) (*pull)->Fail(held);
}

grpc::ServerUnaryReactor* ParameterServiceImpl::Pull(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  auto* reactor = new PullReactor();
  HandlePull(*request, PullDeadline(*context), reactor->handle,
             [reactor, response](const absl::Status& status, grpc::ByteBuffer answer) {
               *response = std::move(answer);
               reactor->Finish(ToGrpcStatus(status));
             });
  return reactor;
}

}  // namespace fulcrum
