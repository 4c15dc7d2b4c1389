#include "scheduler/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/shard_map.h"
#include "common/table_spec.h"

namespace fulcrum {

uint64_t StableHash(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

v1::ShardMap PlanShardMap(const std::vector<kernels::TensorInfo>& tensors, const std::vector<ServerRef>& servers,
                          int32_t num_shards, int replicas, int64_t chunk_elems, int64_t version) {
  v1::ShardMap map;
  map.set_version(version);
  map.set_chunk_elems(chunk_elems);
  std::vector<int64_t> sizes;
  for (const auto& tensor : tensors) {
    v1::TensorLayout* t = map.add_tensors();
    t->set_name(tensor.name);
    for (int64_t d : tensor.shape) t->add_shape(d);
    t->set_size(tensor.size);
    sizes.push_back(tensor.size);
  }
  if (num_shards <= 0) num_shards = static_cast<int32_t>(servers.size());
  std::vector<uint64_t> keys;
  for (const ServerRef& server : servers) keys.push_back(StableHash(server.id));
  const std::vector<size_t> placement = BalancedShardPlacement(num_shards, keys);
  // Replicas each server holds so far (its primaries first): backups go to
  // the servers holding fewest, so that no server holds several shards'
  // copies while another holds one (every replica holds the shard's table
  // buckets, whose bytes the chunk counts do not show).
  std::vector<int> load(servers.size(), 0);
  std::vector<int32_t> first_primary(servers.size(), -1);  // the first shard each server leads
  for (int32_t s = 0; s < num_shards; ++s) {
    ++load[placement[s]];
    if (first_primary[placement[s]] < 0) first_primary[placement[s]] = s;
  }
  // Among servers holding as many: the leaders of the shards that follow s
  // (a ring: each shard's backups lead the next ones, so every server ends
  // with as many replicas), then rendezvous order.
  auto ring_distance = [&](size_t server, int32_t s) {
    return first_primary[server] < 0 ? num_shards : (first_primary[server] - s + num_shards) % num_shards;
  };
  for (int32_t s = 0; s < num_shards; ++s) {
    v1::ShardLocation* shard = map.add_shards();
    shard->set_shard(s);
    shard->set_server_id(servers[placement[s]].id);
    shard->set_address(servers[placement[s]].address);
    // Backups: the least loaded servers (see ring_distance for ties).
    std::vector<size_t> order(servers.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      if (load[a] != load[b]) return load[a] < load[b];
      if (ring_distance(a, s) != ring_distance(b, s)) return ring_distance(a, s) < ring_distance(b, s);
      return RendezvousScore(ShardKey(s), keys[a]) > RendezvousScore(ShardKey(s), keys[b]);
    });
    for (size_t i : order) {
      if (shard->backup_ids_size() + 1 >= replicas) break;
      if (i == placement[s]) continue;
      shard->add_backup_ids(servers[i].id);
      shard->add_backup_addresses(servers[i].address);
      ++load[i];
    }
  }
  const std::vector<ChunkSpan> chunks = CutIntoChunks(sizes, chunk_elems);
  const std::vector<int32_t> shard_of = AssignChunksToShards(chunks, num_shards);
  for (size_t i = 0; i < chunks.size(); ++i) {
    v1::ChunkLocation* chunk = map.add_chunks();
    chunk->set_chunk_id(static_cast<int32_t>(i));
    chunk->set_tensor(chunks[i].tensor_index);
    chunk->set_offset(chunks[i].offset);
    chunk->set_length(chunks[i].length);
    chunk->set_shard(shard_of[i]);
  }
  return map;
}

void AddTableLayouts(const std::vector<kernels::CtrTableInfo>& tables, const v1::JobSpec& spec, v1::ShardMap* map,
                     const v1::ShardMap* saved) {
  const auto shards = static_cast<int32_t>(map->shards_size());
  for (const kernels::CtrTableInfo& info : tables) {
    int32_t buckets = 0;
    for (const v1::TableSpec& named : spec.model().tables()) {
      if (named.name() == info.name) buckets = named.buckets();
    }
    // A restore keeps the checkpoint's buckets (keys hash by their count).
    for (int t = 0; saved != nullptr && t < saved->tables_size(); ++t) {
      if (saved->tables(t).name() == info.name) buckets = saved->tables(t).buckets();
    }
    if (buckets <= 0) buckets = std::min(kMaxTableBuckets, kDefaultBucketsPerShard * std::max(1, shards));
    v1::TableLayout* table = map->add_tables();
    table->set_name(info.name);
    table->set_dim(info.dim);
    table->set_buckets(buckets);
    for (int32_t shard : AssignBucketsToShards(buckets, std::max(1, shards))) table->add_bucket_shards(shard);
  }
}

std::set<int32_t> HoldingShards(const v1::ShardMap& map, const std::optional<v1::HandoverRecord>& handover) {
  std::set<int32_t> holding;
  for (const v1::ChunkLocation& chunk : map.chunks()) holding.insert(chunk.shard());
  for (const v1::TableLayout& table : map.tables()) holding.insert(table.bucket_shards().begin(), table.bucket_shards().end());
  if (handover.has_value() && handover->new_shard()) {
    holding.erase(handover->shard());
    for (const auto& [chunk, from] : handover->moved_from()) holding.insert(from);
  }
  return holding;
}

std::vector<std::string> RemoveServer(v1::ShardMap* map, const std::string& server_id,
                                      const std::set<int32_t>& holding, const std::string& copying,
                                      std::optional<int32_t>* lost) {
  const v1::ShardMap before = *map;
  std::vector<std::string> changes;
  lost->reset();
  for (v1::ShardLocation& shard : *map->mutable_shards()) {
    if (shard.server_id() == server_id && holding.count(shard.shard()) == 0) {
      shard.clear_server_id();  // an empty shard: nothing to lose, nothing to lead
      shard.clear_address();
      shard.clear_backup_ids();
      shard.clear_backup_addresses();
      continue;
    }
    if (shard.server_id() == server_id) {
      int successor = -1;
      for (int b = 0; b < shard.backup_ids_size() && successor < 0; ++b) {
        if (shard.backup_ids(b) != copying) successor = b;
      }
      if (successor < 0) {
        *lost = shard.shard();
        *map = before;
        return {};
      }
      shard.set_server_id(shard.backup_ids(successor));
      shard.set_address(shard.backup_addresses(successor));
      shard.mutable_backup_ids()->DeleteSubrange(successor, 1);
      shard.mutable_backup_addresses()->DeleteSubrange(successor, 1);
      changes.push_back(absl::StrCat("shard ", shard.shard(), " primary -> ", shard.server_id()));
      continue;
    }
    for (int b = 0; b < shard.backup_ids_size(); ++b) {
      if (shard.backup_ids(b) != server_id) continue;
      shard.mutable_backup_ids()->DeleteSubrange(b, 1);
      shard.mutable_backup_addresses()->DeleteSubrange(b, 1);
      changes.push_back(absl::StrCat("shard ", shard.shard(), " lost a backup"));
      break;
    }
  }
  map->set_version(map->version() + 1);
  return changes;
}

std::optional<ServerRef> ChooseBackup(const v1::ShardMap& map, int32_t shard,
                                      const std::vector<ServerRef>& candidates) {
  const v1::ShardLocation& group = map.shards(shard);
  std::optional<ServerRef> best;
  uint64_t best_score = 0;
  for (const ServerRef& candidate : candidates) {
    if (candidate.id == group.server_id()) continue;
    if (std::count(group.backup_ids().begin(), group.backup_ids().end(), candidate.id) > 0) continue;
    const uint64_t score = RendezvousScore(ShardKey(shard), StableHash(candidate.id));
    if (!best.has_value() || score > best_score) {
      best = candidate;
      best_score = score;
    }
  }
  return best;
}

v1::HandoverRecord AddBackup(v1::ShardMap* map, int32_t shard, const ServerRef& newcomer) {
  v1::ShardLocation* group = map->mutable_shards(shard);
  group->add_backup_ids(newcomer.id);
  group->add_backup_addresses(newcomer.address);
  map->set_version(map->version() + 1);
  v1::HandoverRecord handover;
  handover.set_server_id(newcomer.id);
  handover.set_shard(shard);
  return handover;
}

v1::HandoverRecord AddShard(v1::ShardMap* map, const ServerRef& newcomer) {
  const int32_t new_shard = map->shards_size();
  std::vector<ChunkSpan> spans;
  for (const auto& chunk : map->chunks()) spans.push_back({chunk.tensor(), chunk.offset(), chunk.length()});
  const std::vector<int32_t> placement = AssignChunksToShards(spans, new_shard + 1);
  v1::HandoverRecord handover;
  handover.set_server_id(newcomer.id);
  handover.set_new_shard(true);
  handover.set_shard(new_shard);
  for (int i = 0; i < map->chunks_size(); ++i) {
    if (placement[i] != new_shard) continue;  // rendezvous hashing moves chunks only to the new shard
    v1::ChunkLocation* chunk = map->mutable_chunks(i);
    (*handover.mutable_moved_from())[chunk->chunk_id()] = chunk->shard();
    chunk->set_shard(new_shard);
  }
  v1::ShardLocation* shard = map->add_shards();
  shard->set_shard(new_shard);
  shard->set_server_id(newcomer.id);
  shard->set_address(newcomer.address);
  map->set_version(map->version() + 1);
  return handover;
}

void UndoHandover(v1::ShardMap* map, const v1::HandoverRecord& handover) {
  if (handover.new_shard()) {
    // The moved chunks go back to the shards they came from, whose replicas
    // kept their state (they only refused writes to them).
    for (v1::ChunkLocation& chunk : *map->mutable_chunks()) {
      auto from = handover.moved_from().find(chunk.chunk_id());
      if (chunk.shard() == handover.shard() && from != handover.moved_from().end()) chunk.set_shard(from->second);
    }
    if (handover.shard() == map->shards_size() - 1) map->mutable_shards()->RemoveLast();
  } else if (handover.shard() < map->shards_size()) {
    v1::ShardLocation* shard = map->mutable_shards(handover.shard());
    for (int b = 0; b < shard->backup_ids_size(); ++b) {
      if (shard->backup_ids(b) != handover.server_id()) continue;
      shard->mutable_backup_ids()->DeleteSubrange(b, 1);
      shard->mutable_backup_addresses()->DeleteSubrange(b, 1);
      break;
    }
  }
  map->set_version(map->version() + 1);
}

bool InMap(const v1::ShardMap& map, const std::string& server_id) {
  for (const v1::ShardLocation& shard : map.shards()) {
    if (shard.server_id() == server_id) return true;
    for (const std::string& b : shard.backup_ids()) {
      if (b == server_id) return true;
    }
  }
  return false;
}

void AddChunkSetup(const v1::ChunkLocation& chunk, const ModelLayout& layout, v1::SetupJobRequest* request) {
  v1::ChunkSetup* setup = request->add_chunks();
  setup->set_chunk_id(chunk.chunk_id());
  setup->set_shard(chunk.shard());
  setup->set_tensor(chunk.tensor());
  setup->set_offset(chunk.offset());
  setup->set_length(chunk.length());
  const auto& tensor = layout.tensors[chunk.tensor()];
  setup->set_init(tensor.init == InitKind::kUniform ? v1::ChunkSetup::UNIFORM : v1::ChunkSetup::ZEROS);
  setup->set_init_scale(tensor.init_scale);
}

}  // namespace fulcrum
