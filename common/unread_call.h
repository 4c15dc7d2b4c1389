// Tests: a call that sends its request and never reads its answer.
#ifndef FULCRUM_COMMON_UNREAD_CALL_H_
#define FULCRUM_COMMON_UNREAD_CALL_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/payload_wire.h"

namespace fulcrum {

// Its channel (Channel) announces HTTP/2 windows of a byte and never grows
// them, so any answer stays unsent, as to a caller that does not read.
class UnreadCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `method`: "/package.Service/Method"; no deadline.
  UnreadCall(grpc::GenericStub* stub, const std::string& method, const google::protobuf::MessageLite& request)
      : request_(SerializeMessage(request)) {
    stub->PrepareBidiStreamingCall(&context_, method, grpc::StubOptions(), this);
    StartWriteLast(&request_, grpc::WriteOptions());
    StartCall();
  }
  ~UnreadCall() override {
    context_.TryCancel();
    done_.WaitForNotification();
  }
  UnreadCall(const UnreadCall&) = delete;
  UnreadCall& operator=(const UnreadCall&) = delete;

  static std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1);
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }

  void OnDone(const grpc::Status& /*status*/) override { done_.Notify(); }
  // Whether the call ended within `timeout`.
  bool AwaitEnd(absl::Duration timeout) { return done_.WaitForNotificationWithTimeout(timeout); }

 private:
  grpc::ByteBuffer request_;
  grpc::ClientContext context_;
  absl::Notification done_;
};

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_UNREAD_CALL_H_
