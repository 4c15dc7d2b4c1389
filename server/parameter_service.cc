#include "server/parameter_service.h"

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/rpc.h"

namespace fulcrum {
namespace {

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
  config.optimizer = ToOptimizerConfig(request.spec().optimizer());
  config.lr = request.spec().optimizer().lr();
  config.schedule = ToScheduleConfig(request.spec().lr_schedule(), request.total_steps());
  config.synchronous = request.spec().mode() != v1::ASP;
  config.num_partitions = request.num_partitions();
  config.seed = request.spec().seed();
  for (const v1::ChunkSetup& chunk : request.chunks()) {
    ChunkConfig c;
    c.chunk_id = chunk.chunk_id();
    c.tensor = chunk.tensor();
    c.offset = chunk.offset();
    c.length = chunk.length();
    c.init = chunk.init() == v1::ChunkSetup::UNIFORM ? InitKind::kUniform : InitKind::kZeros;
    c.init_scale = chunk.init_scale();
    config.chunks.push_back(c);
  }
  return config;
}

ParameterServiceImpl::ParameterServiceImpl(ParameterStore* store, MetricsEndpoint* metrics)
    : store_(store), metrics_(metrics) {
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
  jobs_ = &prometheus::BuildGauge()
               .Name("fulcrum_server_jobs")
               .Help("Jobs with state on this server")
               .Register(registry)
               .Add({});
}

grpc::Status ParameterServiceImpl::Finish(const char* method, const absl::Status& status,
                                          int64_t received, int64_t sent) {
  metrics_->CountRpc(method, absl::StatusCodeToString(status.code()));
  metrics_->CountBytes(method, received, sent);
  if (!status.ok() && status.code() != absl::StatusCode::kCancelled) {
    FLOG(WARNING) << method << ": " << status;
  }
  return ToGrpcStatus(status);
}

grpc::Status ParameterServiceImpl::SetupJob(grpc::ServerContext*, const v1::SetupJobRequest* request,
                                            v1::SetupJobResponse*) {
  absl::Status status = store_->SetupJob(ToJobShardConfig(*request));
  if (status.ok()) {
    FLOG(INFO) << "job " << request->job_id() << ": holding " << request->chunks_size()
               << " chunks, " << request->num_partitions() << " data partitions";
  }
  jobs_->Set(static_cast<double>(store_->num_jobs()));
  return Finish("SetupJob", status, request->ByteSizeLong(), 0);
}

grpc::Status ParameterServiceImpl::DropJob(grpc::ServerContext*, const v1::DropJobRequest* request,
                                           v1::DropJobResponse*) {
  store_->DropJob(request->job_id(), request->reason(), request->keep_parameters());
  FLOG(INFO) << "job " << request->job_id() << ": " << (request->keep_parameters() ? "finished" : "dropped")
             << " (" << request->reason() << ")";
  jobs_->Set(static_cast<double>(store_->num_jobs()));
  return Finish("DropJob", absl::OkStatus(), request->ByteSizeLong(), 0);
}

grpc::Status ParameterServiceImpl::Push(grpc::ServerContext*, const v1::PushRequest* request,
                                        v1::PushResponse* response) {
  auto shard = store_->Find(request->job_id());
  if (!shard.ok()) return Finish("Push", shard.status(), request->ByteSizeLong(), 0);
  PushArgs args;
  args.worker_id = request->worker_id();
  args.partition = request->partition();
  args.seq = request->seq();
  args.step = request->step();
  for (const v1::ChunkData& chunk : request->chunks()) {
    args.chunk_id = chunk.chunk_id();
    args.gradient = chunk.data();
    absl::StatusOr<PushOutcome> outcome = (*shard)->Push(args);
    if (!outcome.ok()) return Finish("Push", outcome.status(), request->ByteSizeLong(), 0);
    if (*outcome == PushOutcome::kDuplicate) {
      response->set_duplicates(response->duplicates() + 1);
      duplicates_->Increment();
    } else {
      response->set_applied(response->applied() + 1);
      updates_applied_->Increment();
    }
  }
  return Finish("Push", absl::OkStatus(), request->ByteSizeLong(), response->ByteSizeLong());
}

grpc::Status ParameterServiceImpl::Pull(grpc::ServerContext* context, const v1::PullRequest* request,
                                        v1::PullResponse* response) {
  auto shard = store_->Find(request->job_id());
  if (!shard.ok()) return Finish("Pull", shard.status(), request->ByteSizeLong(), 0);
  absl::Time deadline = PullDeadline(*context);
  for (int32_t chunk_id : request->chunk_ids()) {
    v1::ChunkData* chunk = response->add_chunks();
    chunk->set_chunk_id(chunk_id);
    int64_t version = 0;
    absl::Status status = (*shard)->Pull(chunk_id, request->min_version(), deadline,
                                         chunk->mutable_data(), &version);
    if (!status.ok()) return Finish("Pull", status, request->ByteSizeLong(), 0);
    chunk->set_version(version);
  }
  return Finish("Pull", absl::OkStatus(), request->ByteSizeLong(), response->ByteSizeLong());
}

}  // namespace fulcrum
