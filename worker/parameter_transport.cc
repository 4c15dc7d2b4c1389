#include "worker/parameter_transport.h"

#include <grpcpp/client_context.h>

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "fulcrum/v1/parameter.grpc.pb.h"

namespace fulcrum {
namespace {

const std::string& Path(ParameterTransport::Method method) {
  using Method = ParameterTransport::Method;
  static const auto* const paths = new std::map<Method, std::string>{
      {Method::kPush, absl::StrCat("/", v1::ParameterService::service_full_name(), "/Push")},
      {Method::kPull, absl::StrCat("/", v1::ParameterService::service_full_name(), "/Pull")},
      {Method::kSparsePull, absl::StrCat("/", v1::ParameterService::service_full_name(), "/SparsePull")},
      {Method::kSparsePush, absl::StrCat("/", v1::ParameterService::service_full_name(), "/SparsePush")},
  };
  return paths->at(method);
}

class GrpcCall final : public ParameterTransport::Call {
 public:
  GrpcCall(grpc::GenericStub* stub, ParameterTransport::Method method) : stub_(stub), method_(method) {}

  void Start(const grpc::ByteBuffer* request, grpc::ByteBuffer* response, absl::Duration timeout,
             std::function<void(grpc::Status)> done) override {
    SetDeadline(&context_, absl::ToDoubleSeconds(timeout));
    stub_->UnaryCall(&context_, Path(method_), grpc::StubOptions(), request, response, std::move(done));
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

bool CallSet::Track(ParameterTransport::Call* call) {
  MutexLock lock(&mu_);
  if (superseded_) return false;
  calls_.insert(call);
  return true;
}

void CallSet::Untrack(ParameterTransport::Call* call) {
  MutexLock lock(&mu_);
  calls_.erase(call);
}

void CallSet::Supersede() {
  MutexLock lock(&mu_);
  superseded_ = true;
  for (ParameterTransport::Call* call : calls_) call->Cancel();
}

bool CallSet::superseded() const {
  MutexLock lock(&mu_);
  return superseded_;
}

absl::Status CallSet::Outcome(absl::Status status, int64_t map_version) const {
  if (!absl::IsCancelled(status) || !superseded()) return status;
  return absl::AbortedError(
      absl::StrCat("cancelled, the shard map changed (version ", map_version, " is superseded)"));
}

}  // namespace fulcrum
