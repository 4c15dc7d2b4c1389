// The metrics endpoint the services of a test binary share.
#ifndef FULCRUM_COMMON_TEST_METRICS_H_
#define FULCRUM_COMMON_TEST_METRICS_H_

#include "common/metrics.h"

namespace fulcrum {

// Started once, on a port the system picks, and never stopped; nullptr when
// it could not start. The services register the same metric families in it
// (prometheus merges them): tests that read them compare before and after.
inline MetricsEndpoint* SharedTestMetrics() {
  static MetricsEndpoint* const metrics = [] {
    auto started = MetricsEndpoint::Start("127.0.0.1", 0);
    return started.ok() ? started->release() : nullptr;
  }();
  return metrics;
}

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_TEST_METRICS_H_
