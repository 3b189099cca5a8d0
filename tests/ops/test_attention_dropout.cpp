// Dropout on the attention weights (O = (P ⊙ M / (1 − p)) V, M from a counter-based Philox
// generator, attnlab/attention/dropout.hpp) on all four attention paths
// (tests/support/attention_paths.hpp): the generator against Random123's known answers; the kept
// fraction within binomial bounds; every path against the dense definition with the drawn mask
// (so the CPU and the emulated device draw identical masks), combined with causal, a mask, a
// window, GQA and a bias; double central-difference gradient checks with the mask held fixed;
// PyTorch goldens replaying the mask (drawn by an independent Python Philox); p = 0 and the checks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>
#include <xtensor/xbuilder.hpp>

#include "attention_cases.hpp"
#include "attention_checks.hpp"
#include "attention_paths.hpp"
#include "attnlab/attention/dropout.hpp"
#include "attnlab/gradcheck.hpp"
#include "attnlab/random.hpp"
#include "dense_attention.hpp"
#include "helpers.hpp"

using namespace attnlab;
using test::Path;

namespace {

using Case = test::AttentionCase;

SdpaOptions dropout_options(const Case& c, std::uint64_t seed) {
  return test::case_options(c, seed);
}

void check_against_dense(Path path, const Case& c) {
  Rng rng(157);
  (void)test::check_case_against_dense(path, c, dropout_options(c, 0xC0FFEE), rng);
}

}  // namespace

TEST_CASE("dropout: Philox4x32-10 matches Random123's known answers") {
  using attention::Philox4;
  const auto same = [](const Philox4& a, const Philox4& b) {
    return a.x[0] == b.x[0] && a.x[1] == b.x[1] && a.x[2] == b.x[2] && a.x[3] == b.x[3];
  };
  CHECK(same(attention::philox4x32_10(Philox4{{0, 0, 0, 0}}, 0, 0),
             Philox4{{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}));
  CHECK(same(attention::philox4x32_10(Philox4{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
                                      0xffffffffu, 0xffffffffu),
             Philox4{{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}));
  CHECK(same(attention::philox4x32_10(Philox4{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                                      0xa4093822u, 0x299f31d0u),
             Philox4{{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}));
  // The CPU's batch form (AVX2 with x86-64-v3) gives the same words as one block at a time.
  std::uint32_t words[4 * attention::kPhiloxLanes];
  for (std::uint32_t first : {0u, 5u, 0xfffffff8u}) {
    attention::philox_blocks(0x0123456789abcdefULL, 7, 11, 13, first, words);
    for (std::size_t l = 0; l < attention::kPhiloxLanes; ++l) {
      const Philox4 one = attention::philox_block(0x0123456789abcdefULL, 7, 11, 13,
                                                  4 * std::size_t(std::uint32_t(first + l)));
      for (std::size_t w = 0; w < 4; ++w) CHECK(words[4 * l + w] == one.x[w]);
    }
  }
}

TEST_CASE(
    "dropout: the kept fraction is within binomial bounds of 1 - p, and keys give fresh masks") {
  const std::size_t B = 2, H = 4, Tq = 64, Tk = 128;
  const double n = double(B * H * Tq * Tk);
  for (double p : {0.1, 0.5, 0.9}) {
    CAPTURE(p);
    SdpaOptions options;
    options.dropout_p = p;
    options.dropout_seed = attention::dropout_key(42, 7, 1);
    const auto keep = sdpa_dropout_mask(options, B, H, Tq, Tk);
    double kept = 0;
    for (bool x : keep) kept += x ? 1 : 0;
    // 5 standard deviations of a binomial fraction: fails by chance with probability < 1e-6.
    CHECK(std::abs(kept / n - (1 - p)) < 5 * std::sqrt(p * (1 - p) / n));
    // Another step, another layer, another seed: masks that agree only by chance, p² + (1 − p)².
    for (std::uint64_t key : {attention::dropout_key(42, 8, 1), attention::dropout_key(42, 7, 2),
                              attention::dropout_key(43, 7, 1)}) {
      options.dropout_seed = key;
      const auto other = sdpa_dropout_mask(options, B, H, Tq, Tk);
      double agree = 0;
      for (std::size_t e = 0; e < keep.size(); ++e) agree += keep.data()[e] == other.data()[e];
      const double chance = p * p + (1 - p) * (1 - p);
      CHECK(std::abs(agree / n - chance) < 5 * std::sqrt(chance * (1 - chance) / n));
    }
  }
  // The same key draws the same mask (what a backward and a resumed run rely on).
  SdpaOptions options;
  options.dropout_p = 0.3;
  options.dropout_seed = 99;
  CHECK(sdpa_dropout_mask(options, 1, 2, 5, 9) == sdpa_dropout_mask(options, 1, 2, 5, 9));
  // The row helper (one Philox call per four keys) equals the per-element rule from any start.
  AttentionSpec spec;
  spec.dropout_p = 0.3;
  spec.dropout_seed = 99;
  for (std::size_t j0 : {0, 1, 3, 6}) {
    std::vector<double> row(11, 1.0);
    attention::attention_dropout_row(spec, 3, 2, j0, row.size(), row.data());
    for (std::size_t c = 0; c < row.size(); ++c) {
      CHECK(row[c] == attention::attention_dropout_factor<double>(spec, 3, 2, j0 + c));
    }
  }
}

TEST_CASE(
    "dropout: every path equals the dense definition with the drawn mask, over the variants") {
  for (Path path : test::kPaths) {
    check_against_dense(path, {2, 2, 2, 5, 7, 3, 2, false, 0, 0, false, false, false, 0.3});
    check_against_dense(
        path, {2, 4, 2, 6, 6, 3, 2, true, 0, 0, true, false, true, 0.5});  // GQA, mask, bias
    check_against_dense(
        path, {2, 2, 1, 7, 7, 2, 2, true, 0, 3, false, false, false, 0.2});  // window, MQA
    check_against_dense(path,
                        {1, 2, 2, 70, 90, 4, 3, true, 0, 0, true, false, false, 0.1});  // GPU tiles
  }
}

TEST_CASE("dropout: central-difference gradient check with the mask held fixed, on every path") {
  // The mask depends on its key and coordinates only, so every loss evaluation draws the same one.
  for (Path path : test::kPaths) {
    for (const Case& c : {Case{2, 2, 2, 4, 5, 3, 2, false, 0, 0, true, false, false, 0.4},
                          Case{2, 4, 2, 4, 6, 3, 2, true, 0, 0, false, false, true, 0.3}}) {
      CAPTURE(c.causal);
      Rng rng(163);
      auto q = randn<double, 4>({c.B, c.H, c.Tq, c.D}, rng);
      auto k = randn<double, 4>({c.B, c.Hkv, c.Tk, c.D}, rng);
      auto v = randn<double, 4>({c.B, c.Hkv, c.Tk, c.Dv}, rng);
      auto bias = randn<double, 4>({1, c.H, c.Tq, c.Tk}, rng);
      const auto r = randn<double, 4>({c.B, c.H, c.Tq, c.Dv}, rng);
      KeyMask mask = xt::ones<bool>({c.B, c.Tk});
      mask(0, 1) = false;
      const SdpaOptions options = dropout_options(c, 2024);
      test::check_path_gradients(path, q, k, v, r, options, c.mask ? &mask : nullptr,
                                 c.bias ? &bias : nullptr);
    }
  }
}

TEST_CASE("golden: dropout replaying the committed mask matches PyTorch on every path") {
  // tests/golden/make_goldens.py dropout.json: the mask drawn by an independent Python Philox,
  // the weights times keep / (1 - p), autograd, float64.
  const auto& file = test::golden_file("dropout.json");
  REQUIRE(file.at("cases").size() >= 3);
  for (const auto& c : file.at("cases")) {
    const auto& config = c.at("config");
    SdpaOptions options;
    options.causal = config.at("causal").get<bool>();
    options.dropout_p = config.at("p").get<double>();
    options.dropout_seed = config.at("seed").get<std::uint64_t>();
    // attnlab draws the mask that PyTorch replayed.
    const auto& q = test::golden_tensor(c, "q");
    CHECK(xt::cast<double>(sdpa_dropout_mask(options, q.shape()[0], q.shape()[1], q.shape()[2],
                                             test::golden_tensor(c, "k").shape()[2])) ==
          test::golden_tensor(c, "keep"));
    test::check_golden_case(c, options);
  }
}

TEST_CASE("dropout: p = 0 is no dropout whatever the seed, and p outside 0 <= p < 1 is refused") {
  Rng rng(167);
  const auto q = randn<double, 4>({2, 2, 5, 4}, rng);
  const auto r = randn<double, 4>({2, 2, 5, 4}, rng);
  SdpaOptions off;
  off.dropout_seed = 12345;  // ignored at p = 0
  for (Path path : test::kPaths) {
    CAPTURE(test::name_of(path));
    const test::Result plain = test::run(path, q, q, q, &r, {}, nullptr);
    const test::Result zero = test::run(path, q, q, q, &r, off, nullptr);
    CHECK(zero.out == plain.out);
    CHECK(zero.dq == plain.dq);
    CHECK(zero.dk == plain.dk);
    CHECK(zero.dv == plain.dv);
  }
  SdpaCache<double> cache;
  for (double p : {1.0, -0.1, 1.5, std::nan("")}) {
    CAPTURE(p);
    SdpaOptions bad;
    bad.dropout_p = p;
    CHECK_THROWS_WITH_AS(
        sdpa_forward(cache, q, q, q, bad),
        doctest::Contains("sdpa_forward: dropout_p expected a probability in [0, 1)"),
        std::invalid_argument);
  }
  AttentionParams<float> params;
  params.B = params.H = params.Hkv = params.Tq = params.Tk = params.D = params.Dv = 1;
  params.dropout_p = 1.0;
  CHECK_THROWS_WITH_AS(check_attention_params(params, "launcher"),
                       doctest::Contains("launcher: dropout_p expected a probability in [0, 1)"),
                       std::invalid_argument);
}

TEST_CASE(
    "variants combined: GQA, causal, offset, mask, bias, window, ALiBi and dropout together") {
  // Every variant at once on small shapes, on every path, against the dense definition; batch 1's
  // mask hides every key, so its rows are empty and must give exact zeros (outputs and gradients).
  const std::size_t B = 2, H = 4, Hkv = 2, Tq = 5, Tk = 8, D = 3, Dv = 2;
  Rng rng(211);
  auto q = randn<double, 4>({B, H, Tq, D}, rng);
  auto k = randn<double, 4>({B, Hkv, Tk, D}, rng);
  auto v = randn<double, 4>({B, Hkv, Tk, Dv}, rng);
  auto bias = randn<double, 4>({B, 1, Tq, Tk}, rng);
  const auto r = randn<double, 4>({B, H, Tq, Dv}, rng);
  KeyMask mask = xt::ones<bool>({B, Tk});
  mask(0, 4) = false;
  for (std::size_t j = 0; j < Tk; ++j) mask(1, j) = false;
  SdpaOptions options;
  options.causal = true;
  options.query_offset = 3;
  options.window = 4;
  options.alibi_slopes = alibi_slopes(H);
  options.dropout_p = 0.25;
  options.dropout_seed = attention::dropout_key(1, 2, 3);
  const auto keep = sdpa_dropout_mask(options, B, H, Tq, Tk);
  const Tensor4<double> expected = test::dense_attention(q, k, v, options, &mask, &bias, &keep);
  for (Path path : test::kPaths) {
    CAPTURE(test::name_of(path));
    const test::Result g = test::run(path, q, k, v, &r, options, &mask, &bias);
    REQUIRE(test::all_finite(g.out));
    CHECK(test::rel_error(g.out, expected) < 1e-13);
    for (std::size_t h = 0; h < H; ++h) {
      for (std::size_t i = 0; i < Tq; ++i) {
        for (std::size_t c = 0; c < Dv; ++c) CHECK(g.out(1, h, i, c) == 0.0);
        for (std::size_t c = 0; c < D; ++c) CHECK(g.dq(1, h, i, c) == 0.0);
      }
    }
    for (std::size_t i = 0; i < Tq; ++i) {
      for (std::size_t j = 0; j < Tk; ++j) CHECK(g.dbias(1, 0, i, j) == 0.0);
    }
    for (std::size_t h = 0; h < Hkv; ++h) {
      for (std::size_t j = 0; j < Tk; ++j) {
        for (std::size_t c = 0; c < D; ++c) CHECK(g.dk(1, h, j, c) == 0.0);
        for (std::size_t c = 0; c < Dv; ++c) CHECK(g.dv(1, h, j, c) == 0.0);
      }
    }
    test::check_path_gradients(path, q, k, v, r, options, &mask, &bias);
  }
}
