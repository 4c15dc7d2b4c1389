// Launchers for Fulcrum's own CUDA kernels (kernels.cu). Internal to the CUDA
// plugin: cuda_backend.cc validates arguments and calls these.
//
// Every launcher enqueues its work on `stream`, launches nothing for empty
// inputs, and returns the launch status (cudaGetLastError() right after the
// launch). Sizes are assumed valid (non-negative, pointers non-null where
// elements exist). Plain C++ types only, so g++ can compile the includer.

#ifndef FULCRUM_KERNELS_CUDA_KERNELS_H_
#define FULCRUM_KERNELS_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>

namespace fulcrum {
namespace kernels {
namespace cuda {

// Mirrors kernels::Activation (cuda_backend.cc maps one to the other).
enum class ActivationCode : int { kNone = 0, kRelu = 1, kTanh = 2, kSigmoid = 3 };

// Mirrors kernels::Backend::PointLoss (cuda_backend.cc maps one to the other).
enum class PointLossCode : int { kSigmoidCrossEntropy = 0, kSquaredError = 1 };

// --- Device-side data checks ------------------------------------------------
// A check slot is one unsigned 64-bit word in device memory, kCheckClear when
// nothing is wrong. A check kernel atomicMin()s (index << 32 | uint32(value))
// into it for every bad element, so after it runs the slot names the first
// bad index and its value. Kernels that write outputs take the slot(s) and
// return without writing anything when a check failed.
constexpr unsigned long long kCheckClear = ~0ull;

inline unsigned long long CheckIndex(unsigned long long key) { return key >> 32; }
inline int32_t CheckValue(unsigned long long key) { return static_cast<int32_t>(key & 0xFFFFFFFFull); }
// The value of a check on float data, stored as the float's bits.
inline float CheckFloatValue(unsigned long long key) {
  const uint32_t bits = static_cast<uint32_t>(key & 0xFFFFFFFFull);
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Makes sure this binary holds code the current device can run (no
// "no kernel image is available" at the first real launch).
cudaError_t ProbeKernelImage();

// x[i] = value.
cudaError_t LaunchFill(cudaStream_t stream, int64_t n, float value, float* x);
cudaError_t LaunchAxpy(cudaStream_t stream, int64_t n, float alpha, const float* x, float* y);
// x[i] *= beta; beta == 0 writes zeros (even over NaN).
cudaError_t LaunchScale(cudaStream_t stream, int64_t n, float beta, float* x);

cudaError_t LaunchBiasActivation(cudaStream_t stream, ActivationCode act, int rows, int cols,
                                 const float* bias, float* x);
cudaError_t LaunchActivationBackward(cudaStream_t stream, ActivationCode act, int64_t n, const float* y,
                                     float* dy);
// out[cols] = column sums of x[rows, cols]; rows may be 0 (zeros).
cudaError_t LaunchColumnSum(cudaStream_t stream, int rows, int cols, const float* x, float* out,
                            bool accumulate);

// Records the first label outside [0, classes) in *check.
cudaError_t LaunchCheckLabels(cudaStream_t stream, int rows, int classes, const int32_t* labels,
                              unsigned long long* check);
// Fused softmax cross-entropy forward + backward, one warp per row. Writes
// dlogits when non-null; adds the summed loss to *loss_sum and the argmax
// hits to *correct when non-null (device pointers). Does nothing when *check
// is not kCheckClear.
cudaError_t LaunchSoftmaxCrossEntropy(cudaStream_t stream, int rows, int classes, const float* logits,
                                      const int32_t* labels, float grad_scale, float* dlogits,
                                      double* loss_sum, unsigned long long* correct,
                                      const unsigned long long* check);

// float <-> IEEE fp16 (bf16 = false) or bfloat16 (bf16 = true), round to
// nearest even.
cudaError_t LaunchPackHalf(cudaStream_t stream, bool bf16, int64_t n, const float* src, uint16_t* dst);
cudaError_t LaunchUnpackHalf(cudaStream_t stream, bool bf16, int64_t n, const uint16_t* src, float* dst);

// Checks offsets (checks[0]: offsets[0] != 0 or offsets[b + 1] < offsets[b])
// and ids (checks[1]: an id outside [0, table_rows), or any id at all when
// ids is null).
cudaError_t LaunchCheckBags(cudaStream_t stream, int bags, const int32_t* offsets, const int32_t* ids,
                            int64_t table_rows, unsigned long long* checks);
// out[b, :] = sum of scales[j] * table[ids[j], :] over bag b (scales null:
// all 1). Does nothing unless both checks are clear.
cudaError_t LaunchEmbeddingBagForward(cudaStream_t stream, int bags, int dim, const int32_t* offsets,
                                      const int32_t* ids, const float* scales, const float* table, float* out,
                                      const unsigned long long* checks);
// dtable[ids[j], :] += scales[j] * dout[b, :] with atomicAdd. Same gating.
cudaError_t LaunchEmbeddingBagBackward(cudaStream_t stream, int bags, int dim, const int32_t* offsets,
                                       const int32_t* ids, const float* scales, const float* dout,
                                       float* dtable, const unsigned long long* checks);

// dst[r, c] = src[r, c] (or += with accumulate) for r < rows, c < cols, rows
// strided by src_ld and dst_ld. One thread per element.
cudaError_t LaunchCopyColumns(cudaStream_t stream, int rows, int cols, const float* src, int src_ld,
                              float* dst, int dst_ld, bool accumulate);

// --- Interactions over x[rows, vectors, dim] ---------------------------------
// out[r] = 0.5 * sum_d [(sum_i x[r, i, d])^2 - sum_i x[r, i, d]^2]; one
// block per row, threads across dim.
cudaError_t LaunchFmForward(cudaStream_t stream, int rows, int vectors, int dim, const float* x, float* out);
// dx[r, i, d] += dout[r] * (sum_j x[r, j, d] - x[r, i, d]); one thread per
// (r, d).
cudaError_t LaunchFmBackward(cudaStream_t stream, int rows, int vectors, int dim, const float* x,
                             const float* dout, float* dx);
// out[r, p] = x[r, i, :] . x[r, j, :] for the pairs i < j (i major); one
// thread per (r, i, j), those with j <= i idle.
cudaError_t LaunchPairwiseDotForward(cudaStream_t stream, int rows, int vectors, int dim, const float* x,
                                     float* out);
// dx[r, i, d] += sum over j != i of dout[r, pair(i, j)] * x[r, j, d], in
// ascending j; one thread per (r, i, d), so no atomics.
cudaError_t LaunchPairwiseDotBackward(cudaStream_t stream, int rows, int vectors, int dim, const float* x,
                                      const float* dout, float* dx);

// --- Pointwise loss -------------------------------------------------------------
// Records the first label the loss does not take (sigmoid cross-entropy:
// outside [0, 1]; squared error: not finite; NaN for both) in *check, the
// value as the float's bits (CheckFloatValue).
cudaError_t LaunchCheckPointLabels(cudaStream_t stream, PointLossCode loss, int rows, const float* labels,
                                   unsigned long long* check);
// The loss of each row of z[rows] against labels[rows]; writes dz[r] =
// gradient * grad_scale when dz is non-null and adds the summed loss to
// *loss_sum when non-null (a device pointer). Does nothing when *check is not
// kCheckClear.
cudaError_t LaunchPointwiseLoss(cudaStream_t stream, PointLossCode loss, int rows, const float* z,
                                const float* labels, float grad_scale, float* dz, double* loss_sum,
                                const unsigned long long* check);

}  // namespace cuda
}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_CUDA_KERNELS_H_
