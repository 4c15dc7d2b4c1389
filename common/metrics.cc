#include "common/metrics.h"

#include <exception>

#include "absl/strings/str_cat.h"

namespace fulcrum {

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
  return endpoint;
}

void MetricsEndpoint::CountBytes(const std::string& method, int64_t received, int64_t sent) {
  received_->Add({{"method", method}}).Increment(static_cast<double>(received));
  sent_->Add({{"method", method}}).Increment(static_cast<double>(sent));
}

prometheus::Histogram::BucketBoundaries DurationBuckets() {
  return {0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

}  // namespace fulcrum
