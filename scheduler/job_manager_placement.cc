// JobManager: the shard map of a job and setting its chunks up on the servers.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/shard_map.h"
#include "kernels/model_from_spec.h"
#include "scheduler/job_manager_internal.h"

namespace fulcrum {
namespace {

// Stable across processes and platforms (unlike std::hash / absl::Hash).
uint64_t StableHash(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

}  // namespace

void JobManager::StartSetups() {
  for (auto& [id, job] : jobs_) {
    if (job->phase != Job::Phase::kLoading || job->workers.empty()) continue;
    if (!std::all_of(job->workers.begin(), job->workers.end(), [](const JobWorker& w) { return w.ready; })) continue;
    absl::Status status = BuildShardPlan(job.get());
    if (!status.ok()) {
      EndJob(job.get(), v1::FAILED, std::string(status.message()));
      continue;
    }
    std::map<std::string, v1::SetupJobRequest> requests;
    for (const v1::ChunkLocation& chunk : job->shard_map.chunks()) {
      const v1::ShardLocation& shard = job->shard_map.shards(chunk.shard());
      v1::SetupJobRequest& request = requests[shard.address()];
      if (request.job_id().empty()) {
        request.set_job_id(id);
        *request.mutable_spec() = job->status.spec();
        request.set_num_partitions(job->num_partitions);
        request.set_total_steps(job->total_steps);
      }
      v1::ChunkSetup* setup = request.add_chunks();
      setup->set_chunk_id(chunk.chunk_id());
      setup->set_tensor(chunk.tensor());
      setup->set_offset(chunk.offset());
      setup->set_length(chunk.length());
    }
    // Initialization comes from the model's tensor table.
    ModelLayout layout = LayoutFor(job->status.spec(), job->data_info.features(), job->data_info.classes());
    for (auto& [address, request] : requests) {
      for (v1::ChunkSetup& setup : *request.mutable_chunks()) {
        const auto& tensor = layout.tensors[setup.tensor()];
        setup.set_init(tensor.init == InitKind::kUniform ? v1::ChunkSetup::UNIFORM : v1::ChunkSetup::ZEROS);
        setup.set_init_scale(tensor.init_scale);
      }
    }
    job->phase = Job::Phase::kSettingUp;
    job->status.set_reason("setting up parameter shards");
    Touch(job.get());
    actions_.push_back([this, id = id, requests = std::move(requests)]() mutable {
      RunSetup(id, std::move(requests));
    });
  }
}

absl::Status JobManager::BuildShardPlan(Job* job) {
  const v1::JobSpec& spec = job->status.spec();
  const v1::WorkReport& data = job->data_info;
  int64_t global_batch = int64_t{spec.data().batch_size()} * job->num_partitions;
  job->steps_per_epoch = data.train_examples() / global_batch;
  if (job->steps_per_epoch == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training set has ", data.train_examples(), " examples, fewer than one global batch (",
        "data.batchSize * maxWorkers = ", global_batch, ")"));
  }
  job->total_steps = job->steps_per_epoch * spec.data().epochs();
  if (spec.data().max_steps() > 0) job->total_steps = std::min(job->total_steps, spec.data().max_steps());
  job->status.mutable_progress()->set_total_steps(job->total_steps);

  ModelLayout layout = LayoutFor(spec, data.features(), data.classes());
  std::vector<int64_t> sizes;
  v1::ShardMap& map = job->shard_map;
  map.Clear();
  map.set_version(1);
  map.set_chunk_elems(options_.chunk_elems);
  int64_t parameters = 0;
  for (const auto& tensor : layout.tensors) {
    v1::TensorLayout* t = map.add_tensors();
    t->set_name(tensor.name);
    for (int64_t d : tensor.shape) t->add_shape(d);
    t->set_size(tensor.size);
    sizes.push_back(tensor.size);
    parameters += tensor.size;
  }
  job->status.set_num_parameters(parameters);

  std::vector<uint64_t> server_keys;
  std::vector<Member*> servers;
  for (auto& [id, member] : members_) {
    if (member->role != v1::SERVER) continue;
    servers.push_back(member.get());
    server_keys.push_back(StableHash(id));
  }
  if (servers.empty()) return absl::UnavailableError("no parameter server is live");
  int32_t num_shards = spec.num_shards() > 0 ? spec.num_shards() : static_cast<int32_t>(servers.size());
  std::vector<size_t> placement = BalancedShardPlacement(num_shards, server_keys);
  for (int32_t s = 0; s < num_shards; ++s) {
    Member* server = servers[placement[s]];
    v1::ShardLocation* shard = map.add_shards();
    shard->set_shard(s);
    shard->set_server_id(server->id);
    shard->set_address(server->address);
    job->server_addresses[server->id] = server->address;
  }
  std::vector<ChunkSpan> chunks = CutIntoChunks(sizes, options_.chunk_elems);
  std::vector<int32_t> shard_of = AssignChunksToShards(chunks, num_shards);
  job->status.clear_shards();
  for (int32_t s = 0; s < num_shards; ++s) {
    v1::ShardInfo* info = job->status.add_shards();
    info->set_shard(s);
    info->set_server_id(map.shards(s).server_id());
    info->set_address(map.shards(s).address());
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    v1::ChunkLocation* chunk = map.add_chunks();
    chunk->set_chunk_id(static_cast<int32_t>(i));
    chunk->set_tensor(chunks[i].tensor_index);
    chunk->set_offset(chunks[i].offset);
    chunk->set_length(chunks[i].length);
    chunk->set_shard(shard_of[i]);
    v1::ShardInfo* info = job->status.mutable_shards(shard_of[i]);
    info->set_chunks(info->chunks() + 1);
    info->set_elements(info->elements() + chunks[i].length);
  }
  return absl::OkStatus();
}

void JobManager::RunSetup(const std::string& job_id, std::map<std::string, v1::SetupJobRequest> requests) {
  absl::Status failure;
  for (auto& [address, request] : requests) {
    absl::Status status = servers_->SetupJob(address, request);
    if (!status.ok()) {
      failure = absl::Status(status.code(), absl::StrCat("setting up shards on server ", address,
                                                         ": ", status.message()));
      break;
    }
  }
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr || job->phase != Job::Phase::kSettingUp) return;  // ended meanwhile
  if (!failure.ok()) {
    EndJob(job, v1::FAILED, std::string(failure.message()));
    return;
  }
  job->phase = Job::Phase::kTraining;
  job->status.set_reason("training");
  AddEvent(job, absl::StrCat("training with ", job->workers.size(), " workers on ", job->num_partitions,
                             " partitions"));
  *job->status.mutable_shard_map() = job->shard_map;
  FLOG(INFO) << "job " << job_id << " training: " << job->status.num_parameters() << " parameters in "
             << job->shard_map.chunks_size() << " chunks on " << job->server_addresses.size()
             << " servers, " << job->total_steps << " steps";
  Touch(job);
}

}  // namespace fulcrum
