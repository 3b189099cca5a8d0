// Autoregressive generation with a Transformer: a sampler, and a loop over the model's KV cache.
//
//   Sampler sampler({.temperature = 0.8, .top_k = 40, .seed = 1});
//   generate(model, prompt_ids, 500, sampler, [](int id) { print(id); return true; });
//
// The model has one input field whose vocabulary is its output vocabulary (a language model) and
// causal attention. Each step feeds the newest token through Transformer::forward_cached (O(T) per
// token); GenerateOptions::use_cache = false recomputes the whole context every step instead
// (O(T^2) per token), over the same context, for comparisons.
//
// The context window is the model's max_len (its trained block size). When it is full, the oldest
// tokens are dropped: the last max_len / 2 tokens are kept and re-encoded into a fresh cache, and
// decoding continues from there (so the context holds between max_len / 2 and max_len tokens; one
// re-encode every max_len / 2 tokens keeps the cost per token O(T)). A prompt longer than max_len
// keeps its last max_len tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "attnlab/nn/transformer.hpp"
#include "attnlab/random.hpp"

namespace attnlab {

struct SamplerOptions {
  double temperature = 1.0;  // > 0: logits / temperature before the softmax
  std::size_t top_k = 0;     // > 0: only the k most likely tokens (equal logits: lower ids first)
  double top_p = 1.0;        // (0, 1]: only the smallest most-likely set with mass >= top_p
  bool greedy = false;       // the most likely token (the lowest id among equals); no randomness
  std::uint64_t seed = 0;    // the draws' Rng
};

class Sampler {
 public:
  // Throws std::invalid_argument naming the option: temperature not finite and > 0, top_p not in
  // (0, 1].
  explicit Sampler(const SamplerOptions& options = {});
  // One token id from a row of V logits: greedy, or drawn from softmax(logits / temperature)
  // restricted to the top-k, then to the top-p nucleus, renormalised. Non-finite logits are
  // std::invalid_argument (a diverged model), except -inf (a token that cannot occur).
  template <class T>
  int sample(const T* logits, std::size_t V);
  // The token ids sample() may return for these logits (its support), sorted ascending.
  template <class T>
  std::vector<int> support(const T* logits, std::size_t V) const;
  const SamplerOptions& options() const { return options_; }

 private:
  // The kept ids, most likely first, and their renormalised probabilities.
  template <class T>
  void candidates(const T* logits, std::size_t V, std::vector<int>& ids,
                  std::vector<double>& probs) const;
  SamplerOptions options_;
  Rng rng_;
};

struct GenerateOptions {
  bool use_cache = true;  // false: recompute the whole context at every step
};

// Appends up to n tokens to `prompt` (ids in [0, V), at least one) and returns them (without the
// prompt). on_token(id) is called for each token as soon as it is chosen; returning false stops
// generation. Switches the model to eval mode (no dropout). Throws std::invalid_argument for a
// model that is not a causal one-field language model, an empty prompt, or an id outside [0, V).
template <class T>
std::vector<int> generate(Transformer<T>& model, const std::vector<int>& prompt, std::size_t n,
                          Sampler& sampler, const std::function<bool(int)>& on_token = {},
                          const GenerateOptions& options = {});

}  // namespace attnlab
