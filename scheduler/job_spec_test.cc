#include "scheduler/job_spec.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "common/test_util.h"
#include "fulcrum/v1/job.pb.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

// A valid MLP on Fashion-MNIST, with defaults applied.
v1::JobSpec BaseSpec() {
  v1::JobSpec spec;
  spec.set_name("base");
  spec.mutable_model()->set_kind(v1::ModelSpec::MLP);
  spec.mutable_model()->add_hidden_sizes(256);
  spec.mutable_data()->set_dataset(v1::DataSpec::FASHION_MNIST);
  spec.mutable_data()->set_batch_size(64);
  spec.mutable_data()->set_epochs(2);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_lr(0.1f);
  spec.set_num_workers(2);
  ApplyJobSpecDefaults(&spec);
  return spec;
}

void MakeSynthetic(v1::JobSpec* spec) {
  v1::DataSpec* data = spec->mutable_data();
  data->set_dataset(v1::DataSpec::SYNTHETIC);
  data->clear_path();
  data->set_synthetic_examples(1000);
  data->set_synthetic_features(10);
  data->set_synthetic_classes(3);
}

// localSgd of `steps` local steps at rate `lr`.
void SetLocalSgd(v1::JobSpec* spec, int32_t steps, float lr) {
  spec->mutable_local_sgd()->set_steps(steps);
  spec->mutable_local_sgd()->set_lr(lr);
}

TEST(JobSpecTest, BaseSpecIsValid) {
  absl::Status s = ValidateJobSpec(BaseSpec());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(JobSpecTest, OtherValidVariantsPass) {
  std::vector<std::function<void(v1::JobSpec*)>> variants = {
      [](v1::JobSpec* s) {
        s->mutable_model()->set_kind(v1::ModelSpec::SOFTMAX_REGRESSION);
        s->mutable_model()->clear_hidden_sizes();
      },
      [](v1::JobSpec* s) { MakeSynthetic(s); },
      [](v1::JobSpec* s) {
        s->mutable_data()->set_batch_size(1024);
        s->mutable_data()->set_gradient_accumulation(1024);
      },
      [](v1::JobSpec* s) { SetLocalSgd(s, 8, 0.05f); },
      [](v1::JobSpec* s) {
        s->mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
        s->mutable_optimizer()->set_beta1(0.8f);
        s->mutable_optimizer()->set_beta2(0.99f);
        s->mutable_optimizer()->set_epsilon(1e-6f);
      },
      [](v1::JobSpec* s) {
        s->mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAGRAD);
        s->mutable_optimizer()->set_initial_accumulator(0.1f);
      },
      [](v1::JobSpec* s) {
        s->set_mode(v1::BSP);
        s->mutable_optimizer()->set_kind(v1::OptimizerSpec::LAMB);
        s->mutable_optimizer()->set_beta1(0.8f);
        s->mutable_optimizer()->set_beta2(0.99f);
        s->mutable_optimizer()->set_epsilon(1e-6f);
        s->mutable_optimizer()->set_weight_decay(0.01f);
      },
      [](v1::JobSpec* s) {
        s->mutable_optimizer()->set_momentum(0.9f);
        s->mutable_optimizer()->set_nesterov(true);
      },
      [](v1::JobSpec* s) {
        s->mutable_optimizer()->set_kind(v1::OptimizerSpec::RMSPROP);
        s->mutable_optimizer()->set_alpha(0.9f);
        s->mutable_optimizer()->set_centered(true);
        s->mutable_optimizer()->set_momentum(0.5f);
        s->mutable_optimizer()->set_epsilon(1e-6f);
      },
      [](v1::JobSpec* s) {
        s->mutable_optimizer()->set_lr_scaling(v1::OptimizerSpec::LINEAR);
        s->mutable_optimizer()->set_base_batch_size(256);
      },
      [](v1::JobSpec* s) {
        s->mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::WARMUP_COSINE);
        s->mutable_lr_schedule()->set_warmup_steps(10);
        s->mutable_lr_schedule()->set_min_lr(0.01f);
      },
      [](v1::JobSpec* s) {
        s->mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::STEP_DECAY);
        s->mutable_lr_schedule()->set_step_size(100);
        s->mutable_lr_schedule()->set_gamma(1.0f);
      },
      [](v1::JobSpec* s) { s->set_mode(v1::ASP); },
      [](v1::JobSpec* s) { s->set_name(std::string(128, 'n')); },
      // 128 characters of two bytes each: the limit counts characters.
      [](v1::JobSpec* s) {
        std::string name;
        for (int i = 0; i < 128; ++i) name += "\xc3\xa9";
        s->set_name(name);
      },
      [](v1::JobSpec* s) {
        s->set_num_workers(1024);
        s->set_max_workers(1024);
        s->set_num_shards(1024);
        s->mutable_data()->set_batch_size(65536);
        s->mutable_data()->set_epochs(10000);
      },
  };
  for (size_t i = 0; i < variants.size(); ++i) {
    v1::JobSpec spec = BaseSpec();
    variants[i](&spec);
    absl::Status s = ValidateJobSpec(spec);
    EXPECT_TRUE(s.ok()) << "variant " << i << ": " << s;
  }
}

TEST(JobSpecTest, ElasticBoundsMustBracketNumWorkers) {
  v1::JobSpec spec = BaseSpec();
  spec.set_num_workers(4);
  spec.set_max_workers(3);
  absl::Status s = ValidateJobSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "maxWorkers")) << s;
  spec.set_max_workers(8);
  spec.set_min_workers(5);
  s = ValidateJobSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "minWorkers")) << s;
  spec.set_min_workers(2);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
}

TEST(JobSpecTest, DefaultsFillUnsetFields) {
  v1::JobSpec spec;
  spec.mutable_model()->set_kind(v1::ModelSpec::MLP);
  spec.mutable_model()->add_hidden_sizes(32);
  spec.mutable_data()->set_dataset(v1::DataSpec::FASHION_MNIST);
  spec.mutable_data()->set_batch_size(32);
  spec.mutable_optimizer()->set_lr(0.1f);
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.data().epochs(), 1);
  EXPECT_EQ(spec.num_workers(), 1);
  EXPECT_EQ(spec.mode(), v1::BSP);
  EXPECT_EQ(spec.model().activation(), v1::RELU);
  EXPECT_EQ(spec.optimizer().kind(), v1::OptimizerSpec::SGD);
  EXPECT_EQ(spec.lr_schedule().kind(), v1::LrScheduleSpec::CONSTANT);
  EXPECT_EQ(spec.data().path(), kDefaultFashionMnistPath);
  EXPECT_EQ(spec.data().path(), "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(spec.num_shards(), 0);
  EXPECT_EQ(spec.wire_format(), v1::WIRE_FP32);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
}

TEST(JobSpecTest, UnknownWireFormatIsRejectedNamingTheField) {
  v1::JobSpec spec = BaseSpec();
  spec.set_wire_format(v1::WIRE_BF16);
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.wire_format(), v1::WIRE_BF16);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  spec.set_wire_format(static_cast<v1::WireFormat>(12));
  absl::Status status = ValidateJobSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status.message(), "wireFormat")) << status.message();
}

TEST(JobSpecTest, CompressionIsCheckedAndTopKGetsItsDefaultRatio) {
  v1::JobSpec spec = BaseSpec();
  spec.mutable_compression()->set_kind(v1::CompressionSpec::TOPK);
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.compression().topk_ratio(), 0.01);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  spec.mutable_compression()->set_kind(v1::CompressionSpec::INT8);
  spec.mutable_compression()->set_topk_ratio(0);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  auto refused = [](const v1::JobSpec& bad, const std::string& field) {
    absl::Status status = ValidateJobSpec(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_TRUE(Contains(status.message(), field)) << status.message();
  };
  for (double ratio : {-0.1, 0.0, 1.5, std::nan("")}) {
    v1::JobSpec bad = BaseSpec();
    bad.mutable_compression()->set_kind(v1::CompressionSpec::TOPK);
    bad.mutable_compression()->set_topk_ratio(ratio);
    refused(bad, "compression.topkRatio");
  }
  v1::JobSpec ratio_without_topk = BaseSpec();
  ratio_without_topk.mutable_compression()->set_kind(v1::CompressionSpec::INT8);
  ratio_without_topk.mutable_compression()->set_topk_ratio(0.1);
  refused(ratio_without_topk, "compression.topkRatio");
  v1::JobSpec with_half_pulls = BaseSpec();
  with_half_pulls.mutable_compression()->set_kind(v1::CompressionSpec::INT8);
  with_half_pulls.set_wire_format(v1::WIRE_BF16);
  refused(with_half_pulls, "wireFormat");
  for (v1::WireFormat push_only : {v1::WIRE_INT8, v1::WIRE_TOPK}) {
    v1::JobSpec bad = BaseSpec();
    bad.set_wire_format(push_only);
    refused(bad, "wireFormat");
  }
  v1::JobSpec unknown_kind = BaseSpec();
  unknown_kind.mutable_compression()->set_kind(static_cast<v1::CompressionSpec::Kind>(7));
  refused(unknown_kind, "compression");
}

TEST(JobSpecTest, DefaultsKeepSetFields) {
  v1::JobSpec spec = BaseSpec();
  spec.mutable_data()->set_path("/data/fm");
  spec.set_mode(v1::ASP);
  spec.mutable_model()->set_activation(v1::TANH);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
  spec.mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::WARMUP_COSINE);
  v1::JobSpec defaulted = spec;
  ApplyJobSpecDefaults(&defaulted);
  EXPECT_EQ(defaulted.SerializeAsString(), spec.SerializeAsString());
}

TEST(JobSpecTest, DefaultsSetStepDecayGamma) {
  v1::JobSpec spec = BaseSpec();
  spec.mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::STEP_DECAY);
  spec.mutable_lr_schedule()->set_step_size(10);
  ApplyJobSpecDefaults(&spec);
  EXPECT_FLOAT_EQ(spec.lr_schedule().gamma(), 0.1f);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());

  spec.mutable_lr_schedule()->set_gamma(0.5f);
  ApplyJobSpecDefaults(&spec);
  EXPECT_FLOAT_EQ(spec.lr_schedule().gamma(), 0.5f);
}

TEST(JobSpecTest, DefaultsLeaveSyntheticPathAndSoftmaxActivationAlone) {
  v1::JobSpec spec;
  spec.mutable_model()->set_kind(v1::ModelSpec::SOFTMAX_REGRESSION);
  spec.mutable_data()->set_dataset(v1::DataSpec::SYNTHETIC);
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.data().path(), "");
  EXPECT_EQ(spec.model().activation(), v1::ACTIVATION_UNSPECIFIED);
}

TEST(JobSpecTest, ZeroWorkersIsDefaultedToOne) {
  v1::JobSpec spec = BaseSpec();
  spec.set_num_workers(0);
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.num_workers(), 1);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
}

struct RejectCase {
  std::string name;
  std::function<void(v1::JobSpec*)> mutate;
  std::vector<std::string> message_parts;  // each must appear in the message
};

class JobSpecRejectTest : public ::testing::TestWithParam<RejectCase> {};

TEST_P(JobSpecRejectTest, IsInvalidArgumentNamingTheField) {
  v1::JobSpec spec = BaseSpec();
  GetParam().mutate(&spec);
  absl::Status s = ValidateJobSpec(spec);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const std::string& part : GetParam().message_parts) {
    EXPECT_TRUE(Contains(s.message(), part));
  }
}

std::vector<RejectCase> RejectCases() {
  using S = v1::JobSpec;
  return {
      {"MissingModelKind",
       [](S* s) { s->mutable_model()->clear_kind(); },
       {"model.kind"}},
      {"MlpWithoutHiddenSizes",
       [](S* s) { s->mutable_model()->clear_hidden_sizes(); },
       {"model.hiddenSizes", "1 to 16"}},
      {"MlpWithSeventeenHiddenSizes",
       [](S* s) {
         for (int i = 0; i < 16; ++i) s->mutable_model()->add_hidden_sizes(8);
       },
       {"model.hiddenSizes", "1 to 16"}},
      {"SoftmaxWithHiddenSizes",
       [](S* s) { s->mutable_model()->set_kind(v1::ModelSpec::SOFTMAX_REGRESSION); },
       {"model.hiddenSizes", "SOFTMAX_REGRESSION"}},
      {"HiddenSizeZero",
       [](S* s) { s->mutable_model()->add_hidden_sizes(0); },
       {"model.hiddenSizes[1]", "[1, 65536]"}},
      {"HiddenSizeTooLarge",
       [](S* s) { s->mutable_model()->set_hidden_sizes(0, 65537); },
       {"model.hiddenSizes[0]", "[1, 65536]"}},
      {"DatasetUnset",
       [](S* s) { s->mutable_data()->clear_dataset(); },
       {"data.dataset"}},
      {"SyntheticExamplesOnFashionMnist",
       [](S* s) { s->mutable_data()->set_synthetic_examples(100); },
       {"data.synthetic", "SYNTHETIC"}},
      {"SyntheticFeaturesOnFashionMnist",
       [](S* s) { s->mutable_data()->set_synthetic_features(10); },
       {"data.synthetic", "SYNTHETIC"}},
      {"SyntheticClassesOnFashionMnist",
       [](S* s) { s->mutable_data()->set_synthetic_classes(3); },
       {"data.synthetic", "SYNTHETIC"}},
      {"SyntheticExamplesZero",
       [](S* s) {
         MakeSynthetic(s);
         s->mutable_data()->set_synthetic_examples(0);
       },
       {"data.syntheticExamples", "[1, 100000000]"}},
      {"SyntheticExamplesTooMany",
       [](S* s) {
         MakeSynthetic(s);
         s->mutable_data()->set_synthetic_examples(100000001);
       },
       {"data.syntheticExamples", "[1, 100000000]"}},
      {"SyntheticFeaturesZero",
       [](S* s) {
         MakeSynthetic(s);
         s->mutable_data()->set_synthetic_features(0);
       },
       {"data.syntheticFeatures", "[1, 65536]"}},
      {"SyntheticFeaturesTooMany",
       [](S* s) {
         MakeSynthetic(s);
         s->mutable_data()->set_synthetic_features(65537);
       },
       {"data.syntheticFeatures", "[1, 65536]"}},
      {"SyntheticClassesOne",
       [](S* s) {
         MakeSynthetic(s);
         s->mutable_data()->set_synthetic_classes(1);
       },
       {"data.syntheticClasses", "[2, 65536]"}},
      {"BatchSizeZero",
       [](S* s) { s->mutable_data()->set_batch_size(0); },
       {"data.batchSize", "[1, 65536]"}},
      {"BatchSize65537",
       [](S* s) { s->mutable_data()->set_batch_size(65537); },
       {"data.batchSize", "[1, 65536]"}},
      {"GradientAccumulationNegative",
       [](S* s) { s->mutable_data()->set_gradient_accumulation(-1); },
       {"data.gradientAccumulation", "[0, 1024]"}},
      {"GradientAccumulation1025",
       [](S* s) { s->mutable_data()->set_gradient_accumulation(1025); },
       {"data.gradientAccumulation", "[0, 1024]"}},
      {"GradientAccumulationStepOverAMillionExamples",
       [](S* s) {
         s->mutable_data()->set_batch_size(2048);
         s->mutable_data()->set_gradient_accumulation(1024);
       },
       {"data.gradientAccumulation", "2097152 examples", "1048576"}},
      {"LocalSgdStepsOver1024",
       [](S* s) { SetLocalSgd(s, 1025, 0.1f); },
       {"localSgd.steps", "[0, 1024]"}},
      {"LocalSgdWithoutItsRate",
       [](S* s) { s->mutable_local_sgd()->set_steps(4); },
       {"localSgd.lr"}},
      {"LocalSgdRateWithoutSteps",
       [](S* s) { s->mutable_local_sgd()->set_lr(0.1f); },
       {"localSgd.lr", "needs localSgd.steps > 1"}},
      {"LocalSgdWithGradientAccumulation",
       [](S* s) {
         SetLocalSgd(s, 4, 0.1f);
         s->mutable_data()->set_gradient_accumulation(2);
       },
       {"localSgd.steps", "data.gradientAccumulation"}},
      {"LocalSgdWithLinearLrScaling",
       [](S* s) {
         SetLocalSgd(s, 4, 0.1f);
         s->mutable_optimizer()->set_lr_scaling(v1::OptimizerSpec::LINEAR);
         s->mutable_optimizer()->set_base_batch_size(64);
       },
       {"optimizer.lrScaling", "LINEAR"}},
      {"LocalSgdStepOverAMillionExamples",
       [](S* s) {
         s->mutable_data()->set_batch_size(4096);
         SetLocalSgd(s, 512, 0.1f);
       },
       {"localSgd.steps", "2097152 examples"}},
      {"Epochs10001",
       [](S* s) { s->mutable_data()->set_epochs(10001); },
       {"data.epochs", "[1, 10000]"}},
      {"EpochsNegative",
       [](S* s) { s->mutable_data()->set_epochs(-1); },
       {"data.epochs", "[1, 10000]"}},
      {"MaxStepsNegative",
       [](S* s) { s->mutable_data()->set_max_steps(-1); },
       {"data.maxSteps"}},
      {"EvalEveryStepsNegative",
       [](S* s) { s->mutable_data()->set_eval_every_steps(-5); },
       {"data.evalEverySteps"}},
      {"LrZero",
       [](S* s) { s->mutable_optimizer()->set_lr(0); },
       {"optimizer.lr", "(0, 1000]"}},
      {"LrNegative",
       [](S* s) { s->mutable_optimizer()->set_lr(-0.1f); },
       {"optimizer.lr", "(0, 1000]"}},
      {"LrNaN",
       [](S* s) {
         s->mutable_optimizer()->set_lr(std::numeric_limits<float>::quiet_NaN());
       },
       {"optimizer.lr", "(0, 1000]"}},
      {"LrInfinite",
       [](S* s) {
         s->mutable_optimizer()->set_lr(std::numeric_limits<float>::infinity());
       },
       {"optimizer.lr", "(0, 1000]"}},
      {"MomentumOne",
       [](S* s) { s->mutable_optimizer()->set_momentum(1.0f); },
       {"optimizer.momentum", "[0, 1)"}},
      {"MomentumNegative",
       [](S* s) { s->mutable_optimizer()->set_momentum(-0.5f); },
       {"optimizer.momentum", "[0, 1)"}},
      {"NesterovWithoutMomentum",
       [](S* s) { s->mutable_optimizer()->set_nesterov(true); },
       {"optimizer.nesterov", "optimizer.momentum > 0"}},
      {"MomentumWithAdam",
       [](S* s) {
         s->mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
         s->mutable_optimizer()->set_momentum(0.9f);
       },
       {"optimizer.momentum", "SGD and RMSPROP only"}},
      {"LambInAsp",
       [](S* s) {
         s->set_mode(v1::ASP);
         s->mutable_optimizer()->set_kind(v1::OptimizerSpec::LAMB);
       },
       {"optimizer.kind", "LAMB needs mode BSP", "mode ASP"}},
      {"LambInSsp",
       [](S* s) {
         s->set_mode(v1::SSP);
         s->set_staleness(2);
         s->mutable_optimizer()->set_kind(v1::OptimizerSpec::LAMB);
       },
       {"optimizer.kind", "LAMB needs mode BSP", "mode SSP"}},
      {"MomentumWithLamb",
       [](S* s) {
         s->mutable_optimizer()->set_kind(v1::OptimizerSpec::LAMB);
         s->mutable_optimizer()->set_momentum(0.9f);
       },
       {"optimizer.momentum", "SGD and RMSPROP only"}},
      {"NesterovWithRmsprop",
       [](S* s) {
         s->mutable_optimizer()->set_kind(v1::OptimizerSpec::RMSPROP);
         s->mutable_optimizer()->set_momentum(0.9f);
         s->mutable_optimizer()->set_nesterov(true);
       },
       {"optimizer.nesterov", "SGD only"}},
      {"AlphaWithAdam",
       [](S* s) {
         s->mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
         s->mutable_optimizer()->set_alpha(0.9f);
       },
       {"optimizer.alpha", "RMSPROP only"}},
      {"AlphaOne",
       [](S* s) {
         s->mutable_optimizer()->set_kind(v1::OptimizerSpec::RMSPROP);
         s->mutable_optimizer()->set_alpha(1.0f);
       },
       {"optimizer.alpha", "[0, 1)"}},
      {"BaseBatchWithoutLinearScaling",
       [](S* s) { s->mutable_optimizer()->set_base_batch_size(256); },
       {"optimizer.baseBatchSize", "LINEAR only"}},
      {"LinearScalingWithoutBaseBatch",
       [](S* s) { s->mutable_optimizer()->set_lr_scaling(v1::OptimizerSpec::LINEAR); },
       {"optimizer.baseBatchSize", "[1, 16777216]"}},
      {"LinearScalingBeyondTheLargestRate",
       [](S* s) {
         s->mutable_optimizer()->set_lr(900);
         s->mutable_optimizer()->set_lr_scaling(v1::OptimizerSpec::LINEAR);
         s->mutable_optimizer()->set_base_batch_size(64);  // 2 workers x 64: a factor of 2
       },
       {"optimizer.lr", "900 x 2 = 1800"}},
      {"CenteredWithSgd",
       [](S* s) { s->mutable_optimizer()->set_centered(true); },
       {"optimizer.centered", "RMSPROP only"}},
      {"Beta1WithSgd",
       [](S* s) { s->mutable_optimizer()->set_beta1(0.9f); },
       {"optimizer.beta1", "ADAM"}},
      {"Beta1One",
       [](S* s) {
         s->mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
         s->mutable_optimizer()->set_beta1(1.0f);
       },
       {"optimizer.beta1", "[0, 1)"}},
      {"Beta2One",
       [](S* s) {
         s->mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
         s->mutable_optimizer()->set_beta2(1.0f);
       },
       {"optimizer.beta2", "[0, 1)"}},
      {"EpsilonNegative",
       [](S* s) {
         s->mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
         s->mutable_optimizer()->set_epsilon(-1e-8f);
       },
       {"optimizer.epsilon", "[0, 1]"}},
      {"EpsilonZeroOnAdam",
       [](S* s) {
         s->mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
         s->mutable_optimizer()->set_epsilon(0);
       },
       {"optimizer.epsilon", "> 0", "0 by 0"}},
      {"EpsilonZeroOnRmsprop",
       [](S* s) {
         s->mutable_optimizer()->set_kind(v1::OptimizerSpec::RMSPROP);
         s->mutable_optimizer()->set_epsilon(0);
       },
       {"optimizer.epsilon", "> 0"}},
      {"EpsilonZeroOnAdagradWithoutAnAccumulator",
       [](S* s) {
         s->mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAGRAD);
         s->mutable_optimizer()->set_epsilon(0);
       },
       {"optimizer.epsilon", "initialAccumulator > 0"}},
      {"WeightDecayNegative",
       [](S* s) { s->mutable_optimizer()->set_weight_decay(-1.0f); },
       {"optimizer.weightDecay", "[0, 10]"}},
      {"InitialAccumulatorWithSgd",
       [](S* s) { s->mutable_optimizer()->set_initial_accumulator(0.1f); },
       {"optimizer.initialAccumulator", "ADAGRAD"}},
      {"MinLrAboveLr",
       [](S* s) {
         s->mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::WARMUP_COSINE);
         s->mutable_lr_schedule()->set_min_lr(0.2f);
       },
       {"lrSchedule.minLr", "[0, 0.1]"}},
      {"WarmupStepsNegative",
       [](S* s) {
         s->mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::WARMUP_COSINE);
         s->mutable_lr_schedule()->set_warmup_steps(-1);
       },
       {"lrSchedule.warmupSteps"}},
      {"StepDecayStepSizeZero",
       [](S* s) {
         s->mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::STEP_DECAY);
         s->mutable_lr_schedule()->set_gamma(0.1f);
       },
       {"lrSchedule.stepSize", "[1, "}},
      {"StepDecayGammaAboveOne",
       [](S* s) {
         s->mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::STEP_DECAY);
         s->mutable_lr_schedule()->set_step_size(10);
         s->mutable_lr_schedule()->set_gamma(1.5f);
       },
       {"lrSchedule.gamma", "(0, 1]"}},
      {"StepDecayGammaNegative",
       [](S* s) {
         s->mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::STEP_DECAY);
         s->mutable_lr_schedule()->set_step_size(10);
         s->mutable_lr_schedule()->set_gamma(-0.5f);
       },
       {"lrSchedule.gamma", "(0, 1]"}},
      {"StepDecayWithWarmup",
       [](S* s) {
         s->mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::STEP_DECAY);
         s->mutable_lr_schedule()->set_step_size(10);
         s->mutable_lr_schedule()->set_gamma(0.5f);
         s->mutable_lr_schedule()->set_warmup_steps(5);
       },
       {"lrSchedule.warmupSteps", "WARMUP_COSINE"}},
      {"CosineWithStepSize",
       [](S* s) {
         s->mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::WARMUP_COSINE);
         s->mutable_lr_schedule()->set_step_size(5);
       },
       {"lrSchedule.stepSize", "STEP_DECAY"}},
      {"ConstantWithWarmupSteps",
       [](S* s) { s->mutable_lr_schedule()->set_warmup_steps(10); },
       {"lrSchedule", "CONSTANT"}},
      {"ConstantWithGamma",
       [](S* s) { s->mutable_lr_schedule()->set_gamma(0.5f); },
       {"lrSchedule", "CONSTANT"}},
      {"ConstantWithMinLr",
       [](S* s) { s->mutable_lr_schedule()->set_min_lr(0.01f); },
       {"lrSchedule", "CONSTANT"}},
      {"ConstantWithStepSize",
       [](S* s) { s->mutable_lr_schedule()->set_step_size(3); },
       {"lrSchedule", "CONSTANT"}},
      {"SspStalenessTooLarge",
       [](S* s) {
         s->set_mode(v1::SSP);
         s->set_staleness(10001);
       },
       {"staleness", "[0, 10000]"}},
      {"StalenessWithoutSsp",
       [](S* s) { s->set_staleness(2); },
       {"staleness", "SSP"}},
      {"EarlyStoppingWithoutMetric",
       [](S* s) { s->mutable_early_stopping()->set_patience(3); },
       {"earlyStopping.metric", "TEST_LOSS"}},
      {"EarlyStoppingOnAucWithoutAClickModel",
       [](S* s) {
         s->mutable_early_stopping()->set_patience(3);
         s->mutable_early_stopping()->set_metric(v1::EarlyStoppingSpec::TEST_AUC);
       },
       {"earlyStopping.metric", "click model"}},
      {"EarlyStoppingMetricWithoutPatience",
       [](S* s) { s->mutable_early_stopping()->set_metric(v1::EarlyStoppingSpec::TEST_LOSS); },
       {"earlyStopping.patience", "at least 1"}},
      {"EarlyStoppingPatienceTooLarge",
       [](S* s) {
         s->mutable_early_stopping()->set_patience(10001);
         s->mutable_early_stopping()->set_metric(v1::EarlyStoppingSpec::TEST_LOSS);
       },
       {"earlyStopping.patience", "[0, 10000]"}},
      {"EarlyStoppingNegativeMinDelta",
       [](S* s) {
         s->mutable_early_stopping()->set_patience(2);
         s->mutable_early_stopping()->set_metric(v1::EarlyStoppingSpec::TEST_LOSS);
         s->mutable_early_stopping()->set_min_delta(-0.1f);
       },
       {"earlyStopping.minDelta", "[0, 1e+06]"}},
      {"NumWorkersZeroWithoutDefaults",
       [](S* s) { s->set_num_workers(0); },
       {"numWorkers", "[1, 1024]"}},
      {"NumWorkers1025",
       [](S* s) { s->set_num_workers(1025); },
       {"numWorkers", "[1, 1024]"}},
      {"NumShardsNegative",
       [](S* s) { s->set_num_shards(-1); },
       {"numShards", "[0, 1024]"}},
      {"NumShards1025",
       [](S* s) { s->set_num_shards(1025); },
       {"numShards", "[0, 1024]"}},
      {"NameTooLong",
       [](S* s) { s->set_name(std::string(129, 'x')); },
       {"name", "128 characters"}},
      {"NameWithAnEscapeSequence",
       [](S* s) { s->set_name("job\x1b[2J"); },
       {"name", "control characters", "\\x1b"}},
      {"DataPathWithNul",
       [](S* s) { s->mutable_data()->set_path(std::string("/etc/shadow\0", 12)); },
       {"data.path", "NUL", "\\x00"}},
      {"DataPathWithNewline",
       [](S* s) { s->mutable_data()->set_path("/data/fm\nINFO forged log line"); },
       {"data.path", "control characters"}},
      {"DataPathRelative",
       [](S* s) { s->mutable_data()->set_path("../../etc"); },
       {"data.path", "absolute"}},
      {"DataPathTooLong",
       [](S* s) { s->mutable_data()->set_path("/" + std::string(4096, 'a')); },
       {"data.path", "4096 bytes"}},
      {"DataPathOnSyntheticData",
       [](S* s) {
         MakeSynthetic(s);
         s->mutable_data()->set_path("/data/fm");
       },
       {"data.path", "FASHION_MNIST"}},
      {"UnknownField",
       [](S* s) { s->GetReflection()->MutableUnknownFields(s)->AddVarint(999, 1); },
       {"unknown field", "999"}},
      {"UnknownFieldInNestedMessage",
       [](S* s) {
         v1::OptimizerSpec* opt = s->mutable_optimizer();
         opt->GetReflection()->MutableUnknownFields(opt)->AddVarint(77, 1);
       },
       {"unknown field", "77", "optimizer"}},
      {"UnknownModeValue",
       [](S* s) { s->set_mode(static_cast<v1::Mode>(42)); },
       {"mode", "42", "not a known value"}},
      {"UnknownNestedEnumValue",
       [](S* s) {
         s->mutable_optimizer()->set_kind(static_cast<v1::OptimizerSpec::Kind>(42));
       },
       {"optimizer.kind", "42", "not a known value"}},
  };
}

INSTANTIATE_TEST_SUITE_P(
    Rejections, JobSpecRejectTest, ::testing::ValuesIn(RejectCases()),
    [](const ::testing::TestParamInfo<RejectCase>& info) { return info.param.name; });

// A checkpoint's optimizer slots are read back as they were saved: a resume
// keeps what they mean, for the dense optimizer and for each table (by
// name, a table left out having the default, Adagrad).
TEST(ResumeSpecTest, AnOptimizerWhoseStateMeansSomethingElseIsRefusedNamingIt) {
  v1::JobSpec source;
  source.mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
  v1::TableSpec* table = source.mutable_model()->add_tables();
  table->set_name("linear");
  table->mutable_optimizer()->set_kind(v1::SparseOptimizerSpec::FTRL);
  auto resume = [&source](const std::function<void(v1::JobSpec*)>& change) {
    v1::JobSpec spec = source;
    change(&spec);
    return ValidateResume(source, spec);
  };
  EXPECT_TRUE(resume([](v1::JobSpec*) {}).ok());
  for (v1::OptimizerSpec::Kind kind : {v1::OptimizerSpec::ADAMW, v1::OptimizerSpec::LAMB}) {
    EXPECT_TRUE(resume([kind](v1::JobSpec* s) { s->mutable_optimizer()->set_kind(kind); }).ok()) << kind;
  }
  EXPECT_TRUE(resume([](v1::JobSpec* s) { s->mutable_optimizer()->set_lr(0.5f); }).ok())
      << "hyperparameters may change";
  const absl::Status rmsprop = resume([](v1::JobSpec* s) {
    s->mutable_optimizer()->set_kind(v1::OptimizerSpec::RMSPROP);
    s->mutable_optimizer()->set_centered(true);
  });
  EXPECT_EQ(rmsprop.code(), absl::StatusCode::kFailedPrecondition);
  for (const char* part : {"dense optimizer state is Adam's two moments (ADAM)", "RMSPROP, centered",
                           "squared-gradient average, gradient average"}) {
    EXPECT_TRUE(absl::StrContains(rmsprop.message(), part)) << part << " in " << rmsprop;
  }
  const absl::Status ftrl_to_adam = resume([](v1::JobSpec* s) {
    s->mutable_model()->mutable_tables(0)->mutable_optimizer()->set_kind(v1::SparseOptimizerSpec::ADAM);
  });
  EXPECT_EQ(ftrl_to_adam.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      absl::StrContains(ftrl_to_adam.message(), "table linear's rows were saved with FTRL's z and n (FTRL)"))
      << ftrl_to_adam;
  EXPECT_FALSE(resume([](v1::JobSpec* s) { s->mutable_model()->clear_tables(); }).ok())
      << "FTRL to the default";
  v1::JobSpec momentum;
  momentum.mutable_optimizer()->set_momentum(0.9f);
  EXPECT_FALSE(ValidateResume(momentum, v1::JobSpec()).ok()) << "SGD with momentum to SGD without";
}

}  // namespace
}  // namespace fulcrum
