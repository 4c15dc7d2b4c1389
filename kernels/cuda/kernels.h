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

namespace fulcrum {
namespace kernels {
namespace cuda {

// Mirrors kernels::Activation (cuda_backend.cc maps one to the other).
enum class ActivationCode : int { kNone = 0, kRelu = 1, kTanh = 2, kSigmoid = 3 };

// --- Device-side data checks ------------------------------------------------
// A check slot is one unsigned 64-bit word in device memory, kCheckClear when
// nothing is wrong. A check kernel atomicMin()s (index << 32 | uint32(value))
// into it for every bad element, so after it runs the slot names the first
// bad index and its value. Kernels that write outputs take the slot(s) and
// return without writing anything when a check failed.
constexpr unsigned long long kCheckClear = ~0ull;

inline unsigned long long CheckIndex(unsigned long long key) { return key >> 32; }
inline int32_t CheckValue(unsigned long long key) { return static_cast<int32_t>(key & 0xFFFFFFFFull); }

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
// out[b, :] = sum of table rows of bag b. Does nothing unless both checks
// are clear.
cudaError_t LaunchEmbeddingBagForward(cudaStream_t stream, int bags, int dim, const int32_t* offsets,
                                      const int32_t* ids, const float* table, float* out,
                                      const unsigned long long* checks);
// dtable[ids[j], :] += dout[b, :] with atomicAdd. Same gating.
cudaError_t LaunchEmbeddingBagBackward(cudaStream_t stream, int bags, int dim, const int32_t* offsets,
                                       const int32_t* ids, const float* dout, float* dtable,
                                       const unsigned long long* checks);

}  // namespace cuda
}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_CUDA_KERNELS_H_
