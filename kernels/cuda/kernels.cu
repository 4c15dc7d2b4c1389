// Fulcrum's own CUDA kernels; see kernels.h for what each launcher does.
//
// Elementwise kernels use grid-stride loops with 64-bit indices and a capped
// grid. Reductions are deterministic where the CPU reference is (column sums
// reduce in a fixed order); the loss and the scatter-add use atomics.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "kernels/cuda/kernels.h"

namespace fulcrum {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
// Enough blocks to fill any current GPU several times over; the grid-stride
// loops cover the rest.
constexpr int64_t kMaxBlocks = 8192;

unsigned Blocks(int64_t work_items, int per_block) {
  const int64_t blocks = (work_items + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ __forceinline__ int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t GridThreads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__device__ __forceinline__ unsigned long long CheckKey(int64_t index, int32_t value) {
  return (static_cast<unsigned long long>(index) << 32) | static_cast<uint32_t>(value);
}

// --- Elementwise -----------------------------------------------------------

__global__ void FillKernel(int64_t n, float value, float* x) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) x[i] = value;
}

__global__ void AxpyKernel(int64_t n, float alpha, const float* __restrict__ x, float* __restrict__ y) {
  // fmaf would round once where the CPU backend rounds twice: keep them equal.
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) y[i] = __fadd_rn(y[i], __fmul_rn(alpha, x[i]));
}

__global__ void ScaleKernel(int64_t n, float beta, float* x) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) x[i] = beta == 0.0f ? 0.0f : x[i] * beta;
}

template <ActivationCode kAct>
__device__ __forceinline__ float Activate(float z) {
  switch (kAct) {
    case ActivationCode::kRelu:
      return z > 0.0f ? z : 0.0f;
    case ActivationCode::kTanh:
      return tanhf(z);
    case ActivationCode::kSigmoid:
      return 1.0f / (1.0f + expf(-z));
    case ActivationCode::kNone:
      break;
  }
  return z;
}

template <ActivationCode kAct>
__global__ void BiasActivationKernel(int rows, int cols, const float* bias, float* x) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    x[i] = Activate<kAct>(x[i] + bias[i % cols]);
  }
}

template <ActivationCode kAct>
__global__ void ActivationBackwardKernel(int64_t n, const float* y, float* dy) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float out = y[i];
    switch (kAct) {
      case ActivationCode::kRelu:  // select, so a masked NaN/inf never leaks
        dy[i] = out > 0.0f ? dy[i] : 0.0f;
        break;
      case ActivationCode::kTanh:
        dy[i] *= 1.0f - out * out;
        break;
      case ActivationCode::kSigmoid:
        dy[i] *= out * (1.0f - out);
        break;
      case ActivationCode::kNone:
        break;
    }
  }
}

// --- Column sum: a 32-column tile per block, 16 row groups, fixed order ----

constexpr int kSumCols = 32;
constexpr int kSumRowGroups = 16;

__global__ void ColumnSumKernel(int rows, int cols, const float* x, float* out, bool accumulate) {
  __shared__ float partial[kSumRowGroups][kSumCols + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int64_t i = threadIdx.y; i < rows; i += kSumRowGroups) sum += x[i * cols + col];
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int g = 0; g < kSumRowGroups; ++g) total += partial[g][threadIdx.x];
    out[col] = accumulate ? out[col] + total : total;
  }
}

// --- Softmax cross-entropy ---------------------------------------------------

__global__ void CheckLabelsKernel(int rows, int classes, const int32_t* labels, unsigned long long* check) {
  for (int64_t i = GlobalThread(); i < rows; i += GridThreads()) {
    const int32_t label = labels[i];
    if (label < 0 || label >= classes) atomicMin(check, CheckKey(i, label));
  }
}

// Keeps the larger value; on a tie the smaller index (the first maximum).
__device__ __forceinline__ void KeepMax(float& best, int& best_j, float value, int j) {
  if (j == INT_MAX) return;
  if (best_j == INT_MAX || value > best || (value == best && j < best_j)) {
    best = value;
    best_j = j;
  }
}

// One warp per row; blocks reduce loss and hits before one atomic each.
__global__ void SoftmaxCrossEntropyKernel(int rows, int classes, const float* logits, const int32_t* labels,
                                          float grad_scale, float* dlogits, double* loss_sum,
                                          unsigned long long* correct, const unsigned long long* check) {
  if (*check != kCheckClear) return;  // a bad label: write nothing
  __shared__ double block_loss[kThreads / kWarp];
  __shared__ unsigned long long block_hits[kThreads / kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  double loss = 0.0;
  unsigned long long hits = 0;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * warps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * warps) {
    const float* x = logits + row * classes;
    float best = -INFINITY;
    int best_j = INT_MAX;
    for (int j = lane; j < classes; j += kWarp) KeepMax(best, best_j, x[j], j);
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(kFullMask, best, offset);
      const int other_j = __shfl_xor_sync(kFullMask, best_j, offset);
      KeepMax(best, best_j, other, other_j);
    }
    best = __shfl_sync(kFullMask, best, 0);
    best_j = __shfl_sync(kFullMask, best_j, 0);
    float sum = 0.0f;
    for (int j = lane; j < classes; j += kWarp) sum += expf(x[j] - best);
    for (int offset = kWarp / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
    sum = __shfl_sync(kFullMask, sum, 0);  // every lane uses lane 0's rounding
    const int label = labels[row];
    if (dlogits != nullptr) {
      float* d = dlogits + row * classes;
      for (int j = lane; j < classes; j += kWarp) {
        const float p = expf(x[j] - best) / sum;
        d[j] = (p - (j == label ? 1.0f : 0.0f)) * grad_scale;
      }
    }
    if (lane == 0) {
      // max - x[label] first: exact for nearby logits, then the log term.
      loss += (static_cast<double>(best) - static_cast<double>(x[label])) + log(static_cast<double>(sum));
      hits += best_j == label ? 1 : 0;
    }
  }
  if (loss_sum == nullptr && correct == nullptr) return;
  if (lane == 0) {
    block_loss[warp] = loss;
    block_hits[warp] = hits;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double total_loss = 0.0;
    unsigned long long total_hits = 0;
    for (int w = 0; w < warps; ++w) {
      total_loss += block_loss[w];
      total_hits += block_hits[w];
    }
    if (loss_sum != nullptr) atomicAdd(loss_sum, total_loss);
    if (correct != nullptr) atomicAdd(correct, total_hits);
  }
}

// --- 16-bit formats ------------------------------------------------------------

__global__ void PackFp16Kernel(int64_t n, const float* src, uint16_t* dst) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads())
    dst[i] = __half_as_ushort(__float2half_rn(src[i]));
}

__global__ void PackBf16Kernel(int64_t n, const float* src, uint16_t* dst) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(src[i]));
  }
}

__global__ void UnpackFp16Kernel(int64_t n, const uint16_t* src, float* dst) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) dst[i] = __half2float(__ushort_as_half(src[i]));
}

__global__ void UnpackBf16Kernel(int64_t n, const uint16_t* src, float* dst) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    dst[i] = __bfloat162float(__ushort_as_bfloat16(src[i]));
  }
}

// --- Embedding bag ---------------------------------------------------------------

// One warp per bag. checks[0]: offsets, checks[1]: ids.
__global__ void CheckBagsKernel(int bags, const int32_t* offsets, const int32_t* ids, int64_t table_rows,
                                unsigned long long* checks) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = GridThreads() / kWarp;
  for (int64_t b = GlobalThread() / kWarp; b < bags; b += warps) {
    const int32_t start = offsets[b], end = offsets[b + 1];
    if (lane == 0) {
      if (b == 0 && start != 0) atomicMin(&checks[0], CheckKey(0, start));
      if (end < start) atomicMin(&checks[0], CheckKey(b + 1, end));
    }
    if (start < 0 || end <= start) continue;
    for (int64_t j = start + lane; j < end; j += kWarp) {
      if (ids == nullptr) {
        atomicMin(&checks[1], CheckKey(j, 0));
        break;
      }
      const int32_t id = ids[j];
      if (id < 0 || id >= table_rows) {
        atomicMin(&checks[1], CheckKey(j, id));
        break;
      }
    }
  }
}

__device__ __forceinline__ bool BagsChecked(const unsigned long long* checks) {
  return checks[0] == kCheckClear && checks[1] == kCheckClear;
}

__device__ __forceinline__ float BagScale(const float* scales, int32_t j) {
  return scales == nullptr ? 1.0f : scales[j];
}

// One block per bag, threads across dim; sums in id order like the CPU.
__global__ void EmbeddingBagForwardKernel(int bags, int dim, const int32_t* offsets, const int32_t* ids,
                                          const float* scales, const float* table, float* out,
                                          const unsigned long long* checks) {
  if (!BagsChecked(checks)) return;
  for (int64_t b = blockIdx.x; b < bags; b += gridDim.x) {
    const int32_t start = offsets[b], end = offsets[b + 1];
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
      float sum = 0.0f;
      for (int32_t j = start; j < end; ++j) {
        sum += BagScale(scales, j) * table[static_cast<int64_t>(ids[j]) * dim + d];
      }
      out[b * dim + d] = sum;
    }
  }
}

__global__ void EmbeddingBagBackwardKernel(int bags, int dim, const int32_t* offsets, const int32_t* ids,
                                           const float* scales, const float* dout, float* dtable,
                                           const unsigned long long* checks) {
  if (!BagsChecked(checks)) return;
  for (int64_t b = blockIdx.x; b < bags; b += gridDim.x) {
    const int32_t start = offsets[b], end = offsets[b + 1];
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
      const float grad = dout[b * dim + d];
      for (int32_t j = start; j < end; ++j) {
        atomicAdd(&dtable[static_cast<int64_t>(ids[j]) * dim + d], BagScale(scales, j) * grad);
      }
    }
  }
}

// --- Strided copy ------------------------------------------------------------------

__global__ void CopyColumnsKernel(int rows, int cols, const float* __restrict__ src, int src_ld,
                                  float* __restrict__ dst, int dst_ld, bool accumulate) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  for (int64_t k = GlobalThread(); k < n; k += GridThreads()) {
    const int64_t r = k / cols, c = k - r * cols;
    const float value = src[r * src_ld + c];
    float* to = dst + r * dst_ld + c;
    *to = accumulate ? *to + value : value;
  }
}

// --- Interactions over x[rows, vectors, dim] -------------------------------------

// The sum of `value` over the block (blockDim.x a multiple of 32, at most
// kThreads), returned to every thread. Every thread of the block must call it.
__device__ float BlockSum(float value) {
  __shared__ float warp_sums[kThreads / kWarp];
  for (int offset = kWarp / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullMask, value, offset);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  __syncthreads();  // the previous call's readers are done with warp_sums
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) total += warp_sums[w];
  return total;
}

// One block per row (grid-stride), threads across dim.
__global__ void FmForwardKernel(int rows, int vectors, int dim, const float* x, float* out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* v = x + r * vectors * dim;
    float sum_squared = 0.0f, squares = 0.0f;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
      float sum = 0.0f;
      for (int64_t i = 0; i < vectors; ++i) {
        const float value = v[i * dim + d];
        sum += value;
        squares += value * value;
      }
      sum_squared += sum * sum;
    }
    sum_squared = BlockSum(sum_squared);
    squares = BlockSum(squares);
    if (threadIdx.x == 0) out[r] = 0.5f * (sum_squared - squares);
  }
}

// One thread per (r, d).
__global__ void FmBackwardKernel(int rows, int vectors, int dim, const float* x, const float* dout,
                                 float* dx) {
  const int64_t n = static_cast<int64_t>(rows) * dim;
  for (int64_t k = GlobalThread(); k < n; k += GridThreads()) {
    const int64_t r = k / dim, d = k - r * dim;
    const int64_t base = r * vectors * dim + d;
    float sum = 0.0f;
    for (int64_t i = 0; i < vectors; ++i) sum += x[base + i * dim];
    const float grad = dout[r];
    for (int64_t i = 0; i < vectors; ++i) {
      const int64_t at = base + i * dim;
      dx[at] += grad * (sum - x[at]);
    }
  }
}

// The index of pair (i, j), i < j, among the pairs of `vectors` in i-major
// order.
__device__ __forceinline__ int64_t PairIndex(int64_t i, int64_t j, int64_t vectors) {
  return i * vectors - i * (i + 1) / 2 + (j - i - 1);
}

// One thread per (r, i, j); only j > i computes.
__global__ void PairwiseDotForwardKernel(int rows, int vectors, int dim, const float* x, float* out) {
  const int64_t per_row = static_cast<int64_t>(vectors) * vectors;
  const int64_t pairs = static_cast<int64_t>(vectors) * (vectors - 1) / 2;
  const int64_t n = rows * per_row;
  for (int64_t k = GlobalThread(); k < n; k += GridThreads()) {
    const int64_t r = k / per_row, ij = k - r * per_row;
    const int64_t i = ij / vectors, j = ij - i * vectors;
    if (j <= i) continue;
    const float* a = x + (r * vectors + i) * dim;
    const float* b = x + (r * vectors + j) * dim;
    float dot = 0.0f;
    for (int d = 0; d < dim; ++d) dot += a[d] * b[d];
    out[r * pairs + PairIndex(i, j, vectors)] = dot;
  }
}

// One thread per (r, i, d), adding over j in ascending order (the CPU adds in
// another order, and nvcc contracts multiply-adds: equal within float rounding).
__global__ void PairwiseDotBackwardKernel(int rows, int vectors, int dim, const float* x, const float* dout,
                                          float* dx) {
  const int64_t pairs = static_cast<int64_t>(vectors) * (vectors - 1) / 2;
  const int64_t per_row = static_cast<int64_t>(vectors) * dim;
  const int64_t n = rows * per_row;
  for (int64_t k = GlobalThread(); k < n; k += GridThreads()) {
    const int64_t r = k / per_row, id = k - r * per_row;
    const int64_t i = id / dim, d = id - i * dim;
    const float* v = x + r * per_row + d;
    const float* g = dout + r * pairs;
    float acc = dx[k];
    for (int64_t j = 0; j < vectors; ++j) {
      if (j == i) continue;
      const int64_t p = j < i ? PairIndex(j, i, vectors) : PairIndex(i, j, vectors);
      acc += g[p] * v[j * dim];
    }
    dx[k] = acc;
  }
}

// --- Pointwise loss ----------------------------------------------------------------

// checks::PointLabelOk on the device.
__device__ __forceinline__ bool PointLabelOk(PointLossCode loss, float label) {
  if (loss == PointLossCode::kSigmoidCrossEntropy) return label >= 0.0f && label <= 1.0f;
  return isfinite(label);
}

__global__ void CheckPointLabelsKernel(PointLossCode loss, int rows, const float* labels,
                                       unsigned long long* check) {
  for (int64_t i = GlobalThread(); i < rows; i += GridThreads()) {
    const float label = labels[i];
    if (!PointLabelOk(loss, label)) atomicMin(check, CheckKey(i, __float_as_int(label)));
  }
}

// 1 / (1 + e^-z) without overflow for large |z|.
__device__ __forceinline__ float StableSigmoid(float z) {
  if (z >= 0.0f) return 1.0f / (1.0f + expf(-z));
  const float e = expf(z);
  return e / (1.0f + e);
}

// One thread per row (grid-stride); blocks reduce the loss in double before
// one atomic each.
__global__ void PointwiseLossKernel(PointLossCode loss, int rows, const float* z, const float* labels,
                                    float grad_scale, float* dz, double* loss_sum,
                                    const unsigned long long* check) {
  if (*check != kCheckClear) return;  // a bad label: write nothing
  __shared__ double block_loss[kThreads / kWarp];
  double total = 0.0;
  for (int64_t r = GlobalThread(); r < rows; r += GridThreads()) {
    const float zr = z[r], y = labels[r];
    float gradient;
    if (loss == PointLossCode::kSigmoidCrossEntropy) {
      total += fmaxf(zr, 0.0f) - zr * y + log1pf(expf(-fabsf(zr)));
      gradient = StableSigmoid(zr) - y;
    } else {
      total += (zr - y) * (zr - y);
      gradient = 2.0f * (zr - y);
    }
    if (dz != nullptr) dz[r] = gradient * grad_scale;
  }
  if (loss_sum == nullptr) return;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) total += __shfl_xor_sync(kFullMask, total, offset);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) block_loss[warp] = total;
  __syncthreads();
  if (threadIdx.x == 0) {
    double block_total = 0.0;
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) block_total += block_loss[w];
    atomicAdd(loss_sum, block_total);
  }
}

// Threads per block for a row of `dim` floats: a multiple of 32, at most 256.
int RowThreads(int dim) {
  const int rounded = (dim + kWarp - 1) / kWarp * kWarp;
  return rounded < kThreads ? rounded : kThreads;
}

template <template <ActivationCode> class Launch, typename... Args>
cudaError_t DispatchActivation(ActivationCode act, Args... args) {
  switch (act) {
    case ActivationCode::kNone:
      return Launch<ActivationCode::kNone>::Run(args...);
    case ActivationCode::kRelu:
      return Launch<ActivationCode::kRelu>::Run(args...);
    case ActivationCode::kTanh:
      return Launch<ActivationCode::kTanh>::Run(args...);
    case ActivationCode::kSigmoid:
      return Launch<ActivationCode::kSigmoid>::Run(args...);
  }
  return cudaErrorInvalidValue;
}

template <ActivationCode kAct>
struct BiasActivationLaunch {
  static cudaError_t Run(cudaStream_t stream, int rows, int cols, const float* bias, float* x) {
    BiasActivationKernel<kAct>
        <<<Blocks(static_cast<int64_t>(rows) * cols, kThreads), kThreads, 0, stream>>>(rows, cols, bias, x);
    return cudaGetLastError();
  }
};

template <ActivationCode kAct>
struct ActivationBackwardLaunch {
  static cudaError_t Run(cudaStream_t stream, int64_t n, const float* y, float* dy) {
    ActivationBackwardKernel<kAct><<<Blocks(n, kThreads), kThreads, 0, stream>>>(n, y, dy);
    return cudaGetLastError();
  }
};

}  // namespace

cudaError_t ProbeKernelImage() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, FillKernel);
}

cudaError_t LaunchFill(cudaStream_t stream, int64_t n, float value, float* x) {
  if (n == 0) return cudaSuccess;
  FillKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(n, value, x);
  return cudaGetLastError();
}

cudaError_t LaunchAxpy(cudaStream_t stream, int64_t n, float alpha, const float* x, float* y) {
  if (n == 0) return cudaSuccess;
  AxpyKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(n, alpha, x, y);
  return cudaGetLastError();
}

cudaError_t LaunchScale(cudaStream_t stream, int64_t n, float beta, float* x) {
  if (n == 0 || beta == 1.0f) return cudaSuccess;
  ScaleKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(n, beta, x);
  return cudaGetLastError();
}

cudaError_t LaunchBiasActivation(cudaStream_t stream, ActivationCode act, int rows, int cols,
                                 const float* bias, float* x) {
  if (static_cast<int64_t>(rows) * cols == 0) return cudaSuccess;
  return DispatchActivation<BiasActivationLaunch>(act, stream, rows, cols, bias, x);
}

cudaError_t LaunchActivationBackward(cudaStream_t stream, ActivationCode act, int64_t n, const float* y,
                                     float* dy) {
  if (n == 0 || act == ActivationCode::kNone) return cudaSuccess;
  return DispatchActivation<ActivationBackwardLaunch>(act, stream, n, y, dy);
}

cudaError_t LaunchColumnSum(cudaStream_t stream, int rows, int cols, const float* x, float* out,
                            bool accumulate) {
  if (cols == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((static_cast<int64_t>(cols) + kSumCols - 1) / kSumCols);
  ColumnSumKernel<<<blocks, dim3(kSumCols, kSumRowGroups), 0, stream>>>(rows, cols, x, out, accumulate);
  return cudaGetLastError();
}

cudaError_t LaunchCheckLabels(cudaStream_t stream, int rows, int classes, const int32_t* labels,
                              unsigned long long* check) {
  if (rows == 0) return cudaSuccess;
  CheckLabelsKernel<<<Blocks(rows, kThreads), kThreads, 0, stream>>>(rows, classes, labels, check);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxCrossEntropy(cudaStream_t stream, int rows, int classes, const float* logits,
                                      const int32_t* labels, float grad_scale, float* dlogits,
                                      double* loss_sum, unsigned long long* correct,
                                      const unsigned long long* check) {
  if (rows == 0) return cudaSuccess;
  SoftmaxCrossEntropyKernel<<<Blocks(rows, kThreads / kWarp), kThreads, 0, stream>>>(
      rows, classes, logits, labels, grad_scale, dlogits, loss_sum, correct, check);
  return cudaGetLastError();
}

cudaError_t LaunchPackHalf(cudaStream_t stream, bool bf16, int64_t n, const float* src, uint16_t* dst) {
  if (n == 0) return cudaSuccess;
  if (bf16) {
    PackBf16Kernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(n, src, dst);
  } else {
    PackFp16Kernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(n, src, dst);
  }
  return cudaGetLastError();
}

cudaError_t LaunchUnpackHalf(cudaStream_t stream, bool bf16, int64_t n, const uint16_t* src, float* dst) {
  if (n == 0) return cudaSuccess;
  if (bf16) {
    UnpackBf16Kernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(n, src, dst);
  } else {
    UnpackFp16Kernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(n, src, dst);
  }
  return cudaGetLastError();
}

cudaError_t LaunchCheckBags(cudaStream_t stream, int bags, const int32_t* offsets, const int32_t* ids,
                            int64_t table_rows, unsigned long long* checks) {
  if (bags == 0) return cudaSuccess;
  CheckBagsKernel<<<Blocks(bags, kThreads / kWarp), kThreads, 0, stream>>>(bags, offsets, ids, table_rows,
                                                                           checks);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingBagForward(cudaStream_t stream, int bags, int dim, const int32_t* offsets,
                                      const int32_t* ids, const float* scales, const float* table, float* out,
                                      const unsigned long long* checks) {
  if (static_cast<int64_t>(bags) * dim == 0) return cudaSuccess;
  EmbeddingBagForwardKernel<<<Blocks(bags, 1), RowThreads(dim), 0, stream>>>(bags, dim, offsets, ids, scales,
                                                                             table, out, checks);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingBagBackward(cudaStream_t stream, int bags, int dim, const int32_t* offsets,
                                       const int32_t* ids, const float* scales, const float* dout,
                                       float* dtable, const unsigned long long* checks) {
  if (static_cast<int64_t>(bags) * dim == 0) return cudaSuccess;
  EmbeddingBagBackwardKernel<<<Blocks(bags, 1), RowThreads(dim), 0, stream>>>(bags, dim, offsets, ids, scales,
                                                                              dout, dtable, checks);
  return cudaGetLastError();
}

cudaError_t LaunchCopyColumns(cudaStream_t stream, int rows, int cols, const float* src, int src_ld,
                              float* dst, int dst_ld, bool accumulate) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  if (n == 0) return cudaSuccess;
  CopyColumnsKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(rows, cols, src, src_ld, dst, dst_ld,
                                                                  accumulate);
  return cudaGetLastError();
}

cudaError_t LaunchFmForward(cudaStream_t stream, int rows, int vectors, int dim, const float* x, float* out) {
  if (rows == 0) return cudaSuccess;
  // At least one warp, so that dim == 0 still writes zeros.
  const int threads = dim > kWarp ? RowThreads(dim) : kWarp;
  FmForwardKernel<<<Blocks(rows, 1), threads, 0, stream>>>(rows, vectors, dim, x, out);
  return cudaGetLastError();
}

cudaError_t LaunchFmBackward(cudaStream_t stream, int rows, int vectors, int dim, const float* x,
                             const float* dout, float* dx) {
  const int64_t n = static_cast<int64_t>(rows) * dim;
  if (n * vectors == 0) return cudaSuccess;
  FmBackwardKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(rows, vectors, dim, x, dout, dx);
  return cudaGetLastError();
}

cudaError_t LaunchPairwiseDotForward(cudaStream_t stream, int rows, int vectors, int dim, const float* x,
                                     float* out) {
  if (rows == 0 || vectors < 2) return cudaSuccess;  // no pairs
  const int64_t n = static_cast<int64_t>(rows) * vectors * vectors;
  PairwiseDotForwardKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(rows, vectors, dim, x, out);
  return cudaGetLastError();
}

cudaError_t LaunchPairwiseDotBackward(cudaStream_t stream, int rows, int vectors, int dim, const float* x,
                                      const float* dout, float* dx) {
  const int64_t n = static_cast<int64_t>(rows) * vectors * dim;
  if (n == 0 || vectors < 2) return cudaSuccess;  // nothing to add to
  PairwiseDotBackwardKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(rows, vectors, dim, x, dout, dx);
  return cudaGetLastError();
}

cudaError_t LaunchCheckPointLabels(cudaStream_t stream, PointLossCode loss, int rows, const float* labels,
                                   unsigned long long* check) {
  if (rows == 0) return cudaSuccess;
  CheckPointLabelsKernel<<<Blocks(rows, kThreads), kThreads, 0, stream>>>(loss, rows, labels, check);
  return cudaGetLastError();
}

cudaError_t LaunchPointwiseLoss(cudaStream_t stream, PointLossCode loss, int rows, const float* z,
                                const float* labels, float grad_scale, float* dz, double* loss_sum,
                                const unsigned long long* check) {
  if (rows == 0) return cudaSuccess;
  PointwiseLossKernel<<<Blocks(rows, kThreads), kThreads, 0, stream>>>(loss, rows, z, labels, grad_scale, dz,
                                                                       loss_sum, check);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace fulcrum
