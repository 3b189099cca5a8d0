// The training-step operations of the CUDA backend (attnlab/device_ops.hpp) on a GPU against the
// CPU ops, in float with NaN-poisoned outputs (fp32 to ~1e-5 relative against the double CPU op)
// and in double. Without a device these tests are reported as skipped
// (tests/support/cuda_helpers.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include <xtensor/xbuilder.hpp>

#include "attnlab/cuda.hpp"
#include "attnlab/device_ops.hpp"
#include "attnlab/nn/parameter.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/ops/embedding.hpp"
#include "attnlab/ops/gelu.hpp"
#include "attnlab/ops/layernorm.hpp"
#include "attnlab/ops/linear.hpp"
#include "attnlab/ops/rmsnorm.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/optim/clip.hpp"
#include "attnlab/random.hpp"
#include "cuda_helpers.hpp"
#include "helpers.hpp"

using namespace attnlab;
using cuda::DeviceArray;

namespace {

constexpr double kFloatTol = 1e-5;

template <class E>
DeviceArray<typename E::value_type> upload(const E& host) {
  return DeviceArray<typename E::value_type>(host.data(), host.size());
}

template <class T>
DeviceArray<T> poisoned(std::size_t n) {
  DeviceArray<T> a(n);
  a.poison();
  return a;
}

template <class T>
std::vector<T> download(const DeviceArray<T>& a) {
  cuda::synchronize();
  std::vector<T> host(a.size());
  a.download(host.data());
  return host;
}

// The CUDA backend for element type T, made on first use (after the device check) and kept.
template <class T>
DeviceOps<T>& gpu() {
  static const std::unique_ptr<DeviceOps<T>> ops = make_cuda_device_ops<T>();
  return *ops;
}
// The backend whose element type is that of `p` (the op's first T argument).
template <class T>
DeviceOps<T>& ops_of(T* /*p*/) {
  return gpu<T>();
}

template <class T>
xt::xtensor<T, 2> as_float(const xt::xtensor<double, 2>& x) {
  return xt::xtensor<T, 2>(xt::cast<T>(x));
}

}  // namespace

TEST_CASE("cuda train: embedding, LayerNorm, RMSNorm and GELU match the CPU ops") {
  if (!test::cuda_device_or_skip()) return;
  Rng rng(3);
  const std::size_t rows = 33, C = 300, V = 11;
  const auto x = randn<double, 2>({rows, C}, rng, 2.0);
  const auto dy = randn<double, 2>({rows, C}, rng);
  const auto gamma = randn<double, 1>({C}, rng);
  const auto beta = randn<double, 1>({C}, rng);
  const auto xf = as_float<float>(x), dyf = as_float<float>(dy);
  const Tensor1<float> gf = xt::cast<float>(gamma), bf = xt::cast<float>(beta);
  auto x_d = upload(xf), dy_d = upload(dyf), g_d = upload(gf), b_d = upload(bf);

  SUBCASE("embedding") {
    const auto table = randn<double, 2>({V, C}, rng);
    TokenIds ids = xt::zeros<int>({std::size_t{3}, std::size_t{11}});
    for (std::size_t i = 0; i < ids.size(); ++i) ids.data()[i] = static_cast<int>(i * 7 % V);
    ids(1, 4) = kNoToken;
    const auto dye = randn<double, 3>({3, 11, C}, rng);
    EmbeddingCache cache;
    const auto y_cpu = embedding_forward(cache, ids, table);
    const auto dt_cpu = embedding_backward(dye, cache);
    const auto tf = as_float<float>(table);
    const Tensor3<float> dyef = xt::cast<float>(dye);
    auto t_d = upload(tf), dye_d = upload(dyef);
    DeviceArray<int> ids_d(ids.data(), ids.size());
    auto y_d = poisoned<float>(ids.size() * C), dt_d = poisoned<float>(V * C);
    ops_of(y_d.data()).embedding_forward(y_d.data(), ids_d.data(), t_d.data(), ids.size(), C);
    ops_of(dt_d.data())
        .embedding_backward(dt_d.data(), dye_d.data(), ids_d.data(), ids.size(), V, C);
    CHECK(test::rel_error(download(y_d), y_cpu) < kFloatTol);
    CHECK(test::rel_error(download(dt_d), dt_cpu) < kFloatTol);
  }
  SUBCASE("layernorm") {
    LayerNormCache<double, 2> cache;
    const auto y_cpu = layernorm_forward(cache, x, gamma, beta);
    const auto g_cpu = layernorm_backward(dy, cache, gamma);
    auto y_d = poisoned<float>(rows * C), mean_d = poisoned<float>(rows),
         rstd_d = poisoned<float>(rows);
    ops_of(y_d.data())
        .layernorm_forward(y_d.data(), mean_d.data(), rstd_d.data(), x_d.data(), g_d.data(),
                           b_d.data(), rows, C, float(kLayerNormEps));
    auto dx_d = poisoned<float>(rows * C), dg_d = poisoned<float>(C), db_d = poisoned<float>(C);
    ops_of(dx_d.data())
        .layernorm_backward(dx_d.data(), dg_d.data(), db_d.data(), dy_d.data(), x_d.data(),
                            mean_d.data(), rstd_d.data(), g_d.data(), rows, C);
    CHECK(test::rel_error(download(y_d), y_cpu) < kFloatTol);
    CHECK(test::rel_error(download(dx_d), g_cpu.dx) < kFloatTol);
    CHECK(test::rel_error(download(dg_d), g_cpu.dgamma) < kFloatTol);
    CHECK(test::rel_error(download(db_d), g_cpu.dbeta) < kFloatTol);
  }
  SUBCASE("rmsnorm") {
    RmsNormCache<double, 2> cache;
    const auto y_cpu = rmsnorm_forward(cache, x, gamma);
    const auto g_cpu = rmsnorm_backward(dy, cache, gamma);
    auto y_d = poisoned<float>(rows * C), rstd_d = poisoned<float>(rows);
    ops_of(y_d.data())
        .rmsnorm_forward(y_d.data(), rstd_d.data(), x_d.data(), g_d.data(), rows, C,
                         float(kRmsNormEps));
    auto dx_d = poisoned<float>(rows * C), dg_d = poisoned<float>(C);
    ops_of(dx_d.data())
        .rmsnorm_backward(dx_d.data(), dg_d.data(), dy_d.data(), x_d.data(), rstd_d.data(),
                          g_d.data(), rows, C);
    CHECK(test::rel_error(download(y_d), y_cpu) < kFloatTol);
    CHECK(test::rel_error(download(dx_d), g_cpu.dx) < kFloatTol);
    CHECK(test::rel_error(download(dg_d), g_cpu.dgamma) < kFloatTol);
  }
  SUBCASE("gelu") {
    for (bool exact : {false, true}) {
      GeluCache<double, 2> cache;
      const auto y_cpu =
          gelu_forward(cache, x, exact ? GeluApproximation::exact : GeluApproximation::tanh);
      const auto dx_cpu = gelu_backward(dy, cache);
      auto y_d = poisoned<float>(rows * C), dx_d = poisoned<float>(rows * C);
      ops_of(y_d.data()).gelu_forward(y_d.data(), x_d.data(), rows * C, exact);
      ops_of(dx_d.data()).gelu_backward(dx_d.data(), dy_d.data(), x_d.data(), rows * C, exact);
      CHECK(test::rel_error(download(y_d), y_cpu) < kFloatTol);
      CHECK(test::rel_error(download(dx_d), dx_cpu) < kFloatTol);
    }
  }
}

TEST_CASE("cuda train: linear with bias, forward and backward, float and double") {
  if (!test::cuda_device_or_skip()) return;
  Rng rng(5);
  const std::size_t rows = 40, in = 24, out = 36;
  const auto x = randn<double, 2>({rows, in}, rng);
  const auto w = randn<double, 2>({in, out}, rng);
  const auto b = randn<double, 1>({out}, rng);
  const auto dy = randn<double, 2>({rows, out}, rng);
  LinearCache<double, 2> cache;
  const auto y_cpu = linear_forward(cache, x, w, &b);
  const auto g_cpu = linear_backward(dy, cache, w, true);
  auto x_d = upload(x), w_d = upload(w), b_d = upload(b), dy_d = upload(dy);
  auto y_d = poisoned<double>(rows * out), dx_d = poisoned<double>(rows * in),
       dw_d = poisoned<double>(in * out), db_d = poisoned<double>(out);
  ops_of(y_d.data()).linear_forward(y_d.data(), x_d.data(), w_d.data(), b_d.data(), rows, in, out);
  ops_of(dx_d.data())
      .linear_backward(dx_d.data(), dw_d.data(), db_d.data(), dy_d.data(), x_d.data(), w_d.data(),
                       rows, in, out);
  CHECK(test::rel_error(download(y_d), y_cpu) < 1e-13);
  CHECK(test::rel_error(download(dx_d), g_cpu.dx) < 1e-13);
  CHECK(test::rel_error(download(dw_d), g_cpu.dw) < 1e-13);
  CHECK(test::rel_error(download(db_d), g_cpu.db) < 1e-13);
  const auto xf = as_float<float>(x), wf = as_float<float>(w);
  auto xf_d = upload(xf), wf_d = upload(wf);
  auto yf_d = poisoned<float>(rows * out);
  ops_of(yf_d.data())
      .linear_forward(yf_d.data(), xf_d.data(), wf_d.data(), static_cast<const float*>(nullptr),
                      rows, in, out);
  LinearCache<double, 2> no_bias;
  CHECK(test::rel_error(download(yf_d), linear_forward(no_bias, x, w)) < kFloatTol);
}

TEST_CASE("cuda train: fused softmax cross-entropy matches the CPU op") {
  if (!test::cuda_device_or_skip()) return;
  Rng rng(7);
  const std::size_t rows = 50, V = 1000;
  auto logits = randn<double, 2>({rows, V}, rng, 3.0);
  logits(4, 7) = 1e4;
  xt::xtensor<int, 1> targets = xt::zeros<int>({rows});
  for (std::size_t r = 0; r < rows; ++r) targets(r) = static_cast<int>(r * 37 % V);
  targets(3) = kIgnoreIndex;
  const double z_loss = 1e-4;  // with PaLM's z-loss: log Z = 1e4 at row 4 weighs in
  const auto cpu = softmax_cross_entropy(logits, targets, kIgnoreIndex, z_loss);
  const auto lf = as_float<float>(logits);
  auto l_d = upload(lf);
  DeviceArray<int> t_d(targets.data(), targets.size());
  auto loss_d = poisoned<float>(2), dl_d = poisoned<float>(rows * V),
       rl_d = poisoned<float>(2 * rows);
  ops_of(loss_d.data())
      .softmax_cross_entropy(loss_d.data(), dl_d.data(), rl_d.data(), l_d.data(), t_d.data(), rows,
                             V, kIgnoreIndex, static_cast<float>(z_loss));
  CHECK(download(loss_d)[0] == doctest::Approx(cpu.cross_entropy).epsilon(kFloatTol));
  CHECK(download(loss_d)[1] == doctest::Approx(cpu.z_term).epsilon(kFloatTol));
  CHECK(test::rel_error(download(dl_d), cpu.dlogits) < kFloatTol);
}

TEST_CASE("cuda train: AdamW and the grad norm match the CPU optimizer") {
  if (!test::cuda_device_or_skip()) return;
  Rng rng(11);
  const std::size_t n = 5000;
  Parameter<double> p{xt::xarray<double>(randn<double, 1>({n}, rng)), xt::zeros<double>({n})};
  AdamWOptions o;
  o.lr = 1e-2;
  AdamW<double> opt({{"w", &p}}, o);
  auto param_d = upload(p.value);
  DeviceArray<double> m_d(n), v_d(n);
  const std::vector<double> zeros(n, 0.0);
  m_d.upload(zeros.data());
  v_d.upload(zeros.data());
  for (std::size_t t = 1; t <= 5; ++t) {
    p.grad = randn<double, 1>({n}, rng);
    auto g_d = upload(p.grad);
    opt.step();
    ops_of(param_d.data())
        .adamw_update(param_d.data(), m_d.data(), v_d.data(), g_d.data(), n,
                      adamw_scalars<double>(o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, t));
    CAPTURE(t);
    CHECK(test::rel_error(download(param_d), p.value) < 1e-14);
  }
  const double norm = grad_norm<double>({{"w", &p}});
  auto g_d = upload(p.grad);
  DeviceArray<double> out_d(1), partial_d(gpu<double>().sum_of_squares_scratch());
  gpu<double>().sum_of_squares(out_d.data(), partial_d.data(), g_d.data(), n);
  CHECK(std::sqrt(download(out_d)[0]) == doctest::Approx(norm).epsilon(1e-13));
}
