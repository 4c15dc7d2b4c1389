#include "server/checkpoint_store.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "absl/base/config.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/sync.h"

namespace fulcrum {
namespace {

// Record framing; see the header for the layout.
constexpr uint32_t kChunkMagic = 0x504B4346;  // "FCKP" in little-endian byte order
constexpr uint32_t kIndexMagic = 0x494B4346;  // "FCKI"
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderBytes = 20;
constexpr size_t kIndexEntryBytes = 16;  // i32 chunk id, u32 checksum, i64 bytes

// ---------------------------------------------------------------- bytes

void StoreU32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(v >> (8 * i));
}

void StoreU64(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (8 * i));
}

uint32_t LoadU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

uint64_t LoadU64(const char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

void PutU32(uint32_t v, std::string* out) {
  char bytes[4];
  StoreU32(v, bytes);
  out->append(bytes, sizeof(bytes));
}

void PutU64(uint64_t v, std::string* out) {
  char bytes[8];
  StoreU64(v, bytes);
  out->append(bytes, sizeof(bytes));
}

void PutI64(int64_t v, std::string* out) { PutU64(static_cast<uint64_t>(v), out); }

// Copies n float32 between host order and little-endian bytes (either way).
void CopyFloatsLittleEndian(const void* src, size_t n, void* dst) {
#if defined(ABSL_IS_BIG_ENDIAN)
  const uint32_t* in = static_cast<const uint32_t*>(src);
  uint32_t* out = static_cast<uint32_t*>(dst);
  for (size_t i = 0; i < n; ++i) out[i] = __builtin_bswap32(in[i]);
#else
  if (n > 0) std::memcpy(dst, src, n * 4);
#endif
}

void PutFloats(const std::vector<float>& values, std::string* out) {
  PutU64(values.size(), out);
  size_t at = out->size();
  out->resize(at + values.size() * 4);
  CopyFloatsLittleEndian(values.data(), values.size(), out->data() + at);
}

uint32_t Crc32(absl::string_view bytes) {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<z_size_t>(bytes.size())));
}

// Reads a payload front to back; every failure is DATA_LOSS saying what was
// being read and where. Counts are checked against the bytes left before
// anything is allocated for them.
class RecordReader {
 public:
  RecordReader(absl::string_view bytes, absl::string_view what) : bytes_(bytes), what_(what) {}

  absl::Status U64(uint64_t* v, absl::string_view field) {
    RETURN_IF_ERROR(Need(8, field));
    *v = LoadU64(bytes_.data() + pos_);
    pos_ += 8;
    return absl::OkStatus();
  }

  absl::Status I64(int64_t* v, absl::string_view field) {
    uint64_t u = 0;
    RETURN_IF_ERROR(U64(&u, field));
    *v = static_cast<int64_t>(u);
    return absl::OkStatus();
  }

  // The next u64, not consumed.
  absl::Status PeekU64(uint64_t* v, absl::string_view field) const {
    RETURN_IF_ERROR(Need(8, field));
    *v = LoadU64(bytes_.data() + pos_);
    return absl::OkStatus();
  }

  absl::Status U8(uint8_t* v, absl::string_view field) {
    RETURN_IF_ERROR(Need(1, field));
    *v = static_cast<uint8_t>(bytes_[pos_]);
    pos_ += 1;
    return absl::OkStatus();
  }

  // `n` bytes as they are.
  absl::Status Fixed(uint64_t n, std::string* out, absl::string_view field) {
    RETURN_IF_ERROR(Need(n, field));
    out->assign(bytes_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }

  absl::Status U32(uint32_t* v, absl::string_view field) {
    RETURN_IF_ERROR(Need(4, field));
    *v = LoadU32(bytes_.data() + pos_);
    pos_ += 4;
    return absl::OkStatus();
  }

  // A count of items that take at least `min_item_bytes` each.
  absl::Status Count(uint64_t* n, size_t min_item_bytes, absl::string_view field) {
    RETURN_IF_ERROR(U64(n, field));
    if (*n > left() / min_item_bytes) {
      return absl::DataLossError(absl::StrCat(what_, ": ", field, " claims ", *n, " entries at offset ",
                                              pos_ - 8, " but only ", left(), " bytes follow"));
    }
    return absl::OkStatus();
  }

  absl::Status Floats(std::vector<float>* values, absl::string_view field) {
    uint64_t n = 0;
    RETURN_IF_ERROR(Count(&n, 4, field));
    values->resize(n);
    CopyFloatsLittleEndian(bytes_.data() + pos_, n, values->data());
    pos_ += n * 4;
    return absl::OkStatus();
  }

  absl::Status Bytes(std::string* out, absl::string_view field) {
    uint64_t n = 0;
    RETURN_IF_ERROR(Count(&n, 1, field));
    out->assign(bytes_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }

  bool AtEnd() const { return left() == 0; }

  absl::Status Finish() const {
    if (left() == 0) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat(what_, ": ", left(), " unexpected bytes after the end at offset ", pos_));
  }

 private:
  size_t left() const { return bytes_.size() - pos_; }

  absl::Status Need(size_t n, absl::string_view field) const {
    if (left() >= n) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat(what_, ": truncated reading ", field, " (", n,
                                            " bytes at offset ", pos_, ", ", left(), " left)"));
  }

  absl::string_view bytes_;
  absl::string_view what_;
  size_t pos_ = 0;
};

absl::Status ReadFloatArrays(RecordReader& in, std::vector<std::vector<float>>* arrays,
                             absl::string_view field) {
  uint64_t n = 0;
  RETURN_IF_ERROR(in.Count(&n, 8, field));
  arrays->resize(n);
  for (auto& array : *arrays) RETURN_IF_ERROR(in.Floats(&array, field));
  return absl::OkStatus();
}

absl::Status ReadWatermarks(RecordReader& in, std::vector<std::pair<std::string, int64_t>>* watermarks) {
  uint64_t n = 0;
  RETURN_IF_ERROR(in.Count(&n, 16, "watermarks"));
  watermarks->resize(n);
  for (auto& [worker, seq] : *watermarks) {
    RETURN_IF_ERROR(in.Bytes(&worker, "watermark worker id"));
    RETURN_IF_ERROR(in.I64(&seq, "watermark seq"));
  }
  return absl::OkStatus();
}

// Partition steps (see the record layout in checkpoint_store.h): a count
// with this bit set says they follow as distances from the lowest.
constexpr uint64_t kCompactSteps = uint64_t{1} << 63;

// The lowest of (non-empty) `steps`, and the bytes that hold every
// distance from it.
struct StepsLayout {
  int64_t base;
  int width;
};
StepsLayout LayoutOf(const std::vector<int64_t>& steps) {
  const auto [low, high] = std::minmax_element(steps.begin(), steps.end());
  const uint64_t span = static_cast<uint64_t>(*high) - static_cast<uint64_t>(*low);
  return {*low, span == 0 ? 0 : span <= 0xff ? 1 : span <= 0xffff ? 2 : span <= 0xffffffffu ? 4 : 8};
}

size_t StepsSize(const std::vector<int64_t>& steps) {
  if (steps.empty()) return 8;
  return 8 + 8 + 1 + steps.size() * static_cast<size_t>(LayoutOf(steps).width);
}

void PutSteps(const std::vector<int64_t>& steps, std::string* out) {
  if (steps.empty()) return PutU64(0, out);
  const auto [base, width] = LayoutOf(steps);
  PutU64(steps.size() | kCompactSteps, out);
  PutI64(base, out);
  out->push_back(static_cast<char>(width));
  char bytes[8];
  for (int64_t step : steps) {
    // Little-endian: the distance's low `width` bytes come first.
    StoreU64(static_cast<uint64_t>(step) - static_cast<uint64_t>(base), bytes);
    out->append(bytes, static_cast<size_t>(width));
  }
}

absl::Status ReadSteps(RecordReader& in, std::vector<int64_t>* steps) {
  uint64_t n = 0;
  RETURN_IF_ERROR(in.PeekU64(&n, "partition_steps"));
  if ((n & kCompactSteps) == 0) {  // as written before: an i64 each
    RETURN_IF_ERROR(in.Count(&n, 8, "partition_steps"));
    steps->resize(n);
    for (int64_t& step : *steps) RETURN_IF_ERROR(in.I64(&step, "partition_steps"));
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(in.U64(&n, "partition_steps"));
  n &= ~kCompactSteps;
  if (n == 0 || n > static_cast<uint64_t>(kMaxPartitions)) {
    return absl::DataLossError(absl::StrCat("chunk snapshot: partition_steps claims ", n,
                                            " partitions (a job has 1 to ", kMaxPartitions, ")"));
  }
  int64_t base = 0;
  RETURN_IF_ERROR(in.I64(&base, "partition_steps base"));
  uint8_t width = 0;
  RETURN_IF_ERROR(in.U8(&width, "partition_steps width"));
  if (width != 0 && width != 1 && width != 2 && width != 4 && width != 8) {
    return absl::DataLossError(
        absl::StrCat("chunk snapshot: partition_steps width ", width, " (must be 0, 1, 2, 4 or 8)"));
  }
  std::string distances;
  RETURN_IF_ERROR(in.Fixed(n * width, &distances, "partition_steps"));
  steps->resize(n);
  for (size_t i = 0; i < n; ++i) {
    char bytes[8] = {};
    std::memcpy(bytes, distances.data() + i * width, width);
    (*steps)[i] = static_cast<int64_t>(static_cast<uint64_t>(base) + LoadU64(bytes));
  }
  return absl::OkStatus();
}

size_t EncodedSize(const ChunkSnapshot& s) {
  size_t size = 3 * 8 + 8 + 4 * s.values.size();
  size += 8;
  for (const auto& slot : s.optimizer_state) size += 8 + 4 * slot.size();
  size += 8;
  for (const auto& gradient : s.pending) size += 8 + 4 * gradient.size();
  size += 8;
  for (const auto& [worker, seq] : s.watermarks) size += 16 + worker.size();
  size += StepsSize(s.partition_steps);
  return size + (s.table_state.empty() ? 0 : 8 + s.table_state.size());
}

void AppendChunkSnapshot(const ChunkSnapshot& s, std::string* out) {
  PutI64(s.version, out);
  PutI64(s.examples_seen, out);
  PutU64(s.examples_digest, out);
  PutFloats(s.values, out);
  PutU64(s.optimizer_state.size(), out);
  for (const auto& slot : s.optimizer_state) PutFloats(slot, out);
  PutU64(s.pending.size(), out);
  for (const auto& gradient : s.pending) PutFloats(gradient, out);
  PutU64(s.watermarks.size(), out);
  for (const auto& [worker, seq] : s.watermarks) {
    PutU64(worker.size(), out);
    out->append(worker);
    PutI64(seq, out);
  }
  PutSteps(s.partition_steps, out);
  if (!s.table_state.empty()) {
    PutU64(s.table_state.size(), out);
    out->append(s.table_state);
  }
}

// ---------------------------------------------------------------- records

// An empty record with room for the header; the payload is appended to it.
std::string StartRecord(size_t payload_bytes) {
  std::string record(kHeaderBytes, '\0');
  record.reserve(kHeaderBytes + payload_bytes);
  return record;
}

// Fills in the header of a record whose payload has been appended.
uint32_t SealRecord(uint32_t magic, std::string* record) {
  absl::string_view payload = absl::string_view(*record).substr(kHeaderBytes);
  uint32_t checksum = Crc32(payload);
  StoreU32(magic, record->data());
  StoreU32(kFormatVersion, record->data() + 4);
  StoreU32(checksum, record->data() + 8);
  StoreU64(payload.size(), record->data() + 12);
  return checksum;
}

const char* KindOf(uint32_t magic) { return magic == kChunkMagic ? "chunk record" : "index record"; }

// Checks a record's header and checksum; returns its payload.
absl::StatusOr<absl::string_view> OpenRecord(absl::string_view record, uint32_t magic, uint32_t* checksum) {
  const char* kind = KindOf(magic);
  if (record.size() < kHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat(kind, ": ", record.size(), " bytes, shorter than its ", kHeaderBytes, "-byte header"));
  }
  uint32_t found_magic = LoadU32(record.data());
  if (found_magic != magic) {
    return absl::DataLossError(
        absl::StrFormat("%s: bad magic 0x%08x, expected 0x%08x", kind, found_magic, magic));
  }
  uint32_t version = LoadU32(record.data() + 4);
  if (version != kFormatVersion) {
    return absl::DataLossError(
        absl::StrCat(kind, ": format version ", version, ", this build reads version ", kFormatVersion));
  }
  uint64_t payload_bytes = LoadU64(record.data() + 12);
  absl::string_view payload = record.substr(kHeaderBytes);
  if (payload_bytes != payload.size()) {
    return absl::DataLossError(absl::StrCat(kind, ": header says ", payload_bytes,
                                            " payload bytes, the record holds ", payload.size()));
  }
  uint32_t stored = LoadU32(record.data() + 8);
  uint32_t computed = Crc32(payload);
  if (stored != computed) {
    return absl::DataLossError(
        absl::StrFormat("%s: checksum mismatch (stored 0x%08x, computed 0x%08x)", kind, stored, computed));
  }
  *checksum = stored;
  return payload;
}

std::string EncodeIndex(const std::vector<CheckpointStore::ChunkRecordInfo>& chunks) {
  std::string record = StartRecord(8 + kIndexEntryBytes * chunks.size());
  PutU64(chunks.size(), &record);
  for (const auto& chunk : chunks) {
    PutU32(static_cast<uint32_t>(chunk.chunk_id), &record);
    PutU32(chunk.checksum, &record);
    PutI64(chunk.bytes, &record);
  }
  SealRecord(kIndexMagic, &record);
  return record;
}

absl::StatusOr<std::vector<CheckpointStore::ChunkRecordInfo>> DecodeIndex(absl::string_view record) {
  uint32_t checksum = 0;
  ASSIGN_OR_RETURN(absl::string_view payload, OpenRecord(record, kIndexMagic, &checksum));
  RecordReader in(payload, "index record");
  uint64_t n = 0;
  RETURN_IF_ERROR(in.Count(&n, kIndexEntryBytes, "chunks"));
  std::vector<CheckpointStore::ChunkRecordInfo> chunks(n);
  for (auto& chunk : chunks) {
    uint32_t id = 0;
    RETURN_IF_ERROR(in.U32(&id, "chunk id"));
    chunk.chunk_id = static_cast<int32_t>(id);
    RETURN_IF_ERROR(in.U32(&chunk.checksum, "checksum"));
    RETURN_IF_ERROR(in.I64(&chunk.bytes, "bytes"));
    if (chunk.chunk_id < 0)
      return absl::DataLossError(absl::StrCat("index record: chunk id ", chunk.chunk_id));
  }
  RETURN_IF_ERROR(in.Finish());
  return chunks;
}

// ---------------------------------------------------------------- keys

std::string JobPrefix(const std::string& job_id) { return absl::StrCat("ckpt/", job_id, "/"); }

std::string CheckpointPrefix(const std::string& job_id, int64_t checkpoint_id) {
  return absl::StrCat(JobPrefix(job_id), absl::StrFormat("%020d", checkpoint_id), "/");
}

std::string ChunkKey(const std::string& job_id, int64_t checkpoint_id, int32_t chunk_id) {
  return absl::StrCat(CheckpointPrefix(job_id, checkpoint_id), absl::StrFormat("%010d", chunk_id));
}

std::string IndexPrefix(const std::string& job_id) { return absl::StrCat("ckpt-index/", job_id, "/"); }

std::string IndexKey(const std::string& job_id, int64_t checkpoint_id) {
  return absl::StrCat(IndexPrefix(job_id), absl::StrFormat("%020d", checkpoint_id));
}

std::string Describe(const std::string& job_id, int64_t checkpoint_id) {
  return absl::StrCat("checkpoint ", checkpoint_id, " of job \"", job_id, "\"");
}

std::string Describe(const std::string& job_id, int64_t checkpoint_id, int32_t chunk_id) {
  return absl::StrCat("chunk ", chunk_id, " of ", Describe(job_id, checkpoint_id));
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("checkpoint store: ", context, ": ", status.message()));
}

absl::Status CheckJobId(const std::string& job_id) {
  if (!job_id.empty() && job_id.find('/') == std::string::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("checkpoint store: job id \"", job_id, "\" must be non-empty and hold no '/'"));
}

absl::Status CheckIds(const std::string& job_id, int64_t checkpoint_id) {
  RETURN_IF_ERROR(CheckJobId(job_id));
  if (checkpoint_id >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("checkpoint store: job \"", job_id,
                                                 "\": checkpoint id must be >= 0 (got ", checkpoint_id, ")"));
}

absl::Status CheckChunkId(const std::string& job_id, int64_t checkpoint_id, int32_t chunk_id) {
  if (chunk_id >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("checkpoint store: ", Describe(job_id, checkpoint_id),
                                                 ": chunk id must be >= 0 (got ", chunk_id, ")"));
}

absl::Status CheckChunkIds(const std::string& job_id, int64_t checkpoint_id,
                           const std::vector<std::pair<int32_t, ChunkSnapshot>>& chunks) {
  std::set<int32_t> seen;
  for (const auto& chunk : chunks) {
    RETURN_IF_ERROR(CheckChunkId(job_id, checkpoint_id, chunk.first));
    if (!seen.insert(chunk.first).second) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint store: ", Describe(job_id, checkpoint_id),
                                                     ": chunk ", chunk.first, " is given twice"));
    }
  }
  return absl::OkStatus();
}

// The value stored under exactly `key`, or nullopt.
absl::StatusOr<std::optional<std::string>> Lookup(KvStore* kv, const std::string& key) {
  ASSIGN_OR_RETURN(auto entries, kv->Scan(key));
  for (auto& [found_key, value] : entries) {
    if (found_key == key) return std::optional<std::string>(std::move(value));
  }
  return std::optional<std::string>();
}

}  // namespace

// ---------------------------------------------------------------- encoding

std::string EncodeChunkSnapshot(const ChunkSnapshot& snapshot) {
  std::string payload;
  payload.reserve(EncodedSize(snapshot));
  AppendChunkSnapshot(snapshot, &payload);
  return payload;
}

absl::StatusOr<ChunkSnapshot> DecodeChunkSnapshot(absl::string_view payload) {
  RecordReader in(payload, "chunk snapshot");
  ChunkSnapshot s;
  RETURN_IF_ERROR(in.I64(&s.version, "version"));
  RETURN_IF_ERROR(in.I64(&s.examples_seen, "examples_seen"));
  RETURN_IF_ERROR(in.U64(&s.examples_digest, "examples_digest"));
  RETURN_IF_ERROR(in.Floats(&s.values, "values"));
  RETURN_IF_ERROR(ReadFloatArrays(in, &s.optimizer_state, "optimizer_state"));
  RETURN_IF_ERROR(ReadFloatArrays(in, &s.pending, "pending"));
  RETURN_IF_ERROR(ReadWatermarks(in, &s.watermarks));
  RETURN_IF_ERROR(ReadSteps(in, &s.partition_steps));
  if (!in.AtEnd()) RETURN_IF_ERROR(in.Bytes(&s.table_state, "table_state"));
  RETURN_IF_ERROR(in.Finish());
  return s;
}

std::string EncodeChunkRecord(const ChunkSnapshot& snapshot, uint32_t* checksum) {
  std::string record = StartRecord(EncodedSize(snapshot));
  AppendChunkSnapshot(snapshot, &record);
  *checksum = SealRecord(kChunkMagic, &record);
  return record;
}

absl::StatusOr<uint32_t> VerifyChunkRecord(absl::string_view record) {
  uint32_t checksum = 0;
  RETURN_IF_ERROR(OpenRecord(record, kChunkMagic, &checksum).status());
  return checksum;
}

absl::StatusOr<ChunkSnapshot> DecodeChunkRecord(absl::string_view record) {
  uint32_t checksum = 0;
  ASSIGN_OR_RETURN(absl::string_view payload, OpenRecord(record, kChunkMagic, &checksum));
  return DecodeChunkSnapshot(payload);
}

// ---------------------------------------------------------------- store

CheckpointStore::CheckpointStore(KvStore* kv) : kv_(kv) {}

absl::StatusOr<std::vector<CheckpointStore::ChunkRecordInfo>> CheckpointStore::Write(
    const std::string& job_id, int64_t checkpoint_id, std::vector<std::pair<int32_t, ChunkSnapshot>> chunks) {
  RETURN_IF_ERROR(CheckIds(job_id, checkpoint_id));
  RETURN_IF_ERROR(CheckChunkIds(job_id, checkpoint_id, chunks));

  // Encode before taking the lock: that is the slow part.
  std::vector<std::pair<std::string, std::string>> puts;
  puts.reserve(chunks.size() + 1);
  std::vector<ChunkRecordInfo> infos;
  int64_t total_bytes = 0;
  for (auto& [chunk_id, snapshot] : chunks) {
    ChunkRecordInfo& info = infos.emplace_back();
    info.chunk_id = chunk_id;
    std::string record = EncodeChunkRecord(snapshot, &info.checksum);
    snapshot = ChunkSnapshot();  // encoded: the state is held once
    info.bytes = static_cast<int64_t>(record.size());
    total_bytes += info.bytes;
    puts.emplace_back(ChunkKey(job_id, checkpoint_id, chunk_id), std::move(record));
  }
  puts.emplace_back(IndexKey(job_id, checkpoint_id), EncodeIndex(infos));

  MutexLock lock(&mutate_mu_);
  ASSIGN_OR_RETURN(std::vector<std::string> stored, StoredChunkKeys(job_id, checkpoint_id));
  // A batch applies its puts before its deletes: delete only chunks not rewritten.
  std::set<std::string> rewritten;
  for (const auto& put : puts) rewritten.insert(put.first);
  std::vector<std::string> deletes;
  for (auto& key : stored) {
    if (rewritten.count(key) == 0) deletes.push_back(std::move(key));
  }
  RETURN_IF_ERROR(Annotate(kv_->Write(std::move(puts), deletes),
                           absl::StrCat("writing ", Describe(job_id, checkpoint_id), " (", chunks.size(),
                                        " chunks, ", total_bytes, " bytes)")));
  return infos;
}

absl::StatusOr<std::string> CheckpointStore::ReadRecord(const std::string& job_id, int64_t checkpoint_id,
                                                        int32_t chunk_id, uint32_t* checksum) {
  RETURN_IF_ERROR(CheckIds(job_id, checkpoint_id));
  RETURN_IF_ERROR(CheckChunkId(job_id, checkpoint_id, chunk_id));
  std::string what = Describe(job_id, checkpoint_id, chunk_id);
  absl::StatusOr<std::optional<std::string>> record = Lookup(kv_, ChunkKey(job_id, checkpoint_id, chunk_id));
  RETURN_IF_ERROR(Annotate(record.status(), absl::StrCat("reading ", what)));
  if (!record->has_value()) return absl::NotFoundError(absl::StrCat("checkpoint store: no ", what));
  RETURN_IF_ERROR(Annotate(OpenRecord(**record, kChunkMagic, checksum).status(), what));
  return std::move(**record);
}

absl::StatusOr<ChunkSnapshot> CheckpointStore::Read(const std::string& job_id, int64_t checkpoint_id,
                                                    int32_t chunk_id, uint32_t expected_checksum) {
  uint32_t checksum = 0;
  ASSIGN_OR_RETURN(std::string record, ReadRecord(job_id, checkpoint_id, chunk_id, &checksum));
  std::string what = Describe(job_id, checkpoint_id, chunk_id);
  if (expected_checksum != 0 && checksum != expected_checksum) {
    return absl::DataLossError(
        absl::StrFormat("checkpoint store: %s: stored checksum 0x%08x, the manifest says 0x%08x", what,
                        checksum, expected_checksum));
  }
  absl::StatusOr<ChunkSnapshot> snapshot =
      DecodeChunkSnapshot(absl::string_view(record).substr(kHeaderBytes));
  RETURN_IF_ERROR(Annotate(snapshot.status(), what));
  return snapshot;
}

absl::StatusOr<std::string> CheckpointStore::ReadRaw(const std::string& job_id, int64_t checkpoint_id,
                                                     int32_t chunk_id) {
  uint32_t checksum = 0;
  return ReadRecord(job_id, checkpoint_id, chunk_id, &checksum);
}

absl::StatusOr<std::vector<CheckpointStore::ChunkRecordInfo>> CheckpointStore::ReadIndex(
    const std::string& job_id, int64_t checkpoint_id) {
  std::string what = Describe(job_id, checkpoint_id);
  absl::StatusOr<std::optional<std::string>> record = Lookup(kv_, IndexKey(job_id, checkpoint_id));
  RETURN_IF_ERROR(Annotate(record.status(), absl::StrCat("reading ", what)));
  if (!record->has_value()) return absl::NotFoundError(absl::StrCat("checkpoint store: no ", what));
  absl::StatusOr<std::vector<ChunkRecordInfo>> chunks = DecodeIndex(**record);
  RETURN_IF_ERROR(Annotate(chunks.status(), what));
  return chunks;
}

absl::StatusOr<std::vector<std::string>> CheckpointStore::StoredChunkKeys(const std::string& job_id,
                                                                          int64_t checkpoint_id) {
  std::vector<std::string> keys;
  absl::StatusOr<std::vector<ChunkRecordInfo>> index = ReadIndex(job_id, checkpoint_id);
  if (index.ok()) {
    for (const auto& chunk : *index) keys.push_back(ChunkKey(job_id, checkpoint_id, chunk.chunk_id));
    return keys;
  }
  if (!absl::IsNotFound(index.status()) && !absl::IsDataLoss(index.status())) return index.status();
  // No usable index (never the case for checkpoints this class wrote intact):
  // scan the chunk records themselves.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> entries =
      kv_->Scan(CheckpointPrefix(job_id, checkpoint_id));
  RETURN_IF_ERROR(Annotate(entries.status(), absl::StrCat("scanning ", Describe(job_id, checkpoint_id))));
  for (auto& entry : *entries) keys.push_back(std::move(entry.first));
  return keys;
}

absl::Status CheckpointStore::Delete(const std::string& job_id, int64_t checkpoint_id) {
  RETURN_IF_ERROR(CheckIds(job_id, checkpoint_id));
  MutexLock lock(&mutate_mu_);
  ASSIGN_OR_RETURN(std::vector<std::string> keys, StoredChunkKeys(job_id, checkpoint_id));
  keys.push_back(IndexKey(job_id, checkpoint_id));
  return Annotate(kv_->Write({}, keys), absl::StrCat("deleting ", Describe(job_id, checkpoint_id)));
}

absl::Status CheckpointStore::DeleteJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckJobId(job_id));
  MutexLock lock(&mutate_mu_);
  ASSIGN_OR_RETURN(std::vector<int64_t> checkpoint_ids, List(job_id));
  std::vector<std::string> keys;
  for (int64_t checkpoint_id : checkpoint_ids) {
    ASSIGN_OR_RETURN(std::vector<std::string> chunk_keys, StoredChunkKeys(job_id, checkpoint_id));
    keys.insert(keys.end(), chunk_keys.begin(), chunk_keys.end());
    keys.push_back(IndexKey(job_id, checkpoint_id));
  }
  return Annotate(kv_->Write({}, keys), absl::StrCat("deleting the checkpoints of job \"", job_id, "\""));
}

absl::StatusOr<std::vector<int64_t>> CheckpointStore::List(const std::string& job_id) {
  RETURN_IF_ERROR(CheckJobId(job_id));
  const std::string prefix = IndexPrefix(job_id);
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> entries = kv_->Scan(prefix);
  RETURN_IF_ERROR(
      Annotate(entries.status(), absl::StrCat("listing the checkpoints of job \"", job_id, "\"")));
  std::vector<int64_t> checkpoint_ids;
  for (const auto& entry : *entries) {
    absl::string_view digits = absl::string_view(entry.first).substr(prefix.size());
    int64_t checkpoint_id = 0;
    if (digits.size() != 20 || !absl::SimpleAtoi(digits, &checkpoint_id) || checkpoint_id < 0) {
      return absl::DataLossError(absl::StrCat("checkpoint store: malformed index key \"", entry.first, "\""));
    }
    checkpoint_ids.push_back(checkpoint_id);
  }
  return checkpoint_ids;  // zero-padded keys: already ascending
}

absl::StatusOr<std::vector<int32_t>> CheckpointStore::Chunks(const std::string& job_id,
                                                             int64_t checkpoint_id) {
  RETURN_IF_ERROR(CheckIds(job_id, checkpoint_id));
  ASSIGN_OR_RETURN(std::vector<ChunkRecordInfo> index, ReadIndex(job_id, checkpoint_id));
  std::vector<int32_t> chunk_ids;
  for (const auto& chunk : index) chunk_ids.push_back(chunk.chunk_id);
  std::sort(chunk_ids.begin(), chunk_ids.end());
  return chunk_ids;
}

// ---------------------------------------------------------------- writer

CheckpointWriter::CheckpointWriter(CheckpointStore* store) : store_(store) {
  MutexLock lock(&join_mu_);
  thread_ = std::thread([this] { Loop(); });
}

CheckpointWriter::~CheckpointWriter() { Stop(); }

void CheckpointWriter::Enqueue(std::string job_id, int64_t checkpoint_id,
                               std::vector<std::pair<int32_t, ChunkSnapshot>> chunks, Done done) {
  {
    MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.push_back(Task{std::move(job_id), checkpoint_id, std::move(chunks), std::move(done)});
      return;
    }
  }
  if (done) {
    done(absl::FailedPreconditionError(
        absl::StrCat("checkpoint writer is stopped: ", Describe(job_id, checkpoint_id), " was not written")));
  }
}

void CheckpointWriter::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  MutexLock lock(&join_mu_);
  if (thread_.joinable()) thread_.join();
}

bool CheckpointWriter::HasWorkOrStopping() const { return !queue_.empty() || stopping_; }

void CheckpointWriter::Loop() {
  while (true) {
    Task task;
    {
      MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &CheckpointWriter::HasWorkOrStopping));
      if (queue_.empty()) return;  // stopping, and everything queued is written
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::StatusOr<std::vector<CheckpointStore::ChunkRecordInfo>> result =
        store_->Write(task.job_id, task.checkpoint_id, std::move(task.chunks));
    if (task.done) task.done(std::move(result));
  }
}

}  // namespace fulcrum
