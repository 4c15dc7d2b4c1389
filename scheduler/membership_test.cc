#include "scheduler/membership.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000000);
const absl::Duration kLease = absl::Seconds(2);

v1::RegisterRequest Request(v1::Role role, const std::string& id = "", uint64_t incarnation = 1) {
  v1::RegisterRequest request;
  request.set_role(role);
  request.set_requested_id(id);
  request.set_incarnation(incarnation);
  if (role == v1::SERVER) request.set_address("127.0.0.1:7000");
  return request;
}

TEST(MembershipTest, NumbersIdsByRoleSkippingTakenOnes) {
  Membership members(kLease);
  auto taken = members.ChooseId(Request(v1::WORKER, "worker-1"), kStart);
  ASSERT_TRUE(taken.ok());
  members.Add(Request(v1::WORKER, "worker-1"), *taken, kStart);
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    auto id = members.ChooseId(Request(v1::WORKER), kStart);
    ASSERT_TRUE(id.ok());
    members.Add(Request(v1::WORKER), *id, kStart);
    ids.push_back(*id);
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"worker-0", "worker-2"}));
  auto server = members.ChooseId(Request(v1::SERVER), kStart);
  ASSERT_TRUE(server.ok());
  EXPECT_EQ(*server, "server-0");
  EXPECT_EQ(members.next_number(v1::WORKER), 3);
}

TEST(MembershipTest, ALiveIdIsNotTakenByAnotherProcessUntilItsLeaseRunsOut) {
  Membership members(kLease);
  members.Add(Request(v1::SERVER, "ps-0", /*incarnation=*/1), "ps-0", kStart);
  auto other = members.ChooseId(Request(v1::SERVER, "ps-0", /*incarnation=*/2), kStart + absl::Seconds(1));
  ASSERT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(absl::StrContains(other.status().message(), "127.0.0.1:7000")) << other.status();
  // The same process re-registering keeps its id.
  EXPECT_TRUE(members.ChooseId(Request(v1::SERVER, "ps-0", 1), kStart + absl::Seconds(1)).ok());
  // Another process gets it once the lease ran out.
  EXPECT_TRUE(members.ChooseId(Request(v1::SERVER, "ps-0", 2), kStart + kLease + absl::Seconds(1)).ok());
}

TEST(MembershipTest, ExpireRemovesOnlyTheSilent) {
  Membership members(kLease);
  members.Add(Request(v1::WORKER, "a"), "a", kStart);
  members.Add(Request(v1::WORKER, "b"), "b", kStart);
  ASSERT_NE(members.Renew("b", kStart + absl::Seconds(2)), nullptr);
  EXPECT_EQ(members.Renew("nobody", kStart), nullptr);
  std::vector<Membership::Lost> lost = members.Expire(kStart + absl::Seconds(3));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].member.id, "a");
  EXPECT_EQ(lost[0].silent, absl::Seconds(3));
  EXPECT_FALSE(members.Contains("a"));
  EXPECT_TRUE(members.Contains("b"));
}

// The scheduler's own pause is nobody's silence: a member's lease counts
// only the time the scheduler listened, for a pause far longer than a lease
// and for one shorter than a lease that would still have tipped a member
// whose last heartbeat came just before it.
TEST(MembershipTest, TheSchedulersDeafTimeCountsAgainstNoLease) {
  Membership members(kLease);
  members.Add(Request(v1::WORKER, "a"), "a", kStart);
  members.Add(Request(v1::SERVER, "s"), "s", kStart);
  const absl::Time resumed = kStart + absl::Seconds(30);  // the scheduler was stopped 30 s
  members.CreditDeafTime(absl::Seconds(30), resumed);
  EXPECT_TRUE(members.Expire(resumed + absl::Seconds(1)).empty());
  EXPECT_EQ(members.Expire(resumed + kLease + absl::Seconds(1)).size(), 2u);

  // A lease of kLease; "a" last heard kLease/4 before a pause of 0.9 kLease,
  // "s" silent for 0.9 kLease already when the pause began: after the pause
  // "a" has been silent 0.25 kLease of listening time, "s" 0.9 kLease.
  members.Add(Request(v1::WORKER, "a"), "a", kStart);
  members.Add(Request(v1::SERVER, "s"), "s", kStart - kLease * 0.65);
  const absl::Time paused = kStart + kLease * 0.25;
  const absl::Time back = paused + kLease * 0.9;
  members.CreditDeafTime(back - paused, back);
  EXPECT_TRUE(members.Expire(back).empty()) << "without the credit, a's 1.15 leases of silence would expire it";
  std::vector<Membership::Lost> lost = members.Expire(back + kLease * 0.2);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].member.id, "s");
}

TEST(MembershipTest, BadRegistrationsNameTheField) {
  v1::RegisterRequest no_role;
  EXPECT_EQ(CheckRegistration(no_role).code(), absl::StatusCode::kInvalidArgument);
  v1::RegisterRequest server = Request(v1::SERVER);
  server.clear_address();
  EXPECT_TRUE(absl::StrContains(CheckRegistration(server).message(), "address"));
  for (const char* id : {"-x", "a b", "x/y", "\xff"}) {
    EXPECT_EQ(CheckRegistration(Request(v1::WORKER, id)).code(), absl::StatusCode::kInvalidArgument) << id;
  }
  v1::RegisterRequest device = Request(v1::WORKER);
  device.set_device(std::string("cuda\n0"));
  EXPECT_TRUE(absl::StrContains(CheckRegistration(device).message(), "device"));
  EXPECT_TRUE(CheckRegistration(Request(v1::WORKER, "pod-7.ns_1")).ok());
}

}  // namespace
}  // namespace fulcrum
