// Prometheus exposition for every process: one registry, served at
// --metrics-port under /metrics. Metric names are prefixed fulcrum_ and carry
// their unit.
#ifndef FULCRUM_COMMON_METRICS_H_
#define FULCRUM_COMMON_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/sync.h"

namespace fulcrum {

// Gauges whose values are read when /metrics is scraped (ScrapedGauges
// below).
class ScrapedGauges;

// While it lives, the gauge it was returned for is served; once it is
// destroyed its read function is never called again.
class ScrapedGauge {
 public:
  ScrapedGauge(std::shared_ptr<ScrapedGauges> gauges, int64_t id) : gauges_(std::move(gauges)), id_(id) {}
  ~ScrapedGauge();
  ScrapedGauge(const ScrapedGauge&) = delete;
  ScrapedGauge& operator=(const ScrapedGauge&) = delete;

 private:
  std::shared_ptr<ScrapedGauges> gauges_;
  int64_t id_;
};

class MetricsEndpoint {
 public:
  // Binds host:port (0 = a free port) and serves the registry at /metrics.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& host, int port);

  prometheus::Registry& registry() { return *registry_; }
  int port() const { return port_; }

  // fulcrum_rpc_received_bytes_total / fulcrum_rpc_sent_bytes_total by method.
  void CountBytes(const std::string& method, int64_t received, int64_t sent);

  // A gauge `name` whose value `read` gives at every scrape (called on the
  // exposer's thread), for a figure another object knows: what a server's
  // jobs hold of its memory budget. Served until the handle is destroyed.
  std::unique_ptr<ScrapedGauge> AddScrapedGauge(std::string name, std::string help,
                                                std::function<double()> read);

 private:
  MetricsEndpoint() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  prometheus::Family<prometheus::Counter>* received_ = nullptr;
  prometheus::Family<prometheus::Counter>* sent_ = nullptr;
  // The gauges AddScrapedGauge added, and the process_* metrics (from
  // ReadProcessStats at each scrape).
  std::shared_ptr<ScrapedGauges> scraped_;
  // The exposer holds what it serves weakly: these own it.
  std::shared_ptr<prometheus::Collectable> process_;
};

// What /proc says of this process, for the standard process_* metrics of
// Prometheus's client guidelines (prometheus-cpp has none): resident and
// virtual memory, CPU seconds, threads, open and allowed file descriptors,
// start time (Unix seconds).
struct ProcessStats {
  int64_t resident_bytes = 0;
  int64_t resident_peak_bytes = 0;  // VmHWM
  int64_t virtual_bytes = 0;
  double cpu_seconds = 0;
  int64_t threads = 0;
  int64_t open_fds = 0;
  int64_t max_fds = 0;
  double start_time_seconds = 0;
};
// INTERNAL when /proc/self cannot be read or parsed.
absl::StatusOr<ProcessStats> ReadProcessStats();

// Default histogram buckets for durations in seconds (100 us .. 60 s).
prometheus::Histogram::BucketBoundaries DurationBuckets();

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_METRICS_H_
