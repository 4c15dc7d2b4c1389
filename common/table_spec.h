// Defaults of a job's sparse tables (job.proto TableSpec), shared by the
// scheduler (validation, layout) and the servers (setup).
#ifndef FULCRUM_COMMON_TABLE_SPEC_H_
#define FULCRUM_COMMON_TABLE_SPEC_H_

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/data_partition.h"
#include "fulcrum/v1/job.pb.h"

namespace fulcrum {

constexpr float kDefaultTableLr = 0.05f;
// Buckets of a table when its spec leaves them out, per shard.
constexpr int32_t kDefaultBucketsPerShard = 8;
constexpr int32_t kMaxTableBuckets = 4096;
constexpr int32_t kMaxTables = 16;
// Checkpoint chunk ids of table buckets: TableChunkId(table, bucket), above
// every dense chunk's id.
constexpr int32_t kTableChunkBase = 1 << 30;
inline int32_t TableChunkId(int32_t table, int32_t bucket) {
  return kTableChunkBase + table * kMaxTableBuckets + bucket;
}
// The table and bucket of a TableChunkId (chunk_id >= kTableChunkBase).
struct TableBucket {
  int32_t table;
  int32_t bucket;
};
inline TableBucket TableBucketOf(int32_t chunk_id) {
  const int32_t relative = chunk_id - kTableChunkBase;
  return {relative / kMaxTableBuckets, relative % kMaxTableBuckets};
}
// Requests one sparse push of a partition step may take to one server.
constexpr int32_t kMaxPushParts = 1 << 16;
// The highest step a table takes or keeps (a push's, a pull's, a restored
// or copied position, expireAfter): the servers' bound on any step.
constexpr int64_t kMaxSparseStep = kMaxJobStep;

// Rows of "linear" start at 0 (a logistic regression's usual start); other
// tables uniform in [-0.05, 0.05]: small enough that the FM and deep terms
// start near 0 with many fields, large enough that the FM gradient (which
// scales with the other fields' rows) is not stuck.
inline float DefaultTableInitScale(const std::string& table) { return table == "linear" ? 0.0f : 0.05f; }

// The categorical fields and dense features of a click model's data.
// LIBSVM: one field (libsvm.fields with libffm lines), no dense features;
// CSV: its CATEGORICAL and DENSE columns.
inline int32_t CsvColumns(const v1::DataSpec& data, v1::CsvSpec::Column kind) {
  int32_t n = 0;
  for (int c : data.csv().columns()) n += c == kind ? 1 : 0;
  return n;
}
// Fashion-MNIST's features (28 x 28 pixels) and classes.
constexpr int32_t kFashionMnistFeatures = 784;
constexpr int32_t kFashionMnistClasses = 10;

// Dense data (FASHION_MNIST, SYNTHETIC) under a GRAPH that is not an MLP:
// no fields, its features as dense ones.
inline int32_t ClickFields(const v1::DataSpec& data) {
  switch (data.dataset()) {
    case v1::DataSpec::FASHION_MNIST:
    case v1::DataSpec::SYNTHETIC: return 0;
    case v1::DataSpec::LIBSVM:
      return std::max(data.libsvm().fields(), 1);
    case v1::DataSpec::CSV: return CsvColumns(data, v1::CsvSpec::CATEGORICAL);
    default: return data.synthetic_ctr().fields() > 0 ? data.synthetic_ctr().fields() : 8;
  }
}
inline int32_t ClickDense(const v1::DataSpec& data) {
  switch (data.dataset()) {
    case v1::DataSpec::FASHION_MNIST: return kFashionMnistFeatures;
    case v1::DataSpec::SYNTHETIC: return data.synthetic_features();
    case v1::DataSpec::LIBSVM: return 0;
    case v1::DataSpec::CSV: return CsvColumns(data, v1::CsvSpec::DENSE);
    default: return data.synthetic_ctr().dense();
  }
}

// The bounds of a job spec's data.syntheticCtr (scheduler/job_spec_click.cc);
// fulcrum-ctr-data-dump's flags keep them too.
constexpr int64_t kMaxSyntheticCtrExamples = 100000000;
constexpr int32_t kMaxSyntheticCtrFields = 256;
constexpr int32_t kMaxSyntheticCtrDense = 1024;
constexpr int32_t kMaxSyntheticCtrFmDim = 64;
// The most fields of libffm lines (data.libsvm.fields), as CSV's columns.
constexpr int32_t kMaxLibsvmFields = 4096;

// The synthetic click test set: a fifth of the training examples, at least 1
// and at most 10^6 (the workers hold it).
inline int64_t SyntheticCtrTestExamples(int64_t train_examples) {
  return std::clamp<int64_t>(train_examples / 5, 1, 1000000);
}
// Bytes a worker holds a synthetic click example in (worker/ctr_data.h
// HeldBytes): a label, the dense values, and per field one id's key, weight
// and offset.
inline int64_t SyntheticCtrExampleBytes(int64_t fields, int64_t dense) { return 4 + 4 * dense + 20 * fields; }

// The dense models' data (features and a class per example).
inline bool IsDenseData(const v1::DataSpec& data) {
  return data.dataset() == v1::DataSpec::FASHION_MNIST || data.dataset() == v1::DataSpec::SYNTHETIC;
}

// The click models (data from sparse features, tables for the ids): the
// click kinds, and a GRAPH unless its data is dense. Over dense data a
// GRAPH of an MLP's shape trains as the MLP; any other trains on the click
// path too (kernels/model_from_spec.h TrainsOnClickPath decides).
inline bool IsClickModel(const v1::JobSpec& spec) {
  switch (spec.model().kind()) {
    case v1::ModelSpec::LOGISTIC_REGRESSION:
    case v1::ModelSpec::FM:
    case v1::ModelSpec::WIDE_AND_DEEP:
    case v1::ModelSpec::DEEPFM:
    case v1::ModelSpec::DLRM:
      return true;
    case v1::ModelSpec::GRAPH:
      return !IsDenseData(spec.data());
    default:
      return false;
  }
}

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_TABLE_SPEC_H_
