// Sliding-window attention (causal: query i sees keys j with i + o - w < j <= i + o) on all four
// attention paths (tests/support/attention_paths.hpp): against the dense definition
// (tests/support/dense_attention.hpp) with the query offset, a key mask and windows smaller and
// larger than a tile; a window at least Tk wide is plain causal attention; double
// central-difference gradient checks; PyTorch goldens (a boolean band mask); and the checks.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xmath.hpp>

#include "attention_cases.hpp"
#include "attention_checks.hpp"
#include "attention_paths.hpp"
#include "attnlab/gradcheck.hpp"
#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/random.hpp"
#include "dense_attention.hpp"
#include "helpers.hpp"

using namespace attnlab;
using test::Path;

namespace {

// Causal with a window (and an offset): a key mask hiding keys 1, 5, 9, ... of the last batch.
void check_against_dense(Path path, const test::AttentionCase& c) {
  Rng rng(83);
  (void)test::check_case_against_dense(path, c, test::case_options(c), rng, nullptr, 1, 4);
}

}  // namespace

TEST_CASE("window: every path equals the dense definition, with offset, mask and tile edges") {
  for (Path path : test::kPaths) {
    check_against_dense(path,
                        {2, 2, 2, 7, 7, 3, 2, true, 0, 1, false});  // each query sees itself only
    check_against_dense(path, {2, 2, 2, 7, 7, 3, 2, true, 0, 3, true});
    check_against_dense(path, {1, 2, 2, 4, 9, 3, 2, true, 5, 2, true});  // decoding: o = Tk - Tq
    // 64-row GPU tiles: a window of 20 inside a tile and one of 70 across two, Tq not a multiple.
    check_against_dense(path, {1, 1, 1, 130, 130, 4, 3, true, 0, 20, true});
    check_against_dense(path, {1, 1, 1, 130, 130, 4, 3, true, 0, 70, false});
  }
}

TEST_CASE("window: a window at least Tk + o wide is plain causal attention, on every path") {
  Rng rng(89);
  const auto q = randn<double, 4>({2, 2, 6, 3}, rng);
  const auto k = randn<double, 4>({2, 2, 6, 3}, rng);
  const auto v = randn<double, 4>({2, 2, 6, 2}, rng);
  const auto dout = randn<double, 4>({2, 2, 6, 2}, rng);
  SdpaOptions causal;
  causal.causal = true;
  SdpaOptions wide = causal;
  wide.window = 6;
  for (Path path : test::kPaths) {
    CAPTURE(test::name_of(path));
    const test::Result a = test::run(path, q, k, v, &dout, causal, nullptr);
    const test::Result b = test::run(path, q, k, v, &dout, wide, nullptr);
    CHECK(test::rel_error(a.out, b.out) == 0.0);
    CHECK(test::rel_error(a.dq, b.dq) == 0.0);
    CHECK(test::rel_error(a.dk, b.dk) == 0.0);
    CHECK(test::rel_error(a.dv, b.dv) == 0.0);
  }
}

TEST_CASE("window: central-difference gradient check on every path") {
  const std::size_t B = 2, H = 2, Tq = 5, Tk = 6, D = 3, Dv = 2;
  KeyMask mask = xt::ones<bool>({B, Tk});
  mask(1, 3) = false;
  for (Path path : test::kPaths) {
    for (std::size_t window : {2, 3}) {
      CAPTURE(window);
      Rng rng(97);
      auto q = randn<double, 4>({B, H, Tq, D}, rng);
      auto k = randn<double, 4>({B, H, Tk, D}, rng);
      auto v = randn<double, 4>({B, H, Tk, Dv}, rng);
      const auto r = randn<double, 4>({B, H, Tq, Dv}, rng);
      SdpaOptions options;
      options.causal = true;
      options.window = window;
      options.query_offset = 1;
      test::check_path_gradients(path, q, k, v, r, options, &mask);
    }
  }
}

TEST_CASE("golden: sliding-window attention matches PyTorch on every path") {
  // tests/golden/make_goldens.py window.json: masked attention with a boolean band mask and
  // autograd, float64. A window of 1 makes dq and dk exactly zero (one visible key: P = 1 whatever
  // the score): check_golden_case compares all-zero goldens absolutely.
  const auto& file = test::golden_file("window.json");
  REQUIRE(file.at("cases").size() >= 3);
  for (const auto& c : file.at("cases")) {
    const auto& config = c.at("config");
    SdpaOptions options;
    options.causal = true;
    options.window = config.at("window").get<std::size_t>();
    options.query_offset = config.at("offset").get<std::size_t>();
    test::check_golden_case(c, options);
  }
}

TEST_CASE("window: refused without causal, in the op and in the config, naming the field") {
  Rng rng(101);
  const auto x = randn<double, 4>({1, 1, 3, 2}, rng);
  SdpaOptions options;
  options.window = 2;
  SdpaCache<double> cache;
  CHECK_THROWS_WITH_AS(sdpa_forward(cache, x, x, x, options), doctest::Contains("window"),
                       std::invalid_argument);
  AttentionConfig c;
  c.d_model = 4;
  c.heads = 1;
  c.sdpa.window = 2;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("sdpa.window expected 0 without causal"),
                       std::invalid_argument);
  c.sdpa.causal = true;
  CHECK_NOTHROW(c.validate());
}
