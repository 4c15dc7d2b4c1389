#include "common/rpc.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/sync.h"
#include "common/unread_call.h"
#include "fulcrum/v1/parameter.grpc.pb.h"

namespace fulcrum {
namespace {

constexpr char kPush[] = "/fulcrum.v1.ParameterService/Push";

// A ParameterService whose Push is a "streamed unary" method, as the
// parameter server's is, and holds every call it reads until released.
class HoldingPushService final : public v1::ParameterService::Service {
 public:
  HoldingPushService() {
    MarkMethodStreamed(v1::PushRequest::descriptor()
                           ->file()
                           ->FindServiceByName("ParameterService")
                           ->FindMethodByName("Push")
                           ->index(),
                       new grpc::internal::StreamedUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                           [this](grpc::ServerContext*,
                                  grpc::ServerUnaryStreamer<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
                             {
                               MutexLock lock(&mu_);
                               ++entered_;
                             }
                             grpc::ByteBuffer request;
                             if (!stream->Read(&request))
                               return grpc::Status(grpc::StatusCode::CANCELLED, "no request");
                             std::vector<grpc::Slice> slices;
                             std::string body;
                             if (request.Dump(&slices).ok()) {
                               for (const grpc::Slice& slice : slices) {
                                 body.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
                               }
                             }
                             MutexLock lock(&mu_);
                             read_.insert(body);
                             mu_.Await(absl::Condition(&released_));
                             grpc::Slice answer(std::string("ok"));
                             stream->WriteLast(grpc::ByteBuffer(&answer, 1), grpc::WriteOptions());
                             return grpc::Status::OK;
                           }));
  }
  void Release() {
    MutexLock lock(&mu_);
    released_ = true;
  }
  // Waits up to `timeout` for `n` handlers to have started.
  bool AwaitEntered(int n, absl::Duration timeout) {
    MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return entered_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }
  // Waits up to `timeout` for a handler to have read a request of `body`.
  bool AwaitRead(const std::string& body, absl::Duration timeout) {
    MutexLock lock(&mu_);
    auto read = [this, &body]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return read_.count(body) > 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&read), timeout);
  }
  int entered() {
    MutexLock lock(&mu_);
    return entered_;
  }

 private:
  Mutex mu_;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::multiset<std::string> read_ ABSL_GUARDED_BY(mu_);  // the requests' bodies
};

// Calls of Push started without waiting: each ends into its own status.
class Calls {
 public:
  explicit Calls(std::shared_ptr<grpc::Channel> channel, std::string method = kPush)
      : stub_(std::move(channel)), method_(std::move(method)) {}
  ~Calls() {
    for (auto& context : contexts_) context->TryCancel();
    MutexLock lock(&mu_);
    auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ == statuses_.size(); };
    mu_.Await(absl::Condition(&all_done));
  }
  // Starts one call, its request (`body`) sent whole (`send`) or never.
  void Start(bool send, const std::string& body = "request") {
    contexts_.push_back(std::make_unique<grpc::ClientContext>());
    contexts_.back()->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    size_t index = 0;
    grpc::ByteBuffer* response = nullptr;
    {
      MutexLock lock(&mu_);
      index = statuses_.size();
      statuses_.emplace_back();
      responses_.push_back(std::make_unique<grpc::ByteBuffer>());
      response = responses_.back().get();
    }
    auto done = [this, index](grpc::Status status) {
      MutexLock lock(&mu_);
      statuses_[index] = std::move(status);
      ++done_;
    };
    if (send) {
      grpc::Slice bytes(body);
      grpc::ByteBuffer request(&bytes, 1);
      stub_.UnaryCall(contexts_.back().get(), method_, grpc::StubOptions(), &request, response, done);
      return;
    }
    // A call whose request never comes: started, then nothing written.
    auto* reactor = new Silent(std::move(done));
    stub_.PrepareBidiStreamingCall(contexts_.back().get(), method_, grpc::StubOptions(), reactor);
    reactor->StartCall();
  }
  // Waits up to `timeout` for `n` calls to have ended.
  bool AwaitDone(size_t n, absl::Duration timeout) {
    MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }
  std::vector<grpc::Status> statuses() {
    MutexLock lock(&mu_);
    return statuses_;
  }

 private:
  class Silent final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Silent(std::function<void(grpc::Status)> done) : done_(std::move(done)) {}
    void OnDone(const grpc::Status& status) override {
      done_(status);
      delete this;
    }

   private:
    std::function<void(grpc::Status)> done_;
  };

  grpc::GenericStub stub_;
  const std::string method_;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  Mutex mu_;
  std::vector<grpc::Status> statuses_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<grpc::ByteBuffer>> responses_ ABSL_GUARDED_BY(mu_);
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
};

std::shared_ptr<grpc::Channel> ChannelTo(int port) { return MakeChannel(absl::StrCat("127.0.0.1:", port)); }

// grpc.health.v1.Health/Check of the whole server through `channel`; its
// answer's bytes in *answer.
grpc::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel, std::string* answer) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::ByteBuffer request(nullptr, 0), response;
  Mutex mu;
  std::optional<grpc::Status> status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   MutexLock lock(&mu);
                   status = std::move(s);
                 });
  MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](std::optional<grpc::Status>* s) { return s->has_value(); }, &status));
  std::vector<grpc::Slice> slices;
  answer->clear();
  if (status->ok() && response.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices)
      answer->append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return *status;
}

// Sends `body` to `method` on a fresh connection to `port`, again after a
// busy backoff while `refused` says the answer is a refusal of the moment,
// for up to 30 s; the last answer.
grpc::Status SendUntilTaken(int port, const std::string& method, const std::string& body,
                            const std::function<bool(const grpc::Status&)>& refused) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  BusyBackoff backoff;
  while (true) {
    Calls one(ChannelTo(port), method);
    one.Start(/*send=*/true, body);
    if (!one.AwaitDone(1, absl::Seconds(30)))
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no answer");
    const grpc::Status answer = one.statuses()[0];
    if (!refused(answer) || !backoff.WaitBefore(deadline)) return answer;
  }
}

TEST(ServerLimitsTest, CallsWhoseRequestNeverComesHoldAtMostTheThreadBound) {
  HoldingPushService service;
  ServerLimits limits;
  limits.max_threads = 8;
  absl::StatusOr<RunningServer> server = StartGrpcServer("127.0.0.1", 0, {&service}, nullptr, false, limits);
  ASSERT_TRUE(server.ok()) << server.status();
  // Each silent call holds a thread of the server's from its start. Past
  // the bound, calls are refused at once as busy.
  constexpr int kSilent = 24;
  auto silent = std::make_unique<Calls>(ChannelTo(server->port));
  for (int i = 0; i < kSilent; ++i) silent->Start(/*send=*/false);
  ASSERT_TRUE(silent->AwaitDone(1, absl::Seconds(30)))
      << "no call was refused: " << service.entered() << " handlers hold a thread each";
  EXPECT_LT(service.entered(), limits.max_threads);
  int refused = 0;
  for (const grpc::Status& status : silent->statuses()) {
    if (status.ok()) continue;
    EXPECT_TRUE(IsServerBusy(FromGrpcStatus(status))) << status.error_message();
    ++refused;
  }
  EXPECT_GE(refused, 1);
  // The health service still answers (gRPC serves it with its callback
  // API, on no thread of the bound): Kubernetes' probes see the server
  // alive while its calls are refused as busy.
  std::string serving;
  const grpc::Status health = CheckHealth(ChannelTo(server->port), &serving);
  ASSERT_TRUE(health.ok()) << health.error_message();
  EXPECT_EQ(serving, std::string("\x08\x01", 2)) << "not SERVING";
  // Once the silent calls end (their callers give up), the server takes
  // calls again.
  silent.reset();
  service.Release();
  const grpc::Status answered =
      SendUntilTaken(server->port, kPush, "request", [](const grpc::Status& status) {
        return IsServerBusy(FromGrpcStatus(status));  // threads going back to gRPC's pool
      });
  EXPECT_TRUE(answered.ok()) << answered.error_message();
  server->server->Shutdown();
}

// A JobService whose GetJob answers 64 KiB.
class LargeAnswerJobs final : public v1::JobService::Service {
 public:
  grpc::Status GetJob(grpc::ServerContext* /*context*/, const v1::GetJobRequest* request,
                      v1::JobStatus* response) override {
    response->set_job_id(request->job_id());
    response->set_reason(std::string(64 << 10, 'x'));
    return grpc::Status::OK;
  }
};

// A sync call holds its thread until its answer is sent. Callers that never
// read their answers took every thread for as long as they kept their
// calls (no deadline needed), and every sync call of the server was
// refused as busy; now each such call is cancelled once its answer has
// waited the answer wait, and the server takes calls again though those
// callers keep their calls.
TEST(ServerLimitsTest, CallsWhoseAnswersAreNeverReadGiveTheirThreadsBackAfterTheWait) {
  LargeAnswerJobs service;
  ServerLimits limits;
  limits.max_threads = 4;
  absl::StatusOr<RunningServer> server = StartGrpcServer("127.0.0.1", 0, {&service}, nullptr, false, limits);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", server->port);
  grpc::GenericStub stub(UnreadCall::Channel(address));
  v1::GetJobRequest request;
  request.set_job_id("job");
  constexpr char kGetJob[] = "/fulcrum.v1.JobService/GetJob";
  auto served = [&] {
    v1::GetJobRequest get;
    get.set_job_id("read");
    return SendUntilTaken(server->port, kGetJob, get.SerializeAsString(),
                          [](const grpc::Status& status) { return IsServerBusy(FromGrpcStatus(status)); });
  };
  {
    // No wait: the unread answers hold every thread.
    server->answers->set_wait(absl::InfiniteDuration());
    std::vector<std::unique_ptr<UnreadCall>> unread;
    for (int i = 0; i < 2 * limits.max_threads; ++i)
      unread.push_back(std::make_unique<UnreadCall>(&stub, kGetJob, request));
    // Once they have reached their handlers a call is refused as busy.
    const grpc::Status refused = SendUntilTaken(server->port, kGetJob, request.SerializeAsString(),
                                                [](const grpc::Status& status) { return status.ok(); });
    EXPECT_TRUE(IsServerBusy(FromGrpcStatus(refused))) << refused.error_message();
  }
  // Their callers gave up: the threads are free.
  const grpc::Status freed = served();
  EXPECT_TRUE(freed.ok()) << freed.error_message();
  EXPECT_EQ(server->answers->cancelled(), 0);

  server->answers->set_wait(absl::Milliseconds(200));
  std::vector<std::unique_ptr<UnreadCall>> unread;
  for (int i = 0; i < 2 * limits.max_threads; ++i)
    unread.push_back(std::make_unique<UnreadCall>(&stub, kGetJob, request));
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (server->answers->cancelled() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_GE(server->answers->cancelled(), 1) << "no unread answer was cancelled";
  // The call that reads its answer has the default wait (the unread ones
  // keep theirs), so that a loaded machine does not cancel it.
  server->answers->set_wait(CallWatch::kDefaultAnswerWait);
  const grpc::Status answered = served();
  EXPECT_TRUE(answered.ok()) << answered.error_message();
  server->server->Shutdown();
}

TEST(ServerLimitsTest, OneConnectionHasAtMostItsStreamsOpen) {
  HoldingPushService service;
  ServerLimits limits;
  limits.max_streams_per_connection = 4;
  absl::StatusOr<RunningServer> server = StartGrpcServer("127.0.0.1", 0, {&service}, nullptr, false, limits);
  ASSERT_TRUE(server.ok()) << server.status();
  // Handlers held until the end, even when an assertion ends the test early.
  absl::Cleanup release = [&service] { service.Release(); };
  // Ten held calls on one connection, once it is up (the server's limit
  // known to the client): four reach the server, the rest wait in the
  // client for a stream.
  const std::shared_ptr<grpc::Channel> channel = ChannelTo(server->port);
  std::string serving;
  ASSERT_TRUE(CheckHealth(channel, &serving).ok());
  Calls crowded(channel);
  for (int i = 0; i < 10; ++i) crowded.Start(/*send=*/true);
  ASSERT_TRUE(service.AwaitEntered(limits.max_streams_per_connection, absl::Seconds(30)));
  // A call on another connection, started after them, reaches the server
  // before any of the six.
  Calls other(ChannelTo(server->port));
  other.Start(/*send=*/true, "other");
  ASSERT_TRUE(service.AwaitRead("other", absl::Seconds(30)));
  EXPECT_EQ(service.entered(), limits.max_streams_per_connection + 1)
      << "more than " << limits.max_streams_per_connection << " streams were open on one connection";
  // Released, every call is answered: the six waited, none failed.
  std::move(release).Invoke();
  ASSERT_TRUE(crowded.AwaitDone(10, absl::Seconds(30)));
  ASSERT_TRUE(other.AwaitDone(1, absl::Seconds(30)));
  for (const grpc::Status& status : crowded.statuses()) EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(service.entered(), 11);
  server->server->Shutdown();
}

// Reflection is open to anyone and each of its streams holds a sync
// thread while it waits: one past the bound is cancelled at once, and
// reflection serves again once the open ones end.
TEST(ServerLimitsTest, ReflectionHasAtMostItsStreamsOpen) {
  HoldingPushService service;
  ServerLimits limits;
  limits.max_reflection_streams = 3;
  absl::StatusOr<RunningServer> server = StartGrpcServer("127.0.0.1", 0, {&service}, nullptr, false, limits);
  ASSERT_TRUE(server.ok()) << server.status();
  constexpr char kReflection[] = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  auto silent = std::make_unique<Calls>(ChannelTo(server->port), kReflection);
  for (int i = 0; i < limits.max_reflection_streams + 1; ++i) silent->Start(/*send=*/false);
  ASSERT_TRUE(silent->AwaitDone(1, absl::Seconds(20))) << "no reflection stream past the bound was cancelled";
  int cancelled = 0;
  for (const grpc::Status& status : silent->statuses())
    cancelled += status.error_code() == grpc::StatusCode::CANCELLED;
  EXPECT_EQ(cancelled, 1);
  silent.reset();
  // ServerReflectionRequest{list_services: ""}: answered with the services.
  const std::string list("\x3a\x00", 2);
  const grpc::Status listed = SendUntilTaken(server->port, kReflection, list, [](const grpc::Status& status) {
    return status.error_code() == grpc::StatusCode::CANCELLED;  // the ended streams, counted a moment more
  });
  EXPECT_TRUE(listed.ok()) << listed.error_message();
  server->server->Shutdown();
}

TEST(BusyBackoffTest, WaitsDoubleFromTheFirstUpToTheMostEachUpToHalfAsLongAgain) {
  BusyBackoff backoff;
  absl::Duration base = kFirstBusyBackoff;
  for (int i = 0; i < 12; ++i) {
    const absl::Duration wait = backoff.Next();
    EXPECT_GE(wait, base) << i;
    EXPECT_LE(wait, base * 1.5) << i;
    base = std::min(2 * base, kMaxBusyBackoff);
  }
  EXPECT_EQ(base, kMaxBusyBackoff);
}

TEST(BusyBackoffTest, WaitsOnlyWhenTheWaitEndsBeforeTheDeadline) {
  BusyBackoff backoff;
  const absl::Time start = absl::Now();
  EXPECT_FALSE(backoff.WaitBefore(start + kFirstBusyBackoff / 2)) << "the first wait is at least 2 ms";
  EXPECT_TRUE(backoff.WaitBefore(absl::Now() + absl::Seconds(10)));
  EXPECT_GE(absl::Now() - start, 2 * kFirstBusyBackoff) << "the second wait was slept";
}

TEST(IsServerBusyTest, NamesTheRefusalsACallerMaySendAgain) {
  EXPECT_TRUE(
      IsServerBusy(absl::ResourceExhaustedError(absl::StrCat(kServerBusy, ": 1 GiB of pulls in flight"))));
  EXPECT_TRUE(IsServerBusy(absl::ResourceExhaustedError(kGrpcThreadsExhausted)));
  EXPECT_FALSE(IsServerBusy(absl::ResourceExhaustedError("table t is full")));
  EXPECT_FALSE(IsServerBusy(absl::UnavailableError(kServerBusy)));
}

}  // namespace
}  // namespace fulcrum
