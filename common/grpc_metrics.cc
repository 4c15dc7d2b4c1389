#include "common/grpc_metrics.h"

#include <chrono>

#include <prometheus/counter.h>
#include <prometheus/histogram.h>

namespace fulcrum {
namespace {

using grpc::experimental::InterceptionHookPoints;

struct Families {
  explicit Families(prometheus::Registry* registry)
      : started(prometheus::BuildCounter()
                    .Name("grpc_server_started_total")
                    .Help("Total number of RPCs started on the server.")
                    .Register(*registry)),
        handled(prometheus::BuildCounter()
                    .Name("grpc_server_handled_total")
                    .Help("Total number of RPCs completed on the server, regardless of success or failure.")
                    .Register(*registry)),
        seconds(prometheus::BuildHistogram()
                    .Name("grpc_server_handling_seconds")
                    .Help("Histogram of response latency (seconds) of gRPC that had been application-level "
                          "handled by the server.")
                    .Register(*registry)),
        received(prometheus::BuildCounter()
                     .Name("grpc_server_msg_received_total")
                     .Help("Total number of RPC stream messages received on the server.")
                     .Register(*registry)),
        sent(prometheus::BuildCounter()
                 .Name("grpc_server_msg_sent_total")
                 .Help("Total number of gRPC stream messages sent by the server.")
                 .Register(*registry)) {}
  prometheus::Family<prometheus::Counter>& started;
  prometheus::Family<prometheus::Counter>& handled;
  prometheus::Family<prometheus::Histogram>& seconds;
  prometheus::Family<prometheus::Counter>& received;
  prometheus::Family<prometheus::Counter>& sent;
};

const char* TypeName(grpc::experimental::ServerRpcInfo::Type type) {
  switch (type) {
    case grpc::experimental::ServerRpcInfo::Type::UNARY: return "unary";
    case grpc::experimental::ServerRpcInfo::Type::CLIENT_STREAMING: return "client_stream";
    case grpc::experimental::ServerRpcInfo::Type::SERVER_STREAMING: return "server_stream";
    case grpc::experimental::ServerRpcInfo::Type::BIDI_STREAMING: return "bidi_stream";
  }
  return "unary";
}

// One per RPC: times it from its initial metadata to the status it sends.
class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(Families* families, grpc::experimental::ServerRpcInfo* info) : families_(families) {
    // "/package.Service/Method"
    std::string full = info->method() != nullptr ? info->method() : "";
    size_t slash = full.rfind('/');
    service_ = slash == std::string::npos || slash == 0 ? "unknown" : full.substr(1, slash - 1);
    method_ = slash == std::string::npos ? full : full.substr(slash + 1);
    type_ = TypeName(info->type());
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      start_ = std::chrono::steady_clock::now();
      families_->started.Add(Labels()).Increment();
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      families_->received.Add(Labels()).Increment();
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      families_->sent.Add(Labels()).Increment();
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      std::map<std::string, std::string> labels = Labels();
      labels["grpc_code"] = GrpcCodeName(methods->GetSendStatus().error_code());
      families_->handled.Add(labels).Increment();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      families_->seconds
          .Add(Labels(), prometheus::Histogram::BucketBoundaries{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10})
          .Observe(seconds);
    }
    methods->Proceed();
  }

 private:
  std::map<std::string, std::string> Labels() const {
    return {{"grpc_type", type_}, {"grpc_service", service_}, {"grpc_method", method_}};
  }

  Families* families_;
  std::string service_, method_, type_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

class MetricsInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsInterceptorFactory(prometheus::Registry* registry) : families_(registry) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new MetricsInterceptor(&families_, info);
  }

 private:
  Families families_;
};

}  // namespace

std::string GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "Canceled";
    case grpc::StatusCode::UNKNOWN: return "Unknown";
    case grpc::StatusCode::INVALID_ARGUMENT: return "InvalidArgument";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DeadlineExceeded";
    case grpc::StatusCode::NOT_FOUND: return "NotFound";
    case grpc::StatusCode::ALREADY_EXISTS: return "AlreadyExists";
    case grpc::StatusCode::PERMISSION_DENIED: return "PermissionDenied";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "ResourceExhausted";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FailedPrecondition";
    case grpc::StatusCode::ABORTED: return "Aborted";
    case grpc::StatusCode::OUT_OF_RANGE: return "OutOfRange";
    case grpc::StatusCode::UNIMPLEMENTED: return "Unimplemented";
    case grpc::StatusCode::INTERNAL: return "Internal";
    case grpc::StatusCode::UNAVAILABLE: return "Unavailable";
    case grpc::StatusCode::DATA_LOSS: return "DataLoss";
    case grpc::StatusCode::UNAUTHENTICATED: return "Unauthenticated";
    default: return "Unknown";
  }
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewServerMetricsInterceptorFactory(
    prometheus::Registry* registry) {
  return std::make_unique<MetricsInterceptorFactory>(registry);
}

}  // namespace fulcrum
