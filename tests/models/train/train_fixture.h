// The small random-weight model the training tests share: a 2-layer Qwen3 shape with a byte
// vocabulary, weights large enough (init_std 0.1) that the branches move the residual, so
// perturbations and adapters inside them change the reward.
#ifndef FUCINA_TESTS_MODELS_TRAIN_TRAIN_FIXTURE_H_
#define FUCINA_TESTS_MODELS_TRAIN_TRAIN_FIXTURE_H_

#include "models/engine/fixture.h"

namespace fucina {

inline FixtureOptions SmallTrainFixture() {
  FixtureOptions o;
  o.arch = "qwen3";
  o.num_layers = 2;
  o.hidden = 32;
  o.ffn = 64;
  o.num_heads = 2;
  o.num_heads_kv = 1;
  o.head_dim = 16;
  o.init_std = 0.1;
  o.seed = 5;
  return o;
}

}  // namespace fucina

#endif  // FUCINA_TESTS_MODELS_TRAIN_TRAIN_FIXTURE_H_
