#include "worker/ctr_trainer.h"

#include <set>

#include "gtest/gtest.h"

namespace fulcrum {
namespace {

TEST(AffineOrderTest, EachEpochVisitsEveryExampleOnceInItsOwnOrder) {
  for (int64_t n : {1, 2, 7, 1000, 1024}) {
    std::set<int64_t> seen;
    const AffineOrder first(3, 0, n), second(3, 1, n);
    bool differ = false;
    for (int64_t i = 0; i < n; ++i) {
      seen.insert(first[i]);
      differ |= first[i] != second[i];
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), n);
    EXPECT_EQ(*seen.begin(), 0);
    if (n > 2) {
      EXPECT_TRUE(differ) << n;
    }
  }
}

}  // namespace
}  // namespace fulcrum
