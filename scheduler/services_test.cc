// JobService's gRPC edge: calls that hold a thread while they wait (WatchJob,
// CheckpointJob) are bounded, so a flood of them is refused, not served by
// ever more threads.
#include "scheduler/services.h"

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc.h"
#include "common/test_util.h"
#include "common/unread_call.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

class WaitingCallsTest : public ::testing::Test {
 protected:
  static constexpr int kMaxWaiting = 2;

  WaitingCallsTest() : manager_(SchedulerOptions(), &control_), service_(&manager_, kMaxWaiting) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials());
    stub_ = v1::JobService::NewStub(channel_);
  }
  ~WaitingCallsTest() override { server_->Shutdown(std::chrono::system_clock::now()); }

  // A pending job (no workers registered): a watch of it waits.
  std::string PendingJob() {
    v1::SubmitJobRequest request;
    request.mutable_spec()->set_name("waits");
    request.mutable_spec()->mutable_model()->set_kind(v1::ModelSpec::SOFTMAX_REGRESSION);
    request.mutable_spec()->mutable_data()->set_dataset(v1::DataSpec::SYNTHETIC);
    request.mutable_spec()->mutable_data()->set_synthetic_examples(1000);
    request.mutable_spec()->mutable_data()->set_synthetic_features(8);
    request.mutable_spec()->mutable_data()->set_synthetic_classes(2);
    request.mutable_spec()->mutable_data()->set_batch_size(10);
    request.mutable_spec()->mutable_data()->set_epochs(1);
    request.mutable_spec()->mutable_optimizer()->set_lr(0.1f);
    request.mutable_spec()->set_num_workers(1);
    v1::SubmitJobResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub_->SubmitJob(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.job_id();
  }

  // A watch that has been answered once (its handler holds a place).
  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::JobStatus>> reader;
  };
  std::unique_ptr<Watch> StartWatch(const std::string& job_id, grpc::Status* refused) {
    auto watch = std::make_unique<Watch>();
    SetDeadline(&watch->context, 30);
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    watch->reader = stub_->WatchJob(&watch->context, request);
    v1::JobStatus first;
    if (watch->reader->Read(&first)) return watch;
    *refused = watch->reader->Finish();
    return nullptr;
  }

  GrpcServerControl control_;  // no job gets as far as its servers
  JobManager manager_;
  JobServiceImpl service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

TEST_F(WaitingCallsTest, WatchesAndCheckpointWaitsPastTheBoundAreRefusedUntilOneEnds) {
  const std::string job_id = PendingJob();
  ASSERT_FALSE(job_id.empty());
  grpc::Status refused;
  std::unique_ptr<Watch> first = StartWatch(job_id, &refused);
  ASSERT_NE(first, nullptr) << refused.error_message();
  std::unique_ptr<Watch> second = StartWatch(job_id, &refused);
  ASSERT_NE(second, nullptr) << refused.error_message();

  // Both places taken: a third watch, and a checkpoint wait, are refused.
  EXPECT_EQ(StartWatch(job_id, &refused), nullptr);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_TRUE(Contains(refused.error_message(), "at most 2 watches and checkpoint waits"))
      << refused.error_message();
  {
    v1::CheckpointJobRequest request;
    request.set_job_id(job_id);
    v1::CheckpointInfo info;
    grpc::ClientContext context;
    const grpc::Status status = stub_->CheckpointJob(&context, request, &info);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    EXPECT_TRUE(Contains(status.error_message(), "CheckpointJob")) << status.error_message();
  }
  // Calls that do not wait are served meanwhile.
  {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::JobStatus status;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->GetJob(&context, request, &status).ok());
  }

  // A client gives up its watch: its place comes free once the handler sees
  // the cancellation (it checks every half second).
  first->context.TryCancel();
  first->reader->Finish();
  std::unique_ptr<Watch> third;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (third == nullptr && absl::Now() < deadline) {
    third = StartWatch(job_id, &refused);
    if (third != nullptr) break;
    ASSERT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    absl::SleepFor(absl::Milliseconds(20));  // between tries of the condition
  }
  EXPECT_NE(third, nullptr) << "no place came free: " << refused.error_message();
  second->context.TryCancel();
  second->reader->Finish();
  if (third != nullptr) {
    third->context.TryCancel();
    third->reader->Finish();
  }
}

// A watcher that never reads its stream: once an update has waited past
// the write wait to be sent, the watch is cancelled and its thread and its
// waiting place are free, though the watcher set no deadline.
TEST_F(WaitingCallsTest, AWatchWhoseUpdatesAreNotReadIsCancelledAfterTheWait) {
  const std::string job_id = PendingJob();
  ASSERT_FALSE(job_id.empty());
  service_.set_write_wait(absl::Milliseconds(200));
  // Windows of a byte and never grown: the first update stays unsent, as
  // it would to a watcher that does not read.
  auto stub = v1::JobService::NewStub(UnreadCall::Channel(absl::StrCat("127.0.0.1:", port_)));
  grpc::ClientContext context;  // no deadline
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  std::unique_ptr<grpc::ClientReader<v1::JobStatus>> unread = stub->WatchJob(&context, request);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (service_.writes_cancelled() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(service_.writes_cancelled(), 1) << "the unread update still waits";
  // Both places are free again (the handler ends once its write is
  // cancelled), and watches that read are served.
  grpc::Status refused;
  std::unique_ptr<Watch> first, second;
  while (second == nullptr && absl::Now() < deadline) {
    if (first == nullptr) first = StartWatch(job_id, &refused);
    if (first != nullptr) second = StartWatch(job_id, &refused);
    if (second == nullptr) {
      ASSERT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
      absl::SleepFor(absl::Milliseconds(20));  // between tries of the condition
    }
  }
  EXPECT_NE(second, nullptr) << "the unread watch kept its place: " << refused.error_message();
  EXPECT_EQ(service_.writes_cancelled(), 1);
  for (Watch* watch : {first.get(), second.get()}) {
    if (watch == nullptr) continue;
    watch->context.TryCancel();
    watch->reader->Finish();
  }
  context.TryCancel();
  unread->Finish();
}

}  // namespace
}  // namespace fulcrum
