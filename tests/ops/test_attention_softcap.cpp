// The attention-score softcap (S = c · tanh(s · q·k / c), then ALiBi's term, the bias and the mask:
// attnlab/attention/score_rule.hpp) on all four attention paths
// (tests/support/attention_paths.hpp): against the dense definition
// (tests/support/dense_attention.hpp) in every combination with the scale, ALiBi, a bias, causal
// with an offset, a key mask, a sliding window, grouped-query attention and dropout; double
// central-difference gradient checks of dq, dk, dv and dbias on every path, with scores deep in the
// tanh's curve; PyTorch goldens; the bound |S| ≤ c; the layer's learnable scale through the cap;
// the checks.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>
#include <xtensor/xbuilder.hpp>

#include "attention_cases.hpp"
#include "attention_checks.hpp"
#include "attention_paths.hpp"
#include "attnlab/gradcheck.hpp"
#include "attnlab/nn/gradcheck_module.hpp"
#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/random.hpp"
#include "dense_attention.hpp"
#include "helpers.hpp"

using namespace attnlab;
using test::Path;

namespace {

void check_against_dense(Path path, const test::AttentionCase& c, double cap, double scale) {
  CAPTURE(cap);
  CAPTURE(c.alibi);
  CAPTURE(c.bias);
  Rng rng(211);
  SdpaOptions options = test::case_options(c);
  options.scale = scale;
  options.softcap = cap;
  const Tensor4<double> want = test::check_case_against_dense(path, c, options, rng);
  // The cap changes the result: the same inputs without it differ.
  Rng again(211);
  SdpaOptions uncapped = options;
  uncapped.softcap = 0;
  const auto [q, k, v, mask] = test::random_inputs(again, c.B, c.H, c.Hkv, c.Tq, c.Tk, c.D, c.Dv);
  const Tensor4<double> bias = randn<double, 4>({1, c.H, c.Tq, c.Tk}, again);
  const auto keep = sdpa_dropout_mask(options, c.B, c.H, c.Tq, c.Tk);
  CHECK(test::rel_error(want, test::dense_attention(q, k, v, uncapped, c.mask ? &mask : nullptr,
                                                    c.bias ? &bias : nullptr, &keep)) > 1e-3);
}

}  // namespace

TEST_CASE(
    "attention softcap: every path equals the dense definition, with scale, ALiBi, bias, causal, "
    "offset, mask, window, GQA and dropout") {
  for (Path path : test::kPaths) {
    for (double cap : {0.7, 5.0}) {
      // B, H, Hkv, Tq, Tk, D, Dv, causal, offset, window, mask, alibi, bias (dropout)
      check_against_dense(path, {2, 2, 2, 5, 7, 3, 2, false, 0, 0, false, false, false}, cap, 2.0);
      check_against_dense(path, {2, 4, 2, 6, 6, 3, 2, true, 0, 0, true, true, false}, cap, 3.0);
      check_against_dense(path, {2, 2, 2, 4, 6, 3, 3, false, 0, 0, true, false, true}, cap, 1.5);
      check_against_dense(path, {1, 2, 2, 3, 8, 3, 3, true, 5, 0, true, true, true}, cap, 2.5);
      check_against_dense(path, {2, 2, 1, 7, 7, 2, 2, true, 0, 3, false, true, true}, cap, 4.0);
      check_against_dense(path, {2, 2, 2, 5, 5, 3, 2, true, 0, 0, true, true, true, 0.3}, cap, 2.0);
      // 64-row GPU tiles over two key tiles.
      check_against_dense(path, {1, 2, 2, 70, 90, 4, 3, true, 20, 0, true, true, true}, cap, 1.0);
    }
  }
}

TEST_CASE("attention softcap: the capped part of a score stays within (-c, c)") {
  // Huge dots (scale 50): without ALiBi, a bias or the mask the scores are the capped dots.
  Rng rng(223);
  const auto q = randn<double, 4>({1, 2, 4, 3}, rng);
  const auto k = randn<double, 4>({1, 2, 6, 3}, rng);
  SdpaOptions options;
  options.scale = 50.0;
  options.softcap = 2.0;
  const Tensor4<double> s = sdpa_scores(q, k, options);
  CHECK(xt::amax(xt::abs(s))() <= 2.0);  // tanh rounds to ±1 far out
  CHECK(xt::amax(xt::abs(s))() > 1.9);   // some dots are far beyond the cap
  options.softcap = 0;
  CHECK(xt::amax(xt::abs(sdpa_scores(q, k, options)))() > 10.0);
}

TEST_CASE("attention softcap: central-difference gradient check on every path, dbias included") {
  const std::size_t B = 2, H = 2, Tq = 4, Tk = 5, D = 3, Dv = 2;
  KeyMask mask = xt::ones<bool>({B, Tk});
  mask(0, 2) = false;
  for (Path path : test::kPaths) {
    for (bool causal : {false, true}) {
      CAPTURE(causal);
      Rng rng(227);
      auto q = randn<double, 4>({B, H, Tq, D}, rng);
      auto k = randn<double, 4>({B, H, Tk, D}, rng);
      auto v = randn<double, 4>({B, H, Tk, Dv}, rng);
      auto bias = randn<double, 4>({1, H, Tq, Tk}, rng);
      const auto r = randn<double, 4>({B, H, Tq, Dv}, rng);
      SdpaOptions options;
      options.causal = causal;
      options.query_offset = causal ? 1 : 0;
      options.alibi_slopes = {0.7, 0.2};
      options.head_scale = {1.9, 0.8};  // dots of a few units: tanh's slope well below 1
      options.softcap = 1.1;
      test::check_path_gradients(path, q, k, v, r, options, &mask, &bias);
    }
  }
}

TEST_CASE("golden: the attention softcap matches PyTorch on every path") {
  // tests/golden/make_goldens.py softcap.json: c tanh(s q.k / c) + ALiBi + bias, masked, autograd.
  const auto& file = test::golden_file("softcap.json");
  REQUIRE(file.at("cases").size() >= 4);
  for (const auto& c : file.at("cases")) {
    const auto& config = c.at("config");
    SdpaOptions options;
    options.causal = config.at("causal").get<bool>();
    options.query_offset = config.at("offset").get<std::size_t>();
    options.softcap = config.at("softcap").get<double>();
    options.scale = config.at("scale").get<double>();
    options.alibi_slopes = config.at("slopes").get<std::vector<double>>();
    test::check_golden_case(c, options);
  }
}

TEST_CASE("attention softcap: MultiHeadAttention with a learnable scale passes the gradcheck") {
  for (bool qk_norm : {false, true}) {
    CAPTURE(qk_norm);
    AttentionConfig c;
    c.d_model = 8;
    c.heads = 2;
    c.sdpa.causal = true;
    c.sdpa.softcap = 0.9;
    c.learnable_scale = true;
    c.qk_norm = qk_norm;
    c.alibi = true;
    Rng rng(229);
    MultiHeadAttention<double> m(c, rng);
    Rng data(233);
    const Tensor3<double> x = 2.0 * randn<double, 3>({2, 5, 8}, data);
    const auto report = check_module_gradients(m, x);
    INFO(report.table());
    CHECK(report.passed(1e-7));
    CHECK(m.sdpa_options().softcap == 0.9);
    // The weights the forward kept are the softmax of the capped scores (a forward at the
    // restored parameters: the check's last one perturbed them).
    m.forward(x);
    SdpaOptions plain = m.sdpa_options();
    plain.softcap = 0;
    const Tensor4<double> kept = m.attention_weights();
    CHECK(test::rel_error(kept, sdpa_weights(m.queries(), m.keys(), m.sdpa_options())) < 1e-14);
    CHECK(test::rel_error(kept, sdpa_weights(m.queries(), m.keys(), plain)) > 1e-3);
  }
}

TEST_CASE("attention softcap: a negative, NaN or infinite cap is refused, naming softcap") {
  Rng rng(239);
  const auto q = randn<double, 4>({1, 2, 3, 2}, rng);
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    CAPTURE(bad);
    SdpaOptions options;
    options.softcap = bad;
    SdpaCache<double> cache;
    CHECK_THROWS_WITH_AS(sdpa_forward(cache, q, q, q, options), doctest::Contains("softcap"),
                         std::invalid_argument);
    AttentionConfig c;
    c.d_model = 4;
    c.heads = 2;
    c.sdpa.softcap = bad;
    CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("softcap"), std::invalid_argument);
  }
}
