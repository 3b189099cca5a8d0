// ALiBi (Press et al. 2022: a visible key's score gets -m_h · (i + o - j)) on all four attention
// paths (tests/support/attention_paths.hpp): against the dense definition
// (tests/support/dense_attention.hpp), with and without causal, with a query offset, a key mask,
// a sliding window and grouped-query attention; double central-difference gradient checks;
// PyTorch goldens (an additive float bias); the paper's slopes; the module option and the checks.
#include <doctest/doctest.h>

#include <cmath>
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

// Every case with ALiBi's slopes on top of what it names.
void check_against_dense(Path path, test::AttentionCase c) {
  c.alibi = true;
  Rng rng(103);
  (void)test::check_case_against_dense(path, c, test::case_options(c), rng);
}

}  // namespace

// Whether an options type carries ALiBi's slopes itself.
template <class O>
concept HasAlibiSlopes = requires(O o) {
  o.alibi_slopes;
};

TEST_CASE("alibi: the paper's slopes, 2^(-8(h+1)/H)") {
  const auto slopes = alibi_slopes(8);
  REQUIRE(slopes.size() == 8);
  for (std::size_t h = 0; h < 8; ++h) CHECK(slopes[h] == std::ldexp(1.0, -int(h) - 1));
  CHECK(alibi_slopes(4)[0] == 0.25);  // 2^(-8/4)
  CHECK_THROWS_AS(alibi_slopes(0), std::invalid_argument);
}

TEST_CASE("alibi: every path equals the dense definition, with causal, offset, mask, window, GQA") {
  for (Path path : test::kPaths) {
    check_against_dense(path, {2, 2, 2, 5, 7, 3, 2, false, 0, 0, false});  // bidirectional
    check_against_dense(path, {2, 4, 2, 6, 6, 3, 2, true, 0, 0, true});
    check_against_dense(path, {1, 2, 2, 3, 8, 3, 3, true, 5, 0, true});   // decoding
    check_against_dense(path, {2, 2, 1, 7, 7, 2, 2, true, 0, 3, false});  // window, multi-query
    // 64-row GPU tiles over two key tiles.
    check_against_dense(path, {1, 2, 2, 70, 90, 4, 3, true, 20, 0, true});
  }
}

TEST_CASE("alibi: central-difference gradient check on every path") {
  const std::size_t B = 2, H = 2, Tq = 4, Tk = 5, D = 3, Dv = 2;
  KeyMask mask = xt::ones<bool>({B, Tk});
  mask(0, 2) = false;
  for (Path path : test::kPaths) {
    for (bool causal : {false, true}) {
      CAPTURE(causal);
      Rng rng(107);
      auto q = randn<double, 4>({B, H, Tq, D}, rng);
      auto k = randn<double, 4>({B, H, Tk, D}, rng);
      auto v = randn<double, 4>({B, H, Tk, Dv}, rng);
      const auto r = randn<double, 4>({B, H, Tq, Dv}, rng);
      SdpaOptions options;
      options.causal = causal;
      options.query_offset = causal ? 1 : 0;
      options.alibi_slopes = {0.7, 0.2};
      options.head_scale = {0.9, 0.4};
      test::check_path_gradients(path, q, k, v, r, options, &mask);
    }
  }
}

TEST_CASE("golden: ALiBi matches PyTorch on every path") {
  // tests/golden/make_goldens.py alibi.json: masked attention with the bias added to the scaled
  // scores as a float tensor, autograd, float64.
  const auto& file = test::golden_file("alibi.json");
  REQUIRE(file.at("cases").size() >= 3);
  for (const auto& c : file.at("cases")) {
    const auto& config = c.at("config");
    SdpaOptions options;
    options.causal = config.at("causal").get<bool>();
    options.query_offset = config.at("offset").get<std::size_t>();
    options.alibi_slopes = config.at("slopes").get<std::vector<double>>();
    test::check_golden_case(c, options);
  }
}

TEST_CASE("alibi: MultiHeadAttention's alibi option passes the gradcheck, bad slopes are refused") {
  AttentionConfig c;
  c.d_model = 8;
  c.heads = 2;
  c.sdpa.causal = true;
  c.alibi = true;
  Rng rng(109);
  MultiHeadAttention<double> m(c, rng);
  Rng data(113);
  const auto x = randn<double, 3>({2, 5, 8}, data);
  const auto report = check_module_gradients(m, x);
  INFO(report.table());
  CHECK(report.passed(1e-7));
  CHECK(m.sdpa_options().alibi_slopes == alibi_slopes(2));
  // The scores the metrics read carry the bias: against the same scores without it, a visible
  // entry differs by exactly -m_h (i - j).
  const Tensor4<double> with = m.attention_scores();
  SdpaOptions plain = m.sdpa_options();
  plain.alibi_slopes.clear();
  const Tensor4<double> without = sdpa_scores(m.queries(), m.keys(), plain);
  // The forward itself ran with the slopes: the weights it kept (the reference path at 5 keys) are
  // the softmax of the scores with the bias, not of those without.
  const Tensor4<double> kept = m.attention_weights();
  CHECK(test::rel_error(kept, sdpa_weights(m.queries(), m.keys(), m.sdpa_options())) < 1e-14);
  CHECK(test::rel_error(kept, sdpa_weights(m.queries(), m.keys(), plain)) > 1e-3);
  const auto slopes = alibi_slopes(2);
  for (std::size_t h = 0; h < 2; ++h) {
    for (std::size_t i = 0; i < 5; ++i) {
      for (std::size_t j = 0; j <= i; ++j) {
        CHECK(with(1, h, i, j) - without(1, h, i, j) ==
              doctest::Approx(-slopes[h] * double(i - j)).epsilon(1e-12));
      }
    }
  }

  Rng r2(127);
  const auto q = randn<double, 4>({1, 2, 3, 2}, r2);
  SdpaOptions options;
  options.alibi_slopes = {0.5};  // one slope for two heads
  SdpaCache<double> cache;
  CHECK_THROWS_AS(sdpa_forward(cache, q, q, q, options), ShapeError);
  options.alibi_slopes = {0.5, std::nan("")};
  CHECK_THROWS_WITH_AS(sdpa_forward(cache, q, q, q, options), doctest::Contains("alibi_slopes"),
                       std::invalid_argument);
  // A layer's slopes come from its alibi flag alone: its config has no slopes field to disagree.
  static_assert(!HasAlibiSlopes<decltype(AttentionConfig::sdpa)>);
  static_assert(HasAlibiSlopes<SdpaOptions>);
}
