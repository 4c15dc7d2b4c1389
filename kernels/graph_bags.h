// The bags of a layer graph's EMBEDDING layer, one per example and field
// it reads: shared by GraphModel's host pass (graph_model.cc) and the bag
// arrays its backend pass builds (graph_model_backend.cc). Internal to
// kernels/.
#ifndef FULCRUM_KERNELS_GRAPH_BAGS_H_
#define FULCRUM_KERNELS_GRAPH_BAGS_H_

#include <cstdint>
#include <vector>

#include "kernels/ctr_model.h"
#include "kernels/graph_model.h"

namespace fulcrum {
namespace kernels {

// Calls id(at, row, scale) for each id of each bag an EMBEDDING layer reads,
// example by example, vector by vector: `vectors` of them, the fields
// `chosen` (all `fields` of an example when empty), and bag_end() after
// each bag, empty ones too. `at` is the vector's offset in the layer's
// output, `row` the id's row number in its table, `scale` its weight times
// the bag's factor (for a mean, 1 / the bag's total weight, or 0 for an
// empty bag or one of weight 0).
template <typename Id, typename BagEnd>
void ForEachBagId(const GraphBatch& batch, int fields, const std::vector<int>& chosen, int vectors, int dim,
                  BagCombiner combiner, const int32_t* rows, Id id, BagEnd bag_end) {
  const int64_t width = int64_t{vectors} * dim;
  auto weight = [&](int64_t j) { return batch.weights == nullptr ? 1.0f : batch.weights[j]; };
  for (int32_t e = 0; e < batch.batch; ++e) {
    for (int v = 0; v < vectors; ++v) {
      const int f = chosen.empty() ? v : chosen[static_cast<size_t>(v)];
      const int64_t bag = int64_t{e} * fields + f;
      const int64_t begin = batch.offsets[bag], end = batch.offsets[bag + 1];
      float factor = 1.0f;
      if (combiner == BagCombiner::kMean) {
        double total = 0;
        for (int64_t j = begin; j < end; ++j) total += weight(j);
        factor = total > 0 ? static_cast<float>(1.0 / total) : 0.0f;
      }
      const int64_t at = e * width + int64_t{v} * dim;
      for (int64_t j = begin; j < end; ++j) id(at, rows[j], weight(j) * factor);
      bag_end();
    }
  }
}

template <typename Id>
void ForEachBagId(const GraphBatch& batch, int fields, const std::vector<int>& chosen, int vectors, int dim,
                  BagCombiner combiner, const int32_t* rows, Id id) {
  ForEachBagId(batch, fields, chosen, vectors, dim, combiner, rows, id, [] {});
}

}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_GRAPH_BAGS_H_
