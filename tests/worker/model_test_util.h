// Shared by the tests of worker/model.h, param_layout.h, model_file.h: the
// tiny test model, random batches, parameter perturbation.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>  // uint32_t, uint64_t
#include <memory>   // unique_ptr
#include <random>   // mt19937, distributions
#include <utility>  // move
#include <vector>   // token buffers

#include "worker/model.h"

namespace dslaunch::worker {

// The test model: V 67 (padded to 128), maxT 8, 2 layers, 2 heads, C 16.
inline ModelConfig Tiny() { return ModelConfig::Make(8, 67, 2, 2, 16); }

inline std::unique_ptr<Model> NewModel(const ModelConfig& c, uint64_t seed,
                                       ParamOrder order = ParamOrder::kLlmc) {
  StatusOr<std::unique_ptr<Model>> m = Model::Create(c, order);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  (*m)->InitParams(seed);
  return std::move(m).value();
}

struct Batch {
  int B, T;
  std::vector<int> tokens, targets;
};

inline Batch MakeBatch(const ModelConfig& c, int B, int T, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
  Batch b{B, T, std::vector<int>(B * T), std::vector<int>(B * T)};
  for (int& x : b.tokens) x = tok(rng);
  for (int& x : b.targets) x = tok(rng);
  return b;
}

inline float Forward(Model& m, const Batch& b) {
  return m.Forward(b.tokens.data(), b.targets.data(), b.B, b.T);
}

// Moves every parameter off its init (LayerNorm weights off 1, biases off
// 0, larger weights) so the gradient check exercises every path.
inline void Perturb(Model& m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  for (float& p : m.params()) p += noise(rng);
}

}  // namespace dslaunch::worker
