#include "common/authorization.h"

#include <cstring>
#include <deque>
#include <typeinfo>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/impl/service_type.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/method_handler.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/rpc.h"

namespace fulcrum {
namespace {

using grpc::experimental::InterceptionHookPoints;

// The gate's record of a refusal of a callback-API call, read back by the
// interceptor: "CODE:message".
constexpr char kRefusalKey[] = "x-fulcrum-refusal";

std::map<std::string, uint32_t> BuildTable() {
  const uint32_t job = kJobClient;
  const uint32_t member = kClusterMember;
  return {
      // JobService: users (the CLI, any gRPC client) with the job token.
      {"/fulcrum.v1.JobService/SubmitJob", job},
      {"/fulcrum.v1.JobService/GetJob", job},
      {"/fulcrum.v1.JobService/ListJobs", job},
      {"/fulcrum.v1.JobService/CancelJob", job},
      {"/fulcrum.v1.JobService/WatchJob", job},
      {"/fulcrum.v1.JobService/CheckpointJob", job},
      {"/fulcrum.v1.JobService/GetCheckpoint", job},
      // ClusterService: the cluster's own processes; `fulcrum cluster` may
      // also read the member list with a job token.
      {"/fulcrum.v1.ClusterService/Register", member},
      {"/fulcrum.v1.ClusterService/Heartbeat", member},
      {"/fulcrum.v1.ClusterService/ReportWork", member},
      {"/fulcrum.v1.ClusterService/ListMembers", member | job},
      {"/fulcrum.v1.ClusterService/Leave", member},
      // ParameterService: the scheduler, servers and workers (and `fulcrum
      // export`, which holds the cluster credential).
      {"/fulcrum.v1.ParameterService/SetupJob", member},
      {"/fulcrum.v1.ParameterService/DropJob", member},
      {"/fulcrum.v1.ParameterService/Push", member},
      {"/fulcrum.v1.ParameterService/Pull", member},
      {"/fulcrum.v1.ParameterService/SparsePull", member},
      {"/fulcrum.v1.ParameterService/SparsePush", member},
      {"/fulcrum.v1.ParameterService/SparseReplicate", member},
      {"/fulcrum.v1.ParameterService/Replicate", member},
      {"/fulcrum.v1.ParameterService/Reconfigure", member},
      {"/fulcrum.v1.ParameterService/CopyChunk", member},
      {"/fulcrum.v1.ParameterService/Checkpoint", member},
      {"/fulcrum.v1.ParameterService/ReadCheckpoint", member},
      {"/fulcrum.v1.ParameterService/DeleteCheckpoint", member},
      // Served by gRPC itself on every process (not through the gate).
      {"/grpc.health.v1.Health/Check", kAnyone},
      {"/grpc.health.v1.Health/Watch", kAnyone},
      {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", kAnyone},
  };
}

std::string Refusal(const absl::Status& status) {
  return absl::StrCat(static_cast<int>(status.code()), ":", status.message());
}

// Runs the service's own handler only for allowed callers; otherwise lets
// it answer with the refusal (handlers send a non-OK request status without
// calling the service's code).
class GatedHandler final : public grpc::internal::MethodHandler {
 public:
  // How the wrapped handler gets its request, which decides how a refusal
  // reaches the caller.
  enum class Kind {
    kSync,      // parsed before it runs; it answers a failed request status
    kCallback,  // likewise, but owns the request
    kStream,    // a sync stream (incl. "streamed unary"): reads its own
                // requests and ignores the request status
  };
  GatedHandler(const char* method, std::string request_type, grpc::internal::MethodHandler* inner, Kind kind)
      : method_(method), request_type_(std::move(request_type)), inner_(inner), kind_(kind) {}

  void RunHandler(const HandlerParameter& param) override {
    absl::Status verdict = AuthorizeCall(method_, param.server_context->client_metadata());
    if (verdict.ok() && !param.status.ok()) {
      verdict = absl::InvalidArgumentError(
          absl::StrCat("the request is not a valid ", request_type_, " message (it does not parse)"));
    }
    if (verdict.ok()) {
      inner_->RunHandler(param);
      return;
    }
    if (kind_ == Kind::kStream) {
      // The service's handler would run regardless: answer with a stand-in
      // that reads nothing and returns the refusal.
      grpc::internal::TemplatedBidiStreamingHandler<grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>,
                                                    false>
          refuse([&verdict](grpc::ServerContext*, grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>*) {
            return ToGrpcStatus(verdict);
          });
      refuse.RunHandler(param);
      return;
    }
    if (kind_ == Kind::kCallback) {
      // Callback handlers own the request (freed with the call) and answer a
      // failed request status UNIMPLEMENTED; the interceptor fixes the code.
      param.server_context->AddTrailingMetadata(kRefusalKey, Refusal(verdict));
    } else if (param.request != nullptr) {
      // Synchronous handlers destroy a parsed request only when they run it.
      static_cast<google::protobuf::Message*>(param.request)->~Message();
    }
    inner_->RunHandler(HandlerParameter(param.call, param.server_context, nullptr, ToGrpcStatus(verdict),
                                        param.internal_data, param.call_requester));
  }

  void* Deserialize(grpc_call* call, grpc_byte_buffer* request, grpc::Status* status,
                    void** handler_data) override {
    return inner_->Deserialize(call, request, status, handler_data);
  }

 private:
  const char* const method_;
  const std::string request_type_;
  grpc::internal::MethodHandler* const inner_;  // owned by the wrapped service
  const Kind kind_;
};

// Reads the handlers of another grpc::Service (GetHandler is protected).
class HandlerAccess : public grpc::Service {
 public:
  static grpc::internal::MethodHandler* Get(grpc::Service* service, int index) {
    grpc::internal::MethodHandler* (grpc::Service::*get)(int) = &HandlerAccess::GetHandler;
    return (service->*get)(index);
  }
};

grpc::internal::RpcMethod::RpcType TypeOf(const google::protobuf::MethodDescriptor& method) {
  if (method.client_streaming() && method.server_streaming()) return grpc::internal::RpcMethod::BIDI_STREAMING;
  if (method.client_streaming()) return grpc::internal::RpcMethod::CLIENT_STREAMING;
  if (method.server_streaming()) return grpc::internal::RpcMethod::SERVER_STREAMING;
  return grpc::internal::RpcMethod::NORMAL_RPC;
}

class GatedService final : public grpc::Service {
 public:
  absl::Status Wrap(grpc::Service* inner, const google::protobuf::ServiceDescriptor& descriptor) {
    const auto& table = AuthorizationTable();
    for (int i = 0; i < descriptor.method_count(); ++i) {
      const google::protobuf::MethodDescriptor& method = *descriptor.method(i);
      names_.push_back(absl::StrCat("/", descriptor.full_name(), "/", method.name()));
      const char* name = names_.back().c_str();
      if (table.count(name) == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("RPC ", name, " has no entry in the authorization table (common/authorization.cc)"));
      }
      grpc::internal::MethodHandler* handler = HandlerAccess::Get(inner, i);
      if (handler == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat("RPC ", name, " is asynchronous; the gate serves "
                                                          "synchronous and callback methods only"));
      }
      // Generated callback handlers are grpc::internal::Callback*Handler; a
      // unary or server-streaming method that the service marked "streamed"
      // (grpc::Service::MarkMethodStreamed) is served as a bidi stream.
      const char* handler_type = typeid(*handler).name();
      const bool callback = std::strstr(handler_type, "Callback") != nullptr;
      const bool streamed = !callback && (std::strstr(handler_type, "StreamedUnaryHandler") != nullptr ||
                                          std::strstr(handler_type, "SplitServerStreamingHandler") != nullptr);
      const grpc::internal::RpcMethod::RpcType type =
          streamed ? grpc::internal::RpcMethod::BIDI_STREAMING : TypeOf(method);
      GatedHandler::Kind kind = GatedHandler::Kind::kSync;
      if (callback) {
        kind = GatedHandler::Kind::kCallback;
      } else if (type == grpc::internal::RpcMethod::BIDI_STREAMING ||
                 type == grpc::internal::RpcMethod::CLIENT_STREAMING) {
        kind = GatedHandler::Kind::kStream;
      }
      auto* served = new grpc::internal::RpcServiceMethod(
          name, type, new GatedHandler(name, method.input_type()->full_name(), handler, kind));
      if (callback) served->SetServerApiType(grpc::internal::RpcServiceMethod::ApiType::CALL_BACK);
      AddMethod(served);
    }
    return absl::OkStatus();
  }

 private:
  std::deque<std::string> names_;  // stable storage: methods keep `const char*`
};

class GateStatusInterceptor final : public grpc::experimental::Interceptor {
 public:
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      std::multimap<std::string, std::string>* trailing = methods->GetSendTrailingMetadata();
      auto refusal = trailing->find(kRefusalKey);
      if (refusal != trailing->end()) {
        std::pair<std::string, std::string> parts = absl::StrSplit(refusal->second, absl::MaxSplits(':', 1));
        int code = 0;
        if (!absl::SimpleAtoi(parts.first, &code) || code <= 0 || code > 16) code = grpc::StatusCode::PERMISSION_DENIED;
        methods->ModifySendStatus(grpc::Status(static_cast<grpc::StatusCode>(code), parts.second));
        trailing->erase(refusal);
      }
    }
    methods->Proceed();
  }
};

class GateStatusInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo*) override {
    return new GateStatusInterceptor();
  }
};

}  // namespace

const std::map<std::string, uint32_t>& AuthorizationTable() {
  static const auto* table = new std::map<std::string, uint32_t>(BuildTable());
  return *table;
}

absl::Status AuthorizeCall(absl::string_view method,
                           const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) {
  const auto& table = AuthorizationTable();
  auto entry = table.find(std::string(method));
  if (entry == table.end()) {
    return absl::PermissionDeniedError(absl::StrCat("RPC ", method, " is not authorized for any caller"));
  }
  const uint32_t allowed = entry->second;
  if (allowed & kAnyone) return absl::OkStatus();
  std::vector<CredentialCheck> checks;
  for (CallerKind kind : {kClusterMember, kJobClient}) {
    if ((allowed & kind) == 0) continue;
    CredentialCheck check = CheckCredential(kind, metadata);
    if (check.valid) return absl::OkStatus();
    checks.push_back(std::move(check));
  }
  // Refused: PERMISSION_DENIED if a credential of an allowed kind was
  // presented (and is wrong), else UNAUTHENTICATED saying what is needed.
  for (const CredentialCheck& check : checks) {
    if (check.presented) return absl::PermissionDeniedError(check.wrong);
  }
  std::vector<std::string> needs;
  for (const CredentialCheck& check : checks) needs.push_back(check.missing);
  return absl::UnauthenticatedError(absl::StrJoin(needs, "; or "));
}

absl::StatusOr<std::unique_ptr<grpc::Service>> GateService(grpc::Service* service, const std::string& service_name) {
  const google::protobuf::ServiceDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service_name);
  if (descriptor == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("unknown gRPC service ", service_name));
  }
  auto gated = std::make_unique<GatedService>();
  absl::Status wrapped = gated->Wrap(service, *descriptor);
  if (!wrapped.ok()) return wrapped;
  return std::unique_ptr<grpc::Service>(std::move(gated));
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewGateStatusInterceptorFactory() {
  return std::make_unique<GateStatusInterceptorFactory>();
}

}  // namespace fulcrum
