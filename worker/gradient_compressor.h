// Compression of a worker's pushed gradients (JobSpec.compression) with
// error feedback: what an encoding leaves out of a partition's gradient
// (TOPK: the values not sent; INT8: the rounding) is added to that
// partition's next gradient, so it arrives late rather than never. The
// servers decode with DecodeValues (common/tensor_codec.h); the residual is
// computed with the same decoder, so it is exactly what the servers missed.
#ifndef FULCRUM_WORKER_GRADIENT_COMPRESSOR_H_
#define FULCRUM_WORKER_GRADIENT_COMPRESSOR_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/sync.h"
#include "fulcrum/v1/job.pb.h"

namespace fulcrum {

class GradientCompressor {
 public:
  // Residuals of at most this many data partitions are kept (a worker
  // running more, under ASP, drops the least recently pushed one's: its
  // left-out values are then lost, never wrong).
  static constexpr int kMaxPartitions = 4;

  // nullptr for CompressionSpec NONE. `tensor_sizes`: the values of each
  // tensor of the model (the shard map's order).
  static std::unique_ptr<GradientCompressor> For(const v1::CompressionSpec& spec, std::vector<int64_t> tensor_sizes);

  GradientCompressor(v1::CompressionSpec::Kind kind, double topk_ratio, std::vector<int64_t> tensor_sizes);

  // The ChunkData.format of what Encode writes.
  v1::WireFormat format() const;

  // The most bytes Encode writes per value of a chunk, rounded up: INT8's
  // 1 (and a 4-byte scale a chunk), TOPK's 8 a kept value times the ratio.
  int WireBytesPerValue() const;

  // Encodes values [offset, offset + n) of tensor `tensor`'s gradient,
  // computed on `partition`, into *out: adds what the partition's earlier
  // pushes left out of those values, encodes the sum, and keeps what the
  // encoding leaves out. `grad` points at the n values.
  absl::Status Encode(int32_t partition, int tensor, int64_t offset, const float* grad, int64_t n, std::string* out);

  // The residual kept for (partition, tensor) (empty if none), for tests.
  std::vector<float> Residual(int32_t partition, int tensor) const;

 private:
  struct Partition {
    int32_t id;
    std::vector<std::vector<float>> residual;  // per tensor, allocated on first use
  };
  // The partition's entry, made most recent (created, evicting the oldest, if absent).
  Partition& Touch(int32_t partition) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const v1::CompressionSpec::Kind kind_;
  const double topk_ratio_;
  const std::vector<int64_t> tensor_sizes_;
  mutable Mutex mu_;
  std::list<Partition> partitions_ ABSL_GUARDED_BY(mu_);  // most recently pushed first
  std::vector<float> sum_ ABSL_GUARDED_BY(mu_);           // scratch: gradient plus residual
  std::vector<float> sent_ ABSL_GUARDED_BY(mu_);          // scratch: what the servers decode
};

}  // namespace fulcrum

#endif  // FULCRUM_WORKER_GRADIENT_COMPRESSOR_H_
