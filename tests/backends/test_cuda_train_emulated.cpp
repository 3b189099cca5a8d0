// The training-step CUDA kernels (lib/backends/cuda: one .cuh per family) run on the CPU under the
// emulator of the CUDA thread model (attnlab/backends/cuda_emulator.hpp), against the CPU ops:
// embedding, LayerNorm, RMSNorm, GELU, bias and column sums, fused softmax cross-entropy, AdamW,
// SGD, the sum of squares, and the glue of a device-resident model (add, scale, exp, head
// split/merge, per-head dot). Outputs start NaN-filled so that an element a kernel skipped shows.
// Runs on every machine.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <xtensor/xbuilder.hpp>

#include "attnlab/device_ops.hpp"
#include "attnlab/nn/parameter.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/ops/embedding.hpp"
#include "attnlab/ops/gelu.hpp"
#include "attnlab/ops/layernorm.hpp"
#include "attnlab/ops/rmsnorm.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/optim/clip.hpp"
#include "attnlab/optim/sgd.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

// clang-format off
#include "attnlab/backends/cuda_emulator.hpp"
#include "cross_entropy.cuh"
#include "elementwise.cuh"
#include "embedding.cuh"
#include "norms.cuh"
#include "optimizers.cuh"
// clang-format on

using namespace attnlab;
namespace tk = attnlab::cuda::kernels;

namespace {

template <class T>
std::vector<T> nan_vector(std::size_t n) {
  return std::vector<T>(n, std::numeric_limits<T>::quiet_NaN());
}

template <class A, class B>
double rel(const A& a, const B& b) {
  return test::rel_error(a, b);
}

// The emulator runs rows × kRowThreads threads' worth of work: 64 threads per row block keeps it
// quick (the kernels are written for any multiple of 32 threads).
const dim3 kRowBlock(64);

}  // namespace

TEST_CASE("cuda train kernels (CPU emulation): embedding forward and backward") {
  const std::size_t B = 2, T = 5, V = 7, C = 70;
  Rng rng(3);
  const auto table = randn<double, 2>({V, C}, rng);
  TokenIds ids = {{0, 3, 3, -1, 6}, {2, 3, 0, 0, -1}};  // repeats, an absent token, id 1 unused
  const auto dy = randn<double, 3>({B, T, C}, rng);
  EmbeddingCache cache;
  const auto y_cpu = embedding_forward(cache, ids, table);
  const auto dtable_cpu = embedding_backward(dy, cache);
  const std::vector<int> id_rows(ids.begin(), ids.end());
  auto y = nan_vector<double>(B * T * C);
  auto dtable = nan_vector<double>(V * C);
  emu::launch(tk::embedding_forward_kernel<double>, dim3(B * T), kRowBlock, 0, y.data(),
              id_rows.data(), table.data(), C);
  emu::launch(tk::embedding_backward_kernel<double>, dim3(V), kRowBlock, 0, dtable.data(),
              dy.data(), id_rows.data(), B * T, C);
  CHECK(rel(y, y_cpu) == 0.0);
  CHECK(rel(dtable, dtable_cpu) < 1e-15);
  for (std::size_t c = 0; c < C; ++c) CHECK(dtable[1 * C + c] == 0.0);  // unused id
}

TEST_CASE("cuda train kernels (CPU emulation): LayerNorm and RMSNorm forward and backward") {
  const std::size_t rows = 6, C = 100;
  Rng rng(5);
  const auto x = randn<double, 2>({rows, C}, rng, 2.0);
  const auto dy = randn<double, 2>({rows, C}, rng);
  const auto gamma = randn<double, 1>({C}, rng);
  const auto beta = randn<double, 1>({C}, rng);
  const double eps = kLayerNormEps;

  SUBCASE("layernorm") {
    LayerNormCache<double, 2> cache;
    const auto y_cpu = layernorm_forward(cache, x, gamma, beta, eps);
    const auto g_cpu = layernorm_backward(dy, cache, gamma);
    auto y = nan_vector<double>(rows * C), mean = nan_vector<double>(rows),
         rstd = nan_vector<double>(rows);
    emu::launch(tk::layernorm_forward_kernel<double>, dim3(rows), kRowBlock, 0, y.data(),
                mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(), C, eps);
    CHECK(rel(y, y_cpu) < 1e-14);
    CHECK(rel(rstd, cache.rstd) < 1e-14);
    auto dx = nan_vector<double>(rows * C), dgamma = nan_vector<double>(C),
         dbeta = nan_vector<double>(C);
    emu::launch(tk::norm_backward_rows_kernel<double>, dim3(rows), kRowBlock, 0, dx.data(),
                dy.data(), x.data(), static_cast<const double*>(mean.data()),
                static_cast<const double*>(rstd.data()), gamma.data(), C);
    emu::launch(tk::norm_backward_columns_kernel<double>, dim3(2), dim3(64), 0, dgamma.data(),
                dbeta.data(), dy.data(), x.data(), static_cast<const double*>(mean.data()),
                static_cast<const double*>(rstd.data()), rows, C);
    CHECK(rel(dx, g_cpu.dx) < 1e-13);
    CHECK(rel(dgamma, g_cpu.dgamma) < 1e-14);
    CHECK(rel(dbeta, g_cpu.dbeta) < 1e-14);
  }
  SUBCASE("rmsnorm") {
    RmsNormCache<double, 2> cache;
    const auto y_cpu = rmsnorm_forward(cache, x, gamma, eps);
    const auto g_cpu = rmsnorm_backward(dy, cache, gamma);
    auto y = nan_vector<double>(rows * C), rstd = nan_vector<double>(rows);
    emu::launch(tk::rmsnorm_forward_kernel<double>, dim3(rows), kRowBlock, 0, y.data(), rstd.data(),
                x.data(), gamma.data(), C, eps);
    CHECK(rel(y, y_cpu) < 1e-14);
    auto dx = nan_vector<double>(rows * C), dgamma = nan_vector<double>(C);
    const double* no_mean = nullptr;
    emu::launch(tk::norm_backward_rows_kernel<double>, dim3(rows), kRowBlock, 0, dx.data(),
                dy.data(), x.data(), no_mean, static_cast<const double*>(rstd.data()), gamma.data(),
                C);
    emu::launch(tk::norm_backward_columns_kernel<double>, dim3(2), dim3(64), 0, dgamma.data(),
                static_cast<double*>(nullptr), dy.data(), x.data(), no_mean,
                static_cast<const double*>(rstd.data()), rows, C);
    CHECK(rel(dx, g_cpu.dx) < 1e-13);
    CHECK(rel(dgamma, g_cpu.dgamma) < 1e-14);
  }
}

TEST_CASE("cuda train kernels (CPU emulation): GELU, bias and column sums") {
  Rng rng(7);
  const auto x = randn<double, 2>({9, 31}, rng, 3.0);
  const auto dy = randn<double, 2>({9, 31}, rng);
  for (bool exact : {false, true}) {
    CAPTURE(exact);
    GeluCache<double, 2> cache;
    const auto y_cpu =
        gelu_forward(cache, x, exact ? GeluApproximation::exact : GeluApproximation::tanh);
    const auto dx_cpu = gelu_backward(dy, cache);
    auto y = nan_vector<double>(x.size()), dx = nan_vector<double>(x.size());
    // 2 blocks of 64 threads for 279 values: the grid-stride loop covers the rest.
    emu::launch(tk::gelu_forward_kernel<double>, dim3(2), dim3(64), 0, y.data(), x.data(), x.size(),
                exact);
    emu::launch(tk::gelu_backward_kernel<double>, dim3(2), dim3(64), 0, dx.data(), dy.data(),
                x.data(), x.size(), exact);
    CHECK(rel(y, y_cpu) < 1e-15);
    CHECK(rel(dx, dx_cpu) < 1e-15);
  }
  const auto b = randn<double, 1>({31}, rng);
  std::vector<double> y(x.begin(), x.end());
  emu::launch(tk::add_bias_kernel<double>, dim3(2), dim3(64), 0, y.data(), b.data(), 9, 31);
  auto db = nan_vector<double>(31);
  emu::launch(tk::column_sum_kernel<double>, dim3(1), dim3(64), 0, db.data(), dy.data(), 9, 31);
  for (std::size_t r = 0; r < 9; ++r) {
    for (std::size_t c = 0; c < 31; ++c) CHECK(y[r * 31 + c] == x(r, c) + b(c));
  }
  for (std::size_t c = 0; c < 31; ++c) {
    double expected = 0;
    for (std::size_t r = 0; r < 9; ++r) expected += dy(r, c);
    CHECK(db[c] == doctest::Approx(expected).epsilon(1e-15));
  }
}

TEST_CASE("cuda train kernels (CPU emulation): fused softmax cross-entropy with z-loss") {
  const std::size_t rows = 7, V = 90;
  Rng rng(9);
  auto logits = randn<double, 2>({rows, V}, rng, 3.0);
  logits(2, 5) = 1e4;  // a saturated row stays finite
  const xt::xtensor<int, 1> targets = {3, kIgnoreIndex, 5, 89, 0, kIgnoreIndex, 17};
  const std::vector<int> t(targets.begin(), targets.end());
  auto row_loss = nan_vector<double>(2 * rows), dlogits = nan_vector<double>(rows * V);
  auto loss = nan_vector<double>(2), inv_n = nan_vector<double>(1);
  for (const double z_loss : {0.0, 1e-4}) {  // log Z = 1e4 on row 2: the z-loss term is 1e4
    CAPTURE(z_loss);
    const auto result = softmax_cross_entropy(logits, targets, kIgnoreIndex, z_loss);
    emu::launch(tk::cross_entropy_rows_kernel<double>, dim3(rows), kRowBlock, 0, row_loss.data(),
                dlogits.data(), logits.data(), t.data(), rows, V, kIgnoreIndex, z_loss);
    emu::launch(tk::cross_entropy_mean_kernel<double>, dim3(1), kRowBlock, 0, loss.data(),
                inv_n.data(), static_cast<const double*>(row_loss.data()), t.data(), rows, V,
                kIgnoreIndex);
    emu::launch(tk::scale_kernel<double>, dim3(2), dim3(64), 0, dlogits.data(),
                static_cast<const double*>(inv_n.data()), rows * V);
    CHECK(loss[0] == doctest::Approx(result.cross_entropy).epsilon(1e-14));
    CHECK(loss[1] == doctest::Approx(result.z_term).epsilon(1e-14));
    CHECK((z_loss > 0 ? loss[1] > 1e3 : loss[1] == 0.0));
    CHECK(inv_n[0] == doctest::Approx(1.0 / 5));
    CHECK(rel(dlogits, result.dlogits) < 1e-14);
    for (std::size_t j = 0; j < V; ++j) CHECK(dlogits[1 * V + j] == 0.0);  // ignored row
  }
  // No labelled row: loss 0 and gradient 0, never NaN.
  const std::vector<int> none(rows, kIgnoreIndex);
  emu::launch(tk::cross_entropy_rows_kernel<double>, dim3(rows), kRowBlock, 0, row_loss.data(),
              dlogits.data(), logits.data(), none.data(), rows, V, kIgnoreIndex, 1e-4);
  emu::launch(tk::cross_entropy_mean_kernel<double>, dim3(1), kRowBlock, 0, loss.data(),
              inv_n.data(), static_cast<const double*>(row_loss.data()), none.data(), rows, V,
              kIgnoreIndex);
  CHECK(loss[0] == 0.0);
  CHECK(loss[1] == 0.0);
  CHECK(inv_n[0] == 0.0);
}

TEST_CASE("cuda train kernels (CPU emulation): AdamW steps match attnlab::AdamW") {
  Rng rng(11);
  const std::size_t n = 150;
  Parameter<double> p{xt::xarray<double>(randn<double, 1>({n}, rng)), xt::zeros<double>({n})};
  std::vector<double> param(p.value.begin(), p.value.end()), m(n, 0.0), v(n, 0.0);
  AdamWOptions o;
  o.lr = 3e-2;
  o.weight_decay = 0.1;
  AdamW<double> opt({{"w", &p}}, o);
  for (std::size_t t = 1; t <= 3; ++t) {
    p.grad = randn<double, 1>({n}, rng);
    const std::vector<double> g(p.grad.begin(), p.grad.end());
    opt.step();
    const auto s = adamw_scalars<double>(o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, t);
    emu::launch(tk::adamw_kernel<double>, dim3(1), dim3(64), 0, param.data(), m.data(), v.data(),
                g.data(), n, s);
    CAPTURE(t);
    CHECK(rel(param, p.value) < 1e-15);
  }
}

TEST_CASE("cuda train kernels (CPU emulation): the sum of squares gives attnlab's grad norm") {
  Rng rng(13);
  Parameter<float> a{xt::zeros<float>({1000}), xt::xarray<float>(randn<float, 1>({1000}, rng))};
  const double norm = grad_norm<float>({{"a", &a}});
  auto partial = nan_vector<double>(tk::kSumBlocks);
  auto out = nan_vector<double>(1);
  // 4 blocks here (kSumBlocks on the GPU): the second kernel sums whatever partials there are.
  emu::launch(tk::sum_of_squares_partial_kernel<float>, dim3(4), dim3(64), 0, partial.data(),
              a.grad.data(), a.grad.size());
  emu::launch(tk::sum_partials_kernel<double>, dim3(1), dim3(64), 0, out.data(),
              static_cast<const double*>(partial.data()), std::size_t{4});
  CHECK(std::sqrt(out[0]) == doctest::Approx(norm).epsilon(1e-12));
}

TEST_CASE("cuda train kernels (CPU emulation): add, scale and exp, elementwise") {
  Rng rng(15);
  const std::size_t n = 300;  // 2 blocks of 64 threads: the grid-stride loop covers the rest
  const auto a = randn<float, 1>({n}, rng, 2.0);
  const auto b = randn<float, 1>({n}, rng);
  auto y = nan_vector<float>(n);
  emu::launch(tk::add_kernel<float>, dim3(2), dim3(64), 0, y.data(), a.data(), b.data(), n);
  for (std::size_t i = 0; i < n; ++i) CHECK(y[i] == a(i) + b(i));
  std::vector<float> x(a.begin(), a.end());  // y aliasing an input: in place
  emu::launch(tk::add_kernel<float>, dim3(2), dim3(64), 0, x.data(),
              static_cast<const float*>(x.data()), b.data(), n);
  CHECK(x == y);
  emu::launch(tk::scale_by_value_kernel<float>, dim3(2), dim3(64), 0, x.data(), -0.375f, n);
  for (std::size_t i = 0; i < n; ++i) CHECK(x[i] == y[i] * -0.375f);
  auto e = nan_vector<float>(n);
  emu::launch(tk::exp_kernel<float>, dim3(2), dim3(64), 0, e.data(), a.data(), n);
  for (std::size_t i = 0; i < n; ++i) CHECK(e[i] == std::exp(a(i)));
}

TEST_CASE("cuda train kernels (CPU emulation): heads split, merge and per-head dot") {
  const std::size_t B = 2, T = 3, H = 4, D = 5;
  Rng rng(17);
  const auto x = randn<double, 3>({B, T, H * D}, rng);  // (B, T, H·D)
  auto heads = nan_vector<double>(B * H * T * D), back = nan_vector<double>(B * T * H * D);
  emu::launch(tk::permute_heads_kernel<double>, dim3(2), dim3(64), 0, heads.data(), x.data(), B, T,
              H, D, true);
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t h = 0; h < H; ++h) {
      for (std::size_t t = 0; t < T; ++t) {
        for (std::size_t d = 0; d < D; ++d) {
          CHECK(heads[((b * H + h) * T + t) * D + d] == x(b, t, h * D + d));  // (B, H, T, D)
        }
      }
    }
  }
  emu::launch(tk::permute_heads_kernel<double>, dim3(1), dim3(64), 0, back.data(),
              static_cast<const double*>(heads.data()), B, T, H, D, false);
  CHECK(std::equal(back.begin(), back.end(), x.begin()));

  // out[h] = Σ_b Σ_i a[b, h, i] c[b, h, i], n = 70 > 64 threads
  const std::size_t n = 70;
  const auto a = randn<double, 3>({B, H, n}, rng);
  const auto c = randn<double, 3>({B, H, n}, rng);
  auto out = nan_vector<double>(H);
  emu::launch(tk::head_dot_kernel<double>, dim3(H), dim3(64), 0, out.data(), a.data(), c.data(), B,
              H, n);
  for (std::size_t h = 0; h < H; ++h) {
    double expected = 0;
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t i = 0; i < n; ++i) expected += a(b, h, i) * c(b, h, i);
    }
    CHECK(out[h] == doctest::Approx(expected).epsilon(1e-14));
  }
}

TEST_CASE("cuda train kernels (CPU emulation): SGD steps match attnlab::SGD") {
  struct Case {
    double momentum, weight_decay;
  };
  for (const Case o : {Case{0, 0}, Case{0, 0.1}, Case{0.9, 0}, Case{0.9, 0.05}}) {
    CAPTURE(o.momentum);
    CAPTURE(o.weight_decay);
    Rng rng(19);
    const std::size_t n = 150;
    Parameter<float> p{xt::xarray<float>(randn<float, 1>({n}, rng)), xt::zeros<float>({n})};
    std::vector<float> param(p.value.begin(), p.value.end());
    std::vector<float> buf = nan_vector<float>(n);  // assigned on the first step
    SgdOptions options;
    options.lr = 0.1;
    options.momentum = o.momentum;
    options.weight_decay = o.weight_decay;
    SGD<float> opt({{"w", &p}}, options);
    for (std::size_t t = 1; t <= 4; ++t) {
      p.grad = randn<float, 1>({n}, rng);
      const std::vector<float> g(p.grad.begin(), p.grad.end());
      opt.step();
      emu::launch(tk::sgd_kernel<float>, dim3(2), dim3(64), 0, param.data(),
                  o.momentum != 0 ? buf.data() : static_cast<float*>(nullptr), g.data(), n,
                  static_cast<float>(options.lr), static_cast<float>(options.momentum),
                  static_cast<float>(options.weight_decay), t == 1);
      CAPTURE(t);
      // The same float operations in the same order: bitwise equal.
      CHECK(std::equal(param.begin(), param.end(), p.value.begin()));
    }
  }
}

// A row narrower than kRowThreads runs on detail::row_threads(width) threads, the fewest whole
// warps with a thread per value (kernel_device_ops.hpp). That must give the bits of the full
// block: the same values per thread, and only empty warps left out of the block reductions
// (block_sum in the norms, block_merge in the cross-entropy). In float, at widths on both sides of
// a warp and of kRowThreads.
TEST_CASE(
    "cuda row kernels (CPU emulation): a narrow row's fewer warps give the full block's bits") {
  namespace cd = attnlab::cuda::detail;
  const unsigned most = tk::kRowThreads;
  CHECK(cd::row_threads(0, most) == 32);
  CHECK(cd::row_threads(1, most) == 32);
  CHECK(cd::row_threads(32, most) == 32);
  CHECK(cd::row_threads(33, most) == 64);
  CHECK(cd::row_threads(200, most) == 224);
  CHECK(cd::row_threads(256, most) == 256);
  CHECK(cd::row_threads(5000, most) == 256);
  CHECK(cd::row_threads(100, 64) == 64);
  const auto bits_equal = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (const std::size_t C :
       {std::size_t{5}, std::size_t{40}, std::size_t{200}, std::size_t{300}}) {
    CAPTURE(C);
    const std::size_t rows = 4;
    Rng rng(11 + C);
    const auto to_float = [](const auto& t) { return std::vector<float>(t.begin(), t.end()); };
    const auto x = to_float(randn<double, 2>({rows, C}, rng, 3.0));
    const auto dy = to_float(randn<double, 2>({rows, C}, rng));
    const auto gamma = to_float(randn<double, 1>({C}, rng));
    const auto beta = to_float(randn<double, 1>({C}, rng));
    std::vector<int> targets(rows);
    for (std::size_t r = 0; r < rows; ++r) targets[r] = static_cast<int>((7 * r + 3) % C);
    struct Out {
      std::vector<float> y, mean, rstd, dx, row_loss, dlogits;
    };
    const auto run = [&](unsigned threads) {
      Out o{nan_vector<float>(rows * C), nan_vector<float>(rows),     nan_vector<float>(rows),
            nan_vector<float>(rows * C), nan_vector<float>(2 * rows), nan_vector<float>(rows * C)};
      emu::launch(tk::layernorm_forward_kernel<float>, dim3(rows), dim3(threads), 0, o.y.data(),
                  o.mean.data(), o.rstd.data(), x.data(), gamma.data(), beta.data(), C, 1e-5f);
      emu::launch(tk::norm_backward_rows_kernel<float>, dim3(rows), dim3(threads), 0, o.dx.data(),
                  dy.data(), x.data(), static_cast<const float*>(o.mean.data()),
                  static_cast<const float*>(o.rstd.data()), gamma.data(), C);
      emu::launch(tk::cross_entropy_rows_kernel<float>, dim3(rows), dim3(threads), 0,
                  o.row_loss.data(), o.dlogits.data(), x.data(), targets.data(), rows, C,
                  kIgnoreIndex, 1e-4f);
      return o;
    };
    const Out full = run(most), narrow = run(cd::row_threads(C, most));
    CHECK(bits_equal(narrow.y, full.y));
    CHECK(bits_equal(narrow.mean, full.mean));
    CHECK(bits_equal(narrow.rstd, full.rstd));
    CHECK(bits_equal(narrow.dx, full.dx));
    CHECK(bits_equal(narrow.row_loss, full.row_loss));
    CHECK(bits_equal(narrow.dlogits, full.dlogits));
    CHECK(std::isfinite(full.row_loss[0]));
  }
}
