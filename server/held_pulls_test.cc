#include "server/held_pulls.h"

#include <atomic>
#include <memory>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/rpc.h"
#include "common/sync.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

// A pull that becomes ready when `ready` is set; records how it ended.
class FakePull final : public HeldPull {
 public:
  explicit FakePull(absl::Time deadline = absl::InfiniteFuture()) : deadline_(deadline) {}
  bool Ready() override { return ready.load(); }
  void Complete() override {
    code = absl::StatusCode::kOk;
    ended.Notify();
  }
  void Fail(const absl::Status& status) override {
    code = status.code();
    ended.Notify();
  }
  absl::Time deadline() const override { return deadline_; }
  bool cancelled() const override { return cancel.load(); }

  std::atomic<bool> ready{false};
  std::atomic<bool> cancel{false};
  std::atomic<absl::StatusCode> code{absl::StatusCode::kUnknown};
  Notification ended;

 private:
  const absl::Time deadline_;
};

TEST(HeldPullsTest, APokedPullCompletesOnceReady) {
  HeldPulls held({});
  auto pull = std::make_shared<FakePull>();
  ASSERT_TRUE(held.Hold(pull).ok());
  held.Poke();
  EXPECT_FALSE(pull->ended.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  pull->ready = true;
  held.Poke();
  ASSERT_TRUE(pull->ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(pull->code.load(), absl::StatusCode::kOk);
  EXPECT_EQ(held.held(), 0u);
}

TEST(HeldPullsTest, DeadlinesAndCancellationsEndPullsWithoutAPoke) {
  HeldPulls held({});
  auto late = std::make_shared<FakePull>(absl::Now() + absl::Milliseconds(20));
  auto gone = std::make_shared<FakePull>();
  ASSERT_TRUE(held.Hold(late).ok());
  ASSERT_TRUE(held.Hold(gone).ok());
  gone->cancel = true;  // noticed at the next recheck
  ASSERT_TRUE(late->ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(gone->ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(late->code.load(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(gone->code.load(), absl::StatusCode::kCancelled);
}

TEST(HeldPullsTest, HoldsAtMostItsBoundAndFailsTheRestWhenStopping) {
  std::vector<std::shared_ptr<FakePull>> pulls;
  {
    HeldPulls::Options options;
    options.max_held = 3;
    HeldPulls held(options);
    for (int i = 0; i < 3; ++i) {
      pulls.push_back(std::make_shared<FakePull>());
      ASSERT_TRUE(held.Hold(pulls.back()).ok());
    }
    auto extra = std::make_shared<FakePull>();
    const absl::Status refused = held.Hold(extra);
    EXPECT_TRUE(IsServerBusy(refused)) << refused << ": workers send it again";
    EXPECT_FALSE(extra->ended.HasBeenNotified()) << "a refused pull is the caller's to answer";
  }
  for (auto& pull : pulls) {
    ASSERT_TRUE(pull->ended.HasBeenNotified());
    EXPECT_EQ(pull->code.load(), absl::StatusCode::kUnavailable);
  }
}

}  // namespace
}  // namespace fulcrum
