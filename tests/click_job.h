// Click jobs for the multi-process tests: a small synthetic click job and
// the best AUC its test set allows.
#ifndef FULCRUM_TESTS_CLICK_JOB_H_
#define FULCRUM_TESTS_CLICK_JOB_H_

#include <cstdint>
#include <string>
#include <vector>

#include "fulcrum/v1/job.pb.h"
#include "worker/ctr_data.h"

namespace fulcrum {

// A click job on synthetic click data small enough to learn in seconds: 4
// fields of 100 ids, 2 dense features; `fm_dim` > 0 adds pairwise
// interactions to the true model.
inline v1::JobSpec ClickSpec(v1::ModelSpec::Kind kind, int32_t fm_dim) {
  v1::JobSpec spec;
  spec.set_name("click");
  spec.mutable_model()->set_kind(kind);
  if (kind != v1::ModelSpec::LOGISTIC_REGRESSION) spec.mutable_model()->set_embedding_dim(4);
  if (kind == v1::ModelSpec::WIDE_AND_DEEP || kind == v1::ModelSpec::DEEPFM || kind == v1::ModelSpec::DLRM) {
    spec.mutable_model()->add_hidden_sizes(16);
  }
  if (kind == v1::ModelSpec::DLRM) spec.mutable_model()->add_bottom_sizes(8);
  for (const char* name : {"linear", "embedding"}) {
    if (kind == v1::ModelSpec::LOGISTIC_REGRESSION && std::string(name) == "embedding") continue;
    if (kind == v1::ModelSpec::DLRM && std::string(name) == "linear") continue;  // no linear terms
    v1::TableSpec* table = spec.mutable_model()->add_tables();
    table->set_name(name);
    table->mutable_optimizer()->set_kind(v1::SparseOptimizerSpec::ADAGRAD);
    table->mutable_optimizer()->set_lr(0.1f);
  }
  v1::DataSpec* data = spec.mutable_data();
  data->set_dataset(v1::DataSpec::SYNTHETIC_CTR);
  v1::SyntheticCtrSpec* ctr = data->mutable_synthetic_ctr();
  ctr->set_examples(50000);
  ctr->set_fields(4);
  ctr->set_vocabulary(100);
  ctr->set_dense(2);
  ctr->set_fm_dim(fm_dim);
  ctr->set_fm_scale(0.5f);
  data->set_batch_size(64);
  data->set_epochs(2);
  data->set_shuffle_seed(7);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
  spec.mutable_optimizer()->set_lr(0.01f);
  spec.set_mode(v1::ASP);
  spec.set_num_workers(2);
  spec.set_replicas(1);
  spec.set_seed(5);
  return spec;
}

// The AUC of the true click probabilities on the job's test set: the best
// any model can reach.
inline double BestAuc(const v1::JobSpec& spec) {
  SyntheticCtrSpec data;
  data.seed = spec.seed();
  const v1::SyntheticCtrSpec& ctr = spec.data().synthetic_ctr();
  data.examples = ctr.examples();
  data.fields = ctr.fields();
  data.vocabulary = ctr.vocabulary();
  data.dense = ctr.dense();
  data.fm_dim = ctr.fm_dim();
  data.fm_scale = ctr.fm_scale();
  std::vector<float> truth;
  const SparseDataset test = MakeSyntheticCtr(data, /*split=*/1, 0, data.examples / 5, &truth);
  return Auc(truth, test.labels);
}

}  // namespace fulcrum

#endif  // FULCRUM_TESTS_CLICK_JOB_H_
