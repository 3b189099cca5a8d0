// The fused (flash-style) SDPA path against the reference path: float agreement on random inputs
// with several key tiles, causal, masked and empty rows, odd sizes and D = 1; the saved
// log-sum-exp against an independent double computation; gradient checks across tiles;
// determinism over thread counts; the path option.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include "attnlab/gradcheck.hpp"
#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"
#include "helpers.hpp"

using namespace attnlab;
using attnlab::test::all_finite;
using attnlab::test::rel_error;

namespace {

// float vs float with a different summation order (tiles, online rescaling): a few ulps per sum.
constexpr double kFloatTol = 2e-5;
constexpr double kGradTol = 1e-7;  // the suite's gradcheck tolerance (double, central differences)

enum class MaskKind {
  none,
  random,  // each key visible with probability ~3/4, and batch 0 sees no key at all
  prefix   // batch 0 hides the first `hidden_prefix` keys (more than one key tile), others random
};

struct Case {
  std::string name;
  std::size_t B, H, Tq, Tk, D, Dv;
  bool causal;
  MaskKind mask;
  bool head_scale;
  std::size_t tile_rows, tile_keys;  // 0: the tuned default (128 x 512)
  std::size_t hidden_prefix = 0;
};

KeyMask make_mask(MaskKind kind, std::size_t B, std::size_t Tk, Rng& rng,
                  std::size_t hidden_prefix = 0) {
  KeyMask mask = xt::ones<bool>({B, Tk});
  if (kind == MaskKind::none) return mask;
  const auto u = randn<double, 2>({B, Tk}, rng);
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t j = 0; j < Tk; ++j) mask(b, j) = u(b, j) > -0.67;  // P(visible) ≈ 0.75
  }
  for (std::size_t j = 0; j < Tk; ++j) {
    mask(0, j) = kind == MaskKind::prefix ? j >= hidden_prefix : false;
  }
  return mask;
}

template <class T>
struct Run {
  Tensor4<T> out;
  SdpaGrads<T> g;
  SdpaCache<T> cache;
};

template <class T>
Run<T> run_sdpa(const Tensor4<T>& q, const Tensor4<T>& k, const Tensor4<T>& v,
                const Tensor4<T>& dout, SdpaOptions options, SdpaPath path, const KeyMask* mask) {
  options.path = path;
  Run<T> r;
  r.out = sdpa_forward(r.cache, q, k, v, options, mask);
  r.g = sdpa_backward(dout, r.cache, q, k, v);
  return r;
}

// log Σ_j exp(S_ij) over visible keys, in double from the scores (-inf for an empty row).
Tensor3<double> reference_lse(const Tensor4<double>& scores) {
  const std::size_t B = scores.shape()[0], H = scores.shape()[1], Tq = scores.shape()[2],
                    Tk = scores.shape()[3];
  Tensor3<double> lse({B, H, Tq});
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t h = 0; h < H; ++h) {
      for (std::size_t i = 0; i < Tq; ++i) {
        double m = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j < Tk; ++j) m = std::max(m, scores(b, h, i, j));
        if (std::isinf(m)) {
          lse(b, h, i) = m;
          continue;
        }
        double sum = 0;
        for (std::size_t j = 0; j < Tk; ++j) sum += std::exp(scores(b, h, i, j) - m);
        lse(b, h, i) = m + std::log(sum);
      }
    }
  }
  return lse;
}

Tensor4<float> to_float(const Tensor4<double>& x) {
  return xt::cast<float>(x);
}

}  // namespace

TEST_CASE("sdpa fused vs reference: float agreement over tiles, masks and odd sizes") {
  // Small tiles (16 x 32) cross many tile edges on small inputs; the default tiles (128 x 512) get
  // sizes that straddle their edges. Tq and Tk are not multiples of the tiles.
  const Case cases[] = {
      {"several row and key tiles", 2, 2, 75, 101, 16, 16, false, MaskKind::none, false, 16, 32},
      {"causal, Tq == Tk", 2, 2, 101, 101, 16, 16, true, MaskKind::none, false, 16, 32},
      {"Tq 65, Tk 157, D = 1", 1, 3, 65, 157, 1, 3, false, MaskKind::none, false, 16, 32},
      {"causal, Tq 90 > Tk 45", 1, 2, 90, 45, 8, 5, true, MaskKind::none, false, 16, 32},
      {"causal, Tq 20 < Tk 99", 1, 2, 20, 99, 8, 8, true, MaskKind::none, false, 16, 32},
      {"key mask with an empty batch", 3, 2, 77, 77, 32, 24, false, MaskKind::random, false, 16,
       32},
      {"key mask and causal", 3, 2, 77, 77, 32, 24, true, MaskKind::random, false, 16, 32},
      {"first key tiles hidden", 2, 1, 70, 90, 8, 8, false, MaskKind::prefix, false, 16, 32, 40},
      {"first key tiles hidden, causal", 2, 1, 70, 90, 8, 8, true, MaskKind::prefix, false, 16, 32,
       40},
      {"per-head scale", 2, 3, 50, 70, 64, 64, true, MaskKind::none, true, 16, 32},
      {"1 x 1, D = 1", 1, 1, 1, 1, 1, 1, false, MaskKind::none, false, 16, 32},
      {"tiles of one row and one key", 1, 2, 9, 7, 3, 2, true, MaskKind::random, false, 1, 1},
      {"default tiles, Tq 130, Tk 600", 1, 2, 130, 600, 16, 16, false, MaskKind::none, false, 0, 0},
      {"default tiles, causal 600 x 600", 1, 1, 600, 600, 16, 16, true, MaskKind::prefix, false, 0,
       0, 530},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    Rng rng(31);
    const auto qd = randn<double, 4>({c.B, c.H, c.Tq, c.D}, rng);
    const auto kd = randn<double, 4>({c.B, c.H, c.Tk, c.D}, rng);
    const auto vd = randn<double, 4>({c.B, c.H, c.Tk, c.Dv}, rng);
    const auto dod = randn<double, 4>({c.B, c.H, c.Tq, c.Dv}, rng);
    const KeyMask mask = make_mask(c.mask, c.B, c.Tk, rng, c.hidden_prefix);
    const KeyMask* mask_ptr = c.mask == MaskKind::none ? nullptr : &mask;
    SdpaOptions options;
    options.causal = c.causal;
    options.tile_rows = c.tile_rows;
    options.tile_keys = c.tile_keys;
    if (c.head_scale) {
      for (std::size_t h = 0; h < c.H; ++h) options.head_scale.push_back(0.05 + 0.1 * h);
    }
    const auto q = to_float(qd), k = to_float(kd), v = to_float(vd), dout = to_float(dod);
    const auto ref = run_sdpa(q, k, v, dout, options, SdpaPath::reference, mask_ptr);
    const auto fused = run_sdpa(q, k, v, dout, options, SdpaPath::fused, mask_ptr);
    CHECK(ref.cache.has_weights());
    CHECK_FALSE(fused.cache.has_weights());
    CHECK(fused.cache.p.size() == 0);
    CHECK(all_finite(fused.out));
    CHECK(all_finite(fused.g.dq));
    CHECK(all_finite(fused.g.dk));
    CHECK(all_finite(fused.g.dv));
    CHECK(rel_error(fused.out, ref.out) < kFloatTol);
    CHECK(rel_error(fused.g.dq, ref.g.dq) < kFloatTol);
    CHECK(rel_error(fused.g.dk, ref.g.dk) < kFloatTol);
    CHECK(rel_error(fused.g.dv, ref.g.dv) < kFloatTol);
    CHECK(rel_error(fused.g.dscale, ref.g.dscale) < kFloatTol);
    // The saved log-sum-exp against a double computation from the scores.
    const auto lse = reference_lse(sdpa_scores(qd, kd, options, mask_ptr));
    for (std::size_t i = 0; i < lse.size(); ++i) {
      const double expected = lse.data()[i];
      const double got = fused.cache.lse.data()[i];
      if (std::isinf(expected)) {
        CHECK(got == -std::numeric_limits<float>::infinity());
      } else {
        CHECK(got == doctest::Approx(expected).epsilon(1e-5).scale(1.0));
      }
    }
    // An empty row (batch 0 under the random mask, rows before the first visible key under the
    // prefix mask with causal) has O = 0 and dQ = 0 exactly, as on the reference path.
    if (c.mask != MaskKind::none) {
      for (std::size_t i = 0; i < c.Tq; ++i) {
        if (!std::isinf(lse(0, 0, i))) continue;
        for (std::size_t d = 0; d < c.Dv; ++d) CHECK(fused.out(0, 0, i, d) == 0.0f);
        for (std::size_t d = 0; d < c.D; ++d) CHECK(fused.g.dq(0, 0, i, d) == 0.0f);
      }
    }
  }
}

TEST_CASE("sdpa fused: weights recomputed by sdpa_weights equal the reference cache.p") {
  Rng rng(32);
  const auto q = randn<float, 4>({2, 2, 70, 8}, rng);
  const auto k = randn<float, 4>({2, 2, 300, 8}, rng);
  const auto v = randn<float, 4>({2, 2, 300, 4}, rng);
  SdpaOptions options;
  options.causal = true;
  options.path = SdpaPath::reference;
  SdpaCache<float> cache;
  sdpa_forward(cache, q, k, v, options);
  REQUIRE(cache.has_weights());
  const auto p = sdpa_weights(q, k, options);
  CHECK(rel_error(p, cache.p) < 1e-6);
  // The same cache reused by a fused forward drops the weights.
  options.path = SdpaPath::fused;
  sdpa_forward(cache, q, k, v, options);
  CHECK_FALSE(cache.has_weights());
  CHECK(cache.path == SdpaPath::fused);
}

namespace {
double weighted_sum(const Tensor4<double>& o, const Tensor4<double>& r) {
  double l = 0;
  for (std::size_t i = 0; i < o.size(); ++i) l += o.data()[i] * r.data()[i];
  return l;
}
}  // namespace

TEST_CASE("sdpa fused gradcheck: several row and key tiles, causal, hidden first key tiles") {
  // Tiles of 8 rows x 16 keys: Tq = 43 and Tk = 37 give 6 row tiles and 3 key tiles; batch 0 hides
  // keys 0..19, so its rows start from lse = -inf in the first key tile (and, with causal, rows
  // < 20 stay empty).
  const std::size_t B = 2, H = 1, Tq = 43, Tk = 37, D = 3, Dv = 2;
  Rng rng(33);
  auto q = randn<double, 4>({B, H, Tq, D}, rng);
  auto k = randn<double, 4>({B, H, Tk, D}, rng);
  auto v = randn<double, 4>({B, H, Tk, Dv}, rng);
  const auto r = randn<double, 4>({B, H, Tq, Dv}, rng);
  const KeyMask mask = make_mask(MaskKind::prefix, B, Tk, rng, 20);
  SdpaOptions options;
  options.path = SdpaPath::fused;
  options.tile_rows = 8;
  options.tile_keys = 16;
  SUBCASE("not causal") {}
  SUBCASE("causal") {
    options.causal = true;
  }
  options.head_scale = {0.6};
  const auto loss = [&] {
    SdpaCache<double> c;
    return weighted_sum(sdpa_forward(c, q, k, v, options, &mask), r);
  };
  SdpaCache<double> cache;
  sdpa_forward(cache, q, k, v, options, &mask);
  const auto g = sdpa_backward(r, cache, q, k, v);
  const auto report = check_gradients({{"dq", q.data(), g.dq.data(), {B, H, Tq, D}},
                                       {"dk", k.data(), g.dk.data(), {B, H, Tk, D}},
                                       {"dv", v.data(), g.dv.data(), {B, H, Tk, Dv}},
                                       {"dscale", options.head_scale.data(), g.dscale.data(), {H}}},
                                      loss);
  INFO(report.table());
  CHECK(report.max_rel_error() <= kGradTol);
  for (const auto& res : report.results) CHECK(res.analytic_norm > 1e-3);
}

namespace {
// Restores the suite's single worker thread when a test ends, even on failure.
struct ThreadCountGuard {
  ~ThreadCountGuard() { set_num_threads(1); }
};

template <class T>
bool bit_identical(const T& a, const T& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(*a.data())) == 0;
}
}  // namespace

TEST_CASE("sdpa: 1 and 2 threads agree, and a fixed thread count is bit-identical") {
  ThreadCountGuard guard;
  Rng rng(34);
  const std::size_t B = 3, H = 2, T = 300;  // B·H = 6 slices: uneven split over threads
  const auto q = randn<float, 4>({B, H, T, 16}, rng);
  const auto k = randn<float, 4>({B, H, T, 16}, rng);
  const auto v = randn<float, 4>({B, H, T, 16}, rng);
  const auto dout = randn<float, 4>({B, H, T, 16}, rng);
  const KeyMask mask = make_mask(MaskKind::random, B, T, rng);
  SdpaOptions options;
  options.causal = true;
  options.head_scale = {0.2, 0.3};
  options.tile_rows = 32;  // several tiles per slice
  options.tile_keys = 64;
  for (SdpaPath path : {SdpaPath::reference, SdpaPath::fused}) {
    CAPTURE(std::string(to_string(path)));
    set_num_threads(1);
    const auto one = run_sdpa(q, k, v, dout, options, path, &mask);
    set_num_threads(2);
    const auto two = run_sdpa(q, k, v, dout, options, path, &mask);
    const auto two_again = run_sdpa(q, k, v, dout, options, path, &mask);
    CHECK(rel_error(one.out, two.out) < 1e-6);
    CHECK(rel_error(one.g.dq, two.g.dq) < 1e-6);
    CHECK(rel_error(one.g.dk, two.g.dk) < 1e-6);
    CHECK(rel_error(one.g.dv, two.g.dv) < 1e-6);
    CHECK(rel_error(one.g.dscale, two.g.dscale) < 1e-6);
    CHECK(bit_identical(two.out, two_again.out));
    CHECK(bit_identical(two.g.dq, two_again.g.dq));
    CHECK(bit_identical(two.g.dk, two_again.g.dk));
    CHECK(bit_identical(two.g.dv, two_again.g.dv));
    CHECK(bit_identical(two.g.dscale, two_again.g.dscale));
  }
}

TEST_CASE("sdpa path option: parse, print, and auto picks fused for long key sequences") {
  for (SdpaPath path : {SdpaPath::reference, SdpaPath::fused, SdpaPath::automatic}) {
    CHECK(parse_sdpa_path(to_string(path)) == path);
  }
  CHECK(to_string(SdpaPath::automatic) == "auto");
  CHECK_THROWS_WITH_AS(parse_sdpa_path("flash"),
                       "parse_sdpa_path: path expected reference|fused|auto, got 'flash'",
                       std::invalid_argument);
  CHECK(resolve_sdpa_path(SdpaPath::automatic, kSdpaFusedMinKeys - 1, false) ==
        SdpaPath::reference);
  CHECK(resolve_sdpa_path(SdpaPath::automatic, kSdpaFusedMinKeys, false) == SdpaPath::fused);
  CHECK(resolve_sdpa_path(SdpaPath::automatic, kSdpaFusedMinKeysCausal - 1, true) ==
        SdpaPath::reference);
  CHECK(resolve_sdpa_path(SdpaPath::automatic, kSdpaFusedMinKeysCausal, true) == SdpaPath::fused);
  CHECK(kSdpaFusedMinKeysCausal <= kSdpaFusedMinKeys);
  CHECK(resolve_sdpa_path(SdpaPath::reference, 100000, true) == SdpaPath::reference);
  CHECK(resolve_sdpa_path(SdpaPath::fused, 1, false) == SdpaPath::fused);
  // Through the op: the cache records the path that ran.
  Rng rng(35);
  SdpaCache<float> cache;
  for (std::size_t Tk : {kSdpaFusedMinKeys - 1, kSdpaFusedMinKeys}) {
    const auto q = randn<float, 4>({1, 1, 2, 4}, rng);
    const auto k = randn<float, 4>({1, 1, Tk, 4}, rng);
    const auto v = randn<float, 4>({1, 1, Tk, 4}, rng);
    sdpa_forward(cache, q, k, v);
    CHECK(cache.path == resolve_sdpa_path(SdpaPath::automatic, Tk, false));
    CHECK(cache.has_weights() == (cache.path == SdpaPath::reference));
  }
}

TEST_CASE("MHA attention_weights after a fused forward equal the reference path's weights") {
  AttentionConfig c;
  c.d_model = 8;
  c.heads = 2;
  c.sdpa.causal = true;
  c.learnable_scale = true;  // per-head scales reach the recomputation
  Rng rng(36);
  const std::size_t T = kSdpaFusedMinKeysCausal + 3;  // causal auto: the fused path
  const auto x = randn<float, 3>({2, T, 8}, rng);
  KeyMask mask = xt::ones<bool>({std::size_t{2}, T});
  mask(1, 0) = false;
  Rng init_a(1), init_b(1);
  MultiHeadAttention<float> fused(c, init_a);
  c.sdpa.path = SdpaPath::reference;
  MultiHeadAttention<float> reference(c, init_b);
  CHECK(fused.attention_weights().size() == 0);  // before any forward
  const auto y_fused = fused.forward(x, &mask);
  const auto y_ref = reference.forward(x, &mask);
  CHECK(rel_error(y_fused, y_ref) < kFloatTol);
  const auto p = fused.attention_weights();
  REQUIRE(p.shape() == reference.attention_weights().shape());
  CHECK(rel_error(p, reference.attention_weights()) < 1e-6);
}
