#include "worker/parameter_transport.h"

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "fulcrum/v1/parameter.grpc.pb.h"

namespace fulcrum {
namespace {

class GrpcCall final : public ParameterTransport::Call {
 public:
  GrpcCall(grpc::GenericStub* stub, ParameterTransport::Method method) : stub_(stub), method_(method) {}

  void Start(const grpc::ByteBuffer* request, grpc::ByteBuffer* response, absl::Duration timeout,
             std::function<void(grpc::Status)> done) override {
    static const std::string* const kPush =
        new std::string(absl::StrCat("/", v1::ParameterService::service_full_name(), "/Push"));
    static const std::string* const kPull =
        new std::string(absl::StrCat("/", v1::ParameterService::service_full_name(), "/Pull"));
    SetDeadline(&context_, absl::ToDoubleSeconds(timeout));
    stub_->UnaryCall(&context_, method_ == ParameterTransport::Method::kPull ? *kPull : *kPush,
                     grpc::StubOptions(), request, response, std::move(done));
  }
  // A context cancelled before its call starts cancels the call at once.
  void Cancel() override { context_.TryCancel(); }

 private:
  grpc::GenericStub* const stub_;
  const ParameterTransport::Method method_;
  grpc::ClientContext context_;
};

}  // namespace

std::unique_ptr<ParameterTransport::Call> GrpcParameterTransport::NewCall(const std::string& address, Method method) {
  MutexLock lock(&mu_);
  std::unique_ptr<grpc::GenericStub>& stub = stubs_[address];
  if (stub == nullptr) stub = std::make_unique<grpc::GenericStub>(MakeChannel(address));
  return std::make_unique<GrpcCall>(stub.get(), method);
}

}  // namespace fulcrum
