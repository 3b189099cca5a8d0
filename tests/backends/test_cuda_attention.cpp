// GPU attention (both paths) against the CPU op: forward and backward on random inputs over the
// option grid, NaN-poisoned device outputs (sdpa_*_cuda poison every output before the kernels),
// double-precision gradient checks, determinism, TF32 reported on its own. Without a device these
// tests print the skip marker and ctest reports them as skipped (tests/support/cuda_helpers.hpp);
// the boundary checks run everywhere.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <xtensor/xbuilder.hpp>

#include "attnlab/cuda.hpp"
#include "attnlab/gradcheck.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/ops/attention_cuda.hpp"
#include "attnlab/random.hpp"
#include "cuda_helpers.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

constexpr double kFloatTol = 1e-5;  // fp32 GPU vs the double CPU op, relative (‖·‖₂)
constexpr double kGradTol = 1e-7;   // the CPU suite's gradient-check tolerance

struct Case {
  std::string name;
  std::size_t B, H, Tq, Tk, D, Dv;
  SdpaOptions options;
  bool masked = false;  // key mask with a fully hidden batch row and scattered hidden keys
};

std::vector<Case> option_grid() {
  std::vector<Case> cases;
  const auto add = [&](std::string name, std::size_t B, std::size_t H, std::size_t Tq,
                       std::size_t Tk, std::size_t D, std::size_t Dv, SdpaOptions o, bool masked) {
    cases.push_back({std::move(name), B, H, Tq, Tk, D, Dv, std::move(o), masked});
  };
  SdpaOptions o;
  add("sqrt_dk", 2, 3, 17, 17, 16, 16, o, false);
  o.scaling = Scaling::none;
  add("none", 2, 2, 9, 12, 8, 8, o, false);
  o.scaling = Scaling::dk;
  add("dk", 1, 2, 12, 9, 8, 4, o, false);
  o = {};
  o.scale = 0.37;
  add("explicit scale", 2, 2, 7, 7, 5, 5, o, false);
  o = {};
  o.head_scale = {0.2, 0.9, 1.7};
  add("per-head scale", 2, 3, 8, 8, 4, 4, o, false);
  o = {};
  o.causal = true;
  add("causal Tq == Tk, several tiles", 2, 2, 130, 130, 32, 32, o, false);
  add("causal Tq < Tk", 1, 2, 5, 70, 16, 8, o, false);
  add("causal Tq > Tk", 1, 2, 70, 5, 16, 8, o, false);
  add("causal and key mask", 2, 2, 20, 20, 8, 8, o, true);
  o.query_offset = 65;  // bottom-right: the 5 queries are the last 5 of 70
  add("causal, query offset Tk - Tq", 1, 2, 5, 70, 16, 8, o, false);
  o.query_offset = 70;
  add("causal, query offset 70, several tiles", 1, 2, 70, 140, 16, 8, o, false);
  o.query_offset = 3;
  add("causal, query offset 3 and key mask", 2, 2, 20, 23, 8, 8, o, true);
  o = {};
  add("key mask", 2, 2, 20, 67, 8, 8, o, true);
  add("Dv != D, odd sizes", 2, 3, 3, 7, 5, 2, o, false);
  add("D = 1", 2, 2, 4, 4, 1, 2, o, false);
  add("D = 256 (small tiles)", 1, 2, 20, 33, 256, 64, o, false);
  add("T = 300, D = 64", 1, 2, 300, 300, 64, 64, o, false);
  return cases;
}

// Batch 1 sees no key at all; batch 0 hides every third key (never key 0).
KeyMask test_mask(std::size_t B, std::size_t Tk) {
  KeyMask mask = xt::ones<bool>({B, Tk});
  for (std::size_t j = 0; j < Tk; ++j) {
    if (j % 3 == 2) mask(0, j) = false;
    if (B > 1) mask(1, j) = false;
  }
  return mask;
}

template <class T>
Tensor4<T> to(const Tensor4<double>& x) {
  return Tensor4<T>(xt::cast<T>(x));
}

// log Σ exp over a row of the CPU op's scores (-inf entries hidden), in long double.
double row_log_sum_exp(const Tensor4<double>& scores, std::size_t b, std::size_t h, std::size_t i) {
  const std::size_t Tk = scores.shape()[3];
  long double m = -std::numeric_limits<long double>::infinity();
  for (std::size_t j = 0; j < Tk; ++j) m = std::max<long double>(m, scores(b, h, i, j));
  if (std::isinf(m)) return -std::numeric_limits<double>::infinity();
  long double sum = 0;
  for (std::size_t j = 0; j < Tk; ++j) sum += std::exp(scores(b, h, i, j) - m);
  return static_cast<double>(m + std::log(sum));
}

const SdpaPath kPaths[] = {SdpaPath::reference, SdpaPath::fused};

SdpaOptions with_path(SdpaOptions options, SdpaPath path) {
  options.path = path;
  return options;
}

}  // namespace

TEST_CASE("cuda runtime: device buffers round-trip and the batched GEMM matches the CPU") {
  if (!test::cuda_device_or_skip()) return;
  MESSAGE("device: " << cuda_device_name());
  Rng rng(1);
  const auto a = randn<double, 3>({3, 5, 4}, rng);   // (batch, m, k) stored
  const auto b = randn<double, 3>({3, 4, 6}, rng);   // (batch, k, n)
  const auto at = randn<double, 3>({3, 4, 5}, rng);  // (batch, k, m): op(A) = Aᵀ
  const auto bt = randn<double, 3>({3, 6, 4}, rng);  // (batch, n, k): op(B) = Bᵀ
  cuda::DeviceArray<double> round(a.data(), a.size());
  std::vector<double> back(a.size());
  round.download(back.data());
  CHECK(std::equal(back.begin(), back.end(), a.begin()));
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      const auto& ah = ta ? at : a;
      const auto& bhost = tb ? bt : b;
      cuda::DeviceArray<double> ad(ah.data(), ah.size()), bd(bhost.data(), bhost.size());
      cuda::DeviceArray<double> cd(3 * 5 * 6);
      cd.poison();
      cuda::gemm_strided_batched<double>(ta, tb, 5, 6, 4, 2.0, ad.data(), ta ? 5 : 4, 20, bd.data(),
                                         tb ? 4 : 6, 24, 0.0, cd.data(), 6, 30, 3);
      Tensor3<double> c = xt::zeros<double>({3, 5, 6});
      cd.download(c.data());
      for (std::size_t n = 0; n < 3; ++n) {
        for (std::size_t i = 0; i < 5; ++i) {
          for (std::size_t j = 0; j < 6; ++j) {
            double expected = 0;
            for (std::size_t l = 0; l < 4; ++l) {
              expected += (ta ? at(n, l, i) : a(n, i, l)) * (tb ? bt(n, j, l) : b(n, l, j));
            }
            CHECK(c(n, i, j) == doctest::Approx(2 * expected).epsilon(1e-13));
          }
        }
      }
    }
  }
}

TEST_CASE("cuda sdpa: forward of both paths matches the CPU op over the option grid") {
  if (!test::cuda_device_or_skip()) return;
  for (const auto& c : option_grid()) {
    Rng rng(31);
    const auto q = randn<double, 4>({c.B, c.H, c.Tq, c.D}, rng);
    const auto k = randn<double, 4>({c.B, c.H, c.Tk, c.D}, rng);
    const auto v = randn<double, 4>({c.B, c.H, c.Tk, c.Dv}, rng);
    const KeyMask mask = test_mask(c.B, c.Tk);
    const KeyMask* m = c.masked ? &mask : nullptr;
    SdpaCache<double> cpu;
    const auto expected = sdpa_forward(cpu, q, k, v, c.options, m);
    const auto scores = sdpa_scores(q, k, c.options, m);
    for (SdpaPath path : kPaths) {
      CAPTURE(c.name);
      CAPTURE(to_string(path));
      SdpaCache<float> cache;
      const auto out = sdpa_forward_cuda(cache, to<float>(q), to<float>(k), to<float>(v),
                                         with_path(c.options, path), m);
      REQUIRE(test::all_finite(out));  // poisoned with NaN before the kernels ran
      CHECK(test::rel_error(out, expected) < kFloatTol);
      if (path == SdpaPath::reference) {
        REQUIRE(test::all_finite(cache.p));
        CHECK(test::rel_error(cache.p, cpu.p) < kFloatTol);
      } else {
        for (std::size_t b = 0; b < c.B; ++b) {
          for (std::size_t h = 0; h < c.H; ++h) {
            for (std::size_t i = 0; i < c.Tq; ++i) {
              const double lse = row_log_sum_exp(scores, b, h, i);
              if (std::isinf(lse)) {
                CHECK(cache.lse(b, h, i) == -std::numeric_limits<float>::infinity());
              } else {
                CHECK(cache.lse(b, h, i) == doctest::Approx(lse).epsilon(1e-5));
              }
            }
          }
        }
      }
      if (c.masked && c.B > 1) {  // batch 1 sees nothing: exact zeros
        for (std::size_t h = 0; h < c.H; ++h) {
          for (std::size_t i = 0; i < c.Tq; ++i) {
            for (std::size_t e = 0; e < c.Dv; ++e) CHECK(out(1, h, i, e) == 0.0f);
          }
        }
      }
    }
  }
}

TEST_CASE("cuda sdpa: backward of both paths matches the CPU op over the option grid") {
  if (!test::cuda_device_or_skip()) return;
  for (const auto& c : option_grid()) {
    Rng rng(37);
    const auto q = randn<double, 4>({c.B, c.H, c.Tq, c.D}, rng);
    const auto k = randn<double, 4>({c.B, c.H, c.Tk, c.D}, rng);
    const auto v = randn<double, 4>({c.B, c.H, c.Tk, c.Dv}, rng);
    const auto dout = randn<double, 4>({c.B, c.H, c.Tq, c.Dv}, rng);
    const KeyMask mask = test_mask(c.B, c.Tk);
    const KeyMask* m = c.masked ? &mask : nullptr;
    SdpaCache<double> cpu;
    sdpa_forward(cpu, q, k, v, c.options, m);
    const auto expected = sdpa_backward(dout, cpu, q, k, v);
    for (SdpaPath path : kPaths) {
      CAPTURE(c.name);
      CAPTURE(to_string(path));
      const auto qf = to<float>(q), kf = to<float>(k), vf = to<float>(v);
      SdpaCache<float> cache;
      sdpa_forward_cuda(cache, qf, kf, vf, with_path(c.options, path), m);
      const auto g = sdpa_backward_cuda(to<float>(dout), cache, qf, kf, vf);
      REQUIRE(test::all_finite(g.dq));
      REQUIRE(test::all_finite(g.dk));
      REQUIRE(test::all_finite(g.dv));
      CHECK(test::rel_error(g.dq, expected.dq) < kFloatTol);
      CHECK(test::rel_error(g.dk, expected.dk) < kFloatTol);
      CHECK(test::rel_error(g.dv, expected.dv) < kFloatTol);
      CHECK(test::rel_error(g.dscale, expected.dscale) < 1e-4);  // a float sum over B·Tq·D terms
    }
  }
}

TEST_CASE("cuda sdpa: the double path passes the central-difference gradient check") {
  if (!test::cuda_device_or_skip()) return;
  struct Check {
    std::size_t B, H, Tq, Tk, D, Dv;
    bool causal, masked;
    std::size_t query_offset = 0;
  };
  for (const Check s :
       {Check{2, 2, 5, 5, 4, 4, false, false}, Check{1, 2, 6, 4, 4, 3, true, false},
        Check{2, 2, 4, 5, 3, 3, true, true}, Check{1, 2, 3, 6, 4, 3, true, false, 3},
        Check{2, 2, 3, 5, 3, 3, true, true, 1}}) {
    for (SdpaPath path : kPaths) {
      CAPTURE(to_string(path));
      CAPTURE(s.causal);
      CAPTURE(s.masked);
      CAPTURE(s.query_offset);
      Rng rng(7);
      auto q = randn<double, 4>({s.B, s.H, s.Tq, s.D}, rng);
      auto k = randn<double, 4>({s.B, s.H, s.Tk, s.D}, rng);
      auto v = randn<double, 4>({s.B, s.H, s.Tk, s.Dv}, rng);
      const auto r = randn<double, 4>({s.B, s.H, s.Tq, s.Dv}, rng);
      const KeyMask mask = test_mask(s.B, s.Tk);
      const KeyMask* m = s.masked ? &mask : nullptr;
      SdpaOptions options;
      options.causal = s.causal;
      options.query_offset = s.query_offset;
      options.path = path;
      const auto loss = [&] {
        SdpaCache<double> c;
        const auto o = sdpa_forward_cuda(c, q, k, v, options, m);
        double l = 0;
        for (std::size_t i = 0; i < o.size(); ++i) l += o.data()[i] * r.data()[i];
        return l;
      };
      SdpaCache<double> cache;
      sdpa_forward_cuda(cache, q, k, v, options, m);
      const auto g = sdpa_backward_cuda(r, cache, q, k, v);
      const auto report = check_gradients({{"dq", q.data(), g.dq.data(), {s.B, s.H, s.Tq, s.D}},
                                           {"dk", k.data(), g.dk.data(), {s.B, s.H, s.Tk, s.D}},
                                           {"dv", v.data(), g.dv.data(), {s.B, s.H, s.Tk, s.Dv}}},
                                          loss);
      INFO(report.table());
      CHECK(report.max_rel_error() <= kGradTol);
      for (const auto& res : report.results) CHECK(res.analytic_norm > 1e-3);
    }
  }
}

TEST_CASE(
    "cuda sdpa: the variants through the entry points (GQA, window, ALiBi, bias with dBias)") {
  // The variants on device memory: slopes and bias uploaded, dBias downloaded and summed. Against
  // the CPU op in double, both GPU paths.
  if (!test::cuda_device_or_skip()) return;
  const std::size_t B = 2, H = 4, Hkv = 2, Tq = 70, Tk = 90, D = 16, Dv = 8;
  Rng rng(43);
  const auto q = randn<double, 4>({B, H, Tq, D}, rng);
  const auto k = randn<double, 4>({B, Hkv, Tk, D}, rng);
  const auto v = randn<double, 4>({B, Hkv, Tk, Dv}, rng);
  const auto r = randn<double, 4>({B, H, Tq, Dv}, rng);
  const auto bias = randn<double, 4>({1, H, Tq, Tk}, rng);
  const KeyMask mask = test_mask(B, Tk);
  SdpaOptions options;
  options.causal = true;
  options.query_offset = 20;
  options.window = 33;
  options.alibi_slopes = alibi_slopes(H);
  SdpaCache<double> cpu;
  const auto expected_out = sdpa_forward(cpu, q, k, v, options, &mask, &bias);
  const auto expected = sdpa_backward(r, cpu, q, k, v);
  for (SdpaPath path : kPaths) {
    CAPTURE(to_string(path));
    options.path = path;
    SdpaCache<double> cache;
    const auto out = sdpa_forward_cuda(cache, q, k, v, options, &mask, &bias);
    const auto g = sdpa_backward_cuda(r, cache, q, k, v);
    CHECK(test::rel_error(out, expected_out) < 1e-12);
    CHECK(test::rel_error(g.dq, expected.dq) < 1e-12);
    CHECK(test::rel_error(g.dk, expected.dk) < 1e-12);
    CHECK(test::rel_error(g.dv, expected.dv) < 1e-12);
    REQUIRE(g.dbias.shape() == bias.shape());
    CHECK(test::rel_error(g.dbias, expected.dbias) < 1e-12);
  }
}

TEST_CASE("cuda sdpa: the fused backward is deterministic") {
  if (!test::cuda_device_or_skip()) return;
  Rng rng(41);
  const auto q = randn<float, 4>({2, 2, 150, 32}, rng);
  const auto k = randn<float, 4>({2, 2, 150, 32}, rng);
  const auto v = randn<float, 4>({2, 2, 150, 32}, rng);
  const auto dout = randn<float, 4>({2, 2, 150, 32}, rng);
  SdpaOptions options;
  options.causal = true;
  SdpaCache<float> c1, c2;
  const auto o1 = sdpa_forward_cuda(c1, q, k, v, options);
  const auto o2 = sdpa_forward_cuda(c2, q, k, v, options);
  const auto g1 = sdpa_backward_cuda(dout, c1, q, k, v);
  const auto g2 = sdpa_backward_cuda(dout, c2, q, k, v);
  CHECK(o1 == o2);
  CHECK(g1.dq == g2.dq);
  CHECK(g1.dk == g2.dk);
  CHECK(g1.dv == g2.dv);
}

TEST_CASE("cuda sdpa: TF32 GEMMs in the reference path, error reported separately") {
  if (!test::cuda_device_or_skip()) return;
  CHECK_FALSE(cuda::allow_tf32());  // full fp32 unless asked
  Rng rng(43);
  const auto q = randn<double, 4>({2, 4, 128, 64}, rng);
  const auto k = randn<double, 4>({2, 4, 128, 64}, rng);
  const auto v = randn<double, 4>({2, 4, 128, 64}, rng);
  SdpaCache<double> cpu;
  const auto expected = sdpa_forward(cpu, q, k, v);
  SdpaCache<float> cache;
  cuda::set_allow_tf32(true);
  SdpaOptions reference;
  reference.path = SdpaPath::reference;
  const auto out = sdpa_forward_cuda(cache, to<float>(q), to<float>(k), to<float>(v), reference);
  cuda::set_allow_tf32(false);
  const double tf32_error = test::rel_error(out, expected);
  MESSAGE("TF32 reference-path forward, relative error vs the double CPU op: " << tf32_error);
  CHECK(tf32_error < 5e-3);  // 10-bit mantissa inputs
}

TEST_CASE("cuda sdpa: bad inputs throw ShapeError before touching a device") {
  Tensor4<float> q = xt::zeros<float>({2, 4, 5, 16});
  Tensor4<float> k = xt::zeros<float>({2, 4, 7, 16});
  Tensor4<float> v = xt::zeros<float>({2, 4, 7, 8});
  SdpaCache<float> cache;
  Tensor4<float> k8 = xt::zeros<float>({2, 4, 7, 8});
  CHECK_THROWS_WITH_AS(sdpa_forward_cuda(cache, q, k8, v),
                       "sdpa_forward_cuda: k expected (2, 4, *, 16), got (2, 4, 7, 8)", ShapeError);
  Tensor4<float> v6 = xt::zeros<float>({2, 4, 6, 8});
  CHECK_THROWS_WITH_AS(sdpa_forward_cuda(cache, q, k, v6),
                       "sdpa_forward_cuda: v expected (2, 4, 7, *), got (2, 4, 6, 8)", ShapeError);
  KeyMask mask = xt::ones<bool>({2, 5});
  CHECK_THROWS_WITH_AS(sdpa_forward_cuda(cache, q, k, v, SdpaOptions{}, &mask),
                       "sdpa_forward_cuda: key_mask expected (2, 7), got (2, 5)", ShapeError);
  SdpaOptions bad;
  bad.scale = -1.0;
  CHECK_THROWS_AS(sdpa_forward_cuda(cache, q, k, v, bad), std::invalid_argument);
  SdpaOptions offset_without_causal;
  offset_without_causal.query_offset = 1;
  CHECK_THROWS_WITH_AS(
      sdpa_forward_cuda(cache, q, k, v, offset_without_causal),
      doctest::Contains("sdpa_forward_cuda: query_offset expected 0 without causal"),
      std::invalid_argument);
  CHECK_THROWS_AS(sdpa_backward_cuda(q, cache, q, k, v), std::logic_error);
  // The GPU op takes the CPU op's path option (one set of options for every path).
  CHECK(parse_sdpa_path("reference") == SdpaPath::reference);
  CHECK(parse_sdpa_path(to_string(SdpaPath::fused)) == SdpaPath::fused);
  CHECK_THROWS_WITH_AS(parse_sdpa_path("flash"),
                       "parse_sdpa_path: path expected reference|fused|auto, got 'flash'",
                       std::invalid_argument);
}

TEST_CASE("cuda runtime: the build flag, the device query and the no-device error agree") {
#ifdef ATTNLAB_HAS_CUDA
  CHECK(cuda_built());
#else
  CHECK_FALSE(cuda_built());
#endif
  CHECK(cuda_available() == (cuda_device_count() > 0));
  if (!cuda_built()) CHECK_FALSE(cuda_available());
  if (!cuda_available()) {
    // Valid shapes, no device: a clear CudaError, never a crash.
    Tensor4<float> q = xt::zeros<float>({1, 1, 2, 4});
    SdpaCache<float> cache;
    const std::string expected = cuda_built() ? "no CUDA device" : "attnlab was built without CUDA";
    CHECK_THROWS_WITH_AS(sdpa_forward_cuda(cache, q, q, q), doctest::Contains(expected.c_str()),
                         CudaError);
    CHECK_THROWS_AS(cuda::DeviceBuffer(16), CudaError);
  } else {
    CHECK_FALSE(cuda_device_name().empty());
  }
}
