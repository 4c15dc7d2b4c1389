#include "kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/backend_checks.h"
#include "kernels/cuda/kernels.h"

namespace fulcrum {
namespace kernels {
namespace cuda {
namespace {

constexpr size_t kAlign = 256;
constexpr size_t kCopyChunk = size_t{4} << 20;         // one staged transfer
constexpr size_t kToDeviceStaging = 4 * kCopyChunk;    // CopyFromHost ring
constexpr size_t kMaxCachedDownloadBytes = size_t{1} << 30;  // CopyToHostAsync staging kept
constexpr size_t kCublasWorkspace = size_t{32} << 20;  // NVIDIA's advice for Hopper
constexpr int kCheckSlots = 256;
constexpr size_t kCheckBytes = kCheckSlots * sizeof(unsigned long long);
// After the check slots: the loss scalars. SoftmaxCrossEntropy and
// PointwiseLoss zero them, fill them and read them back before returning, so
// they can share them (a call that does not return scalars never touches
// them).
struct LossScalars {
  double loss_sum;
  unsigned long long correct;
};
constexpr size_t kStateBytes = kCheckBytes + sizeof(LossScalars);

size_t RoundUp(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

// OK, or the error as RESOURCE_EXHAUSTED (out of memory) or INTERNAL.
absl::Status CudaError(const char* op, cudaError_t error) {
  if (error == cudaSuccess) return absl::OkStatus();
  // Clear the runtime's last error so that a non-sticky one (say, out of
  // memory) is not reported again by the next launch check.
  (void)cudaGetLastError();
  const std::string message =
      absl::StrCat(op, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::Status CublasError(const char* op, cublasStatus_t status) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message =
      absl::StrCat(op, ": ", cublasGetStatusName(status), ": ", cublasGetStatusString(status));
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

ActivationCode ToCode(Activation act) {
  static_assert(static_cast<int>(Activation::kNone) == static_cast<int>(ActivationCode::kNone) &&
                    static_cast<int>(Activation::kRelu) == static_cast<int>(ActivationCode::kRelu) &&
                    static_cast<int>(Activation::kTanh) == static_cast<int>(ActivationCode::kTanh) &&
                    static_cast<int>(Activation::kSigmoid) == static_cast<int>(ActivationCode::kSigmoid),
                "ActivationCode must mirror Activation");
  return static_cast<ActivationCode>(static_cast<int>(act));
}

PointLossCode ToCode(Backend::PointLoss loss) {
  static_assert(static_cast<int>(Backend::PointLoss::kSigmoidCrossEntropy) ==
                        static_cast<int>(PointLossCode::kSigmoidCrossEntropy) &&
                    static_cast<int>(Backend::PointLoss::kSquaredError) ==
                        static_cast<int>(PointLossCode::kSquaredError),
                "PointLossCode must mirror Backend::PointLoss");
  return static_cast<PointLossCode>(static_cast<int>(loss));
}

cublasOperation_t Op(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

// --- Pinned staging ring for CopyFromHost -------------------------------------
//
// Regions are handed out in ring order; each is busy until the event recorded
// after its transfer completes. Acquire waits for the oldest transfers only
// when the ring is full, so small copies never block the host.
class PinnedRing {
 public:
  static absl::StatusOr<std::unique_ptr<PinnedRing>> Create(size_t capacity) {
    void* base = nullptr;
    RETURN_IF_ERROR(CudaError("CopyFromHost staging: cudaMallocHost", cudaMallocHost(&base, capacity)));
    return std::unique_ptr<PinnedRing>(new PinnedRing(static_cast<char*>(base), capacity));
  }

  ~PinnedRing() {
    for (const Region& region : in_flight_) {
      (void)cudaEventSynchronize(region.done);  // a transfer may still read it
      (void)cudaEventDestroy(region.done);
    }
    for (cudaEvent_t event : spare_events_) (void)cudaEventDestroy(event);
    (void)cudaFreeHost(base_);
  }

  // A region of `bytes` (<= capacity / 2) bytes for the next transfer; call
  // Commit after enqueuing the transfer that reads it.
  absl::StatusOr<char*> Acquire(size_t bytes) {
    bytes = RoundUp(bytes, kAlign);
    for (;;) {
      RETURN_IF_ERROR(Retire(/*wait=*/false));
      if (in_flight_.empty()) head_ = 0;
      if (std::optional<size_t> at = Fit(bytes)) {
        acquired_begin_ = *at;
        head_ = *at + bytes;
        return base_ + *at;
      }
      RETURN_IF_ERROR(Retire(/*wait=*/true));
    }
  }

  // Marks the last acquired region busy until the work now queued on `stream`
  // is done.
  absl::Status Commit(cudaStream_t stream) {
    cudaEvent_t event = nullptr;
    if (!spare_events_.empty()) {
      event = spare_events_.back();
      spare_events_.pop_back();
    } else {
      RETURN_IF_ERROR(CudaError("CopyFromHost: cudaEventCreateWithFlags",
                                cudaEventCreateWithFlags(&event, cudaEventDisableTiming)));
    }
    const absl::Status recorded = CudaError("CopyFromHost: cudaEventRecord", cudaEventRecord(event, stream));
    if (!recorded.ok()) {
      spare_events_.push_back(event);
      return recorded;
    }
    in_flight_.push_back({acquired_begin_, head_, event});
    return absl::OkStatus();
  }

 private:
  struct Region {
    size_t begin, end;
    cudaEvent_t done;
  };

  PinnedRing(char* base, size_t capacity) : base_(base), capacity_(capacity) {}

  // Where `bytes` fit contiguously, if they do. Regions sit in ring order
  // from the oldest (front) to head_; "wrapped" means head_ has come round
  // behind the oldest region.
  std::optional<size_t> Fit(size_t bytes) const {
    if (in_flight_.empty()) return bytes <= capacity_ ? std::optional<size_t>(0) : std::nullopt;
    const size_t tail = in_flight_.front().begin;
    if (head_ > tail) {  // free: [head_, capacity_) and [0, tail)
      if (capacity_ - head_ >= bytes) return head_;
      if (tail >= bytes) return 0;
      return std::nullopt;
    }
    if (tail - head_ >= bytes) return head_;  // wrapped; free: [head_, tail)
    return std::nullopt;
  }

  // Drops finished regions from the front; with `wait`, waits for the oldest.
  absl::Status Retire(bool wait) {
    while (!in_flight_.empty()) {
      cudaEvent_t done = in_flight_.front().done;
      cudaError_t state = wait ? cudaEventSynchronize(done) : cudaEventQuery(done);
      if (state == cudaErrorNotReady) return absl::OkStatus();
      RETURN_IF_ERROR(CudaError("CopyFromHost: waiting for staging", state));
      spare_events_.push_back(done);
      in_flight_.pop_front();
      wait = false;
    }
    return absl::OkStatus();
  }

  char* const base_;
  const size_t capacity_;
  size_t head_ = 0;            // where the next region starts
  size_t acquired_begin_ = 0;  // the region between Acquire and Commit
  std::deque<Region> in_flight_;
  std::vector<cudaEvent_t> spare_events_;
};

// --- DeviceAllocator ---------------------------------------------------------

absl::StatusOr<void*> DeviceAllocator::Allocate(size_t bytes) {
  void* block = nullptr;
  const cudaError_t error = cudaMalloc(&block, bytes);
  if (error == cudaSuccess) return block;
  absl::Status status = CudaError("Allocate: cudaMalloc", error);
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
  return absl::Status(status.code(),
                      absl::StrCat(*device_name_, ": ", status.message(), " (", bytes, " bytes requested, ",
                                   free_bytes, " of ", total_bytes, " bytes free on the device)"));
}

absl::StatusOr<void*> PinnedAllocator::Allocate(size_t bytes) {
  void* block = nullptr;
  RETURN_IF_ERROR(CudaError("CopyToHostAsync staging: cudaMallocHost", cudaMallocHost(&block, bytes)));
  return block;
}

void PinnedAllocator::Free(void* block) {
  if (cudaFreeHost(block) != cudaSuccess) (void)cudaGetLastError();
}

void DeviceAllocator::Free(void* block) {
  // Nothing to report to: a failing cudaFree means the context is already
  // broken, which every later call reports.
  if (cudaFree(block) != cudaSuccess) (void)cudaGetLastError();
}

// --- Set-up and tear-down ------------------------------------------------------

CudaBackend::CudaBackend(int device) : device_(device), name_(absl::StrCat("cuda:", device)) {}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device) {
  int count = 0;
  RETURN_IF_ERROR(CudaError("CudaBackend: cudaGetDeviceCount", cudaGetDeviceCount(&count)));
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaBackend: no CUDA device ", device, " (", count, " present); use 0 to ", count - 1));
  }
  std::unique_ptr<CudaBackend> backend(new CudaBackend(device));
  RETURN_IF_ERROR(backend->Init());
  return backend;
}

absl::Status CudaBackend::Init() {
  RETURN_IF_ERROR(UseDevice());
  cudaDeviceProp properties;
  RETURN_IF_ERROR(CudaError(name_.c_str(), cudaGetDeviceProperties(&properties, device_)));
  name_ = absl::StrCat("cuda:", device_, " (", properties.name, ")");
  const cudaError_t probe = ProbeKernelImage();
  if (probe != cudaSuccess) {
    return absl::Status(
        CudaError("probing kernels", probe).code(),
        absl::StrCat(name_, " (compute capability ", properties.major, ".", properties.minor,
                     "): the CUDA plugin has no code this device can run (", cudaGetErrorString(probe),
                     "); rebuild it with CMAKE_CUDA_ARCHITECTURES including this device"));
  }
  const char* op = "CudaBackend setup";
  RETURN_IF_ERROR(CudaError(op, cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking)));
  RETURN_IF_ERROR(CudaError(op, cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking)));
  for (cudaEvent_t* event : {&compute_mark_, &copy_mark_, &to_host_done_[0], &to_host_done_[1]}) {
    RETURN_IF_ERROR(CudaError(op, cudaEventCreateWithFlags(event, cudaEventDisableTiming)));
  }
  pool_ = std::make_unique<CachingPool<DeviceAllocator>>(DeviceAllocator(&name_),
                                                         std::numeric_limits<size_t>::max());
  RETURN_IF_ERROR(CublasError("CudaBackend setup: cublasCreate", cublasCreate(&cublas_)));
  // cublasSetStream resets the workspace, so the workspace comes second.
  RETURN_IF_ERROR(CublasError("CudaBackend setup: cublasSetStream", cublasSetStream(cublas_, compute_)));
  ASSIGN_OR_RETURN(cublas_workspace_, pool_->Allocate(kCublasWorkspace));
  RETURN_IF_ERROR(CublasError("CudaBackend setup: cublasSetWorkspace",
                              cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspace)));
  RETURN_IF_ERROR(SetPrecision(Precision::kFp32));
  ASSIGN_OR_RETURN(device_state_, pool_->Allocate(kStateBytes));
  RETURN_IF_ERROR(CudaError(op, cudaMemsetAsync(device_state_, 0xFF, kCheckBytes, compute_)));
  RETURN_IF_ERROR(CudaError("CudaBackend setup: cudaMallocHost", cudaMallocHost(&host_state_, kStateBytes)));
  void* to_host = nullptr;
  RETURN_IF_ERROR(CudaError("CudaBackend setup: cudaMallocHost", cudaMallocHost(&to_host, 2 * kCopyChunk)));
  to_host_ = static_cast<char*>(to_host);
  ASSIGN_OR_RETURN(to_device_, PinnedRing::Create(kToDeviceStaging));
  // Pinned memory is precious: keep at most what a few steps' gradients need.
  download_pool_ = std::make_unique<CachingPool<PinnedAllocator>>(PinnedAllocator(), kMaxCachedDownloadBytes);
  return CudaError(op, cudaStreamSynchronize(compute_));
}

CudaBackend::~CudaBackend() {
  // Best effort throughout: a destructor has no one to report to.
  (void)cudaSetDevice(device_);
  if (copy_ != nullptr) (void)cudaStreamSynchronize(copy_);
  if (compute_ != nullptr) (void)cudaStreamSynchronize(compute_);
  to_device_.reset();
  for (const Download& download : downloads_) {  // the copy stream is idle: nothing reads them
    download_pool_->Free(download.staging);
    (void)cudaEventDestroy(download.done);
  }
  for (cudaEvent_t event : spare_download_events_) (void)cudaEventDestroy(event);
  download_pool_.reset();
  if (to_host_ != nullptr) (void)cudaFreeHost(to_host_);
  if (host_state_ != nullptr) (void)cudaFreeHost(host_state_);
  if (cublas_ != nullptr) (void)cublasDestroy(cublas_);
  pool_.reset();  // every block, the workspace and scratch included
  for (cudaEvent_t event : {compute_mark_, copy_mark_, to_host_done_[0], to_host_done_[1]}) {
    if (event != nullptr) (void)cudaEventDestroy(event);
  }
  if (copy_ != nullptr) (void)cudaStreamDestroy(copy_);
  if (compute_ != nullptr) (void)cudaStreamDestroy(compute_);
  (void)cudaGetLastError();
}

absl::Status CudaBackend::UseDevice() { return CudaError(name_.c_str(), cudaSetDevice(device_)); }

// --- Memory and copies -----------------------------------------------------------

absl::StatusOr<void*> CudaBackend::Allocate(size_t bytes) {
  RETURN_IF_ERROR(UseDevice());
  return pool_->Allocate(bytes);
}

void CudaBackend::Free(void* buffer) {
  if (!pool_->Free(buffer) && deferred_error_.ok()) deferred_error_ = checks::UnknownBuffer(buffer);
}

absl::Status CudaBackend::Order(cudaStream_t waiter, cudaStream_t signaller, cudaEvent_t mark,
                                const char* op) {
  RETURN_IF_ERROR(CudaError(op, cudaEventRecord(mark, signaller)));
  return CudaError(op, cudaStreamWaitEvent(waiter, mark, 0));
}

absl::Status CudaBackend::CopyFromHost(void* dst, const void* host_src, size_t bytes) {
  const char* op = "CopyFromHost";
  RETURN_IF_ERROR(checks::FirstError(
      {checks::Bytes(op, "dst", dst, bytes), checks::Bytes(op, "host_src", host_src, bytes)}));
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(UseDevice());
  // The copy overwrites dst: let the compute work queued so far finish with it.
  RETURN_IF_ERROR(Order(copy_, compute_, compute_mark_, op));
  for (size_t offset = 0; offset < bytes; offset += kCopyChunk) {
    const size_t chunk = std::min(kCopyChunk, bytes - offset);
    ASSIGN_OR_RETURN(char* staging, to_device_->Acquire(chunk));
    std::memcpy(staging, static_cast<const char*>(host_src) + offset, chunk);
    RETURN_IF_ERROR(CudaError(
        "CopyFromHost: cudaMemcpyAsync",
        cudaMemcpyAsync(static_cast<char*>(dst) + offset, staging, chunk, cudaMemcpyHostToDevice, copy_)));
    RETURN_IF_ERROR(to_device_->Commit(copy_));
  }
  // Compute queued from now on sees the new contents.
  return Order(compute_, copy_, copy_mark_, op);
}

absl::Status CudaBackend::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  const char* op = "CopyToHost";
  RETURN_IF_ERROR(checks::FirstError(
      {checks::Bytes(op, "host_dst", host_dst, bytes), checks::Bytes(op, "src", src, bytes)}));
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(UseDevice());
  RETURN_IF_ERROR(Order(copy_, compute_, compute_mark_, op));
  // Double-buffered: chunk i travels into to_host_[i % 2] while the host
  // copies chunk i - 1 out of the other half.
  const size_t chunks = (bytes + kCopyChunk - 1) / kCopyChunk;
  auto drain = [&](size_t i) -> absl::Status {
    RETURN_IF_ERROR(
        CudaError("CopyToHost: cudaEventSynchronize", cudaEventSynchronize(to_host_done_[i % 2])));
    const size_t offset = i * kCopyChunk;
    std::memcpy(static_cast<char*>(host_dst) + offset, to_host_ + (i % 2) * kCopyChunk,
                std::min(kCopyChunk, bytes - offset));
    return absl::OkStatus();
  };
  for (size_t i = 0; i < chunks; ++i) {
    const size_t offset = i * kCopyChunk;
    RETURN_IF_ERROR(
        CudaError("CopyToHost: cudaMemcpyAsync",
                  cudaMemcpyAsync(to_host_ + (i % 2) * kCopyChunk, static_cast<const char*>(src) + offset,
                                  std::min(kCopyChunk, bytes - offset), cudaMemcpyDeviceToHost, copy_)));
    RETURN_IF_ERROR(CudaError("CopyToHost: cudaEventRecord", cudaEventRecord(to_host_done_[i % 2], copy_)));
    if (i > 0) RETURN_IF_ERROR(drain(i - 1));
  }
  RETURN_IF_ERROR(drain(chunks - 1));
  if (pending_checks_.empty()) return absl::OkStatus();
  return FinishCompute(op);
}

absl::StatusOr<int64_t> CudaBackend::CopyToHostAsync(void* host_dst, const void* src, size_t bytes) {
  const char* op = "CopyToHostAsync";
  RETURN_IF_ERROR(checks::FirstError(
      {checks::Bytes(op, "host_dst", host_dst, bytes), checks::Bytes(op, "src", src, bytes)}));
  RETURN_IF_ERROR(UseDevice());
  const int64_t ticket = ++next_ticket_;
  if (bytes == 0) return ticket;  // nothing in flight: WaitCopy passes it
  RETURN_IF_ERROR(Order(copy_, compute_, compute_mark_, op));
  ASSIGN_OR_RETURN(void* staging, download_pool_->Allocate(bytes));
  cudaEvent_t done = nullptr;
  if (!spare_download_events_.empty()) {
    done = spare_download_events_.back();
    spare_download_events_.pop_back();
  } else if (absl::Status created =
                 CudaError(op, cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
             !created.ok()) {
    download_pool_->Free(staging);
    return created;
  }
  absl::Status queued =
      CudaError("CopyToHostAsync: cudaMemcpyAsync", cudaMemcpyAsync(staging, src, bytes, cudaMemcpyDeviceToHost, copy_));
  if (queued.ok()) queued = CudaError("CopyToHostAsync: cudaEventRecord", cudaEventRecord(done, copy_));
  if (!queued.ok()) {
    download_pool_->Free(staging);  // stream order: a later copy into it runs after this one
    spare_download_events_.push_back(done);
    return queued;
  }
  downloads_.push_back({ticket, done, staging, host_dst, bytes});
  return ticket;
}

absl::Status CudaBackend::FinishDownload() {
  Download download = downloads_.front();
  downloads_.pop_front();
  absl::Status waited = CudaError("WaitCopy: cudaEventSynchronize", cudaEventSynchronize(download.done));
  if (waited.ok()) std::memcpy(download.host_dst, download.staging, download.bytes);
  download_pool_->Free(download.staging);
  spare_download_events_.push_back(download.done);
  return waited;
}

absl::Status CudaBackend::WaitCopy(int64_t ticket) {
  RETURN_IF_ERROR(UseDevice());
  absl::Status first = absl::OkStatus();
  while (!downloads_.empty() && downloads_.front().ticket <= ticket) {
    absl::Status finished = FinishDownload();
    if (first.ok()) first = finished;
  }
  return first;
}

absl::Status CudaBackend::Synchronize() {
  RETURN_IF_ERROR(UseDevice());
  RETURN_IF_ERROR(CudaError("Synchronize: copy stream", cudaStreamSynchronize(copy_)));
  RETURN_IF_ERROR(FinishCompute("Synchronize: compute stream"));
  return std::exchange(deferred_error_, absl::OkStatus());
}

// --- Device-side checks ---------------------------------------------------------------

absl::StatusOr<unsigned long long*> CudaBackend::ReserveChecks(PendingCheck check, int count) {
  if (checks_used_ + count > kCheckSlots) RETURN_IF_ERROR(FinishCompute(check.op));
  check.slot = checks_used_;
  checks_used_ += count;
  pending_checks_.push_back(check);
  return static_cast<unsigned long long*>(device_state_) + check.slot;
}

absl::Status CudaBackend::FinishCompute(const char* op) {
  if (!pending_checks_.empty()) {
    RETURN_IF_ERROR(
        CudaError(op, cudaMemcpyAsync(host_state_, device_state_, checks_used_ * sizeof(unsigned long long),
                                      cudaMemcpyDeviceToHost, compute_)));
  }
  RETURN_IF_ERROR(CudaError(op, cudaStreamSynchronize(compute_)));
  return ReportChecks();
}

absl::Status CudaBackend::ReportChecks() {
  if (pending_checks_.empty()) return absl::OkStatus();
  const auto* keys = static_cast<const unsigned long long*>(host_state_);
  absl::Status first = absl::OkStatus();
  for (const PendingCheck& check : pending_checks_) {
    first = CheckFailure(check, keys);
    if (!first.ok()) break;
  }
  // Clear the slots for the next checks (queued before any of them).
  RETURN_IF_ERROR(
      CudaError("clearing device checks",
                cudaMemsetAsync(device_state_, 0xFF, checks_used_ * sizeof(unsigned long long), compute_)));
  pending_checks_.clear();
  checks_used_ = 0;
  return first;
}

absl::Status CudaBackend::CheckFailure(const PendingCheck& check, const unsigned long long* keys) {
  const unsigned long long key = keys[check.slot];
  switch (check.kind) {
    case PendingCheck::Kind::kLabels:
      if (key == kCheckClear) return absl::OkStatus();
      return checks::LabelOutOfRange(CheckIndex(key), CheckValue(key), check.bound);
    case PendingCheck::Kind::kPointLabels:
      if (key == kCheckClear) return absl::OkStatus();
      return checks::BadPointLabel(CheckIndex(key), CheckFloatValue(key), check.point_loss);
    case PendingCheck::Kind::kBags:
      break;
  }
  if (key != kCheckClear) return checks::BadOffset(check.op, CheckIndex(key), CheckValue(key));
  const unsigned long long id_key = keys[check.slot + 1];
  if (id_key == kCheckClear) return absl::OkStatus();
  if (check.ids_null) return checks::NullIds(check.op);
  return checks::IdOutOfRange(check.op, CheckIndex(id_key), CheckValue(id_key), check.bound);
}

// --- Ops ------------------------------------------------------------------------------

absl::Status CudaBackend::SetPrecision(Precision precision) {
  RETURN_IF_ERROR(checks::PrecisionValue(precision));
  RETURN_IF_ERROR(UseDevice());
  // TF32 is also chosen per call through the compute type; the math mode
  // keeps cuBLAS from using tensor-core shortcuts in plain fp32.
  const cublasMath_t mode = precision == Precision::kTf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
  RETURN_IF_ERROR(CublasError("SetPrecision: cublasSetMathMode", cublasSetMathMode(cublas_, mode)));
  precision_ = precision;
  return absl::OkStatus();
}

absl::Status CudaBackend::Fill(int64_t n, float value, float* x) {
  RETURN_IF_ERROR(checks::FirstError({checks::Dim("Fill", "n", n), checks::Ptr("Fill", "x", x, n)}));
  RETURN_IF_ERROR(UseDevice());
  return CudaError("Fill: kernel launch", LaunchFill(compute_, n, value, x));
}

absl::Status CudaBackend::Axpy(int64_t n, float alpha, const float* x, float* y) {
  RETURN_IF_ERROR(checks::FirstError(
      {checks::Dim("Axpy", "n", n), checks::Ptr("Axpy", "x", x, n), checks::Ptr("Axpy", "y", y, n)}));
  RETURN_IF_ERROR(UseDevice());
  return CudaError("Axpy: kernel launch", LaunchAxpy(compute_, n, alpha, x, y));
}

absl::Status CudaBackend::EnsureGemmScratch(size_t bytes) {
  if (bytes <= gemm_scratch_bytes_) return absl::OkStatus();
  // Stream order makes reuse safe: work queued on the old block runs first.
  pool_->Free(gemm_scratch_);
  gemm_scratch_ = nullptr;
  gemm_scratch_bytes_ = 0;
  ASSIGN_OR_RETURN(gemm_scratch_, pool_->Allocate(bytes));
  gemm_scratch_bytes_ = bytes;
  return absl::OkStatus();
}

absl::Status CudaBackend::GemmBf16(cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
                                   float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                                   float* c) {
  const int64_t a_elements = int64_t{m} * k, b_elements = int64_t{k} * n;
  const size_t a_bytes = RoundUp(a_elements * sizeof(uint16_t), kAlign);
  RETURN_IF_ERROR(EnsureGemmScratch(a_bytes + b_elements * sizeof(uint16_t)));
  auto* a16 = static_cast<uint16_t*>(gemm_scratch_);
  auto* b16 = reinterpret_cast<uint16_t*>(static_cast<char*>(gemm_scratch_) + a_bytes);
  RETURN_IF_ERROR(
      CudaError("Gemm: bf16 conversion launch", LaunchPackHalf(compute_, true, a_elements, a, a16)));
  RETURN_IF_ERROR(
      CudaError("Gemm: bf16 conversion launch", LaunchPackHalf(compute_, true, b_elements, b, b16)));
  return CublasError(
      "Gemm: cublasGemmEx (bf16)",
      cublasGemmEx(cublas_, op_b, op_a, n, m, k, &alpha, b16, CUDA_R_16BF, ldb, a16, CUDA_R_16BF, lda, &beta,
                   c, CUDA_R_32F, std::max(1, n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

absl::Status CudaBackend::Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                               const float* b, float beta, float* c) {
  const int64_t mk = int64_t{m} * k, kn = int64_t{k} * n, mn = int64_t{m} * n;
  RETURN_IF_ERROR(checks::FirstError({checks::Dim("Gemm", "m", m), checks::Dim("Gemm", "n", n),
                                      checks::Dim("Gemm", "k", k), checks::Ptr("Gemm", "a", a, mk),
                                      checks::Ptr("Gemm", "b", b, kn), checks::Ptr("Gemm", "c", c, mn)}));
  if (mn == 0) return absl::OkStatus();
  RETURN_IF_ERROR(UseDevice());
  if (k == 0) return CudaError("Gemm: scale kernel launch", LaunchScale(compute_, mn, beta, c));
  // cuBLAS is column-major: a row-major [m, n] C is a column-major [n, m]
  // C^T = op(B)^T op(A)^T, so B goes first and the shapes swap.
  const int lda = std::max(1, trans_a ? m : k);
  const int ldb = std::max(1, trans_b ? k : n);
  if (precision_ == Precision::kBf16) {
    return GemmBf16(Op(trans_a), Op(trans_b), m, n, k, alpha, a, lda, b, ldb, beta, c);
  }
  const cublasComputeType_t compute =
      precision_ == Precision::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  return CublasError(
      "Gemm: cublasGemmEx",
      cublasGemmEx(cublas_, Op(trans_b), Op(trans_a), n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda,
                   &beta, c, CUDA_R_32F, std::max(1, n), compute, CUBLAS_GEMM_DEFAULT));
}

absl::Status CudaBackend::BiasActivationForward(Activation act, int rows, int cols, const float* bias,
                                                float* x) {
  const char* op = "BiasActivationForward";
  RETURN_IF_ERROR(checks::FirstError(
      {checks::ActivationValue(op, act), checks::Dim(op, "rows", rows), checks::Dim(op, "cols", cols),
       checks::Ptr(op, "bias", bias, rows == 0 ? 0 : cols), checks::Ptr(op, "x", x, int64_t{rows} * cols)}));
  RETURN_IF_ERROR(UseDevice());
  return CudaError("BiasActivationForward: kernel launch",
                   LaunchBiasActivation(compute_, ToCode(act), rows, cols, bias, x));
}

absl::Status CudaBackend::ActivationBackward(Activation act, int64_t n, const float* y, float* dy) {
  const char* op = "ActivationBackward";
  RETURN_IF_ERROR(checks::FirstError({checks::ActivationValue(op, act), checks::Dim(op, "n", n),
                                      checks::Ptr(op, "y", y, n), checks::Ptr(op, "dy", dy, n)}));
  RETURN_IF_ERROR(UseDevice());
  return CudaError("ActivationBackward: kernel launch",
                   LaunchActivationBackward(compute_, ToCode(act), n, y, dy));
}

absl::Status CudaBackend::ColumnSum(int rows, int cols, const float* x, float* out, bool accumulate) {
  const char* op = "ColumnSum";
  RETURN_IF_ERROR(
      checks::FirstError({checks::Dim(op, "rows", rows), checks::Dim(op, "cols", cols),
                          checks::Ptr(op, "x", x, int64_t{rows} * cols), checks::Ptr(op, "out", out, cols)}));
  RETURN_IF_ERROR(UseDevice());
  return CudaError("ColumnSum: kernel launch", LaunchColumnSum(compute_, rows, cols, x, out, accumulate));
}

absl::Status CudaBackend::SoftmaxCrossEntropy(int rows, int classes, const float* logits,
                                              const int32_t* labels, float grad_scale, float* dlogits,
                                              double* loss_sum, int64_t* correct) {
  const char* op = "SoftmaxCrossEntropy";
  RETURN_IF_ERROR(checks::FirstError({checks::Dim(op, "rows", rows), checks::Dim(op, "classes", classes),
                                      checks::Ptr(op, "logits", logits, int64_t{rows} * classes),
                                      checks::Ptr(op, "labels", labels, rows)}));
  if (rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(UseDevice());
  PendingCheck pending{PendingCheck::Kind::kLabels, op, classes, false, PointLoss{}, 0};
  ASSIGN_OR_RETURN(unsigned long long* check, ReserveChecks(pending, 1));
  RETURN_IF_ERROR(CudaError("SoftmaxCrossEntropy: label check launch",
                            LaunchCheckLabels(compute_, rows, classes, labels, check)));
  const bool want_scalars = loss_sum != nullptr || correct != nullptr;
  auto* scalars = reinterpret_cast<LossScalars*>(static_cast<char*>(device_state_) + kCheckBytes);
  if (want_scalars) {
    RETURN_IF_ERROR(CudaError("SoftmaxCrossEntropy: cudaMemsetAsync",
                              cudaMemsetAsync(scalars, 0, sizeof(LossScalars), compute_)));
  }
  RETURN_IF_ERROR(CudaError("SoftmaxCrossEntropy: kernel launch",
                            LaunchSoftmaxCrossEntropy(compute_, rows, classes, logits, labels, grad_scale,
                                                      dlogits, want_scalars ? &scalars->loss_sum : nullptr,
                                                      want_scalars ? &scalars->correct : nullptr, check)));
  if (!want_scalars) return absl::OkStatus();
  auto* host_scalars = reinterpret_cast<LossScalars*>(static_cast<char*>(host_state_) + kCheckBytes);
  RETURN_IF_ERROR(CudaError(
      "SoftmaxCrossEntropy: cudaMemcpyAsync",
      cudaMemcpyAsync(host_scalars, scalars, sizeof(LossScalars), cudaMemcpyDeviceToHost, compute_)));
  RETURN_IF_ERROR(FinishCompute("SoftmaxCrossEntropy: cudaStreamSynchronize"));
  if (loss_sum != nullptr) *loss_sum += host_scalars->loss_sum;
  if (correct != nullptr) *correct += static_cast<int64_t>(host_scalars->correct);
  return absl::OkStatus();
}

absl::Status CudaBackend::PackHalf(HalfType type, int64_t n, const float* src, uint16_t* dst) {
  const char* op = "PackHalf";
  RETURN_IF_ERROR(checks::FirstError({checks::HalfTypeValue(op, type), checks::Dim(op, "n", n),
                                      checks::Ptr(op, "src", src, n), checks::Ptr(op, "dst", dst, n)}));
  RETURN_IF_ERROR(UseDevice());
  return CudaError("PackHalf: kernel launch", LaunchPackHalf(compute_, type == HalfType::kBf16, n, src, dst));
}

absl::Status CudaBackend::UnpackHalf(HalfType type, int64_t n, const uint16_t* src, float* dst) {
  const char* op = "UnpackHalf";
  RETURN_IF_ERROR(checks::FirstError({checks::HalfTypeValue(op, type), checks::Dim(op, "n", n),
                                      checks::Ptr(op, "src", src, n), checks::Ptr(op, "dst", dst, n)}));
  RETURN_IF_ERROR(UseDevice());
  return CudaError("UnpackHalf: kernel launch",
                   LaunchUnpackHalf(compute_, type == HalfType::kBf16, n, src, dst));
}

absl::Status CudaBackend::EmbeddingBagForward(int bags, int dim, const int32_t* offsets, const int32_t* ids,
                                              const float* scales, int64_t table_rows, const float* table,
                                              float* out) {
  const char* op = "EmbeddingBagForward";
  RETURN_IF_ERROR(checks::BagArgs(op, bags, dim, offsets, table_rows, table, "table", out, "out"));
  if (bags == 0) return absl::OkStatus();
  RETURN_IF_ERROR(UseDevice());
  PendingCheck pending{PendingCheck::Kind::kBags, op, table_rows, ids == nullptr, PointLoss{}, 0};
  ASSIGN_OR_RETURN(unsigned long long* bag_checks, ReserveChecks(pending, 2));
  RETURN_IF_ERROR(CudaError("EmbeddingBagForward: check launch",
                            LaunchCheckBags(compute_, bags, offsets, ids, table_rows, bag_checks)));
  return CudaError(
      "EmbeddingBagForward: kernel launch",
      LaunchEmbeddingBagForward(compute_, bags, dim, offsets, ids, scales, table, out, bag_checks));
}

absl::Status CudaBackend::EmbeddingBagBackward(int bags, int dim, const int32_t* offsets, const int32_t* ids,
                                               const float* scales, int64_t table_rows, const float* dout,
                                               float* dtable) {
  const char* op = "EmbeddingBagBackward";
  RETURN_IF_ERROR(checks::BagArgs(op, bags, dim, offsets, table_rows, dtable, "dtable", dout, "dout"));
  if (bags == 0) return absl::OkStatus();
  RETURN_IF_ERROR(UseDevice());
  PendingCheck pending{PendingCheck::Kind::kBags, op, table_rows, ids == nullptr, PointLoss{}, 0};
  ASSIGN_OR_RETURN(unsigned long long* bag_checks, ReserveChecks(pending, 2));
  RETURN_IF_ERROR(CudaError("EmbeddingBagBackward: check launch",
                            LaunchCheckBags(compute_, bags, offsets, ids, table_rows, bag_checks)));
  return CudaError(
      "EmbeddingBagBackward: kernel launch",
      LaunchEmbeddingBagBackward(compute_, bags, dim, offsets, ids, scales, dout, dtable, bag_checks));
}

absl::Status CudaBackend::CopyColumns(int rows, int cols, const float* src, int src_ld, float* dst,
                                      int dst_ld, bool accumulate) {
  RETURN_IF_ERROR(checks::CopyColumnsArgs("CopyColumns", rows, cols, src, src_ld, dst, dst_ld));
  if (int64_t{rows} * cols == 0) return absl::OkStatus();
  RETURN_IF_ERROR(UseDevice());
  return CudaError("CopyColumns: kernel launch",
                   LaunchCopyColumns(compute_, rows, cols, src, src_ld, dst, dst_ld, accumulate));
}

absl::Status CudaBackend::FmForward(int rows, int vectors, int dim, const float* x, float* out) {
  RETURN_IF_ERROR(checks::InteractionArgs("FmForward", rows, vectors, dim, x, "out", out, rows));
  if (rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(UseDevice());
  return CudaError("FmForward: kernel launch", LaunchFmForward(compute_, rows, vectors, dim, x, out));
}

absl::Status CudaBackend::FmBackward(int rows, int vectors, int dim, const float* x, const float* dout,
                                     float* dx) {
  const char* op = "FmBackward";
  const int64_t elements = int64_t{rows} * vectors * dim;
  RETURN_IF_ERROR(checks::InteractionArgs(op, rows, vectors, dim, x, "dx", dx, elements));
  RETURN_IF_ERROR(checks::Ptr(op, "dout", dout, rows));
  if (elements == 0) return absl::OkStatus();
  RETURN_IF_ERROR(UseDevice());
  return CudaError("FmBackward: kernel launch", LaunchFmBackward(compute_, rows, vectors, dim, x, dout, dx));
}

absl::Status CudaBackend::PairwiseDotForward(int rows, int vectors, int dim, const float* x, float* out) {
  const int64_t pairs = int64_t{vectors} * (vectors - 1) / 2;
  RETURN_IF_ERROR(
      checks::InteractionArgs("PairwiseDotForward", rows, vectors, dim, x, "out", out, rows * pairs));
  if (rows * pairs == 0) return absl::OkStatus();
  RETURN_IF_ERROR(UseDevice());
  return CudaError("PairwiseDotForward: kernel launch",
                   LaunchPairwiseDotForward(compute_, rows, vectors, dim, x, out));
}

absl::Status CudaBackend::PairwiseDotBackward(int rows, int vectors, int dim, const float* x,
                                              const float* dout, float* dx) {
  const char* op = "PairwiseDotBackward";
  const int64_t pairs = int64_t{vectors} * (vectors - 1) / 2;
  const int64_t elements = int64_t{rows} * vectors * dim;
  RETURN_IF_ERROR(checks::InteractionArgs(op, rows, vectors, dim, x, "dx", dx, elements));
  RETURN_IF_ERROR(checks::Ptr(op, "dout", dout, rows * pairs));
  if (elements == 0 || pairs == 0) return absl::OkStatus();
  RETURN_IF_ERROR(UseDevice());
  return CudaError("PairwiseDotBackward: kernel launch",
                   LaunchPairwiseDotBackward(compute_, rows, vectors, dim, x, dout, dx));
}

absl::Status CudaBackend::PointwiseLoss(PointLoss loss, int rows, const float* z, const float* labels,
                                        float grad_scale, float* dz, double* loss_sum) {
  const char* op = "PointwiseLoss";
  RETURN_IF_ERROR(
      checks::FirstError({checks::PointLossValue(op, loss), checks::Dim(op, "rows", rows),
                          checks::Ptr(op, "z", z, rows), checks::Ptr(op, "labels", labels, rows)}));
  if (rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(UseDevice());
  PendingCheck pending{PendingCheck::Kind::kPointLabels, op, 0, false, loss, 0};
  ASSIGN_OR_RETURN(unsigned long long* check, ReserveChecks(pending, 1));
  RETURN_IF_ERROR(CudaError("PointwiseLoss: label check launch",
                            LaunchCheckPointLabels(compute_, ToCode(loss), rows, labels, check)));
  auto* scalars = reinterpret_cast<LossScalars*>(static_cast<char*>(device_state_) + kCheckBytes);
  if (loss_sum != nullptr) {
    RETURN_IF_ERROR(CudaError("PointwiseLoss: cudaMemsetAsync",
                              cudaMemsetAsync(&scalars->loss_sum, 0, sizeof(double), compute_)));
  }
  RETURN_IF_ERROR(CudaError("PointwiseLoss: kernel launch",
                            LaunchPointwiseLoss(compute_, ToCode(loss), rows, z, labels, grad_scale, dz,
                                                loss_sum != nullptr ? &scalars->loss_sum : nullptr, check)));
  if (loss_sum == nullptr) return absl::OkStatus();
  auto* host_scalars = reinterpret_cast<LossScalars*>(static_cast<char*>(host_state_) + kCheckBytes);
  RETURN_IF_ERROR(CudaError("PointwiseLoss: cudaMemcpyAsync",
                            cudaMemcpyAsync(&host_scalars->loss_sum, &scalars->loss_sum, sizeof(double),
                                            cudaMemcpyDeviceToHost, compute_)));
  RETURN_IF_ERROR(FinishCompute("PointwiseLoss: cudaStreamSynchronize"));
  *loss_sum += host_scalars->loss_sum;
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace fulcrum
