// Device-neutral compute interface used by the training code.
//
// A Backend implements the kernels training needs. All matrices are
// row-major float32 with their natural leading dimension (the number of
// columns of the stored matrix). Every pointer passed to an op is *backend
// memory*: host memory for the CPU backend, device memory for the CUDA
// backend. Get it from Allocate() (or a Buffer) and move data in and out with
// CopyFromHost/CopyToHost. Scalars that ops return (loss sums, correct
// counts) are host values.
//
// Ops may run asynchronously on a device; a copy to the host, a returned
// scalar or Synchronize() waits for the work queued before it. Asynchronous
// device errors surface from the next call that waits.
//
// Every method validates its arguments and returns InvalidArgument (without
// writing any output) for negative dimensions, null pointers to non-empty
// buffers, or bad data (out-of-range labels, bad embedding offsets or ids).
// The CUDA backend checks data on the device before the op, skips the op when
// the check fails, and reports the InvalidArgument after the fact, from the
// next call that waits (SoftmaxCrossEntropy returning scalars, CopyToHost,
// Synchronize); the message is the one the CPU backend gives. Device failures (out of memory, a
// failed launch, a lost device) return INTERNAL or RESOURCE_EXHAUSTED naming
// the operation and the CUDA error. Implementations need not be thread-safe;
// use one Backend per thread.

#ifndef FULCRUM_KERNELS_BACKEND_H_
#define FULCRUM_KERNELS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fulcrum {
namespace kernels {

enum class Activation { kNone, kRelu, kTanh, kSigmoid };

// Returns "none", "relu", "tanh" or "sigmoid" (or "unknown").
inline const char* ActivationName(Activation act) {
  switch (act) {
    case Activation::kNone:
      return "none";
    case Activation::kRelu:
      return "relu";
    case Activation::kTanh:
      return "tanh";
    case Activation::kSigmoid:
      return "sigmoid";
  }
  return "unknown";
}

// Math precision of GEMM. Parameters, activations and gradients stay
// float32 in memory; kTf32 uses TF32 tensor cores with float32 accumulation,
// kBf16 rounds GEMM inputs to bfloat16 and accumulates in float32. The CPU
// backend computes float32 for all three.
//
// Accuracy the tests hold backends to (backend_test.cc,
// GemmPrecisionsStayWithinTheirTolerances): for K = 256 and inputs uniform
// in [-1, 1], max|C - C_ref| <= tol * max|C_ref| against the CPU's float32
// product, with tol = 1e-5 for kFp32, 5e-3 for kTf32 (10-bit mantissa inputs)
// and 2e-2 for kBf16 (8-bit mantissa inputs). Errors grow like sqrt(K).
enum class Precision { kFp32, kTf32, kBf16 };

// 16-bit wire formats for gradients and parameters.
enum class HalfType { kFp16, kBf16 };

class Backend {
 public:
  virtual ~Backend() = default;

  // Short identifier such as "cpu" or "cuda:0"; used in logs and test names.
  virtual const char* Name() const = 0;

  // --- Memory -------------------------------------------------------------
  // True when backend memory is ordinary host memory (no copies needed).
  virtual bool HostMemory() const = 0;
  // A buffer of at least `bytes` bytes (aligned to 256), from a pool: after
  // warm-up, training steps allocate nothing from the system or the driver.
  // RESOURCE_EXHAUSTED when the device is out of memory.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  // Returns a buffer to the pool. nullptr is ignored.
  virtual void Free(void* buffer) = 0;
  // Copies between host memory and backend memory (through pinned staging
  // buffers on a device). Both return once the host side may be reused.
  virtual absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  // Waits for every queued op; returns the first asynchronous error.
  virtual absl::Status Synchronize() = 0;

  // Asynchronous download, for overlapping transfers with compute: queues a
  // copy of `bytes` from backend memory `src` into host memory `host_dst`
  // that starts once the ops queued before it are done, and returns at once
  // with a ticket (ops queued after it may run while it travels). `src` must
  // not be written, nor `host_dst` read, until WaitCopy(ticket) returns.
  // This default copies at once (CopyToHost) and returns a ticket that is
  // already done: right for backends whose ops are synchronous.
  virtual absl::StatusOr<int64_t> CopyToHostAsync(void* host_dst, const void* src, size_t bytes) {
    absl::Status copied = CopyToHost(host_dst, src, bytes);
    if (!copied.ok()) return copied;
    return int64_t{0};
  }
  // Blocks until the copy `ticket`, and every one queued before it, is in
  // host memory; returns the first error among them.
  virtual absl::Status WaitCopy(int64_t ticket) {
    (void)ticket;
    return absl::OkStatus();
  }

  // Sets the GEMM precision for later calls. The CPU backend accepts every
  // value and computes float32.
  virtual absl::Status SetPrecision(Precision precision) = 0;

  // --- Ops ------------------------------------------------------------------
  // x[n] = value.
  virtual absl::Status Fill(int64_t n, float value, float* x) = 0;
  // y[n] += alpha * x[n], in float32 whatever SetPrecision chose (it is not a
  // GEMM). x and y must not overlap.
  virtual absl::Status Axpy(int64_t n, float alpha, const float* x, float* y) = 0;

  // C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, where op(X) = X^T
  // when trans_x. A is stored as [m,k] (or [k,m] when trans_a), B as [k,n]
  // (or [n,k] when trans_b), C as [m,n]. When beta == 0, C is write-only: its
  // prior contents (even NaN) do not affect the result. k == 0 is allowed and
  // yields C = beta * C.
  virtual absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                            float alpha, const float* a, const float* b,
                            float beta, float* c) = 0;

  // x[rows, cols] = act(x + bias[cols]) in place (bias broadcast over rows).
  virtual absl::Status BiasActivationForward(Activation act, int rows,
                                             int cols, const float* bias,
                                             float* x) = 0;

  // dy[i] *= act'(z[i]) for i in [0, n), where act' is expressed through the
  // activation output y = act(z): relu: (y > 0), tanh: 1 - y^2,
  // sigmoid: y * (1 - y), none: 1. In place.
  virtual absl::Status ActivationBackward(Activation act, int64_t n,
                                          const float* y, float* dy) = 0;

  // out[j] = sum_i x[i, j] for x[rows, cols]; out has cols elements and is
  // overwritten, or with `accumulate` the sums are added to it.
  virtual absl::Status ColumnSum(int rows, int cols, const float* x, float* out, bool accumulate) = 0;

  // Numerically stable softmax cross-entropy over logits[rows, classes] with
  // labels[rows] in [0, classes). If dlogits != nullptr, writes
  // dlogits[rows, classes] = (softmax(logits) - onehot(labels)) * grad_scale.
  // Adds the summed (not averaged) loss to *loss_sum and the number of rows
  // whose argmax (first maximum) equals the label to *correct; either may be
  // nullptr to skip it. All labels are checked before anything is written, so
  // a label out of range returns InvalidArgument with outputs untouched.
  // Requires classes >= 1.
  virtual absl::Status SoftmaxCrossEntropy(int rows, int classes,
                                           const float* logits,
                                           const int32_t* labels,
                                           float grad_scale, float* dlogits,
                                           double* loss_sum,
                                           int64_t* correct) = 0;

  // Packs float32 values to a 16-bit type (round to nearest even; values
  // beyond the fp16 range become +-inf) and back.
  virtual absl::Status PackHalf(HalfType type, int64_t n, const float* src, uint16_t* dst) = 0;
  virtual absl::Status UnpackHalf(HalfType type, int64_t n, const uint16_t* src, float* dst) = 0;

  // Embedding bag: for bag b in [0, bags), out[b, :] = sum of
  // scales[j] * table[ids[j], :] for j in [offsets[b], offsets[b + 1])
  // (scales null: every scale 1, a plain sum; a weighted sum or a mean is
  // the caller's scales). offsets has bags + 1 entries, non-decreasing,
  // offsets[0] = 0; ids (and scales, when given) have offsets[bags] entries
  // (ids may be null when that is 0), each id in [0, table_rows). Scales are
  // not checked: the caller passes finite ones. An empty bag gives zeros.
  // Offsets are checked before ids, so a bad offset is the error reported
  // even when an id is bad too. ids beyond offsets[bags] cannot be checked: a
  // too-large last offset reads past the ids buffer.
  virtual absl::Status EmbeddingBagForward(int bags, int dim, const int32_t* offsets, const int32_t* ids,
                                           const float* scales, int64_t table_rows, const float* table,
                                           float* out) = 0;
  // The matching scatter-add: dtable[ids[j], :] += scales[j] * dout[b, :] for
  // every j of bag b. dtable is accumulated into, not overwritten; the order
  // of the additions into one row is unspecified (atomics on a device).
  virtual absl::Status EmbeddingBagBackward(int bags, int dim, const int32_t* offsets, const int32_t* ids,
                                            const float* scales, int64_t table_rows, const float* dout,
                                            float* dtable) = 0;

  // dst[r, c] = src[r, c], or += with `accumulate`, for r < rows and
  // c < cols, where row r of src starts at src + r * src_ld and of dst at
  // dst + r * dst_ld (both lds >= cols). src and dst must not overlap.
  virtual absl::Status CopyColumns(int rows, int cols, const float* src, int src_ld, float* dst, int dst_ld,
                                   bool accumulate) = 0;

  // Factorization-machine interaction over x[rows, vectors, dim]:
  // out[r] = 0.5 * sum_d [(sum_i x[r, i, d])^2 - sum_i x[r, i, d]^2].
  virtual absl::Status FmForward(int rows, int vectors, int dim, const float* x, float* out) = 0;
  // Its gradient, added: dx[r, i, d] += dout[r] * (sum_j x[r, j, d] - x[r, i, d]).
  virtual absl::Status FmBackward(int rows, int vectors, int dim, const float* x, const float* dout,
                                  float* dx) = 0;

  // Pairwise dot products over x[rows, vectors, dim]: out[r, p] =
  // x[r, i, :] . x[r, j, :] for the pairs i < j in order (i major), so out is
  // [rows, vectors * (vectors - 1) / 2].
  virtual absl::Status PairwiseDotForward(int rows, int vectors, int dim, const float* x, float* out) = 0;
  // Its gradient, added: dx[r, i, :] += dout[r, p] * x[r, j, :] and
  // dx[r, j, :] += dout[r, p] * x[r, i, :] for each pair p = (i, j).
  virtual absl::Status PairwiseDotBackward(int rows, int vectors, int dim, const float* x, const float* dout,
                                           float* dx) = 0;

  // A loss of one value per row, z[rows] against labels[rows]:
  // kSigmoidCrossEntropy: max(z, 0) - z * y + log(1 + exp(-|z|)), labels in
  // [0, 1], gradient sigmoid(z) - y; kSquaredError: (z - y)^2, labels finite,
  // gradient 2 (z - y). Writes dz[r] = gradient * grad_scale when dz is not
  // null and adds the summed loss to *loss_sum when it is not null. Labels
  // are checked before anything is written (InvalidArgument naming the first
  // bad one, outputs untouched; on a device, reported as SoftmaxCrossEntropy's).
  enum class PointLoss { kSigmoidCrossEntropy, kSquaredError };
  virtual absl::Status PointwiseLoss(PointLoss loss, int rows, const float* z, const float* labels,
                                     float grad_scale, float* dz, double* loss_sum) = 0;

  // Bytes of backend memory this backend holds (in use and cached by its
  // pool); 0 for host-memory backends. Same thread as the ops.
  virtual int64_t MemoryInUse() const { return 0; }
};

// Backend memory owned RAII-style; movable, not copyable.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* backend, void* data, size_t bytes) : backend_(backend), data_(data), bytes_(bytes) {}
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this == &other) return *this;
    Reset();
    backend_ = other.backend_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  // A buffer of `bytes` bytes from `backend`.
  static absl::StatusOr<Buffer> Make(Backend* backend, size_t bytes) {
    absl::StatusOr<void*> data = backend->Allocate(bytes);
    if (!data.ok()) return data.status();
    return Buffer(backend, *data, bytes);
  }

  void Reset() {
    if (data_ != nullptr) backend_->Free(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  template <typename T = float>
  T* get() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_BACKEND_H_
