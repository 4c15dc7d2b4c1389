// Prometheus metrics for every gRPC method a process serves, with the names
// and labels of go-grpc-prometheus, recorded once by a server interceptor:
//   grpc_server_started_total{grpc_type,grpc_service,grpc_method}
//   grpc_server_handled_total{grpc_type,grpc_service,grpc_method,grpc_code}
//   grpc_server_handling_seconds{grpc_type,grpc_service,grpc_method} (histogram)
//   grpc_server_msg_received_total / grpc_server_msg_sent_total
// grpc_type is unary, client_stream, server_stream or bidi_stream; grpc_code
// the Go name of the status code (OK, NotFound, Unavailable, ...).
#ifndef FULCRUM_COMMON_GRPC_METRICS_H_
#define FULCRUM_COMMON_GRPC_METRICS_H_

#include <memory>
#include <string>

#include <grpcpp/support/server_interceptor.h>
#include <prometheus/registry.h>

namespace fulcrum {

// The interceptor factory to give grpc::ServerBuilder; `registry` must
// outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewServerMetricsInterceptorFactory(
    prometheus::Registry* registry);

// go-grpc-prometheus's name for a status code ("OK", "InvalidArgument", ...).
std::string GrpcCodeName(grpc::StatusCode code);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_GRPC_METRICS_H_
