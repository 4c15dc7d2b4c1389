// CUDA implementation of kernels::Backend: GEMM through cuBLAS, everything
// else through our own kernels (kernels.cu). Built only into the plugin
// libfulcrum_kernels_cuda.so; programs reach it through
// kernels/backend_loader.h, never by linking it.
//
// Memory: backend memory is device memory (HostMemory() is false). Allocate()
// serves blocks from a caching pool by size class (kernels/caching_pool.h) over
// cudaMalloc, so steady-state training steps never call cudaMalloc. The cuBLAS
// workspace, the bf16 GEMM scratch and the small state block for device-side
// checks come from the same pool.
//
// Streams: every op runs on one compute stream (cuBLAS is bound to it), in
// call order. Copies run on a separate copy stream through pinned staging
// buffers, ordered against compute with events: a copy starts only after the
// compute work queued before it, and compute queued after a CopyFromHost
// starts only after that copy. CopyFromHost returns as soon as the data sits
// in pinned staging (a ring of 16 MiB, 4 MiB chunks); the transfer itself
// overlaps whatever the host does next. CopyToHost is double-buffered through
// two 4 MiB pinned chunks and returns when the host buffer holds the data.
//
// Data checks: labels, offsets and ids live on the device, so they are
// checked there by a kernel that runs before the op, and the op writes
// nothing when the check fails. The failure is reported, with the same
// message the CPU backend gives, by the next call that waits for the device:
// SoftmaxCrossEntropy when it returns loss or correct counts, PointwiseLoss
// when it returns the loss, CopyToHost or Synchronize. Errors of the CUDA
// runtime or cuBLAS come back as RESOURCE_EXHAUSTED (out of memory) or
// INTERNAL naming the operation and the CUDA error; nothing exits or aborts.
//
// Not thread-safe; use one backend per thread. Each public call makes the
// backend's device current on the calling thread.

#ifndef FULCRUM_KERNELS_CUDA_CUDA_BACKEND_H_
#define FULCRUM_KERNELS_CUDA_CUDA_BACKEND_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/caching_pool.h"

namespace fulcrum {
namespace kernels {
namespace cuda {

// cudaMalloc / cudaFree for the pool; RESOURCE_EXHAUSTED with the device's
// free and total memory when cudaMalloc runs out.
class DeviceAllocator {
 public:
  explicit DeviceAllocator(const std::string* device_name) : device_name_(device_name) {}
  absl::StatusOr<void*> Allocate(size_t bytes);
  void Free(void* block);

 private:
  const std::string* device_name_;  // the backend's Name(), for messages
};

class PinnedRing;  // pinned host staging for CopyFromHost (cuda_backend.cc)

// cudaMallocHost / cudaFreeHost for the pool of CopyToHostAsync's staging.
class PinnedAllocator {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes);
  void Free(void* block);
};

class CudaBackend : public Backend {
 public:
  // A backend on CUDA device `device`. INVALID_ARGUMENT for a device index
  // out of range; INTERNAL (or RESOURCE_EXHAUSTED) when the runtime, the
  // device or cuBLAS cannot be set up, or when this plugin holds no code the
  // device can run.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device);

  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // "cuda:N (<device name>)".
  const char* Name() const override { return name_.c_str(); }

  bool HostMemory() const override { return false; }
  int64_t MemoryInUse() const override {
    return pool_ == nullptr ? 0 : static_cast<int64_t>(pool_->stats().live_bytes + pool_->stats().cached_bytes);
  }
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  // An unknown pointer is reported as INVALID_ARGUMENT by the next
  // Synchronize().
  void Free(void* buffer) override;
  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  // On the copy stream, after the compute queued so far, into pinned staging
  // from a pool (no allocation once shapes repeat); WaitCopy moves it into
  // host_dst. Compute queued afterwards runs while the copy travels.
  absl::StatusOr<int64_t> CopyToHostAsync(void* host_dst, const void* src, size_t bytes) override;
  absl::Status WaitCopy(int64_t ticket) override;
  absl::Status Synchronize() override;
  absl::Status SetPrecision(Precision precision) override;

  absl::Status Fill(int64_t n, float value, float* x) override;
  absl::Status Axpy(int64_t n, float alpha, const float* x, float* y) override;
  absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    const float* b, float beta, float* c) override;
  absl::Status BiasActivationForward(Activation act, int rows, int cols, const float* bias,
                                     float* x) override;
  absl::Status ActivationBackward(Activation act, int64_t n, const float* y, float* dy) override;
  absl::Status ColumnSum(int rows, int cols, const float* x, float* out, bool accumulate) override;
  // Syncs the compute stream when loss_sum or correct is requested (their
  // values are host scalars); with both null it only enqueues work and a bad
  // label surfaces from the next call that waits.
  absl::Status SoftmaxCrossEntropy(int rows, int classes, const float* logits, const int32_t* labels,
                                   float grad_scale, float* dlogits, double* loss_sum,
                                   int64_t* correct) override;
  absl::Status PackHalf(HalfType type, int64_t n, const float* src, uint16_t* dst) override;
  absl::Status UnpackHalf(HalfType type, int64_t n, const uint16_t* src, float* dst) override;
  absl::Status EmbeddingBagForward(int bags, int dim, const int32_t* offsets, const int32_t* ids,
                                   const float* scales, int64_t table_rows, const float* table,
                                   float* out) override;
  absl::Status EmbeddingBagBackward(int bags, int dim, const int32_t* offsets, const int32_t* ids,
                                    const float* scales, int64_t table_rows, const float* dout,
                                    float* dtable) override;
  absl::Status CopyColumns(int rows, int cols, const float* src, int src_ld, float* dst, int dst_ld,
                           bool accumulate) override;
  absl::Status FmForward(int rows, int vectors, int dim, const float* x, float* out) override;
  absl::Status FmBackward(int rows, int vectors, int dim, const float* x, const float* dout,
                          float* dx) override;
  absl::Status PairwiseDotForward(int rows, int vectors, int dim, const float* x, float* out) override;
  absl::Status PairwiseDotBackward(int rows, int vectors, int dim, const float* x, const float* dout,
                                   float* dx) override;
  // Syncs the compute stream when loss_sum is requested (a host scalar); with
  // loss_sum null it only enqueues work and a bad label surfaces from the
  // next call that waits.
  absl::Status PointwiseLoss(PointLoss loss, int rows, const float* z, const float* labels, float grad_scale,
                             float* dz, double* loss_sum) override;

 private:
  // A CopyToHostAsync in flight.
  struct Download {
    int64_t ticket;
    cudaEvent_t done;
    void* staging;  // pinned, from download_pool_
    void* host_dst;
    size_t bytes;
  };
  // Finishes the oldest download (waiting for it) and recycles its staging.
  absl::Status FinishDownload();

  // A device-side data check waiting to be read back.
  struct PendingCheck {
    enum class Kind { kLabels, kBags, kPointLabels } kind;
    const char* op;
    int64_t bound;         // classes or table_rows
    bool ids_null;         // kBags: ids was null
    PointLoss point_loss;  // kPointLabels: the loss the labels are for (else unused)
    int slot;              // first check slot (kBags uses two)
  };
  // The error a finished check reports (OK when it passed); `keys` is the
  // host copy of the check slots.
  static absl::Status CheckFailure(const PendingCheck& check, const unsigned long long* keys);

  explicit CudaBackend(int device);
  absl::Status Init();
  absl::Status UseDevice();
  // Makes `waiter` wait for the work queued on `signaller` so far.
  absl::Status Order(cudaStream_t waiter, cudaStream_t signaller, cudaEvent_t mark, const char* op);
  // Reserves `count` check slots (waiting for the device when all are
  // used) and returns a device pointer to the first.
  absl::StatusOr<unsigned long long*> ReserveChecks(PendingCheck check, int count);
  // Waits for the compute stream, then reports the first failed check.
  absl::Status FinishCompute(const char* op);
  absl::Status ReportChecks();
  absl::Status EnsureGemmScratch(size_t bytes);
  absl::Status GemmBf16(cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k, float alpha,
                        const float* a, int lda, const float* b, int ldb, float beta, float* c);

  const int device_;
  std::string name_;
  Precision precision_ = Precision::kFp32;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t compute_mark_ = nullptr;  // "compute queued so far", for copy_
  cudaEvent_t copy_mark_ = nullptr;     // "copies queued so far", for compute_
  cudaEvent_t to_host_done_[2] = {nullptr, nullptr};
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<CachingPool<DeviceAllocator>> pool_;
  void* cublas_workspace_ = nullptr;
  void* gemm_scratch_ = nullptr;  // bf16 copies of GEMM inputs
  size_t gemm_scratch_bytes_ = 0;
  // Device state: check slots, then the loss scalars (loss, correct).
  void* device_state_ = nullptr;
  // Pinned host mirror of device_state_, for reading it back.
  void* host_state_ = nullptr;
  std::unique_ptr<PinnedRing> to_device_;
  std::unique_ptr<CachingPool<PinnedAllocator>> download_pool_;
  std::deque<Download> downloads_;  // in ticket order
  std::vector<cudaEvent_t> spare_download_events_;
  int64_t next_ticket_ = 0;
  char* to_host_ = nullptr;  // two pinned chunks for CopyToHost
  std::vector<PendingCheck> pending_checks_;
  int checks_used_ = 0;
  absl::Status deferred_error_;  // first bad Free() since the last Synchronize()
};

}  // namespace cuda
}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_CUDA_CUDA_BACKEND_H_
