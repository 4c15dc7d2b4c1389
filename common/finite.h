// Finding infinities and NaNs in float arrays: the servers refuse a
// gradient that holds one, and a worker checks its own before it pushes.
#ifndef FULCRUM_COMMON_FINITE_H_
#define FULCRUM_COMMON_FINITE_H_

#include <cstdint>

namespace fulcrum {

// The index of the first infinity or NaN among n values; -1 when all are
// finite (checked vectorized first: a gradient's check costs a fraction of
// its copy).
int64_t FirstNonFinite(const float* values, int64_t n);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_FINITE_H_
