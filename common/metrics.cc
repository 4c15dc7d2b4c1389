#include "common/metrics.h"

#include <dirent.h>
#include <prometheus/collectable.h>
#include <sys/resource.h>
#include <unistd.h>

#include <exception>
#include <fstream>
#include <map>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/process.h"

namespace fulcrum {

class ScrapedGauges : public prometheus::Collectable {
 public:
  int64_t Add(std::string name, std::string help, std::function<double()> read) {
    MutexLock lock(&mu_);
    gauges_.emplace(next_id_, Gauge{std::move(name), std::move(help), std::move(read)});
    return next_id_++;
  }
  void Remove(int64_t id) {
    MutexLock lock(&mu_);  // a scrape in progress finishes before the read goes
    gauges_.erase(id);
  }
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families;
    MutexLock lock(&mu_);
    for (const auto& [id, gauge] : gauges_) {
      prometheus::MetricFamily& family = families.emplace_back();
      family.name = gauge.name;
      family.help = gauge.help;
      family.type = prometheus::MetricType::Gauge;
      family.metric.emplace_back().gauge.value = gauge.read();
    }
    return families;
  }

 private:
  struct Gauge {
    std::string name;
    std::string help;
    std::function<double()> read;
  };
  mutable Mutex mu_;
  std::map<int64_t, Gauge> gauges_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
};

ScrapedGauge::~ScrapedGauge() { gauges_->Remove(id_); }

namespace {

// The process_* metrics, from one ReadProcessStats per scrape.
class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::StatusOr<ProcessStats> stats = ReadProcessStats();
    if (!stats.ok()) return {};
    struct Field {
      const char* name;
      const char* help;
      prometheus::MetricType type;
      double value;
    };
    const Field fields[] = {
        {"process_resident_memory_bytes", "Resident memory size in bytes", prometheus::MetricType::Gauge,
         static_cast<double>(stats->resident_bytes)},
        {"fulcrum_process_resident_memory_peak_bytes",
         "Largest resident memory size in bytes since the process "
         "started",
         prometheus::MetricType::Gauge, static_cast<double>(stats->resident_peak_bytes)},
        {"process_virtual_memory_bytes", "Virtual memory size in bytes", prometheus::MetricType::Gauge,
         static_cast<double>(stats->virtual_bytes)},
        {"process_cpu_seconds_total", "Total user and system CPU time spent in seconds",
         prometheus::MetricType::Counter, stats->cpu_seconds},
        {"process_threads", "Number of OS threads in the process", prometheus::MetricType::Gauge,
         static_cast<double>(stats->threads)},
        {"process_open_fds", "Number of open file descriptors", prometheus::MetricType::Gauge,
         static_cast<double>(stats->open_fds)},
        {"process_max_fds", "Maximum number of open file descriptors", prometheus::MetricType::Gauge,
         static_cast<double>(stats->max_fds)},
        {"process_start_time_seconds", "Start time of the process since unix epoch in seconds",
         prometheus::MetricType::Gauge, stats->start_time_seconds},
    };
    std::vector<prometheus::MetricFamily> families;
    for (const Field& field : fields) {
      prometheus::MetricFamily& family = families.emplace_back();
      family.name = field.name;
      family.help = field.help;
      family.type = field.type;
      prometheus::ClientMetric& metric = family.metric.emplace_back();
      (field.type == prometheus::MetricType::Counter ? metric.counter.value : metric.gauge.value) =
          field.value;
    }
    return families;
  }
};

absl::Status Unreadable(absl::string_view what) {
  return absl::InternalError(absl::StrCat("cannot read ", what, " of this process"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& host,
                                                                         int port) {
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  std::string address = absl::StrCat(host, ":", port);
  try {  // civetweb reports bind failures by throwing; keep that at this edge.
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(address, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", address, ": ", e.what()));
  }
  auto ports = endpoint->exposer_->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError("metrics: exposer bound no port");
  endpoint->port_ = ports.front();
  endpoint->registry_ = std::make_shared<prometheus::Registry>();
  endpoint->exposer_->RegisterCollectable(endpoint->registry_);
  endpoint->received_ = &prometheus::BuildCounter()
                             .Name("fulcrum_rpc_received_bytes_total")
                             .Help("Request payload bytes received, by method")
                             .Register(*endpoint->registry_);
  endpoint->sent_ = &prometheus::BuildCounter()
                         .Name("fulcrum_rpc_sent_bytes_total")
                         .Help("Response payload bytes sent, by method")
                         .Register(*endpoint->registry_);
  endpoint->scraped_ = std::make_shared<ScrapedGauges>();
  endpoint->exposer_->RegisterCollectable(endpoint->scraped_);
  endpoint->process_ = std::make_shared<ProcessCollector>();
  endpoint->exposer_->RegisterCollectable(endpoint->process_);
  return endpoint;
}

std::unique_ptr<ScrapedGauge> MetricsEndpoint::AddScrapedGauge(std::string name, std::string help,
                                                               std::function<double()> read) {
  const int64_t id = scraped_->Add(std::move(name), std::move(help), std::move(read));
  return std::make_unique<ScrapedGauge>(scraped_, id);
}

absl::StatusOr<ProcessStats> ReadProcessStats() {
  ProcessStats stats;
  std::string stat;
  {
    std::ifstream in("/proc/self/stat");
    if (!std::getline(in, stat)) return Unreadable("/proc/self/stat");
  }
  // pid (comm) state ppid ...: comm may hold spaces and parentheses, so the
  // fields are counted from the last ')'. After it, field 3 (state) is [0].
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return Unreadable("/proc/self/stat");
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
  auto field = [&fields](size_t number, double* out) {  // `number` as proc(5) counts them
    return number - 3 < fields.size() && absl::SimpleAtod(fields[number - 3], out);
  };
  double utime = 0, stime = 0, threads = 0, start_ticks = 0, vsize = 0, rss_pages = 0;
  if (!field(14, &utime) || !field(15, &stime) || !field(20, &threads) || !field(22, &start_ticks) ||
      !field(23, &vsize) || !field(24, &rss_pages)) {
    return Unreadable("the fields of /proc/self/stat");
  }
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  stats.cpu_seconds = (utime + stime) / ticks;
  stats.threads = static_cast<int64_t>(threads);
  stats.virtual_bytes = static_cast<int64_t>(vsize);
  stats.resident_bytes = static_cast<int64_t>(rss_pages) * sysconf(_SC_PAGESIZE);
  stats.resident_peak_bytes = PeakResidentBytes(getpid());
  {
    std::ifstream in("/proc/stat");
    std::string line;
    while (std::getline(in, line)) {
      absl::string_view rest = line;
      int64_t boot = 0;
      if (absl::ConsumePrefix(&rest, "btime ") && absl::SimpleAtoi(rest, &boot)) {
        stats.start_time_seconds = static_cast<double>(boot) + start_ticks / ticks;
      }
    }
  }
  if (DIR* dir = opendir("/proc/self/fd"); dir != nullptr) {
    while (const dirent* entry = readdir(dir)) {
      if (entry->d_name[0] != '.') ++stats.open_fds;
    }
    closedir(dir);
    --stats.open_fds;  // the one opendir holds
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) stats.max_fds = static_cast<int64_t>(limit.rlim_cur);
  return stats;
}

void MetricsEndpoint::CountBytes(const std::string& method, int64_t received, int64_t sent) {
  received_->Add({{"method", method}}).Increment(static_cast<double>(received));
  sent_->Add({{"method", method}}).Increment(static_cast<double>(sent));
}

prometheus::Histogram::BucketBoundaries DurationBuckets() {
  return {0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

}  // namespace fulcrum
