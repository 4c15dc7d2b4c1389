// CPU implementation of kernels::Backend: GEMM through OpenBLAS
// (cblas_sgemm), everything else as plain loops. It is the fallback and the
// reference the CUDA backend is tested against. Backend memory is host memory
// (HostMemory() is true): Allocate() serves 256-byte aligned blocks from a
// size-class pool (kernels/caching_pool.h), copies are memcpy, every op is
// synchronous, and every Precision computes float32.

#ifndef FULCRUM_KERNELS_CPU_CPU_BACKEND_H_
#define FULCRUM_KERNELS_CPU_CPU_BACKEND_H_

#include <memory>

#include "kernels/backend.h"

namespace fulcrum {
namespace kernels {

// Returns a new CPU backend named "cpu"; never null. Not thread-safe (it owns
// a memory pool): use one per thread.
std::unique_ptr<Backend> MakeCpuBackend();

}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_CPU_CPU_BACKEND_H_
