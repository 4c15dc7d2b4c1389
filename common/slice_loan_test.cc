#include "common/slice_loan.h"

#include <cstring>
#include <thread>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "gtest/gtest.h"

namespace fulcrum {
namespace {

TEST(SliceLoanTest, ReturnedOnceEverySliceAndEveryCopyIsGone) {
  SliceLoan loan;
  std::vector<float> values(1000, 1.5f);
  EXPECT_TRUE(loan.AwaitReturned(absl::ZeroDuration()));
  {
    grpc::Slice slice = loan.Lend(values.data(), values.size() * sizeof(float));
    EXPECT_EQ(slice.begin(), reinterpret_cast<const uint8_t*>(values.data()));  // no copy
    grpc::ByteBuffer buffer(&slice, 1);  // gRPC's own reference, as a request holds it
    grpc::Slice copy = slice;            // and a copy of the slice
    EXPECT_EQ(loan.Outstanding(), 1);
    EXPECT_FALSE(loan.AwaitReturned(absl::Milliseconds(1)));
    { grpc::Slice dropped = std::move(copy); }
    EXPECT_FALSE(loan.AwaitReturned(absl::ZeroDuration()));
    { grpc::Slice dropped = std::move(slice); }
    EXPECT_FALSE(loan.AwaitReturned(absl::ZeroDuration())) << "the ByteBuffer still holds it";
  }
  EXPECT_TRUE(loan.AwaitReturned(absl::ZeroDuration()));
  EXPECT_EQ(loan.Outstanding(), 0);
}

TEST(SliceLoanTest, AwaitReturnedWakesWhenAnotherThreadLetsGo) {
  SliceLoan loan;
  std::vector<char> bytes(64, 'x');
  auto held = std::make_unique<grpc::ByteBuffer>();
  {
    grpc::Slice slice = loan.Lend(bytes.data(), bytes.size());
    *held = grpc::ByteBuffer(&slice, 1);
  }
  std::thread releaser([&held] { held.reset(); });
  EXPECT_TRUE(loan.AwaitReturned(absl::Seconds(30)));
  releaser.join();
}

// Abandoned buffers keep their memory (and what the slices read there) until
// the last slice goes; the owner gets fresh zeroed ones of the same sizes,
// and slices over those are counted apart from the abandoned ones.
TEST(SliceLoanTest, AbandonedBuffersLiveUntilTheirLastSliceAndFreshOnesTakeTheirPlace) {
  SliceLoan loan;
  std::vector<std::vector<float>> buffers = {std::vector<float>(300, 2.0f), std::vector<float>(7, 3.0f)};
  const float* old_first = buffers[0].data();
  grpc::Slice stuck = loan.Lend(buffers[0].data(), buffers[0].size() * sizeof(float));
  loan.Abandon(&buffers);
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers[0].size(), 300u);
  EXPECT_EQ(buffers[1].size(), 7u);
  EXPECT_NE(buffers[0].data(), old_first);
  EXPECT_EQ(buffers[0][0], 0.0f);
  EXPECT_EQ(buffers[1][6], 0.0f);
  EXPECT_TRUE(loan.AwaitReturned(absl::ZeroDuration())) << "the stuck slice is the old generation's";
  std::fill(buffers[0].begin(), buffers[0].end(), 9.0f);  // the next step's values
  std::vector<float> seen(300);
  std::memcpy(seen.data(), stuck.begin(), stuck.size());  // ASan: still allocated
  EXPECT_EQ(seen, std::vector<float>(300, 2.0f));
  grpc::Slice fresh = loan.Lend(buffers[1].data(), 4);
  EXPECT_EQ(loan.Outstanding(), 1);
  { grpc::Slice dropped = std::move(stuck); }  // frees the old memory
  EXPECT_EQ(loan.Outstanding(), 1);
}

TEST(SliceLoanTest, ALoanDestroyedBeforeItsSlicesLeavesThemValid) {
  std::vector<std::vector<char>> buffers = {std::vector<char>(100, 'a')};
  grpc::Slice slice;
  {
    SliceLoan loan;
    slice = loan.Lend(buffers[0].data(), buffers[0].size());
    loan.Abandon(&buffers);
  }
  buffers.clear();
  EXPECT_EQ(static_cast<char>(slice.begin()[99]), 'a');
}

}  // namespace
}  // namespace fulcrum
