// Finding a key listed twice among a sparse push's keys: a server refuses
// such a push (a worker sums a key's gradients into one row first), and
// checks every push, so the check must cost little beside applying it.
#ifndef FULCRUM_COMMON_REPEATED_KEY_H_
#define FULCRUM_COMMON_REPEATED_KEY_H_

#include <cstdint>

#include "absl/types/span.h"

namespace fulcrum {

// The index of the first key equal to an earlier one; -1 when all differ.
//
// An open-addressing set of the keys seen, probed linearly, at most half
// full, in memory the calling thread keeps for its next call (up to
// 2^16 slots; larger sets are allocated for the call). Homes come from a
// hash seeded once a process, so keys chosen to collide in one process
// collide in no other (the same defence as Abseil's hash tables, which
// took 5 to 10 times as long here: bench/sparse_table_bench.cc).
int64_t FirstRepeatedKey(absl::Span<const uint64_t> keys);

// A random value drawn once a process: the seed of hashes whose homes keys
// chosen by a client must not predict (FirstRepeatedKey's, and the sparse
// tables' indexes).
uint64_t ProcessHashSeed();

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_REPEATED_KEY_H_
