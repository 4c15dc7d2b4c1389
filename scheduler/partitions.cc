#include "scheduler/partitions.h"

#include <algorithm>

namespace fulcrum {

void SpreadPartitions(int32_t num_partitions, const std::vector<std::vector<int32_t>*>& owners) {
  if (owners.empty()) return;
  std::vector<bool> owned(static_cast<size_t>(std::max(0, num_partitions)), false);
  for (std::vector<int32_t>* list : owners) {
    // A partition held twice, or out of range, is kept once at most.
    list->erase(std::remove_if(list->begin(), list->end(),
                               [&](int32_t p) {
                                 if (p < 0 || p >= num_partitions || owned[p]) return true;
                                 owned[p] = true;
                                 return false;
                               }),
                list->end());
  }
  auto by_size = [](const std::vector<int32_t>* a, const std::vector<int32_t>* b) { return a->size() < b->size(); };
  for (int32_t p = 0; p < num_partitions; ++p) {
    if (!owned[p]) (*std::min_element(owners.begin(), owners.end(), by_size))->push_back(p);
  }
  while (true) {
    std::vector<int32_t>* most = *std::max_element(owners.begin(), owners.end(), by_size);
    std::vector<int32_t>* fewest = *std::min_element(owners.begin(), owners.end(), by_size);
    if (most->size() <= fewest->size() + 1) break;
    std::sort(most->begin(), most->end());
    fewest->push_back(most->back());
    most->pop_back();
  }
  for (std::vector<int32_t>* list : owners) std::sort(list->begin(), list->end());
}

}  // namespace fulcrum
