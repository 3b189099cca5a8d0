#include "attnlab/nn/generate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "attnlab/device_ops.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

Sampler::Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {
  check_arg(std::isfinite(options.temperature) && options.temperature > 0, "Sampler", "temperature",
            "a finite value > 0", std::to_string(options.temperature));
  check_arg(options.top_p > 0 && options.top_p <= 1, "Sampler", "top_p", "a value in (0, 1]",
            std::to_string(options.top_p));
}

template <class T>
void Sampler::candidates(const T* logits, std::size_t V, std::vector<int>& ids,
                         std::vector<double>& probs) const {
  check_arg(V > 0, "Sampler::sample", "V", "> 0", "0");
  std::vector<std::pair<double, int>> z;
  z.reserve(V);
  for (std::size_t i = 0; i < V; ++i) {
    const double l = static_cast<double>(logits[i]);
    if (std::isinf(l) && l < 0) continue;  // a token that cannot occur
    check_arg(std::isfinite(l), "Sampler::sample", "logits", "finite values (or -inf)",
              std::to_string(l) + " at id " + std::to_string(i));
    z.emplace_back(l / options_.temperature, static_cast<int>(i));
  }
  check_arg(!z.empty(), "Sampler::sample", "logits", "at least one finite logit", "all -inf");
  // Most likely first; equal logits in id order (the greedy choice is the lowest id). Only the
  // prefix that greedy or top-k can keep is ordered (a total order: the same prefix as a full
  // sort).
  std::size_t kept = z.size();
  if (options_.greedy) kept = 1;
  if (options_.top_k > 0) kept = std::min(kept, options_.top_k);
  std::partial_sort(z.begin(), z.begin() + static_cast<std::ptrdiff_t>(kept), z.end(),
                    [](const auto& a, const auto& b) {
                      return a.first > b.first || (a.first == b.first && a.second < b.second);
                    });
  probs.resize(kept);
  for (std::size_t i = 0; i < kept; ++i) probs[i] = std::exp(z[i].first - z[0].first);
  double total = std::accumulate(probs.begin(), probs.end(), 0.0);
  if (options_.top_p < 1) {  // the smallest prefix whose mass reaches top_p
    double mass = 0;
    std::size_t n = 0;
    while (n < kept) {
      mass += probs[n++] / total;
      if (mass >= options_.top_p) break;
    }
    kept = n;
    probs.resize(kept);
    total = std::accumulate(probs.begin(), probs.end(), 0.0);
  }
  ids.resize(kept);
  for (std::size_t i = 0; i < kept; ++i) {
    ids[i] = z[i].second;
    probs[i] /= total;
  }
}

template <class T>
int Sampler::sample(const T* logits, std::size_t V) {
  std::vector<int> ids;
  std::vector<double> probs;
  candidates(logits, V, ids, probs);
  if (options_.greedy || ids.size() == 1) return ids.front();
  const double u = rng_.uniform();
  double cumulative = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    cumulative += probs[i];
    if (u < cumulative) return ids[i];
  }
  return ids.back();  // rounding: u just below 1
}

template <class T>
std::vector<int> Sampler::support(const T* logits, std::size_t V) const {
  std::vector<int> ids;
  std::vector<double> probs;
  candidates(logits, V, ids, probs);
  std::sort(ids.begin(), ids.end());
  return ids;
}

template <class T>
std::vector<int> generate(Transformer<T>& model, const std::vector<int>& prompt, std::size_t n,
                          Sampler& sampler, const std::function<bool(int)>& on_token,
                          const GenerateOptions& options) {
  const TransformerConfig& c = model.config();
  check_arg(c.vocab_sizes.size() == 1, "generate", "model.vocab_sizes",
            "one input field (a language model)", std::to_string(c.vocab_sizes.size()) + " fields");
  check_arg(c.out_vocab == c.vocab_sizes[0], "generate", "model.out_vocab",
            "the input vocabulary " + std::to_string(c.vocab_sizes[0]),
            std::to_string(c.out_vocab));
  check_arg(c.block.attention.sdpa.causal, "generate", "model.block.attention.sdpa.causal",
            "causal attention", "false");
  check_arg(!prompt.empty(), "generate", "prompt", "at least one token", "none");
  const std::size_t V = c.out_vocab;
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    check_arg(prompt[i] >= 0 && static_cast<std::size_t>(prompt[i]) < V, "generate", "prompt",
              "ids in [0, " + std::to_string(V) + ")",
              std::to_string(prompt[i]) + " at " + std::to_string(i));
  }
  model.eval();
  DeviceOps<T>& ops = model.ops();
  const std::size_t window = c.max_len, keep = std::max<std::size_t>(1, window / 2);
  // The context: the last `window` tokens at most; its first `fed` are in the cache.
  std::vector<int> context(
      prompt.end() - static_cast<std::ptrdiff_t>(std::min(prompt.size(), window)), prompt.end());
  std::size_t fed = 0;
  TransformerCache<T> cache;
  std::vector<T> row(V);
  const auto upload = [&](const int* ids, std::size_t count) {
    TokenIds t({1, count});
    std::copy(ids, ids + count, t.data());
    return model.upload_fields({t});
  };
  std::vector<int> out;
  for (std::size_t step = 0; step < n; ++step) {
    Buffer<T> logits;
    if (options.use_cache) {
      logits = model.forward_cached(upload(context.data() + fed, context.size() - fed), cache);
      fed = context.size();
    } else {
      logits = model.forward(upload(context.data(), context.size()));
    }
    ops.download(row.data(), logits.data() + (logits.dim(1) - 1) * V, V * sizeof(T));
    const int id = sampler.sample(row.data(), V);
    out.push_back(id);
    if (on_token && !on_token(id)) break;
    if (context.size() == window) {  // full: keep the newest tokens, re-encode them afresh
      context.erase(context.begin(), context.end() - static_cast<std::ptrdiff_t>(keep - 1));
      cache.clear();
      fed = 0;
    }
    context.push_back(id);
  }
  return out;
}

template int Sampler::sample<float>(const float*, std::size_t);
template int Sampler::sample<double>(const double*, std::size_t);
template std::vector<int> Sampler::support<float>(const float*, std::size_t) const;
template std::vector<int> Sampler::support<double>(const double*, std::size_t) const;
template std::vector<int> generate<float>(Transformer<float>&, const std::vector<int>&, std::size_t,
                                          Sampler&, const std::function<bool(int)>&,
                                          const GenerateOptions&);
template std::vector<int> generate<double>(Transformer<double>&, const std::vector<int>&,
                                           std::size_t, Sampler&, const std::function<bool(int)>&,
                                           const GenerateOptions&);

}  // namespace attnlab
