#include "server/parameter_service.h"

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/rpc_security.h"
#include "common/status_macros.h"
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

// Longest a pull waits for a BSP step when the client set no tighter deadline.
constexpr absl::Duration kMaxPullWait = absl::Seconds(120);

OptimizerConfig ToOptimizerConfig(const v1::OptimizerSpec& spec) {
  OptimizerConfig config;
  switch (spec.kind()) {
    case v1::OptimizerSpec::ADAM: config.kind = OptimizerKind::kAdam; break;
    case v1::OptimizerSpec::ADAMW: config.kind = OptimizerKind::kAdamW; break;
    case v1::OptimizerSpec::ADAGRAD: config.kind = OptimizerKind::kAdagrad; break;
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
  }
  config.initial_accumulator = spec.initial_accumulator();
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

absl::Time PullDeadline(const grpc::ServerContext& context) {
  absl::Time cap = absl::Now() + kMaxPullWait;
  auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return cap;
  return std::min(cap, absl::FromChrono(deadline));
}

}  // namespace

JobShardConfig ToJobShardConfig(const v1::SetupJobRequest& request) {
  JobShardConfig config;
  config.job_id = request.job_id();
  config.server_id = request.server_id();
  config.optimizer = ToOptimizerConfig(request.spec().optimizer());
  config.lr = request.spec().optimizer().lr();
  config.schedule = ToScheduleConfig(request.spec().lr_schedule(), request.total_steps());
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

void ToChunkState(const ChunkSnapshot& snapshot, int32_t chunk_id, v1::ChunkState* state) {
  state->set_chunk_id(chunk_id);
  EncodeFloats(snapshot.values.data(), snapshot.values.size(), state->mutable_values());
  for (const auto& slot : snapshot.optimizer_state) EncodeFloats(slot.data(), slot.size(), state->add_optimizer_state());
  state->set_version(snapshot.version);
  for (const auto& gradient : snapshot.pending) EncodeFloats(gradient.data(), gradient.size(), state->add_pending());
  for (const auto& [worker, seq] : snapshot.watermarks) (*state->mutable_watermarks())[worker] = seq;
  for (int64_t s : snapshot.partition_steps) state->add_partition_steps(s);
  state->set_examples_seen(snapshot.examples_seen);
  state->set_examples_digest(snapshot.examples_digest);
}

absl::StatusOr<ChunkSnapshot> FromChunkState(const v1::ChunkState& state) {
  auto decode = [](const std::string& bytes, std::vector<float>* out) {
    out->resize(bytes.size() / 4);
    return DecodeFloats(bytes, static_cast<int64_t>(out->size()), out->data(), "chunk state");
  };
  ChunkSnapshot snapshot;
  RETURN_IF_ERROR(decode(state.values(), &snapshot.values));
  for (const std::string& slot : state.optimizer_state()) {
    RETURN_IF_ERROR(decode(slot, &snapshot.optimizer_state.emplace_back()));
  }
  snapshot.version = state.version();
  for (const std::string& gradient : state.pending()) RETURN_IF_ERROR(decode(gradient, &snapshot.pending.emplace_back()));
  snapshot.watermarks.assign(state.watermarks().begin(), state.watermarks().end());
  snapshot.partition_steps.assign(state.partition_steps().begin(), state.partition_steps().end());
  snapshot.examples_seen = state.examples_seen();
  snapshot.examples_digest = state.examples_digest();
  return snapshot;
}

JobShardConfig ParameterServiceImpl::ConfigFor(const v1::SetupJobRequest& request) {
  JobShardConfig config = ToJobShardConfig(request);
  config.observe_apply = [histogram = optimizer_seconds_](double seconds) { histogram->Observe(seconds); };
  return config;
}

ParameterServiceImpl::~ParameterServiceImpl() {
  if (writer_ != nullptr) writer_->Stop();
}

ParameterServiceImpl::ParameterServiceImpl(ParameterStore* store, MetricsEndpoint* metrics,
                                           std::function<bool()> lease_valid, CheckpointStore* checkpoints)
    : store_(store), metrics_(metrics), lease_valid_(std::move(lease_valid)), checkpoints_(checkpoints) {
  if (checkpoints_ != nullptr) writer_ = std::make_unique<CheckpointWriter>(checkpoints_);
  auto& registry = metrics_->registry();
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
  refused_ = &prometheus::BuildCounter()
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
  replication_seconds_ = &prometheus::BuildHistogram()
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
}

grpc::Status ParameterServiceImpl::Finish(const char* method, const absl::Status& status,
                                          int64_t received, int64_t sent) {
  metrics_->CountBytes(method, received, sent);  // calls themselves: grpc_server_* (interceptor)
  if (!status.ok() && status.code() != absl::StatusCode::kCancelled) {
    FLOG(WARNING) << method << ": " << status;
  }
  return ToGrpcStatus(status);
}

grpc::Status ParameterServiceImpl::SetupJob(grpc::ServerContext* context, const v1::SetupJobRequest* request,
                                            v1::SetupJobResponse*) {
  if (absl::Status denied = Authorize(context, Caller::kClusterMember); !denied.ok()) return Finish("SetupJob", denied, 0, 0);
  absl::Status status;
  std::map<int32_t, std::string> sources;
  for (const v1::ChunkSetup& chunk : request->chunks()) {
    if (!chunk.copy_from().empty()) sources[chunk.chunk_id()] = chunk.copy_from();
  }
  if (request->copy_from().empty() && sources.empty()) {
    // Fresh state, or a checkpoint's: built aside, installed when whole.
    auto shard = JobShard::Create(ConfigFor(*request));
    status = shard.status();
    if (status.ok() && request->has_restore()) status = RestoreChunks(shard->get(), request->restore());
    if (status.ok()) {
      status = (*shard)->Configure(request->shard_map().version(), RolesFor(request->shard_map(), request->server_id()));
    }
    if (status.ok()) store_->Install(std::move(*shard));
  } else {
    // Chunks copied from their primaries (a new backup, or chunks moving to
    // a new shard): fetched first, then added to what this server holds of
    // the job (other shards stay), or to a fresh job state put in place.
    JobShardConfig config = ConfigFor(*request);
    auto snapshots = FetchChunks(request->copy_from(), config, sources);
    status = snapshots.status();
    auto existing = store_->Find(request->job_id());
    const auto roles = RolesFor(request->shard_map(), request->server_id());
    if (status.ok() && existing.ok()) {
      status = (*existing)->AdoptChunks(config.chunks, *snapshots);
      if (status.ok()) {
        status = (*existing)->Configure(request->shard_map().version(), roles, ChunkShards(request->shard_map()));
      }
    } else if (status.ok()) {
      auto shard = JobShard::Create(config);
      status = shard.status();
      if (status.ok()) status = (*shard)->AdoptChunks(config.chunks, *snapshots);
      if (status.ok()) status = (*shard)->Configure(request->shard_map().version(), roles);
      if (status.ok()) store_->Install(std::move(*shard));
    }
  }
  if (status.ok()) {
    FLOG(INFO) << "job " << request->job_id() << ": holding " << request->chunks_size()
               << " chunks, " << request->num_partitions() << " data partitions";
  }
  jobs_->Set(static_cast<double>(store_->num_jobs()));
  return Finish("SetupJob", status, request->ByteSizeLong(), 0);
}

grpc::Status ParameterServiceImpl::DropJob(grpc::ServerContext* context, const v1::DropJobRequest* request,
                                           v1::DropJobResponse*) {
  if (absl::Status denied = Authorize(context, Caller::kClusterMember); !denied.ok()) return Finish("DropJob", denied, 0, 0);
  store_->DropJob(request->job_id(), request->reason(), request->keep_parameters());
  FLOG(INFO) << "job " << request->job_id() << ": " << (request->keep_parameters() ? "finished" : "dropped")
             << " (" << request->reason() << ")";
  jobs_->Set(static_cast<double>(store_->num_jobs()));
  return Finish("DropJob", absl::OkStatus(), request->ByteSizeLong(), 0);
}

absl::Status ParameterServiceImpl::CheckRoute(const JobShard& shard, int64_t map_version,
                                              const v1::PushRequest& request, bool as_primary) const {
  if (lease_valid_ && !lease_valid_()) {
    refused_->Increment();
    return absl::UnavailableError("this server lost its lease with the scheduler: it takes no writes until it has one");
  }
  const int64_t held = shard.map_version();
  if (map_version < held) {
    refused_->Increment();
    return absl::AbortedError(absl::StrCat("job ", request.job_id(), ": request made with shard map version ",
                                           map_version, ", this server is at ", held, ": refresh the map and retry"));
  }
  if (map_version > held) {
    return absl::UnavailableError(absl::StrCat("job ", request.job_id(), ": this server has not received shard map version ",
                                               map_version, " yet (at ", held, "): retry"));
  }
  for (const v1::ChunkData& chunk : request.chunks()) {
    ASSIGN_OR_RETURN(JobShard::ShardRole role, shard.RoleOf(chunk.chunk_id()));
    if (role.primary != as_primary) {
      return absl::AbortedError(absl::StrCat("chunk ", chunk.chunk_id(), " of job ", request.job_id(),
                                             as_primary ? ": this server is not its primary" : ": this server is not its backup",
                                             " in shard map version ", held));
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterServiceImpl::ApplyPush(JobShard* shard, const v1::PushRequest& request,
                                             v1::PushResponse* response) {
  PushArgs args = PushArgsOf(request);
  for (const v1::ChunkData& chunk : request.chunks()) {
    args.chunk_id = chunk.chunk_id();
    args.gradient = chunk.data();
    args.format = chunk.format();
    ASSIGN_OR_RETURN(PushOutcome outcome, shard->Push(args));
    if (outcome == PushOutcome::kDuplicate) {
      response->set_duplicates(response->duplicates() + 1);
      duplicates_->Increment();
    } else {
      response->set_applied(response->applied() + 1);
      updates_applied_->Increment();
    }
  }
  return absl::OkStatus();
}

v1::ParameterService::Stub* ParameterServiceImpl::BackupStub(const std::string& address) {
  absl::MutexLock lock(&stubs_mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) stub = v1::ParameterService::NewStub(MakeChannel(address));
  return stub.get();
}

absl::Status ParameterServiceImpl::ForwardToBackups(const JobShard& shard, const v1::PushRequest& request) {
  std::map<std::string, v1::PushRequest> forwards;
  for (const v1::ChunkData& chunk : request.chunks()) {
    ASSIGN_OR_RETURN(JobShard::ShardRole role, shard.RoleOf(chunk.chunk_id()));
    for (const std::string& backup : role.backup_addresses) {
      v1::PushRequest& forward = forwards[backup];
      if (forward.job_id().empty()) {
        forward = request;
        forward.clear_chunks();
      }
      *forward.add_chunks() = chunk;
    }
  }
  if (forwards.empty()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  struct Call {
    grpc::ClientContext context;
    v1::PushResponse response;
    grpc::Status status;
  };
  std::map<std::string, Call> calls;
  absl::Mutex mu;
  size_t remaining = forwards.size();
  for (auto& [address, forward] : forwards) {
    Call& call = calls[address];
    SetDeadline(&call.context, 10.0);
    BackupStub(address)->async()->Replicate(&call.context, &forward, &call.response, [&](grpc::Status status) {
      absl::MutexLock lock(&mu);
      call.status = std::move(status);
      --remaining;
    });
  }
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(+[](size_t* r) { return *r == 0; }, &remaining));
  }
  replication_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  for (auto& [address, call] : calls) {
    if (call.status.ok()) continue;
    absl::Status status = FromGrpcStatus(call.status);
    // A backup that moved to a newer map fences this primary: ABORTED makes
    // the worker refresh its map. Anything else is retried.
    auto code = status.code() == absl::StatusCode::kAborted ? absl::StatusCode::kAborted
                                                            : absl::StatusCode::kUnavailable;
    return absl::Status(code, absl::StrCat("replicating to backup ", address, ": ", status.message()));
  }
  return absl::OkStatus();
}

grpc::Status ParameterServiceImpl::Push(grpc::ServerContext* context, const v1::PushRequest* request,
                                        v1::PushResponse* response) {
  if (absl::Status denied = Authorize(context, Caller::kClusterMember); !denied.ok()) return Finish("Push", denied, 0, 0);
  absl::ReaderMutexLock writes(&writes_mu_);
  const int64_t received = request->ByteSizeLong();
  auto shard = store_->Find(request->job_id());
  if (!shard.ok()) return Finish("Push", shard.status(), received, 0);
  absl::Status status = CheckRoute(**shard, request->map_version(), *request, /*as_primary=*/true);
  // Validate everything first: a bad push must reach no replica.
  PushArgs args = PushArgsOf(*request);
  for (int i = 0; status.ok() && i < request->chunks_size(); ++i) {
    args.chunk_id = request->chunks(i).chunk_id();
    args.gradient = request->chunks(i).data();
    args.format = request->chunks(i).format();
    status = (*shard)->Validate(args);
  }
  // Backups have it before the primary applies and acknowledges it, so an
  // acknowledged update survives the primary's death. Retries are safe: every
  // replica deduplicates.
  // ASP/SSP: one push at a time from forward to apply (see replication_order).
  absl::MutexLockMaybe order((*shard)->config().synchronous ? nullptr : &(*shard)->replication_order());
  if (status.ok()) status = ForwardToBackups(**shard, *request);
  if (status.ok()) status = ApplyPush(shard->get(), *request, response);
  return Finish("Push", status, received, response->ByteSizeLong());
}

grpc::Status ParameterServiceImpl::Replicate(grpc::ServerContext* context, const v1::PushRequest* request,
                                             v1::PushResponse* response) {
  if (absl::Status denied = Authorize(context, Caller::kClusterMember); !denied.ok()) return Finish("Replicate", denied, 0, 0);
  absl::ReaderMutexLock writes(&writes_mu_);
  const int64_t received = request->ByteSizeLong();
  auto shard = store_->Find(request->job_id());
  if (!shard.ok()) return Finish("Replicate", shard.status(), received, 0);
  absl::Status status = CheckRoute(**shard, request->map_version(), *request, /*as_primary=*/false);
  if (status.ok()) status = ApplyPush(shard->get(), *request, response);
  return Finish("Replicate", status, received, response->ByteSizeLong());
}

grpc::Status ParameterServiceImpl::Reconfigure(grpc::ServerContext* context, const v1::ReconfigureRequest* request,
                                               v1::ReconfigureResponse*) {
  if (absl::Status denied = Authorize(context, Caller::kClusterMember); !denied.ok()) return Finish("Reconfigure", denied, 0, 0);
  absl::MutexLock writes(&writes_mu_);
  auto shard = store_->Find(request->job_id());
  if (!shard.ok()) return Finish("Reconfigure", shard.status(), request->ByteSizeLong(), 0);
  absl::Status status =
      (*shard)->Configure(request->shard_map().version(), RolesFor(request->shard_map(), (*shard)->config().server_id),
                            ChunkShards(request->shard_map()));
  if (status.ok()) {
    FLOG(INFO) << "job " << request->job_id() << ": shard map version " << request->shard_map().version();
  }
  return Finish("Reconfigure", status, request->ByteSizeLong(), 0);
}

grpc::Status ParameterServiceImpl::CopyChunk(grpc::ServerContext* context, const v1::CopyChunkRequest* request,
                                             v1::ChunkState* response) {
  if (absl::Status denied = Authorize(context, Caller::kClusterMember); !denied.ok()) return Finish("CopyChunk", denied, 0, 0);
  auto shard = store_->Find(request->job_id());
  if (!shard.ok()) return Finish("CopyChunk", shard.status(), request->ByteSizeLong(), 0);
  absl::StatusOr<ChunkSnapshot> snapshot = (*shard)->Snapshot(request->chunk_id());
  if (!snapshot.ok()) return Finish("CopyChunk", snapshot.status(), request->ByteSizeLong(), 0);
  ToChunkState(*snapshot, request->chunk_id(), response);
  return Finish("CopyChunk", absl::OkStatus(), request->ByteSizeLong(), response->ByteSizeLong());
}

absl::StatusOr<std::vector<ChunkSnapshot>> ParameterServiceImpl::FetchChunks(
    const std::string& default_source, const JobShardConfig& config, const std::map<int32_t, std::string>& sources) {
  std::vector<ChunkSnapshot> snapshots;
  for (const ChunkConfig& chunk : config.chunks) {
    auto source = sources.find(chunk.chunk_id);
    const std::string& address = source != sources.end() ? source->second : default_source;
    v1::CopyChunkRequest request;
    request.set_job_id(config.job_id);
    request.set_chunk_id(chunk.chunk_id);
    v1::ChunkState state;
    grpc::ClientContext context;
    SetDeadline(&context, 30.0);
    absl::Status status = FromGrpcStatus(BackupStub(address)->CopyChunk(&context, request, &state));
    if (!status.ok()) {
      return absl::UnavailableError(absl::StrCat("copying chunk ", chunk.chunk_id, " of job ", config.job_id, " from ",
                                                 address, ": ", status.message()));
    }
    ASSIGN_OR_RETURN(ChunkSnapshot snapshot, FromChunkState(state));
    snapshots.push_back(std::move(snapshot));
  }
  return snapshots;
}

grpc::Status ParameterServiceImpl::Pull(grpc::ServerContext* context, const v1::PullRequest* request,
                                        v1::PullResponse* response) {
  if (absl::Status denied = Authorize(context, Caller::kClusterMember); !denied.ok()) return Finish("Pull", denied, 0, 0);
  auto shard = store_->Find(request->job_id());
  if (!shard.ok()) return Finish("Pull", shard.status(), request->ByteSizeLong(), 0);
  absl::Time deadline = PullDeadline(*context);
  if (request->map_version() < (*shard)->map_version()) {
    return Finish("Pull", absl::AbortedError(absl::StrCat("job ", request->job_id(), ": pull made with shard map version ",
                                                          request->map_version(), ", this server is at ",
                                                          (*shard)->map_version(), ": refresh the map")),
                  request->ByteSizeLong(), 0);
  }
  if (WireBytes(request->format()) == 0) {
    return Finish("Pull", absl::InvalidArgumentError(absl::StrCat("job ", request->job_id(), ": pull asks for unknown wire format ",
                                                                  static_cast<int>(request->format()),
                                                                  " (known: WIRE_FP32, WIRE_BF16, WIRE_FP16)")),
                  request->ByteSizeLong(), 0);
  }
  for (int32_t chunk_id : request->chunk_ids()) {
    v1::ChunkData* chunk = response->add_chunks();
    chunk->set_chunk_id(chunk_id);
    chunk->set_format(request->format());
    int64_t version = 0;
    int64_t clock = 0;
    // A worker cancels a pull it no longer needs (a peer server failed, a
    // prefetch dropped): stop holding a thread for it.
    absl::Status status = (*shard)->Pull(chunk_id, request->min_version(), request->min_clock(), deadline,
                                         chunk->mutable_data(), &version, &clock, request->format(),
                                         [context] { return context->IsCancelled(); });
    chunk->set_clock(clock);
    if (!status.ok()) return Finish("Pull", status, request->ByteSizeLong(), 0);
    chunk->set_version(version);
  }
  return Finish("Pull", absl::OkStatus(), request->ByteSizeLong(), response->ByteSizeLong());
}

}  // namespace fulcrum
