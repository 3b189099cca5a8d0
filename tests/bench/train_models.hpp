// The models of the training-step benchmarks, shared by the CPU benchmark (bench_train.cpp) and
// the GPU one (tests/bench_cuda), all causal:
//   study:   the study's attention shape, 1 layer, 1 head, attention only, d_model 64, d_k 256
//            (d_v 64), T = 33, B = 64, 16 symbols, causal, learned positions
//   small:   2 layers, 4 heads, d_model 128, d_ff 512, T = 256, B = 16, 16 symbols
//   nanogpt: nanoGPT's CPU Shakespeare shape (its README's "I only have a macbook" run):
//            4 layers, 4 heads, d_model 128, d_ff 512, T = 64, B = 12, 65 characters
#pragma once

#include <cstddef>

#include "attnlab/nn/transformer.hpp"

namespace attnlab::bench {

struct TrainModel {
  const char* name;
  std::size_t B, T, d_model, heads, d_k, d_ff, layers;
  bool attn_only;
  std::size_t vocab;
};

inline constexpr TrainModel kTrainModels[] = {
    {"study", 64, 33, 64, 1, 256, 0, 1, true, 16},
    {"small", 16, 256, 128, 4, 0, 512, 2, false, 16},
    {"nanogpt", 12, 64, 128, 4, 0, 512, 4, false, 65},
};

inline TransformerConfig train_config(const TrainModel& m, SdpaPath path = SdpaPath::automatic) {
  TransformerConfig c;
  c.vocab_sizes = {m.vocab};
  c.max_len = m.T;
  c.block.attention.d_model = m.d_model;
  c.block.attention.heads = m.heads;
  c.block.attention.d_k = m.d_k;
  c.block.d_ff = m.d_ff ? m.d_ff : 4 * m.d_model;
  c.layers = m.layers;
  c.out_vocab = m.vocab;
  c.block.attn_only = m.attn_only;
  c.block.attention.sdpa.causal = true;
  c.block.attention.sdpa.path = path;
  return c;
}

}  // namespace attnlab::bench
