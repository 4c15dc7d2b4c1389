// Prometheus exposition for every process: one registry, served at
// --metrics-port under /metrics. Metric names are prefixed fulcrum_ and carry
// their unit.
#ifndef FULCRUM_COMMON_METRICS_H_
#define FULCRUM_COMMON_METRICS_H_

#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/status/statusor.h"

namespace fulcrum {

class MetricsEndpoint {
 public:
  // Binds host:port (0 = a free port) and serves the registry at /metrics.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& host, int port);

  prometheus::Registry& registry() { return *registry_; }
  int port() const { return port_; }

  // fulcrum_rpc_received_bytes_total / fulcrum_rpc_sent_bytes_total by method.
  void CountBytes(const std::string& method, int64_t received, int64_t sent);

 private:
  MetricsEndpoint() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  prometheus::Family<prometheus::Counter>* received_ = nullptr;
  prometheus::Family<prometheus::Counter>* sent_ = nullptr;
};

// Default histogram buckets for durations in seconds (100 us .. 60 s).
prometheus::Histogram::BucketBoundaries DurationBuckets();

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_METRICS_H_
