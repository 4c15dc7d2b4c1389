#include "common/rpc.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/authorization.h"
#include "common/grpc_metrics.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/rpc_security.h"

namespace fulcrum {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

bool IsServerBusy(const absl::Status& status) {
  return absl::IsResourceExhausted(status) &&
         (absl::StartsWith(status.message(), kServerBusy) || status.message() == kGrpcThreadsExhausted);
}

absl::Duration BusyBackoff::Next() {
  // Seeded from the clock and the caller's address: callers refused at
  // once are apart in one or the other.
  const uint64_t seed =
      static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) ^ reinterpret_cast<uintptr_t>(this);
  const double jitter =
      static_cast<double>(seed * 0x9E3779B97F4A7C15ULL >> 11) / static_cast<double>(1ULL << 53);
  const absl::Duration wait = base_ * (1.0 + jitter / 2);
  base_ = std::min(2 * base_, kMaxBusyBackoff);
  return wait;
}

bool BusyBackoff::WaitBefore(absl::Time deadline) {
  const absl::Duration wait = Next();
  if (absl::Now() + wait >= deadline) return false;
  absl::SleepFor(wait);
  return true;
}

absl::Status BusyUntilTheDeadline(const absl::Status& refusal) {
  return absl::DeadlineExceededError(
      absl::StrCat(refusal.message(), " (sent again until the call's deadline, still refused)"));
}

namespace {

constexpr char kReflectionMethod[] = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

// Counts reflection's streams open on one server; cancels one past the
// bound as soon as it starts, so that it gives its thread back.
class ReflectionStream final : public grpc::experimental::Interceptor {
 public:
  ReflectionStream(std::shared_ptr<std::atomic<int>> open, int most, grpc::ServerContextBase* context)
      : open_(std::move(open)), refused_(open_->fetch_add(1) >= most), context_(context) {}
  ~ReflectionStream() override { open_->fetch_sub(1); }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (refused_ && methods->QueryInterceptionHookPoint(
                        grpc::experimental::InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      FLOG(WARNING) << "cancelled a reflection stream: " << open_->load() - 1 << " are open already";
      context_->TryCancel();
    }
    methods->Proceed();
  }

 private:
  const std::shared_ptr<std::atomic<int>> open_;
  const bool refused_;
  grpc::ServerContextBase* const context_;  // the call's, which owns this interceptor
};

// Watches each call's answer from when its status is sent (a unary call's
// answer goes with it, or just before it) until the call ends: a caller
// that does not read it has the call cancelled once the watch's wait is
// over. The streams' own writes before their status are not watched
// (WatchJob watches its updates itself).
class AnswerWatch final : public grpc::experimental::Interceptor {
 public:
  AnswerWatch(std::shared_ptr<CallWatch> watch, grpc::ServerContextBase* context)
      : watch_(std::move(watch)), context_(context) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (!sending_.has_value() &&
        methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      sending_.emplace(watch_.get(), context_);
    }
    methods->Proceed();
  }

 private:
  const std::shared_ptr<CallWatch> watch_;   // outlives sending_
  grpc::ServerContextBase* const context_;   // the call's, which owns this interceptor
  std::optional<CallWatch::Scope> sending_;  // from the status sent until the call ends
};

class AnswerWatchFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit AnswerWatchFactory(std::shared_ptr<CallWatch> watch) : watch_(std::move(watch)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new AnswerWatch(watch_, info->server_context());
  }

 private:
  const std::shared_ptr<CallWatch> watch_;
};

class ReflectionStreamsFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit ReflectionStreamsFactory(int most) : most_(most) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    if (info->method() == nullptr || std::strcmp(info->method(), kReflectionMethod) != 0) return nullptr;
    return new ReflectionStream(open_, most_, info->server_context());
  }

 private:
  const int most_;
  const std::shared_ptr<std::atomic<int>> open_ = std::make_shared<std::atomic<int>>(0);
};

}  // namespace

prometheus::Counter& CallsCancelled(prometheus::Registry* registry, const std::string& waiting_for) {
  return prometheus::BuildCounter()
      .Name("fulcrum_grpc_calls_cancelled_total")
      .Help(
          "Calls the server cancelled because their peer kept them waiting past their wait: an answer not "
          "read (waiting_for=answer), a request that did not come (waiting_for=request)")
      .Register(*registry)
      .Add({{"waiting_for", waiting_for}});
}

absl::StatusOr<RunningServer> StartGrpcServer(const std::string& host, int port,
                                              const std::vector<ServedService>& services,
                                              MetricsEndpoint* metrics, bool plaintext,
                                              const ServerLimits& limits) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  RunningServer running;
  std::string address = absl::StrCat(host, ":", port);
  builder.AddListeningPort(address, plaintext ? grpc::InsecureServerCredentials() : ServerCredentials(), &running.port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  grpc::ResourceQuota quota("fulcrum-server");
  quota.SetMaxThreads(limits.max_threads);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, limits.max_streams_per_connection);
  for (const ServedService& served : services) {
    absl::StatusOr<std::unique_ptr<grpc::Service>> gated = GateService(served.service, served.name);
    if (!gated.ok()) return gated.status();
    running.gated.push_back(*std::move(gated));
    builder.RegisterService(running.gated.back().get());
  }
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  // Send hooks run in this order: the metrics count the status the gate's
  // interceptor settles on.
  interceptors.push_back(NewGateStatusInterceptorFactory());
  interceptors.push_back(std::make_unique<ReflectionStreamsFactory>(limits.max_reflection_streams));
  if (metrics != nullptr) interceptors.push_back(NewServerMetricsInterceptorFactory(&metrics->registry()));
  running.answers = std::make_shared<CallWatch>("its caller to read its answer", limits.answer_wait);
  if (metrics != nullptr) running.answers->set_counter(&CallsCancelled(&metrics->registry(), "answer"));
  interceptors.push_back(std::make_unique<AnswerWatchFactory>(running.answers));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address,
                                               " (address in use or not local?)"));
  }
  running.server->GetHealthCheckService()->SetServingStatus(true);
  return running;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Independent channels per peer so that one busy connection cannot starve another.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Reconnect within a second of a peer coming back (a restarted scheduler,
  // a pod replaced at once), not after gRPC's default backoff of up to two
  // minutes: a member that reconnects late loses its lease.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, ChannelCredentials(), args,
                                                                  CredentialInterceptors());
}

void SetDeadline(grpc::ClientContext* context, double seconds) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)));
}

}  // namespace fulcrum
