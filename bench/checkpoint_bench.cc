// fulcrum-checkpoint-bench: what checkpoints cost, each figure measured side
// by side with its baseline in one run.
//
// 1. Write throughput: a model of --model-mib MiB of float32 (default 1 GiB)
//    in chunks of 256 KiB (65536 floats, the scheduler's default), with SGD
//    momentum (one optimizer slot per chunk, filled with non-zero values so
//    that nothing compresses for free), held by a JobShard. Its snapshot
//    (JobShard::CaptureAll at once, at_version 0: how long a cut takes in
//    memory) is written through CheckpointStore::Write -- the server's own
//    path, one synced RocksDB WriteBatch -- into a fresh RocksDB; the
//    baseline writes the same bytes (the very chunk records, under other
//    keys) with KvStore::Write in one batch into another fresh RocksDB in the
//    same folder. Raw and checkpoint writes alternate (raw, ckpt, raw, ckpt);
//    GB/s of each (median) and their ratio. The time to encode the records
//    (copy + crc32) is measured on its own, to tell where the difference goes.
// 2. Restore: from the RocksDB of the last checkpoint write, every chunk read
//    and verified (CheckpointStore::Read against the checksum Write returned)
//    and put into a fresh JobShard (RestoreCheckpoint); then, untimed, every
//    restored chunk is checked bit for bit against the record written.
// 3. Step-time overhead: a local cluster of real processes (2 servers, 2
//    workers, replicas 1) runs a BSP synthetic job (MLP 784-2048-2048-10,
//    about 23 MB of parameters, batch 64) of a fixed number of steps
//    (calibrated to at least 90 s) without checkpoints and with
//    checkpoint.every_seconds 30, alternated (none, ckpt, none, ckpt); steps/s
//    of each, the overhead, and the checkpoints taken and their durations.
//
// Each figure is logged as it is measured; the whole is printed as a markdown
// table at the end. Temp folders (under $TMPDIR or /tmp) are removed at the
// end; every process started is killed on exit, also on SIGINT / SIGTERM.
// Exit code 1 when a figure could not be measured or a restore did not verify.
//
//   fulcrum-checkpoint-bench [--quick] [--model-mib N] [--runs N] [--keep-logs]
#include <sys/resource.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "client/local_cluster.h"
#include "common/kv_store.h"
#include "common/param_init.h"
#include "common/status_macros.h"
#include "fulcrum/v1/job.grpc.pb.h"
#include "server/checkpoint_store.h"
#include "server/parameter_store.h"

ABSL_FLAG(bool, quick, false,
          "A smoke test: a 64 MiB model (unless --model-mib), one run of each, ~20 s jobs "
          "checkpointed every 5 s; the figures are rough");
ABSL_FLAG(int, model_mib, 0,
          "Model size for figures 1 and 2, MiB of float32 parameters (0: 1024, or 64 with --quick)");
ABSL_FLAG(int, runs, 0, "Repeats of each side of every figure (0: 2, or 1 with --quick)");
ABSL_FLAG(bool, keep_logs, false, "Keep the temp folder (cluster logs) even when every figure was measured");

namespace fulcrum {
namespace {

constexpr int64_t kChunkElems = 65536;  // 256 KiB, the scheduler's default --chunk-bytes
constexpr char kJobId[] = "ckpt-bench";
constexpr int kWorkers = 2;
constexpr absl::Duration kJobLimit = absl::Minutes(20);
constexpr double kGB = 1e9;

using bench::Log;
using bench::Mean;
using bench::Median;
using bench::RemoveDir;
using bench::StepsPerSecond;
using Cluster = bench::BenchCluster;

double Max(const std::vector<double>& values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

double PeakRssGiB() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / (1024.0 * 1024.0);  // ru_maxrss is in KiB
}

// ---------------------------------------------------------------------------
// Figures 1 and 2: the model, its snapshot, writes and restore.
// ---------------------------------------------------------------------------

// One BSP job shard holding `elements` parameters in 256 KiB chunks, SGD with
// momentum (one optimizer slot), one data partition.
JobShardConfig ModelConfig(int64_t elements) {
  JobShardConfig config;
  config.job_id = kJobId;
  config.server_id = "server-0";
  config.optimizer.kind = OptimizerKind::kSgd;
  config.optimizer.momentum = 0.9f;
  config.lr = 0.01f;
  config.synchronous = true;
  config.num_partitions = 1;
  config.seed = 7;
  int32_t id = 0;
  for (int64_t offset = 0; offset < elements; offset += kChunkElems) {
    ChunkConfig chunk;
    chunk.chunk_id = id++;
    chunk.offset = offset;
    chunk.length = std::min(kChunkElems, elements - offset);
    chunk.init = InitKind::kUniform;
    chunk.init_scale = 0.05f;
    config.chunks.push_back(chunk);
  }
  return config;
}

// Gives every chunk the state it has after one step: momentum all non-zero
// (pseudo-random, so that RocksDB's compression gets nothing for free),
// version 1, a worker's dedup watermark.
absl::Status TrainOneStep(JobShard* shard) {
  for (int32_t id : shard->chunk_ids()) {
    ASSIGN_OR_RETURN(ChunkSnapshot snapshot, shard->Snapshot(id));
    for (std::vector<float>& slot : snapshot.optimizer_state) {
      uint64_t bits = SplitMix64(static_cast<uint64_t>(id) << 32);
      for (float& v : slot) {
        bits ^= bits << 13;  // xorshift64
        bits ^= bits >> 7;
        bits ^= bits << 17;
        v = (BitsToUnitFloat(bits) - 0.5f) * 0.02f;
      }
    }
    snapshot.version = 1;
    snapshot.watermarks = {{"worker-0", 1}};
    snapshot.examples_seen = 64;
    RETURN_IF_ERROR(shard->Restore(id, snapshot));
  }
  return absl::OkStatus();
}

using Snapshots = std::vector<std::pair<int32_t, ChunkSnapshot>>;

struct StorageResults {
  int64_t model_bytes = 0;
  int64_t chunks = 0;
  int64_t record_bytes = 0;  // all chunk records of one checkpoint
  std::vector<double> capture_seconds;
  std::vector<double> raw_seconds;
  std::vector<double> ckpt_seconds;
  std::vector<double> encode_seconds;  // EncodeChunkRecord of every chunk: copy + crc32
  std::vector<double> crc_seconds;     // crc32 alone over the same records
  uint32_t crc_sink = 0;               // keeps that crc32 from being optimized away
  double restore_seconds = 0;
  absl::Status restore = absl::UnknownError("not run");
  std::string failure;  // why the figures stopped short, if they did
};

// The chunk records of a checkpoint as raw key/value pairs (the baseline's
// puts); times their encoding and, separately, a crc32 over them.
std::vector<std::pair<std::string, std::string>> RawPuts(const Snapshots& snapshots,
                                                         StorageResults* results) {
  std::vector<std::pair<std::string, std::string>> puts;
  puts.reserve(snapshots.size());
  const absl::Time encoding = absl::Now();
  for (const auto& [id, snapshot] : snapshots) {
    uint32_t checksum = 0;
    puts.emplace_back(absl::StrFormat("raw/%010d", id), EncodeChunkRecord(snapshot, &checksum));
  }
  results->encode_seconds.push_back(SecondsSince(encoding));
  const absl::Time crcing = absl::Now();
  int64_t bytes = 0;
  for (const auto& put : puts) {
    results->crc_sink ^= static_cast<uint32_t>(crc32_z(0L, reinterpret_cast<const Bytef*>(put.second.data()),
                                                       static_cast<z_size_t>(put.second.size())));
    bytes += static_cast<int64_t>(put.second.size());
  }
  results->crc_seconds.push_back(SecondsSince(crcing));
  results->record_bytes = bytes;
  return puts;
}

absl::StatusOr<double> TimeRawWrite(const std::string& dir, const Snapshots& snapshots,
                                    StorageResults* results) {
  std::vector<std::pair<std::string, std::string>> puts = RawPuts(snapshots, results);
  ASSIGN_OR_RETURN(std::unique_ptr<KvStore> kv, OpenRocksDbStore(dir));
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(kv->Write(puts, {}));
  return SecondsSince(start);
}

struct CheckpointWrite {
  double seconds = 0;
  std::unique_ptr<KvStore> kv;
  std::vector<CheckpointStore::ChunkRecordInfo> infos;
};

absl::StatusOr<CheckpointWrite> TimeCheckpointWrite(const std::string& dir, int64_t checkpoint_id,
                                                    const Snapshots& snapshots) {
  CheckpointWrite write;
  ASSIGN_OR_RETURN(write.kv, OpenRocksDbStore(dir));
  CheckpointStore store(write.kv.get());
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(write.infos, store.Write(kJobId, checkpoint_id, snapshots));
  write.seconds = SecondsSince(start);
  return write;
}

int64_t RecordBytes(const std::vector<CheckpointStore::ChunkRecordInfo>& infos) {
  int64_t bytes = 0;
  for (const auto& info : infos) bytes += info.bytes;
  return bytes;
}

std::string Rate(int64_t bytes, double seconds) {
  return absl::StrFormat("%.3f s, %.2f GB/s", seconds, seconds > 0 ? bytes / kGB / seconds : 0);
}

// Builds the model and times CaptureAll `runs` times; the last cut is kept.
absl::StatusOr<Snapshots> CaptureModel(int64_t elements, int runs, StorageResults* results) {
  const absl::Time building = absl::Now();
  ASSIGN_OR_RETURN(std::unique_ptr<JobShard> shard, JobShard::Create(ModelConfig(elements)));
  RETURN_IF_ERROR(TrainOneStep(shard.get()));
  results->chunks = static_cast<int64_t>(shard->chunk_ids().size());
  Log(absl::StrFormat(
      "model: %d MiB of parameters + 1 momentum slot in %d chunks of %d floats, built in %.1f s",
      results->model_bytes >> 20, results->chunks, kChunkElems, SecondsSince(building)));
  Snapshots snapshots;
  for (int run = 0; run < runs; ++run) {
    snapshots.clear();  // not timed: freeing the previous cut
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(snapshots, shard->CaptureAll(1000 + run, 0, absl::Now() + absl::Minutes(1)));
    results->capture_seconds.push_back(SecondsSince(start));
    Log(absl::StrFormat("snapshot %d/%d (JobShard::CaptureAll, at_version 0): %s of values + momentum",
                        run + 1, runs, Rate(2 * results->model_bytes, results->capture_seconds.back())));
  }
  return snapshots;
}

// Times the restore of checkpoint `checkpoint_id` from `kv` into a fresh
// JobShard, then checks every restored chunk against its record.
absl::Status TimeRestore(KvStore* kv, int64_t checkpoint_id,
                         const std::vector<CheckpointStore::ChunkRecordInfo>& infos, int64_t elements,
                         StorageResults* results) {
  ASSIGN_OR_RETURN(std::unique_ptr<JobShard> shard, JobShard::Create(ModelConfig(elements)));
  CheckpointStore store(kv);
  const absl::Time start = absl::Now();
  for (const auto& info : infos) {
    ASSIGN_OR_RETURN(ChunkSnapshot snapshot, store.Read(kJobId, checkpoint_id, info.chunk_id, info.checksum));
    RETURN_IF_ERROR(shard->RestoreCheckpoint(info.chunk_id, std::move(snapshot), false, 0, 0));
  }
  results->restore_seconds = SecondsSince(start);
  for (const auto& info : infos) {
    ASSIGN_OR_RETURN(ChunkSnapshot restored, shard->Snapshot(info.chunk_id));
    uint32_t checksum = 0;
    const std::string record = EncodeChunkRecord(restored, &checksum);
    if (checksum != info.checksum || static_cast<int64_t>(record.size()) != info.bytes) {
      return absl::DataLossError(absl::StrFormat(
          "restored chunk %d differs from the checkpoint (crc32 0x%08x, %d bytes; written 0x%08x, %d bytes)",
          info.chunk_id, checksum, record.size(), info.checksum, info.bytes));
    }
  }
  return absl::OkStatus();
}

// One round of figure 1: a raw write, then a checkpoint write, each into a
// fresh RocksDB. The checkpoint's store is handed back when `keep` is set.
absl::Status WriteRound(const std::string& dir, int run, int runs, const Snapshots& snapshots, bool keep,
                        StorageResults* results, CheckpointWrite* kept) {
  const std::string raw_dir = absl::StrCat(dir, "/raw-", run);
  absl::StatusOr<double> raw = TimeRawWrite(raw_dir, snapshots, results);
  RemoveDir(raw_dir);
  if (!raw.ok()) return raw.status();
  results->raw_seconds.push_back(*raw);
  Log(absl::StrFormat(
      "raw %d/%d (KvStore::Write, %d values in 1 batch): %s; encoding the same records took %.3f s "
      "(crc32 alone %.3f s)",
      run + 1, runs, snapshots.size(), Rate(results->record_bytes, *raw), results->encode_seconds.back(),
      results->crc_seconds.back()));
  const std::string ckpt_dir = absl::StrCat(dir, "/ckpt-", run);
  const int64_t checkpoint_id = run + 1;
  absl::StatusOr<CheckpointWrite> ckpt = TimeCheckpointWrite(ckpt_dir, checkpoint_id, snapshots);
  if (!ckpt.ok()) {
    RemoveDir(ckpt_dir);
    return ckpt.status();
  }
  results->ckpt_seconds.push_back(ckpt->seconds);
  Log(absl::StrFormat("checkpoint %d/%d (CheckpointStore::Write, %d chunk records + index in 1 batch): %s",
                      run + 1, runs, ckpt->infos.size(), Rate(RecordBytes(ckpt->infos), ckpt->seconds)));
  if (keep) {
    *kept = *std::move(ckpt);
  } else {
    ckpt->kv.reset();
    RemoveDir(ckpt_dir);
  }
  return absl::OkStatus();
}

StorageResults MeasureStorage(const std::string& dir, int model_mib, int runs) {
  StorageResults results;
  const int64_t elements = int64_t{model_mib} * (1 << 20) / 4;
  results.model_bytes = elements * 4;
  Log(absl::StrCat("figures 1+2: RocksDB folders in ", dir));
  absl::StatusOr<Snapshots> snapshots = CaptureModel(elements, runs, &results);
  if (!snapshots.ok()) {
    results.failure = absl::StrCat("building and snapshotting the model: ", snapshots.status().ToString());
    return results;
  }
  CheckpointWrite last;
  for (int run = 0; run < runs; ++run) {
    absl::Status round = WriteRound(dir, run, runs, *snapshots, run + 1 == runs, &results, &last);
    if (!round.ok()) {
      results.failure = absl::StrCat("write round ", run + 1, ": ", round.ToString());
      Log(results.failure);
      return results;
    }
  }
  snapshots->clear();
  snapshots->shrink_to_fit();
  results.restore = TimeRestore(last.kv.get(), runs, last.infos, elements, &results);
  if (results.restore.ok()) {
    Log(
        absl::StrFormat("restore (CheckpointStore::Read + JobShard::RestoreCheckpoint, %d chunks): %s; every "
                        "restored chunk matches its record bit for bit",
                        last.infos.size(), Rate(results.record_bytes, results.restore_seconds)));
  } else {
    Log(absl::StrCat("restore: ", results.restore.ToString()));
  }
  Log(absl::StrFormat("peak resident memory so far: %.1f GiB", PeakRssGiB()));
  return results;
}

// ---------------------------------------------------------------------------
// Figure 3: step time with checkpoints every N s against none, on a cluster.
// ---------------------------------------------------------------------------

// 784 -> 2048 -> 2048 -> 10 (5.8 M parameters, 23 MB) on batches of 64, BSP,
// SGD with momentum; checkpoints every `every_seconds` (0: none), all kept so
// that the status lists every one taken.
v1::JobSpec StepSpec(int64_t steps, int64_t every_seconds) {
  const std::string name = every_seconds > 0 ? absl::StrCat("ckpt-every-", every_seconds, "s") : "no-ckpt";
  // 65536 examples: 512 steps an epoch, so few evaluations.
  v1::JobSpec spec = bench::SyntheticMlpSpec(name, {2048, 2048}, 65536, 0.01f, steps, kWorkers);
  spec.set_replicas(1);
  if (every_seconds > 0) {
    spec.mutable_checkpoint()->set_every_seconds(every_seconds);
    spec.mutable_checkpoint()->set_keep_last(1000);
  }
  return spec;
}

struct OverheadResults {
  int64_t every_seconds = 0;
  int64_t steps = 0;
  std::vector<double> none;  // steps/s
  std::vector<double> ckpt;
  std::vector<double> job_seconds;
  int complete = 0;
  int failed = 0;
  std::string failure_reason;  // of the first FAILED checkpoint
  std::vector<double> durations;
  std::vector<double> checkpoint_bytes;
};

// Counts the checkpoints `done` took into `results`; returns a summary.
std::string CountCheckpoints(const v1::JobStatus& done, OverheadResults* results) {
  int complete = 0, failed = 0;
  std::vector<double> durations;
  std::vector<std::string> steps;
  for (const v1::CheckpointInfo& info : done.checkpoints()) {
    if (info.state() == v1::CheckpointInfo::COMPLETE) {
      ++complete;
      durations.push_back(info.duration_seconds());
      results->durations.push_back(info.duration_seconds());
      results->checkpoint_bytes.push_back(static_cast<double>(info.bytes()));
      steps.push_back(absl::StrCat(info.step()));
    } else if (info.state() == v1::CheckpointInfo::FAILED) {
      ++failed;
      if (results->failure_reason.empty()) results->failure_reason = info.reason();
    }
  }
  results->complete += complete;
  results->failed += failed;
  return absl::StrFormat("%d checkpoints COMPLETE (at steps %s; %.2f s median, %.2f s max), %d FAILED",
                         complete, steps.empty() ? "-" : absl::StrJoin(steps, ", "), Median(durations),
                         Max(durations), failed);
}

absl::StatusOr<OverheadResults> MeasureOverhead(const std::string& dir, int runs, bool quick) {
  OverheadResults results;
  results.every_seconds = quick ? 5 : 30;
  // The first job on fresh processes runs slower than the ones after it, so
  // the calibration underestimates the pace: aim above the 90 s wanted.
  const double target_seconds = quick ? 20 : 120;
  Log(
      absl::StrFormat("figure 3: 2 servers, 2 workers, replicas 1; MLP 784-2048-2048-10, batch 64, BSP; "
                      "checkpoint every %d s vs none, alternated, %d each",
                      results.every_seconds, runs));
  LocalCluster::Options options;
  options.dir = dir;
  options.servers = 2;
  options.workers = kWorkers;
  options.replicas = 1;
  ASSIGN_OR_RETURN(std::unique_ptr<Cluster> cluster, Cluster::Start(options, kJobLimit));
  // Calibration, and a warm-up: the first job on fresh processes also pays
  // for connections and allocations that every later job finds ready.
  ASSIGN_OR_RETURN(v1::JobStatus calibration, cluster->RunToEnd(StepSpec(quick ? 15 : 40, 0)));
  const double rate = StepsPerSecond(calibration);
  results.steps = std::clamp<int64_t>(std::llround(target_seconds * rate), 20, 1000000);
  Log(absl::StrFormat("calibration: %.2f steps/s -> %d steps a job for ~%.0f s", rate, results.steps,
                      target_seconds));
  for (int run = 0; run < runs; ++run) {
    for (int64_t every : {int64_t{0}, results.every_seconds}) {
      ASSIGN_OR_RETURN(v1::JobStatus done, cluster->RunToEnd(StepSpec(results.steps, every)));
      const double steps_per_second = StepsPerSecond(done);
      const double seconds = (done.end_time_unix_ms() - done.start_time_unix_ms()) / 1000.0;
      results.job_seconds.push_back(seconds);
      (every == 0 ? results.none : results.ckpt).push_back(steps_per_second);
      std::string checkpoints = every == 0 ? "no checkpoints" : CountCheckpoints(done, &results);
      Log(absl::StrFormat("%s run %d/%d: %.3f steps/s (%d steps in %.1f s); %s",
                          every == 0 ? "none" : absl::StrCat("every ", every, " s"), run + 1, runs,
                          steps_per_second, done.progress().step(), seconds, checkpoints));
      if (!quick && seconds < 90)
        Log("  (shorter than the 90 s wanted: the figure covers fewer checkpoints)");
    }
  }
  return results;
}

// ---------------------------------------------------------------------------
// The report.
// ---------------------------------------------------------------------------

void PrintStorageRows(const StorageResults& s) {
  const std::string size = absl::StrFormat("%d MiB model + momentum: %.3f GB in %d records",
                                           s.model_bytes >> 20, s.record_bytes / kGB, s.chunks);
  if (s.capture_seconds.empty()) {
    std::printf("| checkpoint write vs raw RocksDB | not measured | %s |\n", s.failure.c_str());
    return;
  }
  const double capture = Median(s.capture_seconds);
  std::printf(
      "| in-memory snapshot (JobShard::CaptureAll, at_version 0) | %.3f s | %.2f GB/s; %s; median of %zu |\n",
      capture, capture > 0 ? 2 * s.model_bytes / kGB / capture : 0, size.c_str(), s.capture_seconds.size());
  if (s.ckpt_seconds.empty() || s.raw_seconds.empty()) {
    std::printf("| checkpoint write vs raw RocksDB | not measured | %s |\n", s.failure.c_str());
    return;
  }
  const double raw = s.record_bytes / kGB / Median(s.raw_seconds);
  const double ckpt = s.record_bytes / kGB / Median(s.ckpt_seconds);
  const double ratio = raw > 0 ? ckpt / raw : 0;
  std::printf(
      "| raw RocksDB write (KvStore::Write, 1 synced batch) | %.2f GB/s | same values; median of %zu |\n",
      raw, s.raw_seconds.size());
  std::printf(
      "| checkpoint write (CheckpointStore::Write, 1 synced batch) | %.2f GB/s | %s; median of %zu |\n", ckpt,
      size.c_str(), s.ckpt_seconds.size());
  std::printf(
      "| checkpoint / raw write | %.2f (goal >= 0.70: %s) | encoding the records (copy + crc32) %.3f s, "
      "crc32 alone "
      "%.3f s, of the checkpoint write's %.3f s; raw and checkpoint alternated |\n",
      ratio, ratio >= 0.70 ? "met" : "NOT met", Median(s.encode_seconds), Median(s.crc_seconds),
      Median(s.ckpt_seconds));
  if (!s.restore.ok()) {
    std::printf("| restore | not measured | %s |\n", s.restore.ToString().c_str());
  } else {
    std::printf(
        "| restore (CheckpointStore::Read + JobShard::RestoreCheckpoint) | %.3f s (%.2f GB/s) | every chunk "
        "read, checksum verified, restored; checked bit for bit afterwards; OS page cache warm |\n",
        s.restore_seconds, s.record_bytes / kGB / s.restore_seconds);
  }
}

void PrintOverheadRow(const absl::StatusOr<OverheadResults>& overhead) {
  if (!overhead.ok() || overhead->none.empty() || overhead->ckpt.empty()) {
    std::printf("| step-time overhead of checkpoints | not measured | %s |\n",
                overhead.ok() ? "no runs" : overhead.status().ToString().c_str());
    return;
  }
  const OverheadResults& o = *overhead;
  const double none = Mean(o.none), ckpt = Mean(o.ckpt);
  const double cost = none > 0 ? (1 - ckpt / none) * 100 : 0;
  double bytes = Median(o.checkpoint_bytes);
  std::printf(
      "| step-time overhead, checkpoint every %lld s | %.2f%% (goal <= 2%%: %s) | none %.3f steps/s, "
      "checkpointed %.3f "
      "steps/s (mean of %zu each, alternated, %lld steps a job, %.0f-%.0f s); %d checkpoints COMPLETE of %.1f "
      "MB, "
      "%.2f s median / %.2f s max; %d FAILED%s |\n",
      static_cast<long long>(o.every_seconds), cost, cost <= 2 ? "met" : "NOT met", none, ckpt, o.none.size(),
      static_cast<long long>(o.steps),
      *std::min_element(o.job_seconds.begin(), o.job_seconds.end()), Max(o.job_seconds), o.complete,
      bytes / 1e6, Median(o.durations), Max(o.durations), o.failed,
      o.failure_reason.empty() ? "" : absl::StrCat(" (", o.failure_reason, ")").c_str());
}

void PrintTable(const StorageResults& storage, const absl::StatusOr<OverheadResults>& overhead) {
  std::printf("\n| figure | value | detail |\n|---|---|---|\n");
  PrintStorageRows(storage);
  PrintOverheadRow(overhead);
  std::fflush(stdout);
}

int Run() {
  const bool quick = absl::GetFlag(FLAGS_quick);
  int model_mib = absl::GetFlag(FLAGS_model_mib);
  int runs = absl::GetFlag(FLAGS_runs);
  if (model_mib <= 0) model_mib = quick ? 64 : 1024;
  if (runs <= 0) runs = quick ? 1 : 2;
  const bool keep = absl::GetFlag(FLAGS_keep_logs);
  const std::string dir = bench::MakeTempDir("fulcrum-checkpoint-bench");
  if (dir.empty()) return 1;
  bench::RegisterTempDir(dir, keep);
  Log(absl::StrCat("temp folder ", dir));
  const StorageResults storage = MeasureStorage(dir + "/storage", model_mib, runs);
  RemoveDir(dir + "/storage");
  absl::StatusOr<OverheadResults> overhead = MeasureOverhead(dir + "/cluster", runs, quick);
  if (!overhead.ok()) Log(absl::StrCat("figure 3 not measured: ", overhead.status().ToString()));
  PrintTable(storage, overhead);
  const bool good = storage.failure.empty() && storage.restore.ok() && overhead.ok();
  return bench::FinishRun(dir, good, keep);
}

}  // namespace
}  // namespace fulcrum

int main(int argc, char** argv) {
  return fulcrum::bench::BenchMain(
      argc, argv, "checkpoint_bench.cc",
      "fulcrum-checkpoint-bench [--quick] [--model-mib N] [--runs N] [--keep-logs]", fulcrum::Run);
}
