#include "common/memory_budget.h"

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/quote.h"

namespace fulcrum {
namespace {

constexpr int64_t kMaxBytes = int64_t{1} << 62;

// The first number in the file (a cgroup limit), or 0 when absent or "max".
int64_t ReadLimit(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return 0;
  uint64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value == 0 || value >= static_cast<uint64_t>(kMaxBytes)) return 0;
  return static_cast<int64_t>(value);
}

int64_t MemTotal() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib * 1024;
  }
  return 0;
}

}  // namespace

MemoryLimit ReadMemoryLimit() {
  MemoryLimit limit{MemTotal(), "the machine's memory"};
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const int64_t cgroup = ReadLimit(path);
    if (cgroup > 0 && (limit.bytes == 0 || cgroup < limit.bytes)) {
      limit = {cgroup, absl::StrCat("the cgroup's memory limit (", path, ")")};
    }
  }
  return limit;
}

int64_t MaxMemoryBudget(int64_t limit) {
  if (limit <= 0) return 0;
  return limit >= 2 * kProcessReserveBytes ? limit - kProcessReserveBytes : limit / 2;
}

int64_t DefaultMemoryBudget(int64_t limit, double fraction) {
  constexpr int64_t kUnknownLimit = int64_t{4} << 30;  // nothing readable: assume a small machine
  if (limit <= 0) return static_cast<int64_t>(static_cast<double>(kUnknownLimit) * fraction);
  return std::min(static_cast<int64_t>(static_cast<double>(limit) * fraction), MaxMemoryBudget(limit));
}

absl::Status CheckMemoryBudget(int64_t budget, const MemoryLimit& limit) {
  const int64_t most = MaxMemoryBudget(limit.bytes);
  if (most == 0 || budget <= most) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      FormatBytes(budget), " is more than this process can hold: ", limit.source, " is ",
      FormatBytes(limit.bytes), ", and the process needs about ", FormatBytes(limit.bytes - most),
      " of it for itself (code, gRPC, RocksDB); set at most ", FormatBytes(most), " (", most,
      " bytes), or leave it unset for ", FormatBytes(DefaultMemoryBudget(limit.bytes))));
}

absl::StatusOr<int64_t> ParseBytes(absl::string_view text) {
  absl::string_view rest = absl::StripAsciiWhitespace(text);
  const std::string original(rest);
  double scale = 1;
  absl::ConsumeSuffix(&rest, "B") || absl::ConsumeSuffix(&rest, "b");
  const struct {
    const char* suffix;
    double scale;
  } units[] = {{"Ki", 1024.0},         {"Mi", 1024.0 * 1024},        {"Gi", 1024.0 * 1024 * 1024},
               {"Ti", 1024.0 * 1024 * 1024 * 1024}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}};
  for (const auto& unit : units) {
    if (absl::ConsumeSuffix(&rest, unit.suffix)) {
      scale = unit.scale;
      break;
    }
  }
  double value = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(rest), &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat("not a size: ", Quote(original),
                                                   " (write bytes, or e.g. 512MiB, 8GiB, 2G)"));
  }
  const double bytes = value * scale;
  if (bytes < 1 || bytes > static_cast<double>(kMaxBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("size ", Quote(original), " is out of range [1 byte, 4 EiB]"));
  }
  return static_cast<int64_t>(bytes);
}

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::abs(value) >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", value, units[unit]);
}

void ReleaseFreedMemory() { malloc_trim(0); }

void KeepFreedMemoryForReuse() {
  // 32 MiB is the largest mmap threshold glibc takes on 64-bit machines.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  // Few arenas: each keeps its own free memory, and gRPC's many threads
  // would otherwise spread a process's buffers over up to 8 per core.
  mallopt(M_ARENA_MAX, 2);
}

}  // namespace fulcrum
