#include "scheduler/admission.h"

#include <string>
#include <vector>

#include "common/test_util.h"
#include "gtest/gtest.h"
#include "kernels/model_from_spec.h"
#include "scheduler/job_spec.h"

namespace fulcrum {
namespace {

// What a server holds a parameter with: its value, the optimizer's state
// slots (server/optimizer.h: OptimizerStateSlots) and, in BSP, a gradient per
// data partition, their sum and the step-before values.
TEST(AdmissionTest, ServerBytesCountEveryOptimizersStateSlots) {
  struct Case {
    std::string name;
    v1::OptimizerSpec spec;
    int slots;
  };
  std::vector<Case> cases;
  auto add = [&cases](const std::string& name, v1::OptimizerSpec::Kind kind, float momentum, bool centered,
                      int slots) {
    Case c{name, {}, slots};
    c.spec.set_kind(kind);
    c.spec.set_lr(0.1f);
    c.spec.set_momentum(momentum);
    c.spec.set_centered(centered);
    cases.push_back(c);
  };
  add("sgd", v1::OptimizerSpec::SGD, 0, false, 0);
  add("sgd momentum", v1::OptimizerSpec::SGD, 0.9f, false, 1);
  add("adam", v1::OptimizerSpec::ADAM, 0, false, 2);
  add("adamw", v1::OptimizerSpec::ADAMW, 0, false, 2);
  add("adagrad", v1::OptimizerSpec::ADAGRAD, 0, false, 1);
  add("rmsprop", v1::OptimizerSpec::RMSPROP, 0, false, 1);
  add("rmsprop momentum", v1::OptimizerSpec::RMSPROP, 0.9f, false, 2);
  add("rmsprop centered momentum", v1::OptimizerSpec::RMSPROP, 0.9f, true, 3);
  for (const Case& c : cases) {
    for (v1::Mode mode : {v1::BSP, v1::ASP}) {
      v1::JobSpec spec;
      spec.mutable_model()->set_kind(v1::ModelSpec::SOFTMAX_REGRESSION);
      spec.mutable_data()->set_dataset(v1::DataSpec::SYNTHETIC);
      spec.mutable_data()->set_synthetic_examples(100);
      spec.mutable_data()->set_synthetic_features(4);
      spec.mutable_data()->set_synthetic_classes(2);
      spec.mutable_data()->set_batch_size(10);
      *spec.mutable_optimizer() = c.spec;
      spec.set_mode(mode);
      spec.set_num_workers(3);
      ApplyJobSpecDefaults(&spec);
      ASSERT_TRUE(ValidateJobSpec(spec).ok()) << c.name << ": " << ValidateJobSpec(spec);
      const int64_t extra = mode == v1::BSP ? 3 + 2 : 0;
      EXPECT_EQ(ClaimsOf(spec).server_bytes_per_parameter, 4 * (1 + c.slots + extra))
          << c.name << " " << v1::Mode_Name(mode);
    }
  }
}

}  // namespace
}  // namespace fulcrum

namespace fulcrum {
namespace {

// A click job claims what its workers hold: the synthetic click test set,
// not a training set (made per step) nor Fashion-MNIST's shape.
TEST(AdmissionTest, ClickDataClaimsItsTestSetOnly) {
  v1::DataSpec data;
  data.set_dataset(v1::DataSpec::SYNTHETIC_CTR);
  data.mutable_synthetic_ctr()->set_examples(50000000);
  data.mutable_synthetic_ctr()->set_fields(10);
  data.mutable_synthetic_ctr()->set_dense(3);
  DataShape shape = DataShapeOf(data);
  EXPECT_EQ(shape.train_examples, 0);
  EXPECT_EQ(shape.test_examples, 1000000) << "the test set is capped";
  EXPECT_EQ(shape.features, 13);
  EXPECT_EQ(shape.classes, 2);
  // Held as the worker holds it: label, dense values, per field an id's
  // key, weight and offset, and a score.
  EXPECT_EQ(shape.example_bytes, 4 + 3 * 4 + 10 * 20 + 4);
  data.set_dataset(v1::DataSpec::LIBSVM);
  data.clear_synthetic_ctr();
  data.set_path("/data/x.libsvm");
  shape = DataShapeOf(data);
  EXPECT_EQ(shape.train_examples + shape.test_examples, 0) << "files are measured by the workers";
  EXPECT_EQ(shape.features, 1);
}

// A preset click kind claims its batch's scratch as its layer graph does,
// and one past 2^28 values a batch is refused naming the kind: a DLRM of 64
// fields of 1024 floats holds more than 64k values an example.
TEST(AdmissionTest, APresetClickKindClaimsItsBatchScratch) {
  v1::JobSpec spec;
  spec.set_num_workers(1);
  spec.mutable_optimizer()->set_lr(0.01f);
  spec.mutable_model()->set_kind(v1::ModelSpec::DLRM);
  spec.mutable_model()->set_embedding_dim(64);
  spec.mutable_model()->add_hidden_sizes(1);
  v1::DataSpec* data = spec.mutable_data();
  data->set_dataset(v1::DataSpec::SYNTHETIC_CTR);
  data->mutable_synthetic_ctr()->set_examples(20000);
  data->mutable_synthetic_ctr()->set_fields(64);
  data->set_batch_size(2048);
  ApplyJobSpecDefaults(&spec);
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  const int64_t per_example = ClickValuesPerExample(LayoutFor(spec, 0, 0));
  EXPECT_GT(per_example, 64 * 64) << "the fields' embeddings at least";
  const JobClaims claims = ClaimsOf(spec);
  EXPECT_GE(claims.worker_bytes - claims.worker_data_bytes, 2048 * per_example * 4 * 2)
      << "values and gradients of a batch";

  spec.mutable_model()->set_embedding_dim(1024);
  spec.mutable_data()->set_batch_size(8192);
  const absl::Status refused = ValidateJobSpec(spec);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(Contains(refused.message(), "model (DLRM) takes")) << refused;
  EXPECT_TRUE(Contains(refused.message(), "values for a batch of 8192")) << refused;
  EXPECT_TRUE(Contains(refused.message(), "more than 2^28")) << refused;
}

// A click step's ids are held whole, every micro-batch of
// data.gradientAccumulation at once, and the next step's beside them: a
// logistic regression over 256 fields in steps of 2^20 examples holds 2^28
// ids a step, each with its weight and offset, about 5.4 GB a copy.
TEST(AdmissionTest, AClickStepClaimsItsIdsEveryMicroBatchOfIt) {
  v1::JobSpec spec;
  spec.set_num_workers(1);
  spec.mutable_optimizer()->set_lr(0.01f);
  spec.mutable_model()->set_kind(v1::ModelSpec::LOGISTIC_REGRESSION);
  v1::DataSpec* data = spec.mutable_data();
  data->set_dataset(v1::DataSpec::SYNTHETIC_CTR);
  data->mutable_synthetic_ctr()->set_examples(20000);
  data->mutable_synthetic_ctr()->set_fields(256);
  data->set_batch_size(1024);
  ApplyJobSpecDefaults(&spec);
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  const int64_t one_batch = ClaimsOf(spec).worker_bytes;
  spec.mutable_data()->set_gradient_accumulation(1024);
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  const int64_t ids = int64_t{1024} * 1024 * 256;
  EXPECT_GE(ClaimsOf(spec).worker_bytes - one_batch, 2 * (ids - 1024 * 256) * 20)
      << "this step's ids and the next's, each with its weight and offset";
  EXPECT_LT(one_batch, int64_t{1} << 30) << "a step of one batch is small";
}

}  // namespace
}  // namespace fulcrum
