#include "common/finite.h"

#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace fulcrum {
namespace {

TEST(FirstNonFiniteTest, FindsTheFirstInfinityOrNanAnywhereAndPassesEveryFiniteValue) {
  const float kSpecial[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::signaling_NaN()};
  // Finite extremes: the largest, the smallest subnormal, negative zero.
  std::vector<float> values(1003);
  for (size_t i = 0; i < values.size(); ++i) {
    const float kFinite[] = {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                             std::numeric_limits<float>::denorm_min(), -0.0f, 1.5f};
    values[i] = kFinite[i % 5];
  }
  EXPECT_EQ(FirstNonFinite(values.data(), static_cast<int64_t>(values.size())), -1);
  EXPECT_EQ(FirstNonFinite(nullptr, 0), -1);
  for (float special : kSpecial) {
    for (int64_t at : {0, 7, 8, 31, 500, 1002}) {
      std::vector<float> bad = values;
      bad[static_cast<size_t>(at)] = special;
      bad[1002] = special;  // a later one too: the first is named
      EXPECT_EQ(FirstNonFinite(bad.data(), static_cast<int64_t>(bad.size())), at) << special << " at " << at;
      EXPECT_EQ(FirstNonFinite(bad.data(), at), -1) << "looked past n";
    }
  }
}

}  // namespace
}  // namespace fulcrum
