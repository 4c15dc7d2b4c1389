// A process's memory budget: how many bytes the jobs it serves may claim.
// Every daemon has one (--memory-budget, default from the machine or its
// cgroup limit); servers and workers report theirs when they register, the
// scheduler admits only jobs that fit, and each process refuses a request
// that would take it over its budget (RESOURCE_EXHAUSTED naming the numbers)
// instead of being killed by the kernel.
#ifndef FULCRUM_COMMON_MEMORY_BUDGET_H_
#define FULCRUM_COMMON_MEMORY_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fulcrum {

// Memory a daemon keeps for itself beside what its jobs claim: its code,
// gRPC's threads and message buffers, RocksDB's block cache and memtable.
// Measured (process_resident_memory_bytes against
// fulcrum_server_budget_used_bytes): about 25 MB for an idle daemon, and 28
// to 31 MB above its count for a server under the example click job.
constexpr int64_t kProcessReserveBytes = int64_t{64} << 20;

// The memory this process may use at most: the smaller of the machine's
// (/proc/meminfo MemTotal) and its cgroup's limit (v2 memory.max or v1
// memory.limit_in_bytes); `bytes` 0 when neither is readable.
struct MemoryLimit {
  int64_t bytes = 0;
  std::string source;  // "the machine's memory", "the cgroup's memory limit"
};
MemoryLimit ReadMemoryLimit();

// The largest budget that leaves a process under `limit` its own memory:
// the limit less kProcessReserveBytes, or half the limit when that is below
// twice the reserve. 0 (no bound) for a limit of 0.
int64_t MaxMemoryBudget(int64_t limit);

// The budget a daemon takes when none is given: `limit` times `fraction`,
// at most MaxMemoryBudget(limit); 4 GiB times `fraction` when the limit is
// unknown (0).
int64_t DefaultMemoryBudget(int64_t limit, double fraction = 0.8);

// INVALID_ARGUMENT, naming the limit, its source and the largest budget that
// fits, when `budget` is more than MaxMemoryBudget(limit.bytes): such a
// process would be killed by the kernel (or its container's OOM killer)
// once its jobs take what the budget lets them.
absl::Status CheckMemoryBudget(int64_t budget, const MemoryLimit& limit);

// "8GiB", "512MiB", "1.5G", "1000000" (bytes). Suffixes K/M/G/T are powers
// of 1000, Ki/Mi/Gi/Ti (with an optional B) powers of 1024. INVALID_ARGUMENT
// for anything else, for 0 or negative values and above 2^62.
absl::StatusOr<int64_t> ParseBytes(absl::string_view text);

// Makes glibc's malloc keep memory it got back for the next request instead
// of returning it to the kernel at once: blocks up to 32 MiB come from the
// heap (not a fresh mmap each), and a heap's free top is trimmed only beyond
// 256 MiB. gRPC allocates a buffer per message read and the data RPCs move
// megabytes per call; without this, most of a transfer's CPU went to page
// faults on memory just mapped and madvise calls giving it back (perf). The
// memory kept is bounded by the process's peak use. Idempotent; every
// daemon calls it first thing (Daemon::Init).
void KeepFreedMemoryForReuse();

// Gives memory freed in the middle of the heap back to the kernel
// (malloc_trim). Called when a job ends (a server drops it, a worker leaves
// it), so that what KeepFreedMemoryForReuse keeps for a job's transfers does
// not outlive the job.
void ReleaseFreedMemory();

// "1.5 GiB", for messages.
std::string FormatBytes(int64_t bytes);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_MEMORY_BUDGET_H_
