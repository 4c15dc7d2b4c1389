// GrpcServerControl's bookkeeping of servers that lost their lease: calls to
// them fail at once, and the addresses and channels kept are bounded (pods
// restarted advertise new IPs that never come back).
#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc.h"
#include "common/test_util.h"
#include "gtest/gtest.h"
#include "scheduler/services.h"

namespace fulcrum {
namespace {

// Port 1 on loopback: nobody listens there, so a call fails UNAVAILABLE at once.
constexpr char kNobody[] = "127.0.0.1:1";

TEST(GrpcServerControlTest, ADeadServersCallsFailAtOnceUntilItIsAlive) {
  GrpcServerControl control;
  const std::string other = "127.0.0.2:1";  // an IP: no DNS lookup (c-ares keeps 10 bytes for good)
  EXPECT_TRUE(absl::IsUnavailable(control.DropJob(kNobody, "job", "test", false, 1)));
  EXPECT_TRUE(absl::IsUnavailable(control.DropJob(other, "job", "test", false, 1)));
  EXPECT_EQ(control.channels(), 2u) << "one channel per address called";

  control.MarkDead(kNobody);
  EXPECT_EQ(control.channels(), 2u) << "a dead server's channel is kept while its address is";
  EXPECT_TRUE(control.dead(kNobody));
  const absl::Status refused = control.DropJob(kNobody, "job", "test", false, 1);
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
  EXPECT_TRUE(Contains(refused.message(), "lost its lease")) << refused;

  control.MarkAlive(kNobody);
  EXPECT_FALSE(control.dead(kNobody));
  const absl::Status tried = control.DropJob(kNobody, "job", "test", false, 1);
  EXPECT_FALSE(Contains(tried.message(), "lost its lease")) << "called again: " << tried;
  EXPECT_EQ(control.channels(), 2u);
}

TEST(GrpcServerControlTest, TheDeadAddressesKeptAreBoundedOldestFirst) {
  GrpcServerControl control;
  const size_t n = GrpcServerControl::kMaxDeadAddresses + 10;
  // Loopback addresses on port 1: a call is refused at once.
  auto address = [](size_t i) { return absl::StrCat("127.1.", i / 256 % 256, ".", i % 256, ":1"); };
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(control.DropJob(address(i), "job", "test", false, 1).ok());  // a channel (nobody is there)
  }
  ASSERT_EQ(control.channels(), 3u);
  for (size_t i = 0; i < n; ++i) control.MarkDead(address(i));
  control.MarkDead(address(n - 1));  // again: kept once
  EXPECT_EQ(control.channels(), 0u) << "the forgotten addresses' channels went with them";
  for (size_t i = 0; i < 10; ++i) EXPECT_FALSE(control.dead(address(i))) << "the oldest are forgotten: " << i;
  for (size_t i = 10; i < n; ++i) ASSERT_TRUE(control.dead(address(i))) << i;
  // An address that comes back leaves the list; the next death forgets none.
  control.MarkAlive(address(10));
  control.MarkDead(address(0));
  EXPECT_TRUE(control.dead(address(11)));
  EXPECT_TRUE(control.dead(address(0)));
}

// A ParameterService whose DropJob is refused as gRPC refuses a call when
// its threads are all taken, `refusals` times, then answered.
class BusyDropJob final : public v1::ParameterService::Service {
 public:
  explicit BusyDropJob(int refusals) : refusals_(refusals) {}
  grpc::Status DropJob(grpc::ServerContext* /*context*/, const v1::DropJobRequest* /*request*/,
                       v1::DropJobResponse* /*response*/) override {
    if (calls_.fetch_add(1) < refusals_)
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, kGrpcThreadsExhausted);
    return grpc::Status::OK;
  }
  int calls() const { return calls_.load(); }

 private:
  const int refusals_;
  std::atomic<int> calls_{0};
};

// The scheduler's calls to a server refused as busy are sent again within
// their deadline; one still refused then is a server away for now
// (UNAVAILABLE), never a failure that ends the job (RESOURCE_EXHAUSTED).
TEST(GrpcServerControlTest, CallsRefusedAsBusyAreSentAgainWithinTheirDeadline) {
  BusyDropJob three(3);
  absl::StatusOr<RunningServer> server = StartGrpcServer("127.0.0.1", 0, {&three});
  ASSERT_TRUE(server.ok()) << server.status();
  GrpcServerControl control;
  const absl::Status dropped =
      control.DropJob(absl::StrCat("127.0.0.1:", server->port), "job", "test", false, 1);
  EXPECT_TRUE(dropped.ok()) << dropped;
  EXPECT_EQ(three.calls(), 4);
  server->server->Shutdown();

  BusyDropJob always(1 << 30);
  server = StartGrpcServer("127.0.0.1", 0, {&always});
  ASSERT_TRUE(server.ok()) << server.status();
  const absl::Time start = absl::Now();
  const absl::Status refused =
      control.DropJob(absl::StrCat("127.0.0.1:", server->port), "job", "test", false, 1);
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
  EXPECT_TRUE(Contains(refused.message(), "is busy (refused until the call's deadline)")) << refused;
  EXPECT_GE(absl::Now() - start, absl::Seconds(4)) << "sent again until DropJob's deadline of 5 s";
  EXPECT_GT(always.calls(), 5);
  server->server->Shutdown();
}

}  // namespace
}  // namespace fulcrum
