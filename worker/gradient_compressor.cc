#include "worker/gradient_compressor.h"

#include <algorithm>
#include <cmath>

#include "common/tensor_codec.h"
#include "absl/strings/str_cat.h"

namespace fulcrum {

std::unique_ptr<GradientCompressor> GradientCompressor::For(const v1::CompressionSpec& spec,
                                                            std::vector<int64_t> tensor_sizes) {
  if (spec.kind() == v1::CompressionSpec::NONE) return nullptr;
  const double ratio = spec.topk_ratio() > 0 ? spec.topk_ratio() : kDefaultTopkRatio;
  return std::make_unique<GradientCompressor>(spec.kind(), ratio, std::move(tensor_sizes));
}

GradientCompressor::GradientCompressor(v1::CompressionSpec::Kind kind, double topk_ratio,
                                       std::vector<int64_t> tensor_sizes)
    : kind_(kind), topk_ratio_(topk_ratio), tensor_sizes_(std::move(tensor_sizes)) {}

v1::WireFormat GradientCompressor::format() const {
  return kind_ == v1::CompressionSpec::TOPK ? v1::WIRE_TOPK : v1::WIRE_INT8;
}

int GradientCompressor::WireBytesPerValue() const {
  if (kind_ != v1::CompressionSpec::TOPK) return 1;
  return static_cast<int>(std::clamp(std::ceil(8 * topk_ratio_), 1.0, 8.0));
}

GradientCompressor::Partition& GradientCompressor::Touch(int32_t partition) {
  auto it = std::find_if(partitions_.begin(), partitions_.end(), [&](const Partition& p) { return p.id == partition; });
  if (it != partitions_.end()) {
    partitions_.splice(partitions_.begin(), partitions_, it);
  } else {
    if (static_cast<int>(partitions_.size()) >= kMaxPartitions) partitions_.pop_back();
    partitions_.push_front(Partition{partition, std::vector<std::vector<float>>(tensor_sizes_.size())});
  }
  return partitions_.front();
}

absl::Status GradientCompressor::Encode(int32_t partition, int tensor, int64_t offset, const float* grad, int64_t n,
                                std::string* out) {
  MutexLock lock(&mu_);
  std::vector<float>& residual = Touch(partition).residual[tensor];
  if (residual.empty()) residual.assign(static_cast<size_t>(tensor_sizes_[tensor]), 0.0f);
  float* kept = residual.data() + offset;
  sum_.resize(static_cast<size_t>(n));
  sent_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sum_[i] = grad[i] + kept[i];
  if (kind_ == v1::CompressionSpec::TOPK) {
    const auto k = static_cast<int64_t>(std::ceil(topk_ratio_ * static_cast<double>(n)));
    EncodeTopK(sum_.data(), n, std::max<int64_t>(k, n > 0 ? 1 : 0), out);
  } else {
    EncodeInt8(sum_.data(), n, out);
  }
  // What the servers will take; the rest waits for the next push.
  absl::Status decoded = DecodeValues(format(), *out, n, sent_.data(), "compressed gradient");
  if (!decoded.ok()) return absl::InternalError(absl::StrCat("our own encoding does not decode: ", decoded.message()));
  for (int64_t i = 0; i < n; ++i) kept[i] = sum_[i] - sent_[i];
  return absl::OkStatus();
}

std::vector<float> GradientCompressor::Residual(int32_t partition, int tensor) const {
  MutexLock lock(&mu_);
  for (const Partition& p : partitions_) {
    if (p.id == partition) return p.residual[tensor];
  }
  return {};
}

}  // namespace fulcrum
