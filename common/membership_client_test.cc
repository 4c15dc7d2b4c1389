// MembershipClient against a fake scheduler that asks for a heartbeat a
// minute: Hurry makes them come at once and every 50 ms.
#include "common/membership_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc.h"
#include "common/sync.h"
#include "fulcrum/v1/cluster.grpc.pb.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

class SlowScheduler : public v1::ClusterService::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest*, v1::RegisterResponse* response) override {
    response->set_member_id("worker-1");
    response->set_lease_ms(120000);
    response->set_heartbeat_interval_ms(60000);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse*) override {
    MutexLock lock(&mu_);
    ++heartbeats_;
    last_ = *request;
    if (busy_ > 0) {
      --busy_;
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, kGrpcThreadsExhausted);
    }
    return grpc::Status::OK;
  }
  // The next `n` heartbeats are refused as gRPC refuses a call with its
  // threads all taken.
  void RefuseAsBusy(int n) {
    MutexLock lock(&mu_);
    busy_ = n;
  }
  v1::HeartbeatRequest last() {
    MutexLock lock(&mu_);
    return last_;
  }
  int heartbeats() {
    MutexLock lock(&mu_);
    return heartbeats_;
  }
  // True once `n` heartbeats arrived, waiting up to `timeout`.
  bool WaitForHeartbeats(int n, absl::Duration timeout) {
    MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return heartbeats_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

 private:
  Mutex mu_;
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int busy_ ABSL_GUARDED_BY(mu_) = 0;
  v1::HeartbeatRequest last_ ABSL_GUARDED_BY(mu_);
};

// A heartbeat the scheduler refuses as busy is sent again at once, within
// its 2 s, not a minute later: a lease must not run out on a busy moment.
TEST(MembershipClientTest, HeartbeatsRefusedAsBusyAreSentAgainAtOnce) {
  SlowScheduler scheduler;
  scheduler.RefuseAsBusy(3);
  absl::StatusOr<RunningServer> server = StartGrpcServer("127.0.0.1", 0, {&scheduler});
  ASSERT_TRUE(server.ok()) << server.status();
  MembershipClient::Options options;
  options.scheduler = absl::StrCat("127.0.0.1:", server->port);
  options.role = v1::WORKER;
  absl::Notification accepted;
  options.on_heartbeat = [&accepted](const v1::HeartbeatResponse&) {
    if (!accepted.HasBeenNotified()) accepted.Notify();
  };
  MembershipClient client(options);
  client.Start();
  // The interval is a minute: the three refused and the fourth, accepted,
  // come from the first heartbeat alone.
  EXPECT_TRUE(accepted.WaitForNotificationWithTimeout(absl::Seconds(20)))
      << "a busy refusal was not sent again";
  EXPECT_EQ(scheduler.heartbeats(), 4);
  client.Stop();
  server->server->Shutdown();
}

TEST(MembershipClientTest, HurryHeartbeatsAtOnceAndOftenThenStopsPromptly) {
  SlowScheduler scheduler;
  absl::StatusOr<RunningServer> server = StartGrpcServer("127.0.0.1", 0, {&scheduler});
  ASSERT_TRUE(server.ok()) << server.status();
  MembershipClient::Options options;
  options.scheduler = absl::StrCat("127.0.0.1:", server->port);
  options.role = v1::WORKER;
  MembershipClient client(options);
  client.Start();
  ASSERT_TRUE(scheduler.WaitForHeartbeats(1, absl::Seconds(30))) << "no heartbeat after registering";
  EXPECT_EQ(client.member_id(), "worker-1");

  // The scheduler's interval is a minute: these come only from hurrying.
  client.Hurry(absl::Seconds(30));
  EXPECT_TRUE(scheduler.WaitForHeartbeats(6, absl::Seconds(20))) << "hurried heartbeats did not come every 50 ms";

  const absl::Time stop = absl::Now();
  client.Stop();
  EXPECT_LT(absl::Now() - stop, absl::Seconds(10)) << "Stop waited out a heartbeat interval";
  server->server->Shutdown();
}

// A server's heartbeats carry what each job it holds takes now, read at
// each heartbeat: the scheduler's claims follow the tables as they grow.
TEST(MembershipClientTest, HeartbeatsCarryTheBytesEachHeldJobTakesNow) {
  SlowScheduler scheduler;
  absl::StatusOr<RunningServer> server = StartGrpcServer("127.0.0.1", 0, {&scheduler});
  ASSERT_TRUE(server.ok()) << server.status();
  std::atomic<int64_t> held{1000};
  MembershipClient::Options options;
  options.scheduler = absl::StrCat("127.0.0.1:", server->port);
  options.role = v1::SERVER;
  options.address = "127.0.0.1:1";
  options.held_bytes = [&held] {
    return std::map<std::string, int64_t>{{"job-1", held.load()}, {"job-2", 7}};
  };
  MembershipClient client(options);
  client.Start();
  ASSERT_TRUE(scheduler.WaitForHeartbeats(1, absl::Seconds(30))) << "no heartbeat after registering";
  v1::HeartbeatRequest first = scheduler.last();
  EXPECT_EQ(first.held_bytes().size(), 2u);
  EXPECT_EQ(first.held_bytes().at("job-1"), 1000);
  EXPECT_EQ(first.held_bytes().at("job-2"), 7);

  held = 5000;
  client.Hurry(absl::Seconds(30));
  ASSERT_TRUE(scheduler.WaitForHeartbeats(3, absl::Seconds(20)));
  EXPECT_EQ(scheduler.last().held_bytes().at("job-1"), 5000);
  client.Stop();
  server->server->Shutdown();
}

}  // namespace
}  // namespace fulcrum
