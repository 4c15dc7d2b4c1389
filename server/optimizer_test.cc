#include "server/optimizer.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "common/half.h"

namespace fulcrum {
namespace {

// Expected values were computed once, in double precision, with a direct
// transcription of the PyTorch update rules (python3). float32 rounding over
// three steps stays far below this tolerance.
constexpr float kTol = 2e-6f;
constexpr float kLr = 0.1f;
constexpr int kN = 3;

const float kInitialParam[kN] = {1.0f, -2.0f, 0.5f};
const float kGrads[3][kN] = {
    {0.1f, -0.2f, 0.3f},
    {0.4f, 0.0f, -0.1f},
    {-0.3f, 0.25f, 0.2f},
};

using Trajectory = std::vector<std::vector<float>>;

// Runs the three gradient steps above and returns the parameters after each.
Trajectory RunThreeSteps(const OptimizerConfig& config) {
  const int slots = OptimizerStateSlots(config);
  std::vector<std::vector<float>> state(slots, std::vector<float>(kN, 0.0f));
  std::vector<float*> state_ptrs;
  for (auto& s : state) state_ptrs.push_back(s.data());
  InitOptimizerState(config, kN, state_ptrs.data());

  std::vector<float> param(kInitialParam, kInitialParam + kN);
  Trajectory out;
  for (int step = 1; step <= 3; ++step) {
    ApplyOptimizer(config, kLr, step, kN, kGrads[step - 1], param.data(),
                   state_ptrs.data());
    out.push_back(param);
  }
  return out;
}

void ExpectTrajectory(const Trajectory& actual, const float expected[3][kN]) {
  for (int step = 0; step < 3; ++step) {
    for (int i = 0; i < kN; ++i) {
      EXPECT_NEAR(actual[step][i], expected[step][i], kTol)
          << "step " << step + 1 << " element " << i;
    }
  }
}

TEST(OptimizerStateSlotsTest, CountsPerKind) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  EXPECT_EQ(OptimizerStateSlots(c), 0);
  c.momentum = 0.9f;
  EXPECT_EQ(OptimizerStateSlots(c), 1);
  c.kind = OptimizerKind::kAdam;
  EXPECT_EQ(OptimizerStateSlots(c), 2);
  c.kind = OptimizerKind::kAdamW;
  EXPECT_EQ(OptimizerStateSlots(c), 2);
  c.kind = OptimizerKind::kAdagrad;
  EXPECT_EQ(OptimizerStateSlots(c), 1);
  c.kind = OptimizerKind::kRmsprop;
  c.momentum = 0;
  EXPECT_EQ(OptimizerStateSlots(c), 1);
  c.centered = true;
  EXPECT_EQ(OptimizerStateSlots(c), 2);
  c.momentum = 0.9f;
  EXPECT_EQ(OptimizerStateSlots(c), 3);
}

TEST(InitOptimizerStateTest, AdagradFillsAccumulator) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdagrad;
  c.initial_accumulator = 0.25f;
  std::vector<float> acc(4, -1.0f);
  float* ptrs[] = {acc.data()};
  InitOptimizerState(c, 4, ptrs);
  for (float x : acc) EXPECT_EQ(x, 0.25f);
}

TEST(InitOptimizerStateTest, AdamZeroesBothMoments) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  std::vector<float> m(4, 7.0f), v(4, 7.0f);
  float* ptrs[] = {m.data(), v.data()};
  InitOptimizerState(c, 4, ptrs);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(m[i], 0.0f);
    EXPECT_EQ(v[i], 0.0f);
  }
}

TEST(OptimizerTest, SgdPlain) {
  OptimizerConfig c;
  const float expected[3][kN] = {
      {0.99f, -1.98f, 0.47f},
      {0.95f, -1.98f, 0.48f},
      {0.98f, -2.005f, 0.46f},
  };
  ExpectTrajectory(RunThreeSteps(c), expected);
}

TEST(OptimizerTest, SgdMomentum) {
  OptimizerConfig c;
  c.momentum = 0.9f;
  const float expected[3][kN] = {
      {0.99f, -1.98f, 0.47f},
      {0.941f, -1.962f, 0.453f},
      {0.9269f, -1.9708f, 0.4177f},
  };
  ExpectTrajectory(RunThreeSteps(c), expected);
}

TEST(OptimizerTest, SgdNesterov) {
  OptimizerConfig c;
  c.momentum = 0.9f;
  c.nesterov = true;
  const float expected[3][kN] = {
      {0.981f, -1.962f, 0.443f},
      {0.8969f, -1.9458f, 0.4377f},
      {0.91421f, -1.97872f, 0.38593f},
  };
  ExpectTrajectory(RunThreeSteps(c), expected);
}

TEST(OptimizerTest, SgdWeightDecay) {
  OptimizerConfig c;
  c.weight_decay = 0.01f;
  const float expected[3][kN] = {
      {0.989f, -1.978f, 0.4695f},
      {0.948011f, -1.976022f, 0.4790305f},
      {0.977062989f, -1.99904598f, 0.45855147f},
  };
  ExpectTrajectory(RunThreeSteps(c), expected);
}

TEST(OptimizerTest, SgdMomentumWeightDecay) {
  OptimizerConfig c;
  c.momentum = 0.9f;
  c.weight_decay = 0.01f;
  const float expected[3][kN] = {
      {0.989f, -1.978f, 0.4695f},
      {0.938111f, -1.956222f, 0.4515805f},
      {0.921372789f, -1.95966558f, 0.41500137f},
  };
  ExpectTrajectory(RunThreeSteps(c), expected);
}

TEST(OptimizerTest, Adam) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  const float expected[3][kN] = {
      {0.90000001f, -1.9f, 0.400000003f},
      {0.811562364f, -1.83299418f, 0.359978148f},
      {0.793891534f, -1.85055984f, 0.299669502f},
  };
  ExpectTrajectory(RunThreeSteps(c), expected);
}

TEST(OptimizerTest, AdamL2WeightDecay) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  c.weight_decay = 0.01f;
  const float expected[3][kN] = {
      {0.900000009f, -1.9f, 0.400000003f},
      {0.810742878f, -1.82683695f, 0.358439948f},
      {0.790205579f, -1.83411106f, 0.297015595f},
  };
  ExpectTrajectory(RunThreeSteps(c), expected);
}

TEST(OptimizerTest, AdamW) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdamW;
  c.weight_decay = 0.01f;
  const float expected[3][kN] = {
      {0.89900001f, -1.898f, 0.399500003f},
      {0.809663364f, -1.82909618f, 0.359078648f},
      {0.79118287f, -1.84483274f, 0.298410923f},
  };
  ExpectTrajectory(RunThreeSteps(c), expected);
}

TEST(OptimizerTest, AdamWWithoutDecayEqualsAdam) {
  OptimizerConfig adam;
  adam.kind = OptimizerKind::kAdam;
  OptimizerConfig adamw = adam;
  adamw.kind = OptimizerKind::kAdamW;
  EXPECT_EQ(RunThreeSteps(adam), RunThreeSteps(adamw));
}

TEST(OptimizerTest, Adagrad) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdagrad;
  c.epsilon = 1e-10f;
  const float expected[3][kN] = {
      {0.9f, -1.9f, 0.4f},
      {0.80298575f, -1.9f, 0.431622777f},
      {0.861820591f, -1.97808688f, 0.378170528f},
  };
  ExpectTrajectory(RunThreeSteps(c), expected);
}

TEST(OptimizerTest, AdagradInitialAccumulatorAndWeightDecay) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdagrad;
  c.epsilon = 1e-10f;
  c.initial_accumulator = 0.1f;
  c.weight_decay = 0.01f;
  const float expected[3][kN] = {
      {0.967145877f, -1.94289085f, 0.430578649f},
      {0.889715666f, -1.93785375f, 0.451860727f},
      {0.937921045f, -1.98917096f, 0.410458014f},
  };
  ExpectTrajectory(RunThreeSteps(c), expected);
}

// PyTorch's RMSprop (alpha 0.99, eps 1e-8), transcribed in double precision.
TEST(OptimizerTest, Rmsprop) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kRmsprop;
  const float expected[3][kN] = {
      {9.99999e-07f, -1.0000005f, -0.499999667f},
      {-0.970426727f, -1.0000005f, -0.182339299f},
      {-0.380032354f, -1.7839189f, -0.72050856f},
  };
  ExpectTrajectory(RunThreeSteps(c), expected);
}

TEST(OptimizerTest, RmspropCenteredWithMomentumAndWeightDecay) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kRmsprop;
  c.centered = true;
  c.momentum = 0.9f;
  c.weight_decay = 0.01f;
  const float expected[3][kN] = {
      {-0.00503689699f, -0.994962644f, -0.505037484f},
      {-1.88145163f, -0.0447752473f, -1.08183675f},
      {-2.95838595f, 0.0572987585f, -2.11316898f},
  };
  ExpectTrajectory(RunThreeSteps(c), expected);
}

// LAMB (Adam's bias-corrected step, decoupled decay, trust ratio |w| / |r|
// over the block), transcribed in double precision from the paper's update.
TEST(OptimizerTest, Lamb) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kLamb;
  c.epsilon = 1e-6f;
  EXPECT_EQ(OptimizerStateSlots(c), 2);
  const float expected[3][kN] = {
      {0.867712949f, -1.86771229f, 0.367712067f},
      {0.71085948f, -1.74887084f, 0.296729169f},
      {0.659108559f, -1.80031364f, 0.120109049f},
  };
  ExpectTrajectory(RunThreeSteps(c), expected);
}

TEST(OptimizerTest, LambWithWeightDecay) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kLamb;
  c.epsilon = 1e-6f;
  c.weight_decay = 0.01f;
  const float expected[3][kN] = {
      {0.86793339f, -1.86662513f, 0.36858632f},
      {0.712028014f, -1.74639135f, 0.298074706f},
      {0.658259107f, -1.79266175f, 0.120803426f},
  };
  ExpectTrajectory(RunThreeSteps(c), expected);
}

// A tensor cut into blocks (chunks on several servers): each block's norms,
// summed, then each block applied with the sums, is the update of the whole
// tensor; bit for bit when the sums are added in the same order.
TEST(OptimizerTest, LambOverBlocksIsTheWholeTensorsUpdate) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kLamb;
  c.weight_decay = 0.01f;
  constexpr int kLen = 1000, kCut = 377;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> whole(kLen), blocks(kLen);
  for (float& w : whole) w = normal(rng);
  blocks = whole;
  std::vector<std::vector<float>> whole_state(2, std::vector<float>(kLen, 0.0f)), block_state = whole_state;
  for (int step = 1; step <= 4; ++step) {
    std::vector<float> grad(kLen);
    for (float& g : grad) g = normal(rng);
    // The whole tensor, its norms summed as two blocks would sum them.
    float* ws[2] = {whole_state[0].data(), whole_state[1].data()};
    const float* cws[2] = {ws[0], ws[1]};
    LambNorms first = LambBlockNorms(c, step, kCut, grad.data(), whole.data(), cws);
    const float* cws2[2] = {ws[0] + kCut, ws[1] + kCut};
    LambNorms second = LambBlockNorms(c, step, kLen - kCut, grad.data() + kCut, whole.data() + kCut, cws2);
    const LambNorms sums{first.weight_sq + second.weight_sq, first.update_sq + second.update_sq};
    ApplyLamb(c, kLr, step, kLen, grad.data(), whole.data(), ws, sums);
    // Two blocks, each with the sums.
    float* bs1[2] = {block_state[0].data(), block_state[1].data()};
    float* bs2[2] = {block_state[0].data() + kCut, block_state[1].data() + kCut};
    ApplyLamb(c, kLr, step, kCut, grad.data(), blocks.data(), bs1, sums);
    ApplyLamb(c, kLr, step, kLen - kCut, grad.data() + kCut, blocks.data() + kCut, bs2, sums);
    for (int i = 0; i < kLen; ++i) {
      ASSERT_EQ(FloatBits(whole[i]), FloatBits(blocks[i])) << "step " << step << " element " << i;
    }
  }
  // And it is a trust-ratio update: one block applied with its own norms
  // only (what a chunk alone would do) moves differently.
  std::vector<float> alone = blocks;
  std::vector<std::vector<float>> alone_state = block_state;
  std::vector<float> grad(kLen, 0.5f);
  float* as[2] = {alone_state[0].data(), alone_state[1].data()};
  ApplyOptimizer(c, kLr, 5, kCut, grad.data(), alone.data(), as);
  float* bs[2] = {block_state[0].data(), block_state[1].data()};
  const float* cbs[2] = {bs[0], bs[1]};
  const float* cbs2[2] = {bs[0] + kCut, bs[1] + kCut};
  LambNorms a = LambBlockNorms(c, 5, kCut, grad.data(), blocks.data(), cbs);
  LambNorms b = LambBlockNorms(c, 5, kLen - kCut, grad.data() + kCut, blocks.data() + kCut, cbs2);
  ApplyLamb(c, kLr, 5, kCut, grad.data(), blocks.data(), bs, {a.weight_sq + b.weight_sq, a.update_sq + b.update_sq});
  EXPECT_NE(alone[0], blocks[0]);
}

TEST(OptimizerTest, LambTrustRatioIsOneWhenANormIsZero) {
  EXPECT_EQ(LambTrustRatio({0, 4}), 1.0f);
  EXPECT_EQ(LambTrustRatio({4, 0}), 1.0f);
  EXPECT_EQ(LambTrustRatio({std::numeric_limits<double>::infinity(), 4}), 1.0f);
  EXPECT_FLOAT_EQ(LambTrustRatio({16, 4}), 2.0f);
}

TEST(OptimizerTest, DeterministicBitForBit) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdam,
                             OptimizerKind::kAdamW, OptimizerKind::kAdagrad}) {
    OptimizerConfig c;
    c.kind = kind;
    c.momentum = 0.9f;
    c.weight_decay = 0.01f;
    const Trajectory a = RunThreeSteps(c);
    const Trajectory b = RunThreeSteps(c);
    for (int step = 0; step < 3; ++step) {
      for (int i = 0; i < kN; ++i) EXPECT_EQ(FloatBits(a[step][i]), FloatBits(b[step][i])) << "step " << step;
    }
  }
}

TEST(OptimizerTest, ZeroElementsIsNoOp) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  ApplyOptimizer(c, kLr, 1, 0, nullptr, nullptr, nullptr);
  InitOptimizerState(c, 0, nullptr);
}

TEST(ValidateOptimizerConfigTest, AcceptsDefaults) {
  EXPECT_TRUE(ValidateOptimizerConfig(OptimizerConfig()).ok());
}

TEST(ValidateOptimizerConfigTest, RejectsBadFields) {
  OptimizerConfig c;
  c.nesterov = true;
  EXPECT_EQ(ValidateOptimizerConfig(c).code(),
            absl::StatusCode::kInvalidArgument);
  c = OptimizerConfig();
  c.momentum = -0.1f;
  EXPECT_FALSE(ValidateOptimizerConfig(c).ok());
  c = OptimizerConfig();
  c.beta1 = 1.0f;
  EXPECT_FALSE(ValidateOptimizerConfig(c).ok());
  c = OptimizerConfig();
  c.beta2 = -0.5f;
  EXPECT_FALSE(ValidateOptimizerConfig(c).ok());
  c = OptimizerConfig();
  c.epsilon = -1e-8f;
  EXPECT_FALSE(ValidateOptimizerConfig(c).ok());
  c = OptimizerConfig();
  c.weight_decay = -0.01f;
  EXPECT_FALSE(ValidateOptimizerConfig(c).ok());
  c = OptimizerConfig();
  c.alpha = 1.0f;
  EXPECT_FALSE(ValidateOptimizerConfig(c).ok());
  c = OptimizerConfig();
  c.initial_accumulator = -1.0f;
  EXPECT_FALSE(ValidateOptimizerConfig(c).ok());
}

// A zero epsilon divides 0 by 0 on a zero gradient of a fresh parameter
// (NaN parameters from finite gradients): refused where it divides, and
// kept where nothing does (SGD) or where Adagrad's starting accumulator
// keeps the denominator above zero.
TEST(ValidateOptimizerConfigTest, ZeroEpsilonIsRefusedWhereItDivides) {
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW, OptimizerKind::kLamb,
                             OptimizerKind::kRmsprop, OptimizerKind::kAdagrad}) {
    OptimizerConfig c;
    c.kind = kind;
    c.epsilon = 0;
    const absl::Status status = ValidateOptimizerConfig(c);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << static_cast<int>(kind);
    EXPECT_NE(status.message().find("epsilon must be > 0"), std::string::npos) << status;
  }
  OptimizerConfig sgd;
  sgd.epsilon = 0;
  EXPECT_TRUE(ValidateOptimizerConfig(sgd).ok());
  OptimizerConfig adagrad;
  adagrad.kind = OptimizerKind::kAdagrad;
  adagrad.epsilon = 0;
  adagrad.initial_accumulator = 0.1f;
  EXPECT_TRUE(ValidateOptimizerConfig(adagrad).ok());
}

}  // namespace
}  // namespace fulcrum

namespace fulcrum {
namespace {

// The straightforward per-element updates (PyTorch's rules, one rounding per
// operation), against which the vectorized loops must agree bit for bit on
// a length that leaves a tail after every vector width.
void ReferenceStep(const OptimizerConfig& c, float lr, int64_t step, float g, float* w, float* s0, float* s1) {
  const float wd = c.weight_decay;
  switch (c.kind) {
    case OptimizerKind::kSgd: {
      const float gg = wd != 0 ? g + wd * *w : g;
      if (c.momentum <= 0) {
        *w -= lr * gg;
        return;
      }
      *s0 = c.momentum * *s0 + gg;
      *w -= lr * (c.nesterov ? gg + c.momentum * *s0 : *s0);
      return;
    }
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: {
      float gg = g;
      if (c.kind == OptimizerKind::kAdamW) {
        if (wd != 0) *w *= 1.0f - lr * wd;
      } else if (wd != 0) {
        gg = g + wd * *w;
      }
      const double bias1 = 1.0 - std::pow(static_cast<double>(c.beta1), step);
      const double bias2 = 1.0 - std::pow(static_cast<double>(c.beta2), step);
      const float step_size = static_cast<float>(lr / bias1);
      const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
      *s0 = c.beta1 * *s0 + (1.0f - c.beta1) * gg;
      *s1 = c.beta2 * *s1 + (1.0f - c.beta2) * (gg * gg);
      *w -= step_size * (*s0 / (std::sqrt(*s1) / bias2_sqrt + c.epsilon));
      return;
    }
    case OptimizerKind::kAdagrad: {
      const float gg = wd != 0 ? g + wd * *w : g;
      *s0 += gg * gg;
      *w -= lr * (gg / (std::sqrt(*s0) + c.epsilon));
      return;
    }
    case OptimizerKind::kRmsprop: {  // s0: the squared average; s1: the gradient average or the momentum buffer
      const float gg = wd != 0 ? g + wd * *w : g;
      const float one_minus_alpha = 1.0f - c.alpha;
      *s0 = *s0 * c.alpha + (one_minus_alpha * gg) * gg;
      float d = std::sqrt(*s0) + c.epsilon;
      if (c.centered) {
        *s1 = *s1 + one_minus_alpha * (gg - *s1);
        d = std::sqrt(*s0 - *s1 * *s1) + c.epsilon;
      }
      if (c.momentum > 0) {
        *s1 = *s1 * c.momentum + gg / d;
        *w -= lr * *s1;
      } else {
        *w -= lr * (gg / d);
      }
      return;
    }
    case OptimizerKind::kLamb:  // not per element: LambLoopAgreesBitForBitWithTheScalarRule
      ADD_FAILURE() << "LAMB has a per-tensor trust ratio";
      return;
  }
}

// LAMB's scalar rule: norms in double in order, the trust ratio rounded to
// float once, then each element.
TEST(OptimizerTest, LambLoopAgreesBitForBitWithTheScalarRule) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kLamb;
  c.weight_decay = 0.01f;
  c.epsilon = 1e-6f;
  constexpr int64_t n = 1003;
  std::mt19937 random(9);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> param(n), ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = param[i] = uniform(random);
  std::vector<std::vector<float>> state(2, std::vector<float>(n, 0.0f)), ref_state = state;
  std::vector<float*> slots = {state[0].data(), state[1].data()};
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<float> grad(n);
    for (float& g : grad) g = uniform(random);
    ApplyOptimizer(c, kLr, step, n, grad.data(), param.data(), slots.data());
    const float bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta1), step));
    const float bias2 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta2), step));
    std::vector<float> r(n);
    double w_sq = 0, r_sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i];
      ref_state[0][i] = c.beta1 * ref_state[0][i] + (1.0f - c.beta1) * g;
      ref_state[1][i] = c.beta2 * ref_state[1][i] + (1.0f - c.beta2) * (g * g);
      r[i] = (ref_state[0][i] / bias1) / (std::sqrt(ref_state[1][i] / bias2) + c.epsilon) + c.weight_decay * ref[i];
      w_sq += static_cast<double>(ref[i]) * ref[i];
      r_sq += static_cast<double>(r[i]) * r[i];
    }
    const float step_size = kLr * static_cast<float>(std::sqrt(w_sq) / std::sqrt(r_sq));
    for (int64_t i = 0; i < n; ++i) ref[i] -= step_size * r[i];
  }
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(FloatBits(param[i]), FloatBits(ref[i])) << "element " << i << ": " << param[i] << " vs " << ref[i];
  }
}

TEST(OptimizerTest, VectorizedLoopsAgreeBitForBitWithTheScalarRules) {
  std::vector<OptimizerConfig> configs(11);
  configs[1].weight_decay = 0.01f;
  configs[2].momentum = 0.9f;
  configs[3].momentum = 0.9f;
  configs[3].nesterov = true;
  configs[3].weight_decay = 0.01f;
  configs[4].kind = OptimizerKind::kAdam;
  configs[5].kind = OptimizerKind::kAdam;
  configs[5].weight_decay = 0.01f;
  configs[6].kind = OptimizerKind::kAdamW;
  configs[6].weight_decay = 0.01f;
  configs[7].kind = OptimizerKind::kAdagrad;
  configs[8].kind = OptimizerKind::kRmsprop;
  configs[9].kind = OptimizerKind::kRmsprop;
  configs[9].centered = true;
  configs[9].weight_decay = 0.01f;
  configs[10].kind = OptimizerKind::kRmsprop;
  configs[10].momentum = 0.9f;
  constexpr int64_t n = 1003;
  std::mt19937 random(5);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (size_t k = 0; k < configs.size(); ++k) {
    const OptimizerConfig& config = configs[k];
    std::vector<float> param(n), ref_param(n);
    for (int64_t i = 0; i < n; ++i) ref_param[i] = param[i] = uniform(random);
    std::vector<std::vector<float>> state(2, std::vector<float>(n, 0.0f)), ref_state = state;
    std::vector<float*> slots = {state[0].data(), state[1].data()};
    InitOptimizerState(config, n, slots.data());
    InitOptimizerState(config, n, std::vector<float*>{ref_state[0].data(), ref_state[1].data()}.data());
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<float> grad(n);
      for (float& g : grad) g = uniform(random);
      ApplyOptimizer(config, kLr, step, n, grad.data(), param.data(), slots.data());
      for (int64_t i = 0; i < n; ++i) {
        ReferenceStep(config, kLr, step, grad[i], &ref_param[i], &ref_state[0][i], &ref_state[1][i]);
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(FloatBits(param[i]), FloatBits(ref_param[i])) << "config " << k << ", element " << i << ": "
                                                              << param[i] << " vs " << ref_param[i];
    }
  }
}

}  // namespace
}  // namespace fulcrum
