// Per-parameter-block optimizers applied by the parameter server.
//
// All optimizers update a dense block of `n` floats in place. Their numerics
// follow PyTorch's single-tensor (non-foreach, non-fused) implementations and
// use plain sequential float arithmetic, so a given sequence of gradients
// always yields bit-identical parameters on the same build.

#ifndef FULCRUM_SERVER_OPTIMIZER_H_
#define FULCRUM_SERVER_OPTIMIZER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace fulcrum {

enum class OptimizerKind { kSgd, kAdam, kAdamW, kAdagrad, kRmsprop, kLamb };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  // SGD and RMSprop. Heavy-ball momentum coefficient (PyTorch, dampening = 0).
  float momentum = 0;
  // SGD only. Nesterov momentum; requires momentum > 0.
  bool nesterov = false;
  // Adam/AdamW/LAMB moment decay rates.
  float beta1 = 0.9f, beta2 = 0.999f;
  // Adam/AdamW/Adagrad denominator epsilon. Note that Adagrad uses this same
  // field, so its default here is 1e-8 rather than PyTorch's Adagrad default
  // of 1e-10; set epsilon = 1e-10f for exact PyTorch Adagrad parity.
  float epsilon = 1e-8f;
  // SGD/Adam/Adagrad: L2 penalty folded into the gradient (g += wd * w).
  // AdamW: decoupled decay applied before the Adam step (w -= lr * wd * w).
  // LAMB: decoupled, added to the update before its trust ratio.
  float weight_decay = 0;
  // Adagrad only. Initial value of the squared-gradient accumulator.
  float initial_accumulator = 0;
  // RMSprop only: the squared-gradient average's decay, and whether the
  // gradient's running mean is subtracted (centered RMSprop).
  float alpha = 0.99f;
  bool centered = false;
};

// Returns InvalidArgument if `config` is not usable: negative momentum,
// nesterov without momentum, betas outside [0, 1), negative epsilon (or 0
// where it divides: every kind but SGD, Adagrad with an initial
// accumulator apart),
// weight_decay or initial_accumulator, or any non-finite field. ApplyOptimizer
// assumes a config that passed this check.
absl::Status ValidateOptimizerConfig(const OptimizerConfig& config);

// Number of float state slots per parameter:
//   SGD: 1 (momentum buffer) if momentum > 0, else 0.
//   Adam/AdamW/LAMB: 2 (slot 0: first moment m, slot 1: second moment v).
//   Adagrad: 1 (squared-gradient accumulator).
//   RMSprop: 1 (squared-gradient average), + 1 (gradient average) if
//            centered, + 1 (momentum buffer) if momentum > 0, in that order.
int OptimizerStateSlots(const OptimizerConfig& config);

// Fills the optimizer state for a fresh block of `n` parameters. `state` has
// OptimizerStateSlots(config) arrays of `n` floats each. Every slot is set to
// zero except Adagrad's accumulator, which is set to
// config.initial_accumulator. Nothing is touched when n <= 0. Callers may
// either call this or zero the arrays themselves and call it only for
// Adagrad; both give the same result.
void InitOptimizerState(const OptimizerConfig& config, int64_t n,
                        float* const* state);

// Applies one update to `param[0..n)` in place using `grad[0..n)`.
//
// `lr` is the learning rate for this update (see LearningRate()). `step` is
// the 1-based number of updates applied to this block including this one; it
// drives Adam's bias correction and must be >= 1 (values < 1 are treated as
// 1). `state` holds OptimizerStateSlots(config) arrays of `n` floats,
// initialized by InitOptimizerState() before the first update and carried
// unchanged between updates. `grad` must not alias `param` or the state.
// With n <= 0 nothing is read or written (pointers may be null).
//
// Update rules (g = grad, w = param, all per element):
//   SGD:     g += wd*w; if momentum: v = mu*v + g, u = nesterov ? g + mu*v : v
//            else u = g; w -= lr*u.
//   Adam:    g += wd*w; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
//            w -= (lr / (1-b1^step)) * m / (sqrt(v) / sqrt(1-b2^step) + eps).
//   AdamW:   w *= 1 - lr*wd; then the Adam update with wd = 0.
//   Adagrad: g += wd*w; s += g*g; w -= lr * g / (sqrt(s) + eps).
//   RMSprop: g += wd*w; s = alpha*s + ((1-alpha)*g)*g;
//            centered: a = a + (1-alpha)*(g - a), d = sqrt(s - a*a) + eps,
//            else d = sqrt(s) + eps;
//            momentum: b = mu*b + g/d, w -= lr*b; else w -= lr * (g/d)
//            (PyTorch's single-tensor RMSprop, operation by operation).
//   LAMB:    (You et al. 2019, with Adam's bias correction, trust ratio
//            unclipped) m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
//            r = (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps) + wd*w;
//            w -= lr * trust * r, trust = |w| / |r| over the whole tensor
//            (1 when either norm is 0). ApplyOptimizer takes the block as
//            the whole tensor; a tensor cut into blocks (chunks on several
//            servers) sums the blocks' LambBlockNorms and applies each block
//            with ApplyLamb and the sums.
void ApplyOptimizer(const OptimizerConfig& config, float lr, int64_t step,
                    int64_t n, const float* grad, float* param,
                    float* const* state);

// LAMB's squared norms of a tensor, or of a block of it: sum(w*w) and
// sum(r*r), each accumulated in double element by element in order.
struct LambNorms {
  double weight_sq = 0;
  double update_sq = 0;
};

// The squared norms of a block's weights and of its LAMB update r at `step`
// (see ApplyOptimizer) for gradient `grad`, changing nothing.
LambNorms LambBlockNorms(const OptimizerConfig& config, int64_t step, int64_t n, const float* grad,
                         const float* param, const float* const* state);

// INVALID_ARGUMENT (`what` names whose norms) unless both sums are finite
// and >= 0.
absl::Status CheckLambNorms(const LambNorms& tensor, const std::string& what);

// |w| / |r| from a whole tensor's squared norms, rounded to float; 1 when
// either is 0 (or not finite).
float LambTrustRatio(const LambNorms& tensor);

// One LAMB update of a block of a tensor whose squared norms, summed over
// all its blocks, are `tensor`: the moments and weights of the block change
// as ApplyOptimizer describes.
void ApplyLamb(const OptimizerConfig& config, float lr, int64_t step, int64_t n, const float* grad, float* param,
               float* const* state, const LambNorms& tensor);

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_OPTIMIZER_H_
