// CPU implementation of kernels::Backend: GEMM through OpenBLAS
// (cblas_sgemm), everything else as plain loops. Operates on host memory.

#ifndef FULCRUM_KERNELS_CPU_CPU_BACKEND_H_
#define FULCRUM_KERNELS_CPU_CPU_BACKEND_H_

#include <memory>

#include "kernels/backend.h"

namespace fulcrum {
namespace kernels {

// Returns a new CPU backend named "cpu". Stateless; never null.
std::unique_ptr<Backend> MakeCpuBackend();

}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_CPU_CPU_BACKEND_H_
