// The CUDA kernels themselves (lib/backends/cuda/*_kernels.cuh), compiled by the C++ compiler and
// run on the CPU under attnlab/backends/cuda_emulator.hpp (a fiber per CUDA thread, or a
// std::thread under ThreadSanitizer; barriers for __syncthreads and warp shuffles, NaN-filled
// shared memory), against the CPU op. This runs on
// every machine: it checks the kernels' tiling, indexing, masking, synchronisation points and
// arithmetic where no GPU is available. It cannot check nvcc's code generation or speed:
// tests/backends/test_cuda_attention.cpp does that on a device.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <xtensor/xbuilder.hpp>

#include "attnlab/ops/attention.hpp"
#include "attnlab/ops/softmax.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

// clang-format off
#include "attnlab/backends/cuda_emulator.hpp"
#include "attention_fused_kernels.cuh"
#include "attention_reference_kernels.cuh"
// clang-format on

using namespace attnlab;

namespace {

struct Problem {
  std::string name;
  std::size_t B, H, Tq, Tk, D, Dv;
  bool causal, masked;
  std::vector<double> head_scale;  // empty: sqrt_dk
};

// Batch 0 hides every third key (never key 0); batch 1, when present, sees no key at all.
KeyMask problem_mask(std::size_t B, std::size_t Tk) {
  KeyMask mask = xt::ones<bool>({B, Tk});
  for (std::size_t j = 0; j < Tk; ++j) {
    if (j % 3 == 2) mask(0, j) = false;
    if (B > 1) mask(1, j) = false;
  }
  return mask;
}

template <class T>
Tensor4<T> cast(const Tensor4<double>& x) {
  return Tensor4<T>(xt::cast<T>(x));
}

template <class T, std::size_t N>
xt::xtensor<T, N> nan_filled(const std::array<std::size_t, N>& shape) {
  xt::xtensor<T, N> x(shape);
  x.fill(std::numeric_limits<T>::quiet_NaN());
  return x;
}

struct Expected {
  Tensor4<double> out, dq, dk, dv, p;
  Tensor3<double> lse;
  std::vector<double> scale;
};

Expected cpu_reference(const Problem& pr, const Tensor4<double>& q, const Tensor4<double>& k,
                       const Tensor4<double>& v, const Tensor4<double>& dout, const KeyMask* mask) {
  SdpaOptions options;
  options.causal = pr.causal;
  options.head_scale = pr.head_scale;
  SdpaCache<double> cache;
  Expected e;
  e.out = sdpa_forward(cache, q, k, v, options, mask);
  const auto g = sdpa_backward(dout, cache, q, k, v);
  e.dq = g.dq, e.dk = g.dk, e.dv = g.dv, e.p = cache.p;
  e.scale = cache.scale;
  const auto scores = sdpa_scores(q, k, options, mask);
  e.lse = Tensor3<double>({pr.B, pr.H, pr.Tq});
  for (std::size_t b = 0; b < pr.B; ++b) {
    for (std::size_t h = 0; h < pr.H; ++h) {
      for (std::size_t i = 0; i < pr.Tq; ++i) {
        double m = -std::numeric_limits<double>::infinity(), sum = 0;
        for (std::size_t j = 0; j < pr.Tk; ++j) m = std::max(m, scores(b, h, i, j));
        for (std::size_t j = 0; j < pr.Tk; ++j)
          sum += std::isinf(m) ? 0 : std::exp(scores(b, h, i, j) - m);
        e.lse(b, h, i) = sum > 0 ? m + std::log(sum) : -std::numeric_limits<double>::infinity();
      }
    }
  }
  return e;
}

template <class T, int TILE>
void check_fused(const Problem& pr, double tol) {
  namespace fused = attnlab::cuda::fused;
  Rng rng(23);
  const auto q = randn<double, 4>({pr.B, pr.H, pr.Tq, pr.D}, rng);
  const auto k = randn<double, 4>({pr.B, pr.H, pr.Tk, pr.D}, rng);
  const auto v = randn<double, 4>({pr.B, pr.H, pr.Tk, pr.Dv}, rng);
  const auto dout = randn<double, 4>({pr.B, pr.H, pr.Tq, pr.Dv}, rng);
  const KeyMask mask = problem_mask(pr.B, pr.Tk);
  const KeyMask* m = pr.masked ? &mask : nullptr;
  const Expected e = cpu_reference(pr, q, k, v, dout, m);

  const auto qt = cast<T>(q), kt = cast<T>(k), vt = cast<T>(v), dot = cast<T>(dout);
  const std::vector<T> scale(e.scale.begin(), e.scale.end());
  const std::vector<unsigned char> mask_bytes(mask.begin(), mask.end());
  AttentionParams<T> a;
  a.B = pr.B, a.H = pr.H, a.Hkv = pr.H, a.Tq = pr.Tq, a.Tk = pr.Tk, a.D = pr.D, a.Dv = pr.Dv;
  a.q = qt.data(), a.k = kt.data(), a.v = vt.data(), a.scale = scale.data();
  a.key_mask = pr.masked ? mask_bytes.data() : nullptr;
  a.causal = pr.causal;

  auto out = nan_filled<T, 4>({pr.B, pr.H, pr.Tq, pr.Dv});
  auto lse = nan_filled<T, 3>({pr.B, pr.H, pr.Tq});
  auto row_dot = nan_filled<T, 3>({pr.B, pr.H, pr.Tq});
  auto dq = nan_filled<T, 4>({pr.B, pr.H, pr.Tq, pr.D});
  auto dk = nan_filled<T, 4>({pr.B, pr.H, pr.Tk, pr.D});
  auto dv = nan_filled<T, 4>({pr.B, pr.H, pr.Tk, pr.Dv});
  const fused::Geometry g(pr.D, pr.Dv, TILE);
  const dim3 block(fused::kThreads);
  emu::launch(fused::fused_forward_kernel<T, TILE>, fused::packed_query_grid(a, TILE), block,
              fused::forward_smem<T>(g, TILE), out.data(), lse.data(), a);
  const std::size_t rows = pr.B * pr.H * pr.Tq;
  emu::launch(
      fused::row_dot_kernel<T>,
      dim3(static_cast<unsigned>(kernel_math::tile_count(rows, fused::kRowDotRowsPerBlock))), block,
      0, row_dot.data(), dot.data(), out.data(), rows, pr.Dv);
  emu::launch(fused::fused_key_pass_kernel<T, TILE>, fused::key_tile_grid(a, TILE), block,
              fused::key_pass_smem<T>(g, TILE), dk.data(), dv.data(), dot.data(), lse.data(),
              row_dot.data(), a);
  emu::launch(fused::fused_query_pass_kernel<T, TILE>, fused::query_tile_grid(a, TILE), block,
              fused::query_pass_smem<T>(g, TILE), dq.data(), dot.data(), lse.data(), row_dot.data(),
              a);

  CAPTURE(pr.name);
  CAPTURE(TILE);
  REQUIRE(test::all_finite(out));
  REQUIRE(test::all_finite(dq));
  REQUIRE(test::all_finite(dk));
  REQUIRE(test::all_finite(dv));
  CHECK(test::rel_error(out, e.out) < tol);
  CHECK(test::rel_error(dq, e.dq) < tol);
  CHECK(test::rel_error(dk, e.dk) < tol);
  CHECK(test::rel_error(dv, e.dv) < tol);
  for (std::size_t i = 0; i < lse.size(); ++i) {
    const double expected = e.lse.data()[i];
    if (std::isinf(expected)) {
      CHECK(lse.data()[i] == -std::numeric_limits<T>::infinity());
    } else {
      CHECK(lse.data()[i] == doctest::Approx(expected).epsilon(tol));
    }
  }
}

}  // namespace

TEST_CASE("cuda kernels (CPU emulation): fused forward and backward match the CPU op") {
  // Tiles of 64 with 70 rows: a full and a partial tile; D = 70: two column chunks of 64.
  check_fused<float, 64>({"causal, key mask, two tiles", 2, 2, 70, 70, 8, 5, true, true, {}}, 1e-5);
  check_fused<float, 16>({"key mask, D = 70, Dv = 5", 2, 2, 20, 37, 70, 5, false, true, {}}, 1e-5);
  check_fused<double, 16>(
      {"causal Tq > Tk, per-head scale", 1, 2, 37, 20, 4, 3, true, false, {0.3, 1.4}}, 1e-12);
  check_fused<double, 64>({"causal Tq < Tk: unseen keys", 1, 2, 5, 70, 4, 3, true, false, {}},
                          1e-12);
  check_fused<double, 16>({"no mask, no causal", 2, 1, 33, 18, 1, 2, false, false, {}}, 1e-12);
  // Four rows per thread (tile 64) over three column chunks of 64 (D = 130, Dv = 65).
  check_fused<float, 64>({"D = 130, Dv = 65, causal, mask", 1, 1, 40, 50, 130, 65, true, true, {}},
                         1e-5);
}

TEST_CASE("cuda kernels (CPU emulation): reference softmax rows and their backward") {
  namespace ref = attnlab::cuda::reference;
  const std::size_t B = 2, H = 2, Tq = 5, Tk = 70, D = 4, Dv = 3;
  Rng rng(29);
  const auto q = randn<double, 4>({B, H, Tq, D}, rng);
  const auto k = randn<double, 4>({B, H, Tk, D}, rng);
  const auto v = randn<double, 4>({B, H, Tk, Dv}, rng);
  const auto dout = randn<double, 4>({B, H, Tq, Dv}, rng);
  const KeyMask mask = problem_mask(B, Tk);
  const std::vector<unsigned char> mask_bytes(mask.begin(), mask.end());
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const Problem pr{"reference", B, H, Tq, Tk, D, Dv, causal, true, {0.6, 0.25}};
    const Expected e = cpu_reference(pr, q, k, v, dout, &mask);
    // The GEMM outputs the kernels start from: S = Q Kᵀ (unscaled) and dP = dO Vᵀ.
    Tensor4<double> p = xt::zeros<double>({B, H, Tq, Tk});
    Tensor4<double> ds = xt::zeros<double>({B, H, Tq, Tk});
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t i = 0; i < Tq; ++i) {
          for (std::size_t j = 0; j < Tk; ++j) {
            for (std::size_t d = 0; d < D; ++d) p(b, h, i, j) += q(b, h, i, d) * k(b, h, j, d);
            for (std::size_t d = 0; d < Dv; ++d) ds(b, h, i, j) += dout(b, h, i, d) * v(b, h, j, d);
          }
        }
      }
    }
    // 64 threads per row block here (256 on the GPU): the kernels are written for any multiple
    // of 32.
    const unsigned rows = static_cast<unsigned>(B * H * Tq);
    AttentionParams<double> a;
    a.B = B, a.H = H, a.Hkv = H, a.Tq = Tq, a.Tk = Tk, a.D = D, a.Dv = Dv;
    a.q = q.data(), a.k = k.data(), a.v = v.data(), a.scale = e.scale.data();
    a.key_mask = mask_bytes.data();
    a.causal = causal;
    emu::launch(ref::masked_softmax_rows<double>, dim3(rows), dim3(64), 0, p.data(), a);
    CHECK(test::rel_error(p, e.p) < 1e-14);
    for (std::size_t j = 0; j < Tk; ++j) CHECK(p(1, 0, 2, j) == 0.0);  // batch 1 sees nothing
    emu::launch(ref::softmax_backward_rows<double>, dim3(rows), dim3(64), 0, ds.data(),
                static_cast<double*>(nullptr), static_cast<const double*>(p.data()),
                static_cast<const double*>(nullptr), a);
    // Expected dS = s_h · P ⊙ (dP − rowsum(dP ⊙ P)), from the CPU row kernel.
    Tensor4<double> ds_expected = xt::zeros<double>({B, H, Tq, Tk});
    Tensor4<double> dpe = xt::zeros<double>({B, H, Tq, Tk});
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t i = 0; i < Tq; ++i) {
          for (std::size_t j = 0; j < Tk; ++j) {
            for (std::size_t d = 0; d < Dv; ++d)
              dpe(b, h, i, j) += dout(b, h, i, d) * v(b, h, j, d);
          }
        }
      }
    }
    softmax_rows_backward(ds_expected.data(), dpe.data(), e.p.data(), B * H * Tq, Tk);
    for (std::size_t bh = 0; bh < B * H; ++bh) {
      for (std::size_t x = 0; x < Tq * Tk; ++x)
        ds_expected.data()[bh * Tq * Tk + x] *= e.scale[bh % H];
    }
    CHECK(test::rel_error(ds, ds_expected) < 1e-14);
  }
}
