#include "common/repeated_key.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/param_init.h"

namespace fulcrum {
namespace {

TEST(RepeatedKeyTest, NoKeysOrOneKeyRepeatNothing) {
  EXPECT_EQ(FirstRepeatedKey({}), -1);
  const std::vector<uint64_t> one = {7};
  EXPECT_EQ(FirstRepeatedKey(one), -1);
}

TEST(RepeatedKeyTest, NamesTheFirstKeyThatRepeatsAnEarlierOne) {
  const std::vector<uint64_t> keys = {5, 9, 1, 9, 5};
  EXPECT_EQ(FirstRepeatedKey(keys), 3);
  const std::vector<uint64_t> distinct = {5, 9, 1, 4, 6};
  EXPECT_EQ(FirstRepeatedKey(distinct), -1);
}

TEST(RepeatedKeyTest, KeyZeroAndTheLargestKeyAreKeysLikeAnyOther) {
  // 0 is the set's empty mark: it is counted beside the set.
  const std::vector<uint64_t> zero_once = {0, 3, UINT64_MAX};
  EXPECT_EQ(FirstRepeatedKey(zero_once), -1);
  const std::vector<uint64_t> zero_twice = {0, 3, 0};
  EXPECT_EQ(FirstRepeatedKey(zero_twice), 2);
  const std::vector<uint64_t> max_twice = {UINT64_MAX, 0, UINT64_MAX};
  EXPECT_EQ(FirstRepeatedKey(max_twice), 2);
}

TEST(RepeatedKeyTest, FindsARepeatAmongKeysThatShareTheirLowBits) {
  // Keys alike but for their high bits (as a hash table's homes by low bits
  // would crowd them), in a set larger than the thread keeps between calls.
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < 200000; ++i) keys.push_back(i << 40);
  EXPECT_EQ(FirstRepeatedKey(keys), -1);
  keys.push_back(uint64_t{123456} << 40);
  EXPECT_EQ(FirstRepeatedKey(keys), 200000);
}

TEST(RepeatedKeyTest, ASmallCallAfterALargeOneSeesOnlyItsOwnKeys) {
  std::vector<uint64_t> many;
  for (uint64_t i = 1; i <= 30000; ++i) many.push_back(SplitMix64(i));
  EXPECT_EQ(FirstRepeatedKey(many), -1);
  // The thread's set held these keys: a call of one of them alone is no repeat.
  const std::vector<uint64_t> again = {many[17], many[4]};
  EXPECT_EQ(FirstRepeatedKey(again), -1);
  const std::vector<uint64_t> twice = {many[17], many[4], many[17]};
  EXPECT_EQ(FirstRepeatedKey(twice), 2);
}

}  // namespace
}  // namespace fulcrum
