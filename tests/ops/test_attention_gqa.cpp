// Grouped-query attention (Hkv key/value heads shared by H / Hkv query heads each) on all four
// attention paths (tests/support/attention_paths.hpp): it equals multi-head attention over K and V
// repeated per group (PyTorch's repeat_interleave, what enable_gqa=True means), forward and
// backward, with dK and dV the sums over each group; double central-difference gradient checks
// with causal attention and a key mask; multi-query attention (Hkv = 1); the module's kv_heads
// option (shapes, gradient check, one seed and one config error); and the checks.
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

#include "attention_cases.hpp"
#include "attention_checks.hpp"
#include "attention_paths.hpp"
#include "attnlab/gradcheck.hpp"
#include "attnlab/nn/gradcheck_module.hpp"
#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

using namespace attnlab;
using test::Path;

namespace {

// x (B,Hkv,T,·) with every K/V head repeated for the g = H / Hkv query heads that read it.
Tensor4<double> repeat_heads(const Tensor4<double>& x, std::size_t H) {
  const std::size_t B = x.shape()[0], Hkv = x.shape()[1], g = H / Hkv;
  Tensor4<double> out({B, H, x.shape()[2], x.shape()[3]});
  for (std::size_t h = 0; h < H; ++h) {
    xt::view(out, xt::all(), h, xt::all(), xt::all()) =
        xt::view(x, xt::all(), h / g, xt::all(), xt::all());
  }
  return out;
}

// dx (B,H,T,·) summed over each group of g query heads: (B,Hkv,T,·).
Tensor4<double> sum_groups(const Tensor4<double>& dx, std::size_t Hkv) {
  const std::size_t B = dx.shape()[0], H = dx.shape()[1], g = H / Hkv;
  Tensor4<double> out = xt::zeros<double>({B, Hkv, dx.shape()[2], dx.shape()[3]});
  for (std::size_t h = 0; h < H; ++h) {
    xt::view(out, xt::all(), h / g, xt::all(), xt::all()) +=
        xt::view(dx, xt::all(), h, xt::all(), xt::all());
  }
  return out;
}

void check_equals_repeated(Path path, const test::AttentionCase& c) {
  CAPTURE(test::name_of(path));
  CAPTURE(c.H);
  CAPTURE(c.Hkv);
  CAPTURE(c.causal);
  CAPTURE(c.mask);
  Rng rng(61);
  const auto [q, k, v, mask] =
      test::random_inputs(rng, c.B, c.H, c.Hkv, c.Tq, c.Tk, c.D, c.Dv, 0, 3);
  const auto dout = randn<double, 4>({c.B, c.H, c.Tq, c.Dv}, rng);
  SdpaOptions options = test::case_options(c);
  options.head_scale.resize(c.H);
  for (std::size_t h = 0; h < c.H; ++h) options.head_scale[h] = 0.3 + 0.1 * double(h);
  const KeyMask* m = c.mask ? &mask : nullptr;
  const test::Result grouped = test::run(path, q, k, v, &dout, options, m);
  const test::Result full =
      test::run(path, q, repeat_heads(k, c.H), repeat_heads(v, c.H), &dout, options, m);
  REQUIRE(grouped.dk.shape()[1] == c.Hkv);
  REQUIRE(test::all_finite(grouped.out));
  REQUIRE(test::all_finite(grouped.dk));
  REQUIRE(test::all_finite(grouped.dv));
  CHECK(test::rel_error(grouped.out, full.out) < 1e-13);
  CHECK(test::rel_error(grouped.dq, full.dq) < 1e-13);
  CHECK(test::rel_error(grouped.dk, sum_groups(full.dk, c.Hkv)) < 1e-13);
  CHECK(test::rel_error(grouped.dv, sum_groups(full.dv, c.Hkv)) < 1e-13);
  CHECK(xt::amax(xt::abs(grouped.dk))() > 1e-3);
}

}  // namespace

TEST_CASE("gqa: equals attention over repeated K/V, dK and dV summed per group, on every path") {
  for (Path path : test::kPaths) {
    check_equals_repeated(path, {2, 4, 2, 5, 7, 3, 2, false, 0, 0, false});
    check_equals_repeated(path, {2, 4, 2, 5, 7, 3, 2, true, 0, 0, true});
    check_equals_repeated(path, {1, 6, 3, 4, 4, 2, 3, true, 0, 0, false});
    check_equals_repeated(path, {2, 4, 1, 3, 6, 3, 3, false, 0, 0, true});  // multi-query
    check_equals_repeated(path, {2, 3, 3, 4, 5, 2, 2, true, 0, 0, true});   // Hkv = H: plain MHA
  }
  // 64-row GPU tiles: two key tiles and a partial query tile, several heads per group.
  for (Path path : test::kPaths)
    check_equals_repeated(path, {1, 4, 2, 70, 80, 4, 3, true, 0, 0, true});
}

TEST_CASE("gqa: central-difference gradient check on every path") {
  const std::size_t B = 2, H = 4, Hkv = 2, Tq = 3, Tk = 5, D = 3, Dv = 2;
  KeyMask mask = xt::ones<bool>({B, Tk});
  mask(1, 1) = false;
  for (Path path : test::kPaths) {
    for (bool causal : {false, true}) {
      CAPTURE(causal);
      Rng rng(67);
      auto q = randn<double, 4>({B, H, Tq, D}, rng);
      auto k = randn<double, 4>({B, Hkv, Tk, D}, rng);
      auto v = randn<double, 4>({B, Hkv, Tk, Dv}, rng);
      const auto r = randn<double, 4>({B, H, Tq, Dv}, rng);
      SdpaOptions options;
      options.causal = causal;
      test::check_path_gradients(path, q, k, v, r, options, &mask);
    }
  }
}

TEST_CASE("golden: grouped-query attention matches PyTorch on every path") {
  // tests/golden/make_goldens.py gqa.json: masked attention over K and V expanded with
  // repeat_interleave, dK and dV from autograd (summed over each group by it), float64.
  const auto& file = test::golden_file("gqa.json");
  REQUIRE(file.at("cases").size() >= 4);
  for (const auto& c : file.at("cases")) {
    const auto& config = c.at("config");
    REQUIRE(test::golden_tensor(c, "k").shape()[1] == config.at("kv_heads").get<std::size_t>());
    SdpaOptions options;
    options.causal = config.at("causal").get<bool>();
    test::check_golden_case(c, options);
  }
}

TEST_CASE("gqa: K/V heads that do not divide the query heads are refused, naming Hkv") {
  Rng rng(71);
  const auto q = randn<double, 4>({1, 4, 3, 2}, rng);
  const auto k = randn<double, 4>({1, 3, 3, 2}, rng);
  const auto v = randn<double, 4>({1, 3, 3, 2}, rng);
  SdpaCache<double> cache;
  CHECK_THROWS_WITH_AS(sdpa_forward(cache, q, k, v), doctest::Contains("Hkv"),
                       std::invalid_argument);
  // k and v with different head counts
  CHECK_THROWS_AS(sdpa_forward(cache, q, randn<double, 4>({1, 2, 3, 2}, rng), v), ShapeError);
  AttentionConfig c;
  c.d_model = 8;
  c.heads = 4;
  c.kv_heads = 3;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("kv_heads expected a divisor of heads (4)"),
                       std::invalid_argument);
}

TEST_CASE("gqa: MultiHeadAttention with kv_heads shrinks W_K and W_V and passes the gradcheck") {
  for (std::size_t kv_heads : {1, 2}) {
    CAPTURE(kv_heads);
    AttentionConfig c;
    c.d_model = 16;
    c.heads = 4;
    c.kv_heads = kv_heads;
    c.sdpa.causal = true;
    c.learnable_scale = kv_heads == 2;  // per query head, on a shared K/V head
    Rng rng(73);
    MultiHeadAttention<double> m(c, rng);
    CHECK(m.w_k.value.shape()[1] == kv_heads * 4);
    CHECK(m.w_v.value.shape()[1] == kv_heads * 4);
    CHECK(m.w_q.value.shape()[1] == 16);
    Rng data(79);
    const auto x = randn<double, 3>({2, 5, 16}, data);
    const auto report = check_module_gradients(m, x);
    INFO(report.table());
    CHECK(report.passed(1e-7));
    CHECK(m.keys().shape()[1] == kv_heads);
    CHECK(m.queries().shape()[1] == 4);
  }
}
