// The causal query offset (query i sees key j iff j <= i + o) on all four attention paths: the CPU
// reference and fused paths (tiny tiles, so that every offset crosses tile edges), and the CUDA
// reference and fused kernels run on the CPU by the emulated backend
// (attnlab/backends/emulated.hpp). Tq queries with o = Tk - Tq are the last Tq rows of a full
// causal attention over Tk queries (PyTorch's causal_lower_right), forward and backward; double
// central-difference gradient checks with an offset; a row whose visible keys are all masked gives
// zeros; and the option's checks.
#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

#include "attention_paths.hpp"
#include "attnlab/backends/emulated.hpp"
#include "attnlab/gradcheck.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"
#include "sdpa_paths.hpp"

using namespace attnlab;

namespace {

using test::kPaths;
using test::name_of;
using test::Path;
using test::Result;
using test::run;

// Rows [Tk - Tq, Tk) of x (B,H,Tk,·).
Tensor4<double> last_rows(const Tensor4<double>& x, std::size_t Tq) {
  const std::size_t Tk = x.shape()[2];
  return xt::view(x, xt::all(), xt::all(), xt::range(Tk - Tq, Tk), xt::all());
}

struct Sizes {
  std::size_t B, H, Tq, Tk, D, Dv;
  std::size_t tile_rows = 0, tile_keys = 0;  // CPU fused tiles; 0: the tests' 2 x 3
};

// Attention of the last Tq queries with o = Tk - Tq against the full causal attention of all Tk
// queries: the same outputs, dQ rows, dK and dV (the first Tk - Tq rows get zero upstream
// gradient).
void check_equals_last_rows(Path path, const Sizes& s, const KeyMask* mask) {
  CAPTURE(name_of(path));
  CAPTURE(s.Tq);
  CAPTURE(s.Tk);
  Rng rng(51);
  const auto q_all = randn<double, 4>({s.B, s.H, s.Tk, s.D}, rng);
  const auto k = randn<double, 4>({s.B, s.H, s.Tk, s.D}, rng);
  const auto v = randn<double, 4>({s.B, s.H, s.Tk, s.Dv}, rng);
  const auto dout = randn<double, 4>({s.B, s.H, s.Tq, s.Dv}, rng);
  Tensor4<double> dout_all = xt::zeros<double>({s.B, s.H, s.Tk, s.Dv});
  xt::view(dout_all, xt::all(), xt::all(), xt::range(s.Tk - s.Tq, s.Tk), xt::all()) = dout;
  const Tensor4<double> q = last_rows(q_all, s.Tq);

  SdpaOptions full;
  full.causal = true;
  full.tile_rows = s.tile_rows, full.tile_keys = s.tile_keys;
  SdpaOptions offset = full;
  offset.query_offset = s.Tk - s.Tq;
  const Result all = run(path, q_all, k, v, &dout_all, full, mask);
  const Result last = run(path, q, k, v, &dout, offset, mask);

  REQUIRE(test::all_finite(last.out));
  REQUIRE(test::all_finite(last.dq));
  REQUIRE(test::all_finite(last.dk));
  REQUIRE(test::all_finite(last.dv));
  CHECK(test::rel_error(last.out, last_rows(all.out, s.Tq)) < 1e-13);
  CHECK(test::rel_error(last.dq, last_rows(all.dq, s.Tq)) < 1e-13);
  CHECK(test::rel_error(last.dk, all.dk) < 1e-13);
  CHECK(test::rel_error(last.dv, all.dv) < 1e-13);
  CHECK(xt::amax(xt::abs(last.dk))() > 1e-3);  // non-trivial gradients
}

KeyMask mask_with_gaps(std::size_t B, std::size_t Tk) {
  KeyMask mask = xt::ones<bool>({B, Tk});
  for (std::size_t j = 0; j < Tk; ++j) {
    if (j % 4 == 1) mask(0, j) = false;
    if (B > 1 && j % 3 == 0) mask(1, j) = false;
  }
  return mask;
}

}  // namespace

TEST_CASE("query offset: Tq queries with o = Tk - Tq are the last rows of full causal attention") {
  for (Path path : kPaths) {
    // One tile on the GPU kernels; many 2 x 3 tiles on the CPU fused path.
    check_equals_last_rows(path, {2, 2, 5, 9, 4, 3}, nullptr);
    const KeyMask mask = mask_with_gaps(2, 9);
    check_equals_last_rows(path, {2, 2, 5, 9, 4, 3}, &mask);
    check_equals_last_rows(path, {1, 2, 1, 7, 3, 2}, nullptr);  // one decoding step
  }
  // CPU fused tiles of 4 x 5 that do not divide Tq or Tk, and 64-row GPU tiles: Tq = 66 makes a
  // partial second query tile, and the offset 14 makes key tile 1 visible from query tile 0.
  check_equals_last_rows(Path::cpu_fused, {1, 2, 7, 16, 3, 2, 4, 5}, nullptr);
  const KeyMask mask = mask_with_gaps(1, 80);
  for (Path path : kPaths) check_equals_last_rows(path, {1, 2, 66, 80, 5, 3, 16, 32}, &mask);
}

TEST_CASE("query offset: central-difference gradient check on every path") {
  const std::size_t B = 2, H = 1, Tq = 3, Tk = 5, D = 3, Dv = 2;
  KeyMask mask = xt::ones<bool>({B, Tk});
  mask(1, 1) = false;
  for (Path path : kPaths) {
    for (std::ptrdiff_t o : {1, 2, 4}) {
      CAPTURE(name_of(path));
      CAPTURE(o);
      Rng rng(53);
      auto q = randn<double, 4>({B, H, Tq, D}, rng);
      auto k = randn<double, 4>({B, H, Tk, D}, rng);
      auto v = randn<double, 4>({B, H, Tk, Dv}, rng);
      const auto r = randn<double, 4>({B, H, Tq, Dv}, rng);
      SdpaOptions options;
      options.causal = true;
      options.query_offset = o;
      options.head_scale = {0.8};
      const auto loss = [&] {
        const Tensor4<double> out = run(path, q, k, v, nullptr, options, &mask).out;
        double l = 0;
        for (std::size_t i = 0; i < out.size(); ++i) l += out.data()[i] * r.data()[i];
        return l;
      };
      const Result g = run(path, q, k, v, &r, options, &mask);
      const auto report = check_gradients({{"dq", q.data(), g.dq.data(), {B, H, Tq, D}},
                                           {"dk", k.data(), g.dk.data(), {B, H, Tk, D}},
                                           {"dv", v.data(), g.dv.data(), {B, H, Tk, Dv}}},
                                          loss);
      INFO(report.table());
      CHECK(report.max_rel_error() <= 1e-7);  // the suite's gradcheck tolerance
      for (const auto& res : report.results) CHECK(res.analytic_norm > 1e-3);
    }
  }
}

TEST_CASE("query offset: a row whose visible keys are all masked gives zeros, never NaN") {
  // o = 2: query 0 sees keys 0..2, all hidden in batch 0; query 1 also sees key 3.
  const std::size_t B = 2, H = 2, Tq = 4, Tk = 6, D = 3, Dv = 2;
  Rng rng(55);
  const auto q = randn<double, 4>({B, H, Tq, D}, rng);
  const auto k = randn<double, 4>({B, H, Tk, D}, rng);
  const auto v = randn<double, 4>({B, H, Tk, Dv}, rng);
  const auto dout = randn<double, 4>({B, H, Tq, Dv}, rng);
  KeyMask mask = xt::ones<bool>({B, Tk});
  mask(0, 0) = mask(0, 1) = mask(0, 2) = false;
  SdpaOptions options;
  options.causal = true;
  options.query_offset = 2;
  for (Path path : kPaths) {
    CAPTURE(name_of(path));
    const Result r = run(path, q, k, v, &dout, options, &mask);
    REQUIRE(test::all_finite(r.out));
    REQUIRE(test::all_finite(r.dq));
    REQUIRE(test::all_finite(r.dk));
    REQUIRE(test::all_finite(r.dv));
    for (std::size_t h = 0; h < H; ++h) {
      for (std::size_t c = 0; c < Dv; ++c) CHECK(r.out(0, h, 0, c) == 0.0);
      for (std::size_t c = 0; c < D; ++c) CHECK(r.dq(0, h, 0, c) == 0.0);
      for (std::size_t c = 0; c < Dv; ++c)
        CHECK(r.out(0, h, 1, c) == doctest::Approx(v(0, h, 3, c)));
      for (std::size_t j = 0; j < 3; ++j) {  // hidden keys get no gradient
        for (std::size_t c = 0; c < D; ++c) CHECK(r.dk(0, h, j, c) == 0.0);
        for (std::size_t c = 0; c < Dv; ++c) CHECK(r.dv(0, h, j, c) == 0.0);
      }
    }
  }
}

TEST_CASE("query offset: o >= Tk - 1 shows every key, as without causal") {
  Rng rng(57);
  const auto q = randn<double, 4>({1, 2, 4, 3}, rng);
  const auto k = randn<double, 4>({1, 2, 6, 3}, rng);
  const auto v = randn<double, 4>({1, 2, 6, 2}, rng);
  SdpaOptions offset;
  offset.causal = true;
  offset.query_offset = 5;
  for (Path path : kPaths) {
    CAPTURE(name_of(path));
    const Result full = run(path, q, k, v, nullptr, SdpaOptions{}, nullptr);
    CHECK(test::rel_error(run(path, q, k, v, nullptr, offset, nullptr).out, full.out) < 1e-14);
  }
}

TEST_CASE("query offset: the option is checked at every entry point") {
  const Tensor4<double> q = xt::zeros<double>({1, 1, 2, 4});
  const Tensor4<double> k = xt::zeros<double>({1, 1, 5, 4});
  SdpaCache<double> cache;
  // One type per quantity: the option is the spec's size_t (a negative offset cannot be passed).
  static_assert(
      std::is_same_v<decltype(SdpaOptions::query_offset), decltype(AttentionSpec::query_offset)>);
  SdpaOptions without_causal;
  without_causal.query_offset = 3;
  CHECK_THROWS_WITH_AS(sdpa_forward(cache, q, k, k, without_causal),
                       doctest::Contains("sdpa_forward: query_offset expected 0 without causal"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(sdpa_scores(q, k, without_causal),
                       doctest::Contains("sdpa_scores: query_offset expected 0 without causal"),
                       std::invalid_argument);
  // The translator a layer resolves its call with gives the same checks.
  CHECK_THROWS_AS(resolve_sdpa("model", without_causal,
                               {.B = 1, .H = 1, .Hkv = 1, .Tq = 2, .Tk = 5, .D = 4, .Dv = 4}),
                  std::invalid_argument);
  SdpaOptions ok = without_causal;
  ok.causal = true;
  const AttentionSpec spec =
      resolve_sdpa("model", ok, {.B = 1, .H = 1, .Hkv = 1, .Tq = 2, .Tk = 5, .D = 4, .Dv = 4}).spec;
  CHECK(spec.causal);
  CHECK(spec.query_offset == 3);
  // The scores show the offset: query 0 sees keys 0..3.
  const auto scores = sdpa_scores(q, k, ok);
  for (std::size_t j = 0; j < 5; ++j) CHECK((scores(0, 0, 0, j) == 0.0) == (j <= 3));
}
