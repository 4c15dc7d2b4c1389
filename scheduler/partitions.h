// Data partitions over a job's ready workers: a pure function (no locks, no
// clock) that the JobManager applies when a worker becomes ready, leaves or
// dies.
#ifndef FULCRUM_SCHEDULER_PARTITIONS_H_
#define FULCRUM_SCHEDULER_PARTITIONS_H_

#include <cstdint>
#include <vector>

namespace fulcrum {

// Gives every partition in [0, num_partitions) that none of `owners` holds
// to the one holding fewest, then evens them out (the busiest gives its
// highest partition to the idlest until they differ by at most one), so a
// worker keeps what it has whenever the spread allows. Each list ends
// sorted. Partitions outside the range are dropped. With no owners nothing
// changes: unowned partitions wait for a ready worker.
void SpreadPartitions(int32_t num_partitions, const std::vector<std::vector<int32_t>*>& owners);

}  // namespace fulcrum

#endif  // FULCRUM_SCHEDULER_PARTITIONS_H_
