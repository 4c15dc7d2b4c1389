// The CTR models' shapes and config checks, apart from their compute (which
// needs BLAS): the scheduler lays out a job's tensors and tables from these.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/table_spec.h"
#include "kernels/ctr_model.h"
#include "kernels/model_util.h"

namespace fulcrum {
namespace kernels {
namespace {

constexpr int64_t kMaxEmbeddingDim = 4096;
constexpr int64_t kMaxHiddenWidth = 65536;
constexpr size_t kMaxHiddenLayers = 16;

// The dot interaction's vectors: x0 (with dense features), then the fields.
int64_t InteractionVectors(const CtrModelConfig& c) { return int64_t{c.num_fields} + (c.num_dense > 0 ? 1 : 0); }

absl::Status ConfigError(const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("CtrModelConfig: ", message));
}

absl::Status CheckRange(const std::string& field, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return ConfigError(absl::StrCat(field, " = ", value, " must be in [", lo, ", ", hi, "]"));
}

absl::Status ValidateSizes(const CtrModelConfig& c) {
  RETURN_IF_ERROR(CheckRange("num_fields", c.num_fields, 0, kMaxClickFields));
  RETURN_IF_ERROR(CheckRange("num_dense", c.num_dense, 0, kMaxClickDense));
  RETURN_IF_ERROR(CheckRange("embedding_dim", c.embedding_dim, 0, kMaxEmbeddingDim));
  if (c.hidden.size() > kMaxHiddenLayers) {
    return ConfigError(
        absl::StrCat("hidden has ", c.hidden.size(), " layers, at most ", kMaxHiddenLayers, " are allowed"));
  }
  for (size_t i = 0; i < c.hidden.size(); ++i) {
    RETURN_IF_ERROR(CheckRange(absl::StrCat("hidden[", i, "]"), c.hidden[i], 1, kMaxHiddenWidth));
  }
  if (c.bottom.size() > kMaxHiddenLayers) {
    return ConfigError(
        absl::StrCat("bottom has ", c.bottom.size(), " layers, at most ", kMaxHiddenLayers, " are allowed"));
  }
  for (size_t i = 0; i < c.bottom.size(); ++i) {
    RETURN_IF_ERROR(CheckRange(absl::StrCat("bottom[", i, "]"), c.bottom[i], 1, kMaxHiddenWidth));
  }
  return absl::OkStatus();
}

absl::Status ValidateEnums(const CtrModelConfig& c) {
  switch (c.activation) {
    case Activation::kNone:
    case Activation::kRelu:
    case Activation::kTanh:
    case Activation::kSigmoid:
      break;
    default:
      return ConfigError(absl::StrCat("activation = ", static_cast<int>(c.activation),
                                      " is not an Activation; use kNone, kRelu, kTanh or kSigmoid"));
  }
  if (c.combiner != BagCombiner::kSum && c.combiner != BagCombiner::kMean) {
    return ConfigError(absl::StrCat("combiner = ", static_cast<int>(c.combiner),
                                    " is not a BagCombiner; use kSum or kMean"));
  }
  return absl::OkStatus();
}

// Which terms read which inputs.
absl::Status ValidateTerms(const CtrModelConfig& c) {
  if (c.num_fields == 0 && c.num_dense == 0) {
    return ConfigError("no inputs: num_fields and num_dense are both 0");
  }
  if (!c.linear && !c.fm && c.hidden.empty()) {
    return ConfigError("no term: set linear, fm or hidden");
  }
  if (c.fm && c.embedding_dim == 0) return ConfigError("fm needs an embedding: set embedding_dim > 0");
  if (c.embedding_dim > 0 && c.num_fields == 0) {
    return ConfigError(absl::StrCat("embedding_dim = ", c.embedding_dim, " needs num_fields > 0"));
  }
  if (c.embedding_dim > 0 && !c.fm && c.hidden.empty()) {
    return ConfigError(
        absl::StrCat("embedding_dim = ", c.embedding_dim,
                     " but no term reads the embedding: set fm or hidden, or embedding_dim = 0"));
  }
  if (!c.hidden.empty() && c.embedding_dim == 0 && c.num_dense == 0) {
    return ConfigError("hidden layers need an input: set embedding_dim > 0 or num_dense > 0");
  }
  if (!c.dot_interaction) {
    if (!c.bottom.empty()) return ConfigError("bottom applies to dot_interaction only");
    return absl::OkStatus();
  }
  if (c.embedding_dim == 0 || c.hidden.empty() || c.fm) {
    return ConfigError("dot_interaction needs embedding_dim > 0 and hidden layers, and no fm");
  }
  if (!c.bottom.empty() && c.num_dense == 0) return ConfigError("bottom needs num_dense > 0");
  const int64_t vectors = InteractionVectors(c);
  if (vectors < 2 || vectors * (vectors - 1) / 2 > kMaxDotInteractionPairs) {
    return ConfigError(absl::StrCat("dot_interaction pairs ", vectors,
                                    " vectors (the fields, and x0 with dense features): it needs at least 2 ",
                                    "and at most ", kMaxDotInteractionPairs, " pairs"));
  }
  return absl::OkStatus();
}

// In int64: CtrDenseTensors takes configs that were not validated.
}  // namespace

std::vector<int64_t> CtrDeepDims(const CtrModelConfig& c) {
  if (c.hidden.empty()) return {};
  const int64_t vectors = InteractionVectors(c);
  std::vector<int64_t> dims = {c.dot_interaction
                                   ? (c.num_dense > 0 ? c.embedding_dim : 0) + vectors * (vectors - 1) / 2
                                   : int64_t{c.num_fields} * c.embedding_dim + c.num_dense};
  dims.insert(dims.end(), c.hidden.begin(), c.hidden.end());
  dims.push_back(1);
  return dims;
}

std::vector<int64_t> CtrBottomDims(const CtrModelConfig& c) {
  if (!c.dot_interaction || c.num_dense == 0) return {};
  std::vector<int64_t> dims = {c.num_dense};
  dims.insert(dims.end(), c.bottom.begin(), c.bottom.end());
  dims.push_back(c.embedding_dim);
  return dims;
}

absl::Status ValidateCtrModelConfig(const CtrModelConfig& config) {
  RETURN_IF_ERROR(ValidateSizes(config));
  RETURN_IF_ERROR(ValidateEnums(config));
  return ValidateTerms(config);
}

std::vector<TensorInfo> CtrDenseTensors(const CtrModelConfig& config) {
  std::vector<TensorInfo> tensors;
  tensors.push_back({"bias", {1}, 1, InitKind::kZeros, 0.0f});
  if (config.linear && config.num_dense > 0) {
    tensors.push_back({"dense.weight", {config.num_dense}, config.num_dense, InitKind::kZeros, 0.0f});
  }
  auto add_layers = [&tensors](const char* name, const std::vector<int64_t>& dims) {
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
      const int64_t in = dims[i], out = dims[i + 1];
      const float glorot = std::sqrt(6.0f / static_cast<float>(in + out));
      const std::string prefix = absl::StrCat(name, i);
      tensors.push_back({prefix + ".weight", {in, out}, in * out, InitKind::kUniform, glorot});
      tensors.push_back({prefix + ".bias", {out}, out, InitKind::kZeros, 0.0f});
    }
  };
  add_layers("bottom", CtrBottomDims(config));
  add_layers("deep", CtrDeepDims(config));
  return tensors;
}

std::vector<CtrTableInfo> CtrTables(const CtrModelConfig& config) {
  std::vector<CtrTableInfo> tables;
  if (config.linear && config.num_fields > 0) tables.push_back({"linear", 1, InitKind::kZeros, DefaultTableInitScale("linear")});
  if (config.embedding_dim > 0) {
    tables.push_back({"embedding", config.embedding_dim, InitKind::kUniform, DefaultTableInitScale("embedding")});
  }
  return tables;
}

}  // namespace kernels
}  // namespace fulcrum
