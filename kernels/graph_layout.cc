// Layer graphs' checks and shapes, apart from their compute (which needs
// BLAS): the scheduler validates a job's graph and lays out its tensors and
// tables from these.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/table_spec.h"
#include "kernels/graph_model.h"
#include "kernels/model_util.h"

namespace fulcrum {
namespace kernels {
namespace {

constexpr size_t kMaxLayers = 256;
constexpr size_t kMaxName = 64;
constexpr int64_t kMaxUnits = 65536;
constexpr int64_t kMaxDim = 1024;
constexpr int64_t kMaxWidth = int64_t{1} << 20;       // values a layer's output has per example
constexpr int64_t kMaxWeight = int64_t{1} << 28;      // floats of one weight
constexpr int64_t kMaxTotalWidth = int64_t{1} << 22;  // values of every layer per example
constexpr int64_t kMaxClasses = 65536;

const char* TypeName(LayerType type) {
  switch (type) {
    case LayerType::kDenseInput: return "DENSE_INPUT";
    case LayerType::kEmbedding: return "EMBEDDING";
    case LayerType::kLinear: return "LINEAR";
    case LayerType::kActivation: return "ACTIVATION";
    case LayerType::kConcat: return "CONCAT";
    case LayerType::kFm: return "FM";
    case LayerType::kDot: return "DOT";
    case LayerType::kAdd: return "ADD";
    case LayerType::kReduceSum: return "REDUCE_SUM";
    case LayerType::kLoss: return "LOSS";
    case LayerType::kUnspecified: break;
  }
  return "TYPE_UNSPECIFIED";
}

absl::Status LayerError(size_t i, const GraphLayer& layer, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("layer ", i, " (\"", layer.name, "\", ", TypeName(layer.type),
                                                 "): ", message));
}

bool GoodName(const std::string& name) {
  if (name.empty() || name.size() > kMaxName) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
  });
}

// Settings that apply to other types only.
absl::Status CheckSettings(size_t i, const GraphLayer& layer) {
  const LayerType t = layer.type;
  if (layer.units != 0 && t != LayerType::kLinear) return LayerError(i, layer, "units applies to LINEAR only");
  if (!layer.table.empty() && t != LayerType::kEmbedding) return LayerError(i, layer, "table applies to EMBEDDING only");
  if (layer.dim != 0 && t != LayerType::kEmbedding) return LayerError(i, layer, "dim applies to EMBEDDING only");
  if (!layer.fields.empty() && t != LayerType::kEmbedding) {
    return LayerError(i, layer, "fields applies to EMBEDDING only");
  }
  if (layer.combiner != BagCombiner::kSum && layer.combiner != BagCombiner::kMean) {
    return LayerError(i, layer, absl::StrCat("combiner ", static_cast<int>(layer.combiner), " is not SUM or MEAN"));
  }
  if (layer.combiner != BagCombiner::kSum && t != LayerType::kEmbedding) {
    return LayerError(i, layer, "combiner applies to EMBEDDING only");
  }
  if (layer.activation != Activation::kNone && t != LayerType::kActivation) {
    return LayerError(i, layer, "activation applies to ACTIVATION only");
  }
  if (layer.loss != LossKind::kSigmoidCrossEntropy && t != LayerType::kLoss) {
    return LayerError(i, layer, "loss applies to LOSS only");
  }
  if (layer.bias && t != LayerType::kAdd) return LayerError(i, layer, "bias applies to ADD only");
  return absl::OkStatus();
}

absl::Status CheckInputCount(size_t i, const GraphLayer& layer) {
  const size_t n = layer.inputs.size();
  switch (layer.type) {
    case LayerType::kDenseInput:
    case LayerType::kEmbedding:
      if (n != 0) return LayerError(i, layer, absl::StrCat("reads no layer, but lists ", n, " inputs"));
      return absl::OkStatus();
    case LayerType::kConcat:
    case LayerType::kDot:
    case LayerType::kAdd:
      if (n < 1 || n > kMaxLayers) return LayerError(i, layer, absl::StrCat("needs 1 to 256 inputs, got ", n));
      return absl::OkStatus();
    default:
      if (n != 1) return LayerError(i, layer, absl::StrCat("needs exactly 1 input, got ", n));
      return absl::OkStatus();
  }
}

// Resolves every layer's inputs and shape; the checks of
// ValidateGraphConfig, in layer order.
absl::Status Resolve(const GraphConfig& config, std::vector<std::vector<int>>* inputs, std::vector<GraphShape>* shapes) {
  if (config.num_fields < 0 || config.num_fields > kMaxClickFields) {
    return absl::InvalidArgumentError(absl::StrCat("graph: num_fields = ", config.num_fields, " is outside [0, 4096]"));
  }
  if (config.num_dense < 0 || config.num_dense > kMaxClickDense) {
    return absl::InvalidArgumentError(absl::StrCat("graph: num_dense = ", config.num_dense, " is outside [0, 65536]"));
  }
  const std::vector<GraphLayer>& layers = config.layers;
  if (layers.empty() || layers.size() > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat("graph: has ", layers.size(), " layers; it needs 1 to 256"));
  }
  std::map<std::string, int> index;
  std::map<std::string, int64_t> table_dims;
  std::vector<bool> read(layers.size(), false);
  int64_t total_width = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const GraphLayer& layer = layers[i];
    if (!GoodName(layer.name)) {
      return LayerError(i, layer, "a name is 1 to 64 letters, digits, '_', '-' or '.'");
    }
    if (layer.type == LayerType::kUnspecified) return LayerError(i, layer, "has no type");
    if (index.count(layer.name) > 0) {
      return LayerError(i, layer, absl::StrCat("has the name of layer ", index[layer.name]));
    }
    RETURN_IF_ERROR(CheckSettings(i, layer));
    RETURN_IF_ERROR(CheckInputCount(i, layer));
    const bool last = i + 1 == layers.size();
    if ((layer.type == LayerType::kLoss) != last) {
      return LayerError(i, layer, last ? "the last layer must be the LOSS" : "a LOSS must be the last layer");
    }
    std::vector<int>& in = (*inputs)[i];
    for (const std::string& name : layer.inputs) {
      const auto it = index.find(name);
      if (it == index.end()) {
        return LayerError(i, layer, absl::StrCat("reads \"", name, "\", which is not a layer before it"));
      }
      in.push_back(it->second);
      read[static_cast<size_t>(it->second)] = true;
    }
    GraphShape& out = (*shapes)[i];
    auto input_shape = [&](size_t k) { return (*shapes)[static_cast<size_t>(in[k])]; };
    auto input_name = [&](size_t k) { return absl::StrCat("\"", layer.inputs[k], "\""); };
    switch (layer.type) {
      case LayerType::kUnspecified:
        break;  // refused above
      case LayerType::kDenseInput:
        if (config.num_dense == 0) return LayerError(i, layer, "the data has no dense features");
        out = {1, config.num_dense};
        break;
      case LayerType::kEmbedding: {
        if (layer.table.empty() || !GoodName(layer.table)) {
          return LayerError(i, layer, "table must name its table (1 to 64 letters, digits, '_', '-' or '.')");
        }
        if (layer.dim < 1 || layer.dim > kMaxDim) {
          return LayerError(i, layer, absl::StrCat("dim = ", layer.dim, " is outside [1, 1024]"));
        }
        if (config.num_fields == 0) return LayerError(i, layer, "the data has no categorical fields");
        std::set<int32_t> seen;
        for (int32_t f : layer.fields) {
          if (f < 0 || f >= config.num_fields) {
            return LayerError(i, layer, absl::StrCat("field ", f, " is outside the data's fields [0, ",
                                                     config.num_fields, ")"));
          }
          if (!seen.insert(f).second) return LayerError(i, layer, absl::StrCat("lists field ", f, " twice"));
        }
        const auto [dim, fresh] = table_dims.try_emplace(layer.table, layer.dim);
        if (!fresh && dim->second != layer.dim) {
          return LayerError(i, layer, absl::StrCat("table \"", layer.table, "\" has dim ", dim->second,
                                                   " in an earlier layer, here ", layer.dim));
        }
        if (table_dims.size() > static_cast<size_t>(kMaxTables)) {
          return LayerError(i, layer, absl::StrCat("a model has at most ", kMaxTables, " tables"));
        }
        out = {layer.fields.empty() ? config.num_fields : static_cast<int64_t>(layer.fields.size()), layer.dim};
        break;
      }
      case LayerType::kLinear: {
        if (layer.units < 1 || layer.units > kMaxUnits) {
          return LayerError(i, layer, absl::StrCat("units = ", layer.units, " is outside [1, 65536]"));
        }
        if (input_shape(0).width() * layer.units > kMaxWeight) {
          return LayerError(i, layer, absl::StrCat("its weight would be ", input_shape(0).width(), " x ", layer.units,
                                                   " floats, more than 2^28"));
        }
        out = {1, layer.units};
        break;
      }
      case LayerType::kActivation:
        if (layer.activation == Activation::kNone) return LayerError(i, layer, "activation must be RELU, TANH or SIGMOID");
        if (layer.activation != Activation::kRelu && layer.activation != Activation::kTanh &&
            layer.activation != Activation::kSigmoid) {
          return LayerError(i, layer, "activation must be RELU, TANH or SIGMOID");
        }
        out = input_shape(0);
        break;
      case LayerType::kConcat: {
        bool same_dim = true;
        int64_t vectors = 0, width = 0;
        for (size_t k = 0; k < in.size(); ++k) {
          same_dim = same_dim && input_shape(k).dim == input_shape(0).dim;
          vectors += input_shape(k).vectors;
          width += input_shape(k).width();
        }
        out = same_dim ? GraphShape{vectors, input_shape(0).dim} : GraphShape{1, width};
        break;
      }
      case LayerType::kFm:
        if (input_shape(0).vectors < 2) {
          return LayerError(i, layer, absl::StrCat(input_name(0), " has ", input_shape(0).vectors,
                                                   " vector; FM pairs at least 2 (an EMBEDDING of 2 or more fields, "
                                                   "or a CONCAT of vectors of one dim)"));
        }
        out = {1, 1};
        break;
      case LayerType::kDot: {
        int64_t vectors = 0, joined = 0;
        for (size_t k = 0; k < in.size(); ++k) {
          if (input_shape(k).dim != input_shape(0).dim) {
            return LayerError(i, layer, absl::StrCat(input_name(k), "'s vectors have ", input_shape(k).dim,
                                                     " values, ", input_name(0), "'s ", input_shape(0).dim,
                                                     "; DOT pairs vectors of one dim"));
          }
          vectors += input_shape(k).vectors;
          joined += input_shape(k).width();
        }
        // A backend lays the inputs side by side (and their gradients): an
        // input listed many times counts each time.
        if (joined > kMaxWidth) {
          return LayerError(
              i, layer,
              absl::StrCat("its inputs take ", joined, " values an example together, more than 2^20"));
        }
        if (vectors < 2) return LayerError(i, layer, "its inputs have 1 vector; DOT pairs at least 2");
        if (vectors * (vectors - 1) / 2 > kMaxWidth) {
          return LayerError(i, layer, absl::StrCat(vectors, " vectors make more than 2^20 pairs"));
        }
        out = {1, vectors * (vectors - 1) / 2};
        break;
      }
      case LayerType::kAdd:
        for (size_t k = 0; k < in.size(); ++k) {
          if (input_shape(k).width() != input_shape(0).width()) {
            return LayerError(i, layer, absl::StrCat(input_name(k), " has ", input_shape(k).width(), " values, ",
                                                     input_name(0), " ", input_shape(0).width(),
                                                     "; ADD sums equal widths"));
          }
        }
        out = input_shape(0);
        break;
      case LayerType::kReduceSum:
        out = {1, 1};
        break;
      case LayerType::kLoss: {
        const int64_t width = input_shape(0).width();
        if (layer.loss == LossKind::kSoftmaxCrossEntropy) {
          if (width < 2 || width > kMaxClasses) {
            return LayerError(i, layer, absl::StrCat(input_name(0), " has ", width,
                                                     " values; SOFTMAX_CROSS_ENTROPY scores 2 to 65536 classes"));
          }
        } else if (layer.loss == LossKind::kSigmoidCrossEntropy || layer.loss == LossKind::kMeanSquaredError) {
          if (width != 1) {
            return LayerError(i, layer, absl::StrCat(input_name(0), " has ", width,
                                                     " values; this loss scores 1 (a LINEAR of 1 unit, an FM, "
                                                     "a REDUCE_SUM, or an ADD of those)"));
          }
        } else {
          return LayerError(i, layer, "loss is not a known loss");
        }
        out = input_shape(0);
        break;
      }
    }
    if (out.width() > kMaxWidth) {
      return LayerError(i, layer, absl::StrCat("has ", out.width(), " values an example, more than 2^20"));
    }
    total_width += out.width();
    if (total_width > kMaxTotalWidth) {
      return LayerError(i, layer, "the layers up to here have more than 2^22 values an example");
    }
    index[layer.name] = static_cast<int>(i);
  }
  for (size_t i = 0; i + 1 < layers.size(); ++i) {
    if (!read[i]) return LayerError(i, layers[i], "no later layer reads it");
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<GraphShape> GraphShapes(const GraphConfig& config) {
  std::vector<std::vector<int>> inputs(config.layers.size());
  std::vector<GraphShape> shapes(config.layers.size());
  (void)Resolve(config, &inputs, &shapes);
  return shapes;
}

absl::Status ValidateGraphConfig(const GraphConfig& config) {
  std::vector<std::vector<int>> inputs(config.layers.size());
  std::vector<GraphShape> shapes(config.layers.size());
  return Resolve(config, &inputs, &shapes);
}

int64_t GraphValuesPerExample(const GraphConfig& config) {
  const std::vector<GraphShape> shapes = GraphShapes(config);
  std::map<std::string, int64_t> width;
  int64_t total = 0;
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const GraphLayer& layer = config.layers[i];
    total += shapes[i].width();
    // A DOT's inputs side by side (GraphModelOnBackend).
    if (layer.type == LayerType::kDot) {
      for (const std::string& input : layer.inputs) total += width[input];
    }
    width[layer.name] = shapes[i].width();
  }
  return total;
}

std::vector<TensorInfo> GraphDenseTensors(const GraphConfig& config) {
  const std::vector<GraphShape> shapes = GraphShapes(config);
  std::map<std::string, int64_t> width;
  for (size_t i = 0; i < config.layers.size(); ++i) width[config.layers[i].name] = shapes[i].width();
  std::vector<TensorInfo> tensors;
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const GraphLayer& layer = config.layers[i];
    if (layer.type == LayerType::kLinear) {
      const int64_t in = width[layer.inputs[0]], out = layer.units;
      const float glorot = std::sqrt(6.0f / static_cast<float>(in + out));
      tensors.push_back({layer.name + ".weight", {in, out}, in * out, InitKind::kUniform, glorot});
      tensors.push_back({layer.name + ".bias", {out}, out, InitKind::kZeros, 0.0f});
    } else if (layer.type == LayerType::kAdd && layer.bias) {
      tensors.push_back({layer.name + ".bias", {shapes[i].width()}, shapes[i].width(), InitKind::kZeros, 0.0f});
    }
  }
  return tensors;
}

std::vector<CtrTableInfo> GraphTables(const GraphConfig& config) {
  std::vector<CtrTableInfo> tables;
  for (const GraphLayer& layer : config.layers) {
    if (layer.type != LayerType::kEmbedding) continue;
    const bool known = std::any_of(tables.begin(), tables.end(),
                                   [&](const CtrTableInfo& t) { return t.name == layer.table; });
    if (!known) tables.push_back({layer.table, layer.dim, InitKind::kUniform, DefaultTableInitScale(layer.table)});
  }
  return tables;
}

std::vector<std::vector<int32_t>> GraphTableFields(const GraphConfig& config) {
  const std::vector<CtrTableInfo> tables = GraphTables(config);
  std::vector<std::set<int32_t>> fields(tables.size());
  for (const GraphLayer& layer : config.layers) {
    if (layer.type != LayerType::kEmbedding) continue;
    size_t t = 0;
    while (tables[t].name != layer.table) ++t;
    if (layer.fields.empty()) {
      for (int32_t f = 0; f < config.num_fields; ++f) fields[t].insert(f);
    } else {
      fields[t].insert(layer.fields.begin(), layer.fields.end());
    }
  }
  std::vector<std::vector<int32_t>> out;
  for (const auto& set : fields) out.emplace_back(set.begin(), set.end());
  return out;
}

absl::Status GraphAsMlp(const std::vector<GraphLayer>& layers, int32_t classes, std::vector<int>* hidden,
                        Activation* activation, std::vector<std::string>* linear_names) {
  hidden->clear();
  linear_names->clear();
  *activation = Activation::kNone;
  const std::string shape =
      "over FASHION_MNIST or SYNTHETIC data a graph is an MLP: DENSE_INPUT, LINEAR layers each but the last "
      "followed by one ACTIVATION of one kind, then a SOFTMAX_CROSS_ENTROPY LOSS";
  if (layers.size() < 3) {
    return absl::InvalidArgumentError(absl::StrCat("graph: has ", layers.size(), " layers; ", shape));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const GraphLayer& layer = layers[i];
    const bool first = i == 0, last = i + 1 == layers.size();
    LayerType want = LayerType::kLinear;
    if (first) {
      want = LayerType::kDenseInput;
    } else if (last) {
      want = LayerType::kLoss;
    } else if (layers[i - 1].type == LayerType::kLinear) {
      want = LayerType::kActivation;  // a LINEAR before the last is a hidden one
    }
    if (layer.type != want) {
      return LayerError(i, layer, absl::StrCat("expected ", TypeName(want), ": ", shape));
    }
    if (!first && (layer.inputs.size() != 1 || layer.inputs[0] != layers[i - 1].name)) {
      return LayerError(i, layer, absl::StrCat("must read the layer before it, \"", layers[i - 1].name, "\": ", shape));
    }
    if (layer.type == LayerType::kActivation) {
      if (*activation != Activation::kNone && layer.activation != *activation) {
        return LayerError(i, layer, absl::StrCat("the MLP takes one activation, ", ActivationName(*activation),
                                                 " before: ", shape));
      }
      *activation = layer.activation;
    }
    if (layer.type == LayerType::kLinear) {
      linear_names->push_back(layer.name);
      if (i + 2 < layers.size()) hidden->push_back(layer.units);  // not the output layer
    }
    if (last && layer.loss != LossKind::kSoftmaxCrossEntropy) {
      return LayerError(i, layer, absl::StrCat("loss must be SOFTMAX_CROSS_ENTROPY: ", shape));
    }
  }
  const GraphLayer& output = layers[layers.size() - 2];
  if (output.type != LayerType::kLinear) {
    return LayerError(layers.size() - 2, output, absl::StrCat("expected LINEAR (the output layer): ", shape));
  }
  if (classes > 0 && output.units != classes) {
    return LayerError(layers.size() - 2, output,
                      absl::StrCat("units = ", output.units, ", the data has ", classes, " classes"));
  }
  return absl::OkStatus();
}

LossKind GraphLossOf(const GraphConfig& config) {
  return config.layers.empty() ? LossKind::kSigmoidCrossEntropy : config.layers.back().loss;
}

GraphLayer MakeLayer(std::string name, LayerType type, std::vector<std::string> inputs) {
  GraphLayer layer;
  layer.name = std::move(name);
  layer.type = type;
  layer.inputs = std::move(inputs);
  return layer;
}

GraphLayer LinearLayer(std::string name, std::string input, int32_t units) {
  GraphLayer layer = MakeLayer(std::move(name), LayerType::kLinear, {std::move(input)});
  layer.units = units;
  return layer;
}

GraphLayer ActivationLayer(std::string name, std::string input, Activation activation) {
  GraphLayer layer = MakeLayer(std::move(name), LayerType::kActivation, {std::move(input)});
  layer.activation = activation;
  return layer;
}

GraphLayer EmbeddingLayer(std::string name, std::string table, int32_t dim, std::vector<int32_t> fields,
                          BagCombiner combiner) {
  GraphLayer layer = MakeLayer(std::move(name), LayerType::kEmbedding);
  layer.table = std::move(table);
  layer.dim = dim;
  layer.fields = std::move(fields);
  layer.combiner = combiner;
  return layer;
}

GraphConfig CtrModelAsGraph(const CtrModelConfig& c) {
  GraphConfig g;
  g.num_fields = c.num_fields;
  g.num_dense = c.num_dense;
  std::vector<std::string> terms;
  if (c.num_dense > 0) g.layers.push_back(MakeLayer("dense", LayerType::kDenseInput));
  if (c.linear && c.num_fields > 0) {
    g.layers.push_back(EmbeddingLayer("lin_ids", "linear", 1, {}, c.combiner));
    g.layers.push_back(MakeLayer("wide", LayerType::kReduceSum, {"lin_ids"}));
    terms.push_back("wide");
  }
  if (c.linear && c.num_dense > 0) {
    g.layers.push_back(LinearLayer("dense_lin", "dense", 1));
    terms.push_back("dense_lin");
  }
  if (c.embedding_dim > 0) g.layers.push_back(EmbeddingLayer("emb", "embedding", c.embedding_dim, {}, c.combiner));
  if (c.fm) {
    g.layers.push_back(MakeLayer("fm", LayerType::kFm, {"emb"}));
    terms.push_back("fm");
  }
  if (!c.hidden.empty()) {
    std::string input;
    if (c.dot_interaction) {
      std::vector<std::string> vectors;
      if (c.num_dense > 0) {
        std::string x = "dense";
        std::vector<int> widths = c.bottom;
        widths.push_back(c.embedding_dim);
        for (size_t i = 0; i < widths.size(); ++i) {
          g.layers.push_back(LinearLayer("bottom" + std::to_string(i), x, widths[i]));
          g.layers.push_back(ActivationLayer("bact" + std::to_string(i), "bottom" + std::to_string(i), c.activation));
          x = "bact" + std::to_string(i);
        }
        vectors.push_back(x);
      }
      vectors.push_back("emb");
      g.layers.push_back(MakeLayer("dots", LayerType::kDot, vectors));
      if (c.num_dense > 0) {
        g.layers.push_back(MakeLayer("inter", LayerType::kConcat, {vectors[0], "dots"}));
        input = "inter";
      } else {
        input = "dots";
      }
    } else {
      std::vector<std::string> parts;
      if (c.embedding_dim > 0) parts.push_back("emb");
      if (c.num_dense > 0) parts.push_back("dense");
      g.layers.push_back(MakeLayer("deep_in", LayerType::kConcat, parts));
      input = "deep_in";
    }
    std::vector<int> widths = c.hidden;
    widths.push_back(1);
    for (size_t i = 0; i < widths.size(); ++i) {
      const std::string name = "deep" + std::to_string(i);
      g.layers.push_back(LinearLayer(name, input, widths[i]));
      input = name;
      if (i + 1 < widths.size()) {
        g.layers.push_back(ActivationLayer("act" + std::to_string(i), name, c.activation));
        input = "act" + std::to_string(i);
      }
    }
    terms.push_back(input);
  }
  GraphLayer logit = MakeLayer("logit", LayerType::kAdd, terms);
  logit.bias = true;
  g.layers.push_back(logit);
  g.layers.push_back(MakeLayer("loss", LayerType::kLoss, {"logit"}));
  return g;
}

std::vector<int> CtrTensorsOfGraph(const CtrModelConfig& config) {
  const std::map<std::string, std::string> renamed = {{"logit.bias", "bias"}, {"dense_lin.weight", "dense.weight"}};
  std::map<std::string, int> kind_index;
  const std::vector<TensorInfo> kind = CtrDenseTensors(config);
  for (size_t t = 0; t < kind.size(); ++t) kind_index[kind[t].name] = static_cast<int>(t);
  std::vector<int> mapped;
  for (const TensorInfo& tensor : GraphDenseTensors(CtrModelAsGraph(config))) {
    const auto rename = renamed.find(tensor.name);
    const auto found = kind_index.find(rename == renamed.end() ? tensor.name : rename->second);
    mapped.push_back(found == kind_index.end() ? -1 : found->second);
  }
  return mapped;
}

int32_t GraphOutputWidth(const GraphConfig& config) {
  const std::vector<GraphShape> shapes = GraphShapes(config);
  return shapes.empty() ? 0 : static_cast<int32_t>(shapes.back().width());
}

}  // namespace kernels
}  // namespace fulcrum
