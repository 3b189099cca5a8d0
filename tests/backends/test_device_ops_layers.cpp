// Every layer op of DeviceOps (attnlab/device_ops.hpp: embedding, the norms, the activations,
// softcap, RoPE, linear, cross-entropy) against the CPU op, for every implementation, as
// test_device_ops.cpp does for the other groups:
// the emulated one (the CUDA kernel sources on the CPU, attnlab/backends/emulated.hpp) and the CPU
// backend (attnlab/backends/cpu.hpp) on every machine, one body over both (device_backends.hpp),
// and the CUDA one (make_cuda_device_ops) where a device exists; without one those cases are
// reported as skipped. Outputs start as NaN so that an element an operation never wrote shows.
// Inputs are rounded to T first, so the double CPU reference sees exactly the device's inputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <xtensor/xbuilder.hpp>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

#include "attnlab/backends/emulated.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/device_ops.hpp"
#include "attnlab/nn/parameter.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/ops/embedding.hpp"
#include "attnlab/ops/gelu.hpp"
#include "attnlab/ops/layernorm.hpp"
#include "attnlab/ops/linear.hpp"
#include "attnlab/ops/relu.hpp"
#include "attnlab/ops/rmsnorm.hpp"
#include "attnlab/ops/rope.hpp"
#include "attnlab/ops/softcap.hpp"
#include "attnlab/ops/swiglu.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/optim/sgd.hpp"
#include "attnlab/random.hpp"
#include "cuda_helpers.hpp"
#include "device_backends.hpp"
#include "device_vector.hpp"
#include "helpers.hpp"

using namespace attnlab;
using test::DeviceVector;
using test::random_rounded;
using test::values;

namespace {

// The sizes and inputs the layer ops' checks share, drawn from one Rng in the order the checks run:
// x and dy (rows, C), gamma and beta (C,) and their device copies, drawn after the embedding's
// check. A new layer op adds one check below and one line to check_layers.
struct LayerSizes {
  static constexpr std::size_t B = 2, Tn = 5, C = 12, V = 11, rows = B * Tn, hidden = 7;
};

template <class T>
struct LayerInputs {
  LayerInputs(DeviceOps<T>& ops_in, double tol_in) : ops(ops_in), tol(tol_in) {}

  void draw_rows() {
    using S = LayerSizes;
    x = random_rounded<T, 2>({S::rows, S::C}, rng, 2.0);
    dy = random_rounded<T, 2>({S::rows, S::C}, rng);
    gamma = random_rounded<T, 1>({S::C}, rng);
    beta = random_rounded<T, 1>({S::C}, rng);
    dx_in = std::make_unique<DeviceVector<T, T>>(ops, values<T>(x));
    ddy = std::make_unique<DeviceVector<T, T>>(ops, values<T>(dy));
    dgamma_in = std::make_unique<DeviceVector<T, T>>(ops, values<T>(gamma));
    dbeta_in = std::make_unique<DeviceVector<T, T>>(ops, values<T>(beta));
  }

  DeviceOps<T>& ops;
  double tol;
  Rng rng{3};
  Tensor<double, 2> x, dy;
  Tensor<double, 1> gamma, beta;
  std::unique_ptr<DeviceVector<T, T>> dx_in, ddy, dgamma_in, dbeta_in;
};

// embedding: the table lookup, and its gradient summed per id (an unused id and absent tokens).
template <class T>
void check_embedding(LayerInputs<T>& in) {
  DeviceOps<T>& ops = in.ops;
  const double tol = in.tol;
  Rng& rng = in.rng;
  constexpr std::size_t B = LayerSizes::B, Tn = LayerSizes::Tn, C = LayerSizes::C,
                        V = LayerSizes::V, rows = LayerSizes::rows;
  INFO("embedding");
  const TokenIds ids = {{0, 3, 3, kNoToken, 10}, {2, 3, 0, 0, kNoToken}};  // id 1 unused
  const auto table = random_rounded<T, 2>({V, C}, rng);
  const auto dy = random_rounded<T, 3>({B, Tn, C}, rng);
  EmbeddingCache cache;
  const auto y_cpu = embedding_forward(cache, ids, table);
  const auto dtable_cpu = embedding_backward(dy, cache);
  DeviceVector<int, T> dids(ops, std::vector<int>(ids.begin(), ids.end()));
  DeviceVector<T, T> dtable(ops, values<T>(table)), ddy(ops, values<T>(dy)), y(ops, rows * C),
      grad(ops, V * C);
  ops.embedding_forward(y.get(), dids.get(), dtable.get(), rows, C);
  ops.embedding_backward(grad.get(), ddy.get(), dids.get(), rows, V, C);
  CHECK(test::rel_error(y.host(), y_cpu) == 0.0);
  CHECK(test::rel_error(grad.host(), dtable_cpu) < tol);
}

// layernorm, with and without bias (beta and dbeta null).
template <class T>
void check_layernorm(LayerInputs<T>& in) {
  DeviceOps<T>& ops = in.ops;
  const double tol = in.tol;
  const Tensor<double, 2>& x = in.x;
  const Tensor<double, 2>& dy = in.dy;
  const Tensor<double, 1>& gamma = in.gamma;
  const Tensor<double, 1>& beta = in.beta;
  DeviceVector<T, T>& dx_in = *in.dx_in;
  DeviceVector<T, T>& ddy = *in.ddy;
  DeviceVector<T, T>& dgamma_in = *in.dgamma_in;
  DeviceVector<T, T>& dbeta_in = *in.dbeta_in;
  constexpr std::size_t C = LayerSizes::C, rows = LayerSizes::rows;
  INFO("layernorm");
  LayerNormCache<double, 2> cache;
  const auto y_cpu = layernorm_forward(cache, x, gamma, beta, kLayerNormEps);
  const auto g = layernorm_backward(dy, cache, gamma);
  DeviceVector<T, T> y(ops, rows * C), mean(ops, rows), rstd(ops, rows), dx(ops, rows * C),
      dgamma(ops, C), dbeta(ops, C);
  ops.layernorm_forward(y.get(), mean.get(), rstd.get(), dx_in.get(), dgamma_in.get(),
                        dbeta_in.get(), rows, C, T(kLayerNormEps));
  ops.layernorm_backward(dx.get(), dgamma.get(), dbeta.get(), ddy.get(), dx_in.get(), mean.get(),
                         rstd.get(), dgamma_in.get(), rows, C);
  CHECK(test::rel_error(y.host(), y_cpu) < tol);
  CHECK(test::rel_error(rstd.host(), cache.rstd) < tol);
  CHECK(test::rel_error(dx.host(), g.dx) < tol);
  CHECK(test::rel_error(dgamma.host(), g.dgamma) < tol);
  CHECK(test::rel_error(dbeta.host(), g.dbeta) < tol);

  // Without bias (a LayerNorm built with bias = false): beta and dbeta are null.
  DeviceVector<T, T> y0(ops, rows * C), dx0(ops, rows * C), dgamma0(ops, C);
  ops.layernorm_forward(y0.get(), mean.get(), rstd.get(), dx_in.get(), dgamma_in.get(), nullptr,
                        rows, C, T(kLayerNormEps));
  ops.layernorm_backward(dx0.get(), dgamma0.get(), nullptr, ddy.get(), dx_in.get(), mean.get(),
                         rstd.get(), dgamma_in.get(), rows, C);
  const Tensor<double, 2> y_no_beta = y_cpu - beta;
  CHECK(test::rel_error(y0.host(), y_no_beta) < tol);
  CHECK(test::rel_error(dx0.host(), g.dx) < tol);
  CHECK(test::rel_error(dgamma0.host(), g.dgamma) < tol);
}

// rmsnorm.
template <class T>
void check_rmsnorm(LayerInputs<T>& in) {
  DeviceOps<T>& ops = in.ops;
  const double tol = in.tol;
  const Tensor<double, 2>& x = in.x;
  const Tensor<double, 2>& dy = in.dy;
  const Tensor<double, 1>& gamma = in.gamma;
  DeviceVector<T, T>& dx_in = *in.dx_in;
  DeviceVector<T, T>& ddy = *in.ddy;
  DeviceVector<T, T>& dgamma_in = *in.dgamma_in;
  constexpr std::size_t C = LayerSizes::C, rows = LayerSizes::rows;
  INFO("rmsnorm");
  RmsNormCache<double, 2> cache;
  const auto y_cpu = rmsnorm_forward(cache, x, gamma, kLayerNormEps);
  const auto g = rmsnorm_backward(dy, cache, gamma);
  DeviceVector<T, T> y(ops, rows * C), rstd(ops, rows), dx(ops, rows * C), dgamma(ops, C);
  ops.rmsnorm_forward(y.get(), rstd.get(), dx_in.get(), dgamma_in.get(), rows, C, T(kLayerNormEps));
  ops.rmsnorm_backward(dx.get(), dgamma.get(), ddy.get(), dx_in.get(), rstd.get(), dgamma_in.get(),
                       rows, C);
  CHECK(test::rel_error(y.host(), y_cpu) < tol);
  CHECK(test::rel_error(rstd.host(), cache.rstd) < tol);
  CHECK(test::rel_error(dx.host(), g.dx) < tol);
  CHECK(test::rel_error(dgamma.host(), g.dgamma) < tol);
}

// gelu, tanh-approximated and exact.
template <class T>
void check_gelu(LayerInputs<T>& in) {
  DeviceOps<T>& ops = in.ops;
  const double tol = in.tol;
  const Tensor<double, 2>& x = in.x;
  const Tensor<double, 2>& dy = in.dy;
  DeviceVector<T, T>& dx_in = *in.dx_in;
  DeviceVector<T, T>& ddy = *in.ddy;
  constexpr std::size_t C = LayerSizes::C, rows = LayerSizes::rows;
  INFO("gelu");
  for (bool exact : {false, true}) {
    CAPTURE(exact);
    GeluCache<double, 2> cache;
    const auto y_cpu =
        gelu_forward(cache, x, exact ? GeluApproximation::exact : GeluApproximation::tanh);
    const auto dx_cpu = gelu_backward(dy, cache);
    DeviceVector<T, T> y(ops, rows * C), dx(ops, rows * C);
    ops.gelu_forward(y.get(), dx_in.get(), rows * C, exact);
    ops.gelu_backward(dx.get(), ddy.get(), dx_in.get(), rows * C, exact);
    CHECK(test::rel_error(y.host(), y_cpu) < tol);
    CHECK(test::rel_error(dx.host(), dx_cpu) < tol);
  }
}

// relu and relu² (ReLU squared), both branches taken.
template <class T>
void check_relu(LayerInputs<T>& in) {
  DeviceOps<T>& ops = in.ops;
  const double tol = in.tol;
  const Tensor<double, 2>& x = in.x;
  const Tensor<double, 2>& dy = in.dy;
  DeviceVector<T, T>& dx_in = *in.dx_in;
  DeviceVector<T, T>& ddy = *in.ddy;
  constexpr std::size_t C = LayerSizes::C, rows = LayerSizes::rows;
  for (const bool squared : {false, true}) {
    const char* op = squared ? "relu_squared" : "relu";
    INFO(op);
    ReluCache<double, 2> cache;
    const auto y_cpu = squared ? relu_squared_forward(cache, x) : relu_forward(cache, x);
    const auto dx_cpu = squared ? relu_squared_backward(dy, cache) : relu_backward(dy, cache);
    DeviceVector<T, T> y(ops, rows * C), dx(ops, rows * C);
    if (squared) {
      ops.relu_squared_forward(y.get(), dx_in.get(), rows * C);
      ops.relu_squared_backward(dx.get(), ddy.get(), dx_in.get(), rows * C);
    } else {
      ops.relu_forward(y.get(), dx_in.get(), rows * C);
      ops.relu_backward(dx.get(), ddy.get(), dx_in.get(), rows * C);
    }
    const std::vector<T> y_dev = y.host();
    CHECK(test::rel_error(y_dev, y_cpu) < tol);
    CHECK(test::rel_error(dx.host(), dx_cpu) < tol);
    CHECK(std::count(y_dev.begin(), y_dev.end(), T(0)) > 0);  // both branches ran
  }
}

// swiglu: x read as h (rows, 2F), F = C / 2.
template <class T>
void check_swiglu(LayerInputs<T>& in) {
  DeviceOps<T>& ops = in.ops;
  const double tol = in.tol;
  const Tensor<double, 2>& x = in.x;
  const Tensor<double, 2>& dy = in.dy;
  DeviceVector<T, T>& dx_in = *in.dx_in;
  constexpr std::size_t C = LayerSizes::C, rows = LayerSizes::rows;
  INFO("swiglu");
  // x (rows, C) read as h (rows, 2F) with F = C / 2; dy (rows, F) from the first half of dy.
  REQUIRE(C % 2 == 0);
  const std::size_t F = C / 2;
  const Tensor2<double> dyh = xt::view(dy, xt::all(), xt::range(0, F));
  SwigluCache<double, 2> cache;
  const auto y_cpu = swiglu_forward(cache, x);
  const auto dh_cpu = swiglu_backward(dyh, cache);
  DeviceVector<T, T> y(ops, rows * F), dh(ops, rows * C), dyv(ops, values<T>(dyh));
  ops.swiglu_forward(y.get(), dx_in.get(), rows, F);
  ops.swiglu_backward(dh.get(), dyv.get(), dx_in.get(), rows, F);
  CHECK(test::rel_error(y.host(), y_cpu) < tol);
  CHECK(test::rel_error(dh.host(), dh_cpu) < tol);
}

// softcap at a cap the inputs reach.
template <class T>
void check_softcap(LayerInputs<T>& in) {
  DeviceOps<T>& ops = in.ops;
  const double tol = in.tol;
  const Tensor<double, 2>& x = in.x;
  const Tensor<double, 2>& dy = in.dy;
  DeviceVector<T, T>& dx_in = *in.dx_in;
  DeviceVector<T, T>& ddy = *in.ddy;
  constexpr std::size_t C = LayerSizes::C, rows = LayerSizes::rows;
  INFO("softcap");
  SoftcapCache<double, 2> cache;
  const double cap = 0.7;  // the inputs reach its curved part
  const auto y_cpu = softcap_forward(cache, x, cap);
  const auto dx_cpu = softcap_backward(dy, cache);
  DeviceVector<T, T> y(ops, rows * C), dx(ops, rows * C);
  ops.softcap_forward(y.get(), dx_in.get(), rows * C, T(cap));
  ops.softcap_backward(dx.get(), ddy.get(), y.get(), rows * C, T(cap));
  CHECK(test::rel_error(y.host(), y_cpu) < tol);
  CHECK(test::rel_error(dx.host(), dx_cpu) < tol);
}

// rope, half-split and interleaved, partial, at an offset.
template <class T>
void check_rope(LayerInputs<T>& in) {
  DeviceOps<T>& ops = in.ops;
  const double tol = in.tol;
  Rng& rng = in.rng;
  for (const bool interleaved : {false, true}) {
    INFO("rope, interleaved = " << interleaved);
    // (B, H, T, D) = (2, 3, 40, 10), partial (6 of 10 dims), at positions 5 ..: more pairs than
    // one GPU block's threads.
    const std::size_t Bh = 2, Hh = 3, Tr = 40, Dr = 10, offset = 5;
    const RopeOptions options{.theta = 300.0, .fraction = 0.6, .interleaved = interleaved};
    const auto xr = random_rounded<T, 4>({Bh, Hh, Tr, Dr}, rng);
    const auto y_cpu = rope_forward(xr, options, offset);
    const auto dx_cpu = rope_backward(xr, options, offset);
    const RopeTable table = rope_table(options, Dr, offset + Tr);
    DeviceVector<T, T> cos(ops, std::vector<T>(table.cos.begin(), table.cos.end())),
        sin(ops, std::vector<T>(table.sin.begin(), table.sin.end())), y(ops, values<T>(xr)),
        dx(ops, values<T>(xr));
    kernel_math::RopeShape shape{.slices = Bh * Hh,
                                 .Tn = Tr,
                                 .D = Dr,
                                 .rot = rope_dims("test", options, Dr),
                                 .offset = offset,
                                 .interleaved = interleaved};
    ops.rope(y.get(), cos.get(), sin.get(), shape);
    shape.inverse = true;
    ops.rope(dx.get(), cos.get(), sin.get(), shape);
    CHECK(test::rel_error(y.host(), y_cpu) < tol);
    CHECK(test::rel_error(dx.host(), dx_cpu) < tol);
  }
}

// linear, with and without bias, without dx, and with W stored (Out, In).
template <class T>
void check_linear(LayerInputs<T>& in) {
  DeviceOps<T>& ops = in.ops;
  const double tol = in.tol;
  Rng& rng = in.rng;
  const Tensor<double, 2>& x = in.x;
  DeviceVector<T, T>& dx_in = *in.dx_in;
  constexpr std::size_t C = LayerSizes::C, rows = LayerSizes::rows, hidden = LayerSizes::hidden;
  INFO("linear");
  const auto w = random_rounded<T, 2>({C, hidden}, rng);
  const Tensor1<double> b = random_rounded<T, 1>({hidden}, rng);
  const auto dyl = random_rounded<T, 2>({rows, hidden}, rng);
  DeviceVector<T, T> dw_in(ops, values<T>(w)), db_in(ops, values<T>(b)), ddyl(ops, values<T>(dyl)),
      y(ops, rows * hidden), dx(ops, rows * C), dw(ops, C * hidden), db(ops, hidden);
  for (bool with_bias : {false, true}) {
    CAPTURE(with_bias);
    LinearCache<double, 2> cache;
    const auto y_cpu = linear_forward(cache, x, w, with_bias ? &b : nullptr);
    const auto g = linear_backward(dyl, cache, w, with_bias);
    ops.linear_forward(y.get(), dx_in.get(), dw_in.get(), with_bias ? db_in.get() : nullptr, rows,
                       C, hidden);
    ops.linear_backward(dx.get(), dw.get(), with_bias ? db.get() : nullptr, ddyl.get(), dx_in.get(),
                        dw_in.get(), rows, C, hidden);
    CHECK(test::rel_error(y.host(), y_cpu) < tol);
    CHECK(test::rel_error(dx.host(), g.dx) < tol);
    CHECK(test::rel_error(dw.host(), g.dw) < tol);
    if (with_bias) CHECK(test::rel_error(db.host(), g.db) < tol);
  }
  // dx null: skipped (the first layer has no input gradient); dW still assigned.
  DeviceVector<T, T> dw2(ops, C * hidden);
  ops.linear_backward(nullptr, dw2.get(), nullptr, ddyl.get(), dx_in.get(), dw_in.get(), rows, C,
                      hidden);
  CHECK(dw2.host() == dw.host());
  // W stored (Out, In) (a tied head reads the embedding table so): the CPU op on Wᵀ, with dW
  // returned (Out, In).
  LinearCache<double, 2> cache;
  const auto y_cpu = linear_forward(cache, x, w);
  const auto g = linear_backward(dyl, cache, w, false);
  const Tensor2<double> w_out_in = xt::transpose(w);      // (hidden, C)
  const Tensor2<double> dw_out_in = xt::transpose(g.dw);  // (hidden, C)
  DeviceVector<T, T> wt_in(ops, values<T>(w_out_in)), dwt(ops, hidden * C);
  ops.linear_forward(y.get(), dx_in.get(), wt_in.get(), nullptr, rows, C, hidden, true);
  ops.linear_backward(dx.get(), dwt.get(), nullptr, ddyl.get(), dx_in.get(), wt_in.get(), rows, C,
                      hidden, true);
  CHECK(test::rel_error(y.host(), y_cpu) < tol);
  CHECK(test::rel_error(dx.host(), g.dx) < tol);
  CHECK(test::rel_error(dwt.host(), dw_out_in) < tol);
  // accumulate_dw: the GEMM adds into dW (β = 1), in both layouts. Into zeros it gives the
  // assigning call's bits (what keeps a training run's numbers when the modules write their
  // gradients in place); into a gradient already there, the sum.
  for (bool transposed : {false, true}) {
    CAPTURE(transposed);
    const T* weights = transposed ? wt_in.get() : dw_in.get();
    const std::vector<T> assigned = transposed ? dwt.host() : dw.host();
    DeviceVector<T, T> acc(ops, std::vector<T>(C * hidden, T(0)));
    ops.linear_backward(nullptr, acc.get(), nullptr, ddyl.get(), dx_in.get(), weights, rows, C,
                        hidden, transposed, /*accumulate_dw=*/true);
    CHECK(acc.host() == assigned);
    ops.linear_backward(nullptr, acc.get(), nullptr, ddyl.get(), dx_in.get(), weights, rows, C,
                        hidden, transposed, /*accumulate_dw=*/true);
    const Tensor2<double> twice = 2.0 * (transposed ? dw_out_in : g.dw);
    CHECK(test::rel_error(acc.host(), twice) < tol);
  }
}

// softmax cross-entropy with ignored rows, with and without z-loss.
template <class T>
void check_cross_entropy(LayerInputs<T>& in) {
  DeviceOps<T>& ops = in.ops;
  const double tol = in.tol;
  Rng& rng = in.rng;
  constexpr std::size_t V = LayerSizes::V, rows = LayerSizes::rows;
  for (const T z_loss : {T(0), T(0.05)}) {
    INFO("softmax cross-entropy, z-loss " << z_loss);
    const auto logits = random_rounded<T, 2>({rows, V}, rng, 3.0);
    const xt::xtensor<int, 1> targets = {3, kIgnoreIndex, 5, 10, 0, kIgnoreIndex, 1, 2, 2, 7};
    const auto result =
        softmax_cross_entropy(logits, targets, kIgnoreIndex, static_cast<double>(z_loss));
    DeviceVector<T, T> dlogits_in(ops, values<T>(logits)), loss(ops, 2), dlogits(ops, rows * V),
        row_loss(ops, 2 * rows);
    DeviceVector<int, T> dtargets(ops, std::vector<int>(targets.begin(), targets.end()));
    ops.softmax_cross_entropy(loss.get(), dlogits.get(), row_loss.get(), dlogits_in.get(),
                              dtargets.get(), rows, V, kIgnoreIndex, z_loss);
    CHECK(loss.host()[0] == doctest::Approx(result.cross_entropy).epsilon(tol));
    CHECK(loss.host()[1] == doctest::Approx(result.z_term).epsilon(tol));
    CHECK((z_loss == T(0) ? result.z_term == T(0) : result.z_term > T(0)));
    CHECK(test::rel_error(dlogits.host(), result.dlogits) < tol);
  }
}

// The layer ops, one check each, in the order they draw their inputs.
template <class T>
void check_layers(DeviceOps<T>& ops, double tol) {
  LayerInputs<T> in(ops, tol);
  check_embedding(in);
  in.draw_rows();
  check_layernorm(in);
  check_rmsnorm(in);
  check_gelu(in);
  check_relu(in);
  check_swiglu(in);
  check_softcap(in);
  check_rope(in);
  check_linear(in);
  check_cross_entropy(in);
}

constexpr double kDoubleTol = 1e-12;
constexpr double kFloatTol = 1e-5;

}  // namespace

TEST_CASE_TEMPLATE("device ops: every layer op matches the CPU op, in double", Backend,
                   test::EmulatedBackend, test::CpuBackend) {
  const auto device = Backend::template make<double>();
  check_layers(*device, kDoubleTol);
  test::check_no_live_allocations<Backend>(*device);
}

TEST_CASE_TEMPLATE("device ops: every layer op matches the CPU op, in float", Backend,
                   test::EmulatedBackend, test::CpuBackend) {
  const auto device = Backend::template make<float>();
  check_layers(*device, kFloatTol);
  test::check_no_live_allocations<Backend>(*device);
}

TEST_CASE("device ops (cuda): every layer op matches the CPU op") {
  if (!test::cuda_device_or_skip()) return;
  const auto ops_double = make_cuda_device_ops<double>();
  const auto ops_float = make_cuda_device_ops<float>();
  check_layers(*ops_double, kDoubleTol);
  check_layers(*ops_float, kFloatTol);
}
