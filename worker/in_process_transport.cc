#include "worker/in_process_transport.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/payload_wire.h"
#include "common/rpc.h"

namespace fulcrum {

std::string BufferBytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!buffer.Dump(&slices).ok()) return bytes;
  for (const grpc::Slice& slice : slices) bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return bytes;
}

class InProcessTransport::InProcessCall final : public ParameterTransport::Call {
 public:
  InProcessCall(InProcessTransport* transport, std::string address, Method method)
      : transport_(transport), address_(std::move(address)), method_(method) {}

  void Start(const grpc::ByteBuffer* request, grpc::ByteBuffer* response, absl::Duration timeout,
             std::function<void(grpc::Status)> done) override {
    if (cancelled_.load()) return done(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled before it started"));
    transport_->MaybeKeep(method_, *request);
    Fault fault;
    ParameterServiceImpl* service = transport_->Find(address_, &fault);
    // The fault hook's verdict at `stage` (OK: go on).
    auto injected = [this, fault](Stage stage) { return fault ? fault(address_, method_, stage) : absl::OkStatus(); };
    if (absl::Status before = injected(Stage::kBeforeServer); !before.ok()) return done(ToGrpcStatus(before));
    if (service == nullptr) {
      return done(grpc::Status(grpc::StatusCode::UNAVAILABLE, absl::StrCat("no server at ", address_)));
    }
    if (method_ == Method::kSparsePull || method_ == Method::kSparsePush) {
      absl::Status status;
      if (method_ == Method::kSparsePull) {
        status = service->HandleSparsePull(*request, response);
      } else {
        v1::SparsePushResponse answer;
        status = service->HandleSparsePush(*request, /*from_worker=*/true, &answer);
        if (status.ok()) *response = SerializeMessage(answer);
      }
      if (absl::Status after = injected(Stage::kAfterServer); !after.ok()) return done(ToGrpcStatus(after));
      return done(ToGrpcStatus(status));
    }
    if (method_ == Method::kPush) {
      v1::PushResponse answer;
      absl::Status status = service->HandlePush(*request, /*from_worker=*/true, &answer);
      if (absl::Status after = injected(Stage::kAfterServer); !after.ok()) return done(ToGrpcStatus(after));
      if (status.ok()) *response = SerializeMessage(answer);
      return done(ToGrpcStatus(status));
    }
    service->HandlePull(*request, absl::Now() + timeout, handle_,
                        [response, injected, done = std::move(done)](const absl::Status& status,
                                                                     grpc::ByteBuffer answer) {
                          if (absl::Status after = injected(Stage::kAfterServer); !after.ok()) {
                            return done(ToGrpcStatus(after));
                          }
                          *response = std::move(answer);
                          done(ToGrpcStatus(status));
                        });
  }

  void Cancel() override {
    cancelled_ = true;
    handle_->Cancel();
  }

 private:
  InProcessTransport* const transport_;
  const std::string address_;
  const Method method_;
  const std::shared_ptr<ParameterServiceImpl::PullHandle> handle_ = std::make_shared<ParameterServiceImpl::PullHandle>();
  std::atomic<bool> cancelled_{false};
};

void InProcessTransport::Serve(const std::string& address, ParameterServiceImpl* service) {
  MutexLock lock(&mu_);
  services_[address] = service;
}

void InProcessTransport::set_fault(Fault fault) {
  MutexLock lock(&mu_);
  fault_ = std::move(fault);
}

void InProcessTransport::set_keep(std::function<bool(Method)> keep) {
  MutexLock lock(&mu_);
  keep_ = std::move(keep);
}

std::vector<InProcessTransport::Kept> InProcessTransport::TakeKept() {
  MutexLock lock(&mu_);
  return std::exchange(kept_, {});
}

void InProcessTransport::MaybeKeep(Method method, const grpc::ByteBuffer& request) {
  MutexLock lock(&mu_);
  if (!keep_ || !keep_(method)) return;
  Kept& kept = kept_.emplace_back();
  kept.request = request;  // a reference to the same slices, no copy
  kept.sent = BufferBytes(request);
}

ParameterServiceImpl* InProcessTransport::Find(const std::string& address, Fault* fault) {
  MutexLock lock(&mu_);
  *fault = fault_;
  auto it = services_.find(address);
  return it == services_.end() ? nullptr : it->second;
}

std::unique_ptr<ParameterTransport::Call> InProcessTransport::NewCall(const std::string& address, Method method) {
  return std::make_unique<InProcessCall>(this, address, method);
}

}  // namespace fulcrum
