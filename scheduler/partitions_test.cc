#include "scheduler/partitions.h"

#include <algorithm>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace fulcrum {
namespace {

// Every partition is owned exactly once, the spread differs by at most one,
// and each list is sorted.
void ExpectSpread(int32_t num_partitions, const std::vector<std::vector<int32_t>>& owners) {
  std::multiset<int32_t> all;
  size_t fewest = SIZE_MAX, most = 0;
  for (const auto& list : owners) {
    all.insert(list.begin(), list.end());
    fewest = std::min(fewest, list.size());
    most = std::max(most, list.size());
    EXPECT_TRUE(std::is_sorted(list.begin(), list.end()));
  }
  ASSERT_EQ(all.size(), static_cast<size_t>(num_partitions));
  for (int32_t p = 0; p < num_partitions; ++p) EXPECT_EQ(all.count(p), 1u) << "partition " << p;
  EXPECT_LE(most, fewest + 1);
}

std::vector<std::vector<int32_t>*> Pointers(std::vector<std::vector<int32_t>>* owners) {
  std::vector<std::vector<int32_t>*> pointers;
  for (auto& list : *owners) pointers.push_back(&list);
  return pointers;
}

TEST(PartitionsTest, SpreadsEvenlyOverNewWorkers) {
  for (int workers = 1; workers <= 9; ++workers) {
    for (int32_t partitions : {1, 4, 7, 16}) {
      std::vector<std::vector<int32_t>> owners(workers);
      SpreadPartitions(partitions, Pointers(&owners));
      ExpectSpread(partitions, owners);
    }
  }
}

TEST(PartitionsTest, ALostWorkersPartitionsGoToTheOthersWhoKeepTheirs) {
  std::vector<std::vector<int32_t>> owners = {{0, 1}, {2, 3}, {4, 5}};
  owners.erase(owners.begin() + 1);  // the second worker dies
  SpreadPartitions(6, Pointers(&owners));
  ExpectSpread(6, owners);
  const std::vector<int32_t> first = {0, 1}, third = {4, 5};
  EXPECT_TRUE(std::includes(owners[0].begin(), owners[0].end(), first.begin(), first.end()));
  EXPECT_TRUE(std::includes(owners[1].begin(), owners[1].end(), third.begin(), third.end()));
}

TEST(PartitionsTest, AJoiningWorkerTakesFromTheBusiest) {
  std::vector<std::vector<int32_t>> owners = {{0, 1, 2, 3}, {4, 5, 6, 7}, {}};
  SpreadPartitions(8, Pointers(&owners));
  ExpectSpread(8, owners);
  EXPECT_FALSE(owners[2].empty());
  // The others gave up only their highest partitions.
  EXPECT_EQ(owners[0].front(), 0);
  EXPECT_EQ(owners[1].front(), 4);
}

TEST(PartitionsTest, DuplicatesAndOutOfRangeAreDropped) {
  std::vector<std::vector<int32_t>> owners = {{0, 0, 9, -1}, {0, 1}};
  SpreadPartitions(3, Pointers(&owners));
  ExpectSpread(3, owners);
}

TEST(PartitionsTest, NoOwnersChangesNothing) {
  SpreadPartitions(5, {});  // unowned partitions wait for a ready worker
  std::vector<std::vector<int32_t>> none;
  SpreadPartitions(0, Pointers(&none));
  EXPECT_TRUE(none.empty());
}

}  // namespace
}  // namespace fulcrum
