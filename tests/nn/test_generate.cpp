// Generation: the KV cache (Transformer::forward_cached) against a full recomputation, the
// sampler's properties, and the generate() loop.
//  - Exactness: at every decoding step the cached logits equal forward() over the whole prefix,
//    <= 1e-12 relative in double and <= 1e-5 in float, for multi-layer multi-head models with an
//    MLP and each attention variant (GQA / multi-query, QK-norm, learnable scale, RMSNorm, sliding
//    window, ALiBi without positions, sinusoidal positions), on both attention paths, on the CPU
//    and on the emulated CUDA device, with one token per step and with chunks of several.
//  - The sampler: greedy is the argmax and deterministic; top-k never leaves the k most likely;
//    top-p keeps the smallest nucleus; a seed reproduces a sample; frequencies follow the softmax.
//  - generate(): cached and uncached decoding choose the same tokens, past the context window too
//    (the cache slides), and bad input throws naming the argument.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "attnlab/backends/emulated.hpp"
#include "attnlab/nn/generate.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

constexpr std::size_t kVocab = 11;

// f() throws E whose message holds every needle.
template <class E, class F>
void check_throws_with(F&& f, std::initializer_list<const char*> needles) {
  try {
    f();
    FAIL("expected an exception");
  } catch (const E& e) {
    const std::string message = e.what();
    CAPTURE(message);
    for (const char* needle : needles) CHECK(message.find(needle) != std::string::npos);
  }
}

TransformerConfig lm_config(const std::string& variant, SdpaPath path) {
  TransformerConfig c;
  c.vocab_sizes = {kVocab};
  c.out_vocab = kVocab;
  c.max_len = 24;
  c.layers = 3;
  c.block.attention.d_model = 16;
  c.block.attention.heads = 4;
  c.block.attention.sdpa.causal = true;
  c.block.attention.sdpa.path = path;
  c.block.attention.sdpa.tile_rows = 4;  // small tiles: the fused paths cross tile edges
  c.block.attention.sdpa.tile_keys = 8;
  c.block.d_ff = 24;
  if (variant == "gqa") {
    c.block.attention.kv_heads = 2;
    c.block.attention.qk_norm = true;
    c.block.attention.learnable_scale = true;
    c.block.attention.d_k = 6;
    c.block.attention.d_v = 5;
    c.block.norm = Norm::rmsnorm;
  } else if (variant == "mqa-window") {
    c.block.attention.kv_heads = 1;
    c.block.attention.sdpa.window = 5;
    c.positions = PositionEncoding::sinusoidal;
  } else if (variant == "alibi") {
    c.block.attention.alibi = true;
    c.positions = PositionEncoding::none;
    c.block.attention.sdpa.scaling = Scaling::dk;
  } else if (variant == "rope") {
    c.positions = PositionEncoding::rope;  // positions continue from the cache's length
    c.block.attention.rope_fraction = 0.5;
    c.block.attention.qk_norm = true;  // RoPE after QK-norm
  } else if (variant == "rope-interleaved-gqa") {
    c.positions = PositionEncoding::rope;
    c.block.attention.rope_interleaved = true;
    c.block.attention.rope_theta = 50.0;  // fast turns: positions matter at these lengths
    c.block.attention.kv_heads = 1;
  } else if (variant == "softcap") {
    c.logit_softcap = 2.0;  // the output cap runs in every forward, cached or not
  } else if (variant == "attn-softcap-alibi") {
    c.block.attention.sdpa.softcap = 0.5;  // the score cap, before ALiBi's distance term
    c.block.attention.alibi = true;
    c.positions = PositionEncoding::none;
  } else if (variant == "tied") {
    c.tie_embeddings = true;  // the head reads the token table
  }
  return c;
}

TokenIds random_ids(std::size_t B, std::size_t T, Rng& rng) {
  TokenIds ids({B, T});
  for (auto& v : ids) v = static_cast<int>(rng.below(kVocab));
  return ids;
}

TokenIds columns(const TokenIds& ids, std::size_t begin, std::size_t end) {
  TokenIds out({ids.shape()[0], end - begin});
  for (std::size_t b = 0; b < ids.shape()[0]; ++b)
    for (std::size_t t = begin; t < end; ++t) out(b, t - begin) = ids(b, t);
  return out;
}

// Decodes `ids` (B, T) through the cache in chunks of `chunk` tokens (the first chunk is the
// prompt of `prompt` tokens) and compares every chunk's logits with the matching rows of a full
// forward over the prefix so far. Returns the largest relative error.
template <class T>
double cache_error(Transformer<T>& model, const TokenIds& ids, std::size_t prompt,
                   std::size_t chunk) {
  const std::size_t B = ids.shape()[0], T_total = ids.shape()[1], V = model.config().out_vocab;
  TransformerCache<T> cache;
  double worst = 0;
  for (std::size_t begin = 0; begin < T_total;) {
    const std::size_t end = std::min(T_total, begin == 0 ? prompt : begin + chunk);
    const Tensor3<T> cached = to_tensor<T, 3>(
        model.forward_cached(model.upload_fields({columns(ids, begin, end)}), cache));
    REQUIRE(cache.length() == end);
    const Tensor3<T> full = model.forward({columns(ids, 0, end)});
    Tensor3<T> rows({B, end - begin, V});
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = begin; t < end; ++t)
        for (std::size_t v = 0; v < V; ++v) rows(b, t - begin, v) = full(b, t, v);
    worst = std::max(worst, test::rel_error(cached, rows));
    begin = end;
  }
  return worst;
}

const char* const kVariants[] = {"plain",   "gqa",  "mqa-window",           "alibi",
                                 "softcap", "rope", "rope-interleaved-gqa", "attn-softcap-alibi",
                                 "tied"};

}  // namespace

TEST_CASE("generate: cached decoding equals a full recomputation at every step (CPU, double)") {
  for (const char* variant : kVariants) {
    for (SdpaPath path : {SdpaPath::reference, SdpaPath::fused}) {
      CAPTURE(variant);
      CAPTURE(to_string(path));
      Rng rng(5);
      Transformer<double> model(lm_config(variant, path), rng);
      Rng data(9);
      const TokenIds ids = random_ids(2, 24, data);
      CHECK(cache_error(model, ids, 5, 1) <= 1e-12);  // a prompt, then one token per step
      CHECK(cache_error(model, ids, 3, 4) <= 1e-12);  // chunks of several new tokens
    }
  }
}

TEST_CASE("generate: cached decoding equals a full recomputation (CPU, float)") {
  for (const char* variant : kVariants) {
    CAPTURE(variant);
    Rng rng(6);
    Transformer<float> model(lm_config(variant, SdpaPath::automatic), rng);
    Rng data(10);
    CHECK(cache_error(model, random_ids(1, 24, data), 1, 1) <= 1e-5);
  }
}

TEST_CASE("generate: cached decoding equals a full recomputation on the emulated CUDA device") {
  const auto ops = emulated::make_device_ops<double>();  // outlives the model on it
  for (const char* variant : kVariants) {
    for (SdpaPath path : {SdpaPath::reference, SdpaPath::fused}) {
      CAPTURE(variant);
      CAPTURE(to_string(path));
      Rng rng(7);
      TransformerConfig c = lm_config(variant, path);
      c.max_len = 12;
      Transformer<double> model(c, rng);
      model.to(*ops);
      Rng data(11);
      CHECK(cache_error(model, random_ids(2, 12, data), 4, 1) <= 1e-12);
    }
  }
}

TEST_CASE("generate: the cache refuses what it cannot do, naming the argument") {
  Rng rng(8);
  Transformer<double> model(lm_config("plain", SdpaPath::automatic), rng);
  Rng data(12);
  TransformerCache<double> cache;
  model.forward_cached(model.upload_fields({random_ids(1, 20, data)}), cache);
  check_throws_with<std::invalid_argument>(
      [&] { model.forward_cached(model.upload_fields({random_ids(1, 5, data)}), cache); },
      {"Transformer::forward_cached", "max_len = 24", "20 + 5"});
  // No backward through a decoding step.
  CHECK_THROWS_AS(model.backward(Tensor3<double>({1, 1, kVocab})), std::logic_error);
  // A non-causal model cannot decode with a cache.
  TransformerConfig bidirectional = lm_config("plain", SdpaPath::automatic);
  bidirectional.block.attention.sdpa.causal = false;
  Transformer<double> encoder(bidirectional, rng);
  TransformerCache<double> other;
  check_throws_with<std::invalid_argument>(
      [&] { encoder.forward_cached(encoder.upload_fields({random_ids(1, 3, data)}), other); },
      {"forward_cached", "causal"});
}

TEST_CASE("sampler: greedy is the argmax, lowest id among equals, and needs no seed") {
  Rng rng(13);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<double> logits(9);
    for (auto& l : logits) l = rng.normal();
    Sampler a({.greedy = true, .seed = 1}), b({.greedy = true, .seed = 2});
    const int want =
        static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    CHECK(a.sample(logits.data(), logits.size()) == want);
    CHECK(b.sample(logits.data(), logits.size()) == want);
  }
  const std::vector<float> tie = {1.0f, 3.0f, 3.0f, -2.0f};
  Sampler g({.greedy = true});
  CHECK(g.sample(tie.data(), tie.size()) == 1);
}

TEST_CASE("sampler: top-k never emits a token outside the k most likely") {
  Rng rng(14);
  for (std::size_t k : {1u, 2u, 5u}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<double> logits(12);
      for (auto& l : logits) l = 2 * rng.normal();
      std::vector<double> sorted = logits;
      std::sort(sorted.rbegin(), sorted.rend());
      const double kth = sorted[k - 1];
      Sampler s({.temperature = 3.0, .top_k = k, .seed = static_cast<std::uint64_t>(trial)});
      CHECK(s.support(logits.data(), logits.size()).size() == k);
      for (int draw = 0; draw < 200; ++draw) {
        const int id = s.sample(logits.data(), logits.size());
        REQUIRE(logits[static_cast<std::size_t>(id)] >= kth);
      }
    }
  }
}

TEST_CASE("sampler: top-p keeps the smallest most-likely set whose mass reaches p") {
  // softmax of log(0.5, 0.25, 0.15, 0.1): masses 0.5, 0.75, 0.9, 1.0.
  const std::vector<double> logits = {std::log(0.15), std::log(0.5), std::log(0.1), std::log(0.25)};
  const auto support = [&](double p) {
    return Sampler({.top_p = p}).support(logits.data(), logits.size());
  };
  CHECK(support(0.4) == std::vector<int>{1});
  CHECK(support(0.5) == std::vector<int>{1});
  CHECK(support(0.6) == std::vector<int>{1, 3});
  CHECK(support(0.8) == std::vector<int>{0, 1, 3});
  CHECK(support(1.0) == std::vector<int>{0, 1, 2, 3});
  // top-k first, then top-p within it.
  CHECK(Sampler({.top_k = 2, .top_p = 0.9}).support(logits.data(), logits.size()) ==
        std::vector<int>{1, 3});
}

TEST_CASE("sampler: a fixed seed reproduces a sample, and frequencies follow the softmax") {
  const std::vector<double> logits = {0.0, 1.0, 2.0, -1.0};
  const auto draw = [&](std::uint64_t seed, double temperature, int n) {
    Sampler s({.temperature = temperature, .seed = seed});
    std::vector<int> out;
    for (int i = 0; i < n; ++i) out.push_back(s.sample(logits.data(), logits.size()));
    return out;
  };
  CHECK(draw(3, 1.0, 100) == draw(3, 1.0, 100));
  CHECK(draw(3, 1.0, 100) != draw(4, 1.0, 100));
  for (double temperature : {1.0, 0.5, 2.0}) {
    CAPTURE(temperature);
    const int n = 40000;
    const std::vector<int> ids = draw(5, temperature, n);
    double z = 0;
    for (double l : logits) z += std::exp(l / temperature);
    for (std::size_t i = 0; i < logits.size(); ++i) {
      const double p = std::exp(logits[i] / temperature) / z;
      const double f = double(std::count(ids.begin(), ids.end(), int(i))) / n;
      CHECK(std::abs(f - p) < 4 * std::sqrt(p * (1 - p) / n) + 1e-3);  // 4 sigma
    }
  }
  check_throws_with<std::invalid_argument>([] { Sampler({.temperature = 0}); },
                                           {"Sampler", "temperature"});
  check_throws_with<std::invalid_argument>([] { Sampler({.top_p = 1.5}); },
                                           {"Sampler", "top_p", "(0, 1]"});
  const std::vector<double> bad = {0.0, std::nan("")};
  Sampler s;
  check_throws_with<std::invalid_argument>([&] { s.sample(bad.data(), bad.size()); },
                                           {"logits", "finite"});
}

TEST_CASE("generate: cached and uncached decoding choose the same tokens, past the window too") {
  for (const char* variant : kVariants) {
    CAPTURE(variant);
    Rng rng(15);
    TransformerConfig c = lm_config(variant, SdpaPath::automatic);
    c.max_len = 10;  // 40 tokens: the cache slides (keeps the newest 5, re-encodes) several times
    Transformer<double> model(c, rng);
    const std::vector<int> prompt = {1, 4, 2};
    for (const SamplerOptions& options :
         {SamplerOptions{.greedy = true}, SamplerOptions{.temperature = 1.5, .seed = 21}}) {
      Sampler a(options), b(options);
      std::vector<int> streamed;
      const auto cached = generate(model, prompt, 40, a, [&](int id) {
        streamed.push_back(id);
        return true;
      });
      const auto uncached = generate(model, prompt, 40, b, {}, {.use_cache = false});
      CHECK(cached.size() == 40);
      CHECK(cached == uncached);
      CHECK(streamed == cached);
      for (int id : cached) CHECK((id >= 0 && id < int(kVocab)));
    }
    // The callback stops it.
    Sampler s({.greedy = true});
    int calls = 0;
    CHECK(generate(model, prompt, 40, s, [&](int) { return ++calls < 3; }).size() == 3);
  }
}

TEST_CASE("generate: bad input throws naming the argument") {
  Rng rng(16);
  Transformer<double> model(lm_config("plain", SdpaPath::automatic), rng);
  Sampler s;
  check_throws_with<std::invalid_argument>([&] { generate(model, {}, 3, s); },
                                           {"generate", "prompt", "at least one token"});
  check_throws_with<std::invalid_argument>(
      [&] {
        generate(model, {1, 11}, 3, s);
      },
      {"generate", "prompt", "[0, 11)", "11 at 1"});
  TransformerConfig two = lm_config("plain", SdpaPath::automatic);
  two.vocab_sizes = {kVocab, 3};
  Transformer<double> fields(two, rng);
  check_throws_with<std::invalid_argument>([&] { generate(fields, {1}, 3, s); },
                                           {"generate", "one input field"});
}
