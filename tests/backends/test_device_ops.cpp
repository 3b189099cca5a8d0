// Every DeviceOps operation (attnlab/device_ops.hpp) against the CPU ops, for every implementation:
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

// ---- the checks, one per group of operations ----------------------------------------------------

template <class T>
void check_memory(DeviceOps<T>& ops) {
  CHECK(ops.allocate(0) == nullptr);
  ops.release(nullptr);
  const std::vector<T> host = {1, -2, 3.5, 4};
  DeviceVector<T, T> a(ops, host), b(ops, 4);
  ops.copy(b.get(), a.get(), 4 * sizeof(T));
  CHECK(b.host() == host);
  ops.zero(a.get() + 1, 2 * sizeof(T));
  CHECK(a.host() == std::vector<T>{1, 0, 0, 4});
  ops.synchronize();
}

template <class T>
void check_elementwise(DeviceOps<T>& ops, double tol) {
  Rng rng(1);
  const std::size_t rows = 7, C = 45, n = rows * C;  // n > 256: more than one GPU block
  const auto a = random_rounded<T, 2>({rows, C}, rng), b = random_rounded<T, 2>({rows, C}, rng);
  const auto bias = random_rounded<T, 1>({C}, rng);
  DeviceVector<T, T> da(ops, values<T>(a)), db(ops, values<T>(b)), y(ops, n),
      dbias(ops, values<T>(bias));
  ops.add(y.get(), da.get(), db.get(), n);
  CHECK(test::rel_error(y.host(), Tensor2<double>(a + b)) < tol);
  ops.add(da.get(), da.get(), db.get(), n);  // in place
  CHECK(da.host() == y.host());
  ops.scale(y.get(), T(-0.75), n);
  CHECK(test::rel_error(y.host(), Tensor2<double>(-0.75 * (a + b))) < tol);
  ops.exp(y.get(), db.get(), n);
  CHECK(test::rel_error(y.host(), Tensor2<double>(xt::exp(b))) < tol);

  ops.copy(y.get(), db.get(), n * sizeof(T));
  ops.add_bias(y.get(), dbias.get(), rows, C);  // adds
  Tensor2<double> expected = b;
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < C; ++c) expected(r, c) += bias(c);
  }
  CHECK(test::rel_error(y.host(), expected) < tol);
  DeviceVector<T, T> sums(ops, C);
  ops.column_sum(sums.get(), db.get(), rows, C);
  Tensor1<double> column_sums = xt::zeros<double>({C});
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < C; ++c) column_sums(c) += b(r, c);
  }
  CHECK(test::rel_error(sums.host(), column_sums) < tol);
}

template <class T>
void check_heads(DeviceOps<T>& ops, double tol) {
  const std::size_t B = 2, Tn = 5, H = 3, D = 4, n = 9;
  Rng rng(2);
  const auto x = random_rounded<T, 3>({B, Tn, H * D}, rng);
  DeviceVector<T, T> dx(ops, values<T>(x)), heads(ops, B * H * Tn * D), back(ops, x.size());
  ops.split_heads(heads.get(), dx.get(), B, Tn, H, D);
  const auto split = heads.host();
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t h = 0; h < H; ++h) {
      for (std::size_t t = 0; t < Tn; ++t) {
        for (std::size_t d = 0; d < D; ++d) {
          REQUIRE(split[((b * H + h) * Tn + t) * D + d] == static_cast<T>(x(b, t, h * D + d)));
        }
      }
    }
  }
  ops.merge_heads(back.get(), heads.get(), B, Tn, H, D);
  CHECK(back.host() == values<T>(x));

  const auto a = random_rounded<T, 3>({B, H, n}, rng), c = random_rounded<T, 3>({B, H, n}, rng);
  DeviceVector<T, T> da(ops, values<T>(a)), dc(ops, values<T>(c)), out(ops, H);
  ops.head_dot(out.get(), da.get(), dc.get(), B, H, n);
  Tensor1<double> expected = xt::zeros<double>({H});
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t h = 0; h < H; ++h) {
      for (std::size_t i = 0; i < n; ++i) expected(h) += a(b, h, i) * c(b, h, i);
    }
  }
  CHECK(test::rel_error(out.host(), expected) < tol);
}

// Batch 0 hides every third key; batch 1 hides key 0, so that with causal its query 0 sees nothing
// (an empty row: zeros).
KeyMask attention_mask(std::size_t B, std::size_t Tk) {
  KeyMask mask = xt::ones<bool>({B, Tk});
  for (std::size_t j = 0; j < Tk; ++j) {
    if (j % 3 == 2) mask(0, j) = false;
  }
  mask(1, 0) = false;
  return mask;
}

// fused_limited: the backend's fused path has a head-dim limit (shared memory on a GPU).
template <class T>
void check_attention(DeviceOps<T>& ops, double tol, bool fused_limited) {
  const std::size_t B = 2, H = 2, Tq = 6, Tk = 6, D = 4, Dv = 3;
  Rng rng(4);
  const auto q = random_rounded<T, 4>({B, H, Tq, D}, rng),
             k = random_rounded<T, 4>({B, H, Tk, D}, rng);
  const auto v = random_rounded<T, 4>({B, H, Tk, Dv}, rng),
             dout = random_rounded<T, 4>({B, H, Tq, Dv}, rng);
  const KeyMask mask = attention_mask(B, Tk);
  const std::vector<T> head_scale = {T(0.3), T(0.8)};

  SdpaOptions options;
  options.causal = true;
  options.head_scale = {static_cast<double>(head_scale[0]), static_cast<double>(head_scale[1])};
  options.path = SdpaPath::reference;
  SdpaCache<double> cache;
  const auto out_cpu = sdpa_forward(cache, q, k, v, options, &mask);
  const auto g = sdpa_backward(dout, cache, q, k, v);

  DeviceVector<T, T> dq_in(ops, values<T>(q)), dk_in(ops, values<T>(k)), dv_in(ops, values<T>(v)),
      ddout(ops, values<T>(dout)), dscale(ops, head_scale);
  DeviceVector<unsigned char, T> dmask(ops, std::vector<unsigned char>(mask.begin(), mask.end()));
  AttentionParams<T> a;
  a.B = B, a.H = H, a.Hkv = H, a.Tq = Tq, a.Tk = Tk, a.D = D, a.Dv = Dv;
  a.q = dq_in.get(), a.k = dk_in.get(), a.v = dv_in.get(), a.scale = dscale.get();
  a.key_mask = dmask.get();
  a.causal = true;

  DeviceVector<T, T> out(ops, B * H * Tq * Dv), dq(ops, q.size()), dk(ops, k.size()),
      dv(ops, v.size());
  const auto check_outputs = [&] {
    const auto out_host = out.host();
    CHECK(test::rel_error(out_host, out_cpu) < tol);
    CHECK(test::rel_error(dq.host(), g.dq) < tol);
    CHECK(test::rel_error(dk.host(), g.dk) < tol);
    CHECK(test::rel_error(dv.host(), g.dv) < tol);
    for (std::size_t c = 0; c < Dv; ++c) CHECK(out_host[(1 * H + 0) * Tq * Dv + c] == T(0));
  };
  {
    INFO("reference");
    DeviceVector<T, T> p(ops, B * H * Tq * Tk), ds(ops, B * H * Tq * Tk);
    ops.sdpa_reference_forward(out.get(), p.get(), a);
    ops.sdpa_reference_backward(dq.get(), dk.get(), dv.get(), ds.get(), ddout.get(), p.get(), a);
    CHECK(test::rel_error(p.host(), cache.p) < tol);
    check_outputs();
  }
  {
    INFO("fused");
    ops.check_fused(D, Dv);
    if (fused_limited) {
      CHECK_THROWS_AS(ops.check_fused(100000, 4), std::invalid_argument);
    } else {
      CHECK_NOTHROW(ops.check_fused(100000, 4));
    }
    DeviceVector<T, T> lse(ops, B * H * Tq), row_dot(ops, B * H * Tq);
    ops.sdpa_fused_forward(out.get(), lse.get(), a);
    ops.sdpa_fused_backward(dq.get(), dk.get(), dv.get(), row_dot.get(), ddout.get(), out.get(),
                            lse.get(), a);
    // lse of each row from the CPU weights' definition: log Σ_visible exp(s_h · q·k).
    const auto lse_host = lse.host();
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t i = 0; i < Tq; ++i) {
          double m = -std::numeric_limits<double>::infinity();
          std::vector<double> s;
          for (std::size_t j = 0; j <= i && j < Tk; ++j) {
            if (!mask(b, j)) continue;
            double dot = 0;
            for (std::size_t d = 0; d < D; ++d) dot += q(b, h, i, d) * k(b, h, j, d);
            s.push_back(options.head_scale[h] * dot);
            m = std::max(m, s.back());
          }
          const T got = lse_host[(b * H + h) * Tq + i];
          if (s.empty()) {
            CHECK(got == -std::numeric_limits<T>::infinity());
          } else {
            double sum = 0;
            for (double x : s) sum += std::exp(x - m);
            CHECK(got == doctest::Approx(m + std::log(sum)).epsilon(tol));
          }
        }
      }
    }
    check_outputs();
  }
}

template <class T>
void check_optimizers(DeviceOps<T>& ops, double tol) {
  Rng rng(5);
  const std::size_t n = 300;
  {
    INFO("adamw");
    Parameter<double> p{xt::xarray<double>(random_rounded<T, 1>({n}, rng)), xt::zeros<double>({n})};
    DeviceVector<T, T> param(ops, values<T>(p.value)), m(ops, n), v(ops, n), grad(ops, n);
    ops.zero(m.get(), n * sizeof(T));
    ops.zero(v.get(), n * sizeof(T));
    AdamWOptions o;
    o.lr = 3e-2;
    o.weight_decay = 0.1;
    AdamW<double> opt({{"w", &p}}, o);
    for (std::size_t t = 1; t <= 3; ++t) {
      p.grad = random_rounded<T, 1>({n}, rng);
      ops.upload(grad.get(), values<T>(p.grad).data(), n * sizeof(T));
      opt.step();
      ops.adamw_update(param.get(), m.get(), v.get(), grad.get(), n,
                       adamw_scalars<T>(o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, t));
      CAPTURE(t);
      CHECK(test::rel_error(param.host(), p.value) < tol);
    }
  }
  {
    INFO("sgd");
    for (const double momentum : {0.0, 0.9}) {
      CAPTURE(momentum);
      Parameter<double> p{xt::xarray<double>(random_rounded<T, 1>({n}, rng)),
                          xt::zeros<double>({n})};
      DeviceVector<T, T> param(ops, values<T>(p.value)), buf(ops, n), grad(ops, n);
      SgdOptions o;
      o.lr = 0.1;
      o.momentum = momentum;
      o.weight_decay = 0.05;
      SGD<double> opt({{"w", &p}}, o);
      for (std::size_t t = 1; t <= 3; ++t) {
        p.grad = random_rounded<T, 1>({n}, rng);
        ops.upload(grad.get(), values<T>(p.grad).data(), n * sizeof(T));
        opt.step();
        ops.sgd_update(param.get(), momentum != 0 ? buf.get() : nullptr, grad.get(), n, T(o.lr),
                       T(o.momentum), T(o.weight_decay), t == 1);
        CAPTURE(t);
        CHECK(test::rel_error(param.host(), p.value) < tol);
      }
    }
  }
  // Short of one group of 8 (the CPU backend's running sums), n itself, and three blocks of 4096
  // with a tail.
  for (const std::size_t count : {std::size_t(5), n, std::size_t(3 * 4096 + 13)}) {
    INFO("sum of squares, n = " << count);
    const auto x = random_rounded<T, 1>({count}, rng);
    DeviceVector<T, T> dx(ops, values<T>(x));
    DeviceVector<double, T> out(ops, 1), partial(ops, ops.sum_of_squares_scratch());
    ops.sum_of_squares(out.get(), partial.get(), dx.get(), count);
    double expected = 0;
    for (double value : x) expected += value * value;
    CHECK(out.host()[0] == doctest::Approx(expected).epsilon(1e-12));
  }
}

// Muon's four ops against plain loops in double: gemm (every transpose, padded strides, alpha and
// beta), the momentum, the normalisation by a device norm, and y = a y + b x.
template <class T>
void check_muon_ops(DeviceOps<T>& ops, double tol) {
  Rng rng(77);
  {
    INFO("gemm");
    const std::size_t m = 5, n = 7, k = 3, pad = 2;
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        CAPTURE(ta);
        CAPTURE(tb);
        const std::size_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
        const std::size_t lda = ac + pad, ldb = bc + pad, ldc = n + pad;
        auto a = random_rounded<T, 1>({ar * lda}, rng), b = random_rounded<T, 1>({br * ldb}, rng);
        auto c = random_rounded<T, 1>({m * ldc}, rng);
        DeviceVector<T, T> da(ops, values<T>(a)), db(ops, values<T>(b)), dc(ops, values<T>(c));
        const double alpha = 0.75, beta = -1.5;
        ops.gemm(ta, tb, m, n, k, T(alpha), da.get(), lda, db.get(), ldb, T(beta), dc.get(), ldc);
        const std::vector<T> got = dc.host();
        for (std::size_t i = 0; i < m; ++i) {
          for (std::size_t j = 0; j < n; ++j) {
            double sum = 0;
            for (std::size_t l = 0; l < k; ++l)
              sum +=
                  (ta ? a(l * lda + i) : a(i * lda + l)) * (tb ? b(j * ldb + l) : b(l * ldb + j));
            const double want = alpha * sum + beta * c(i * ldc + j);
            CHECK(static_cast<double>(got[i * ldc + j]) ==
                  doctest::Approx(want).epsilon(tol).scale(1));
          }
          for (std::size_t j = n; j < ldc; ++j)  // the padding is left alone
            CHECK(static_cast<double>(got[i * ldc + j]) == c(i * ldc + j));
        }
      }
    }
  }
  const std::size_t n = 1000;
  {
    INFO("muon momentum");
    for (const bool nesterov : {true, false}) {
      CAPTURE(nesterov);
      auto m = random_rounded<T, 1>({n}, rng), g = random_rounded<T, 1>({n}, rng);
      DeviceVector<T, T> dm(ops, values<T>(m)), dg(ops, values<T>(g)), du(ops, n);
      const double beta = 0.95;
      ops.muon_momentum(du.get(), dm.get(), dg.get(), n, T(beta), T(1 - beta), nesterov);
      const std::vector<T> u = du.host(), m1 = dm.host();
      for (std::size_t i = 0; i < n; i += 37) {
        const double mm = m(i) + (1 - beta) * (g(i) - m(i));
        CHECK(static_cast<double>(m1[i]) == doctest::Approx(mm).epsilon(tol).scale(1));
        const double want = nesterov ? g(i) + beta * (mm - g(i)) : mm;
        CHECK(static_cast<double>(u[i]) == doctest::Approx(want).epsilon(tol).scale(1));
      }
    }
  }
  {
    INFO("divide by norm, axpby");
    auto x = random_rounded<T, 1>({n}, rng), y = random_rounded<T, 1>({n}, rng);
    DeviceVector<T, T> dx(ops, values<T>(x)), dy(ops, values<T>(y));
    DeviceVector<double, T> norm(ops, 1), partial(ops, ops.sum_of_squares_scratch());
    ops.sum_of_squares(norm.get(), partial.get(), dx.get(), n);
    ops.divide_by_norm(dx.get(), norm.get(), n, T(1e-7));
    double sum = 0;
    for (double v : x) sum += v * v;
    const std::vector<T> xs = dx.host();
    double unit = 0;
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(static_cast<double>(xs[i]) ==
            doctest::Approx(x(i) / (std::sqrt(sum) + 1e-7)).epsilon(tol).scale(1));
      unit += static_cast<double>(xs[i]) * static_cast<double>(xs[i]);
    }
    const double shrunk = std::sqrt(sum) / (std::sqrt(sum) + 1e-7);  // the eps's share
    CHECK(unit == doctest::Approx(shrunk * shrunk).epsilon(100 * tol));
    ops.axpby(dy.get(), dx.get(), n, T(0.9), T(-0.25));
    const std::vector<T> ys = dy.host();
    for (std::size_t i = 0; i < n; i += 13) {
      CHECK(static_cast<double>(ys[i]) ==
            doctest::Approx(0.9 * y(i) - 0.25 * static_cast<double>(xs[i])).epsilon(tol).scale(1));
    }
  }
}

template <class T>
void check_all(DeviceOps<T>& ops, double tol, bool fused_limited = true) {
  CAPTURE(ops.name());
  check_memory(ops);
  check_elementwise(ops, tol);
  check_heads(ops, tol);
  check_attention(ops, tol, fused_limited);
  check_optimizers(ops, tol);
  check_muon_ops(ops, tol);
  ops.synchronize();
}

constexpr double kDoubleTol = 1e-12;
constexpr double kFloatTol = 1e-5;

}  // namespace

TEST_CASE_TEMPLATE("device ops: every operation matches the CPU op, in double", Backend,
                   test::EmulatedBackend, test::CpuBackend) {
  const auto device = Backend::template make<double>();
  check_all(*device, kDoubleTol, Backend::kFusedLimited);
  test::check_no_live_allocations<Backend>(*device);
}

TEST_CASE_TEMPLATE("device ops: every operation matches the CPU op, in float", Backend,
                   test::EmulatedBackend, test::CpuBackend) {
  const auto device = Backend::template make<float>();
  check_all(*device, kFloatTol, Backend::kFusedLimited);
  test::check_no_live_allocations<Backend>(*device);
}

TEST_CASE("device ops: the backends name themselves") {
  CHECK(emulated::make_device_ops<float>()->name() == "emulated (CPU)");
  CHECK(make_cpu_device_ops<float>()->name() == "cpu");
}

TEST_CASE("device ops (emulated): allocations are NaN-filled and counted until released") {
  const auto device = emulated::make_device_ops<double>();
  auto& ops = *device;
  void* p = ops.allocate(3 * sizeof(double));
  CHECK(emulated::live_allocations(ops) == 1);
  double host[3];
  ops.download(host, p, sizeof(host));
  for (double x : host) CHECK(std::isnan(x));
  ops.release(p);
  CHECK(emulated::live_allocations(ops) == 0);
}

// A GPU faults on a host address (cudaErrorIllegalAddress); the emulated device, whose "device"
// memory is host memory, refuses one in every kernel (the pointers of AttentionParams included),
// GEMM and copy instead of reading it.
TEST_CASE(
    "device ops (emulated): a host pointer given to a kernel, a GEMM or a copy throws, unless "
    "allowed") {
  const auto device = emulated::make_device_ops<double>();
  auto& ops = *device;
  DeviceVector<double, double> a(ops, std::vector<double>{1, 2, 3}), b(ops, 3);
  std::vector<double> host{4, 5, 6};
  const auto host_error = "expected device memory";
  CHECK_THROWS_WITH_AS(ops.add(b.get(), a.get(), host.data(), 3), doctest::Contains(host_error),
                       std::logic_error);
  CHECK_THROWS_WITH_AS(ops.scale(host.data(), 2.0, 3), doctest::Contains(host_error),
                       std::logic_error);
  CHECK_THROWS_AS(ops.copy(b.get(), host.data(), 3 * sizeof(double)), std::logic_error);
  CHECK_THROWS_AS(ops.upload(host.data(), a.get(), 3 * sizeof(double)), std::logic_error);
  // A copy that runs past the end of its block is refused too.
  CHECK_THROWS_AS(ops.copy(b.get(), a.get(), 4 * sizeof(double)), std::logic_error);
  CHECK_THROWS_AS(ops.gemm(false, false, 1, 1, 3, 1.0, host.data(), 3, a.get(), 1, 0.0, b.get(), 1),
                  std::logic_error);
  // The pointers inside an attention call's parameter struct are checked too, each named.
  {
    AttentionSpec spec;
    spec.B = spec.H = spec.Hkv = 1;
    spec.Tq = spec.Tk = spec.D = spec.Dv = 1;
    DeviceVector<double, double> q(ops, std::vector<double>{1}), scale(ops, std::vector<double>{1});
    DeviceVector<double, double> out(ops, 1), lse(ops, 1);
    const std::vector<unsigned char> host_mask{1};
    auto args =
        attention_params<double>(spec, q.get(), q.get(), q.get(), scale.get(), nullptr, nullptr);
    // The fused path hands the struct to its kernel as it is.
    ops.sdpa_fused_forward(out.get(), lse.get(), args);  // all on the device: runs
    CHECK(out.host() == std::vector<double>{1});
    args.key_mask = host_mask.data();
    CHECK_THROWS_WITH_AS(ops.sdpa_fused_forward(out.get(), lse.get(), args),
                         doctest::Contains("AttentionParams::key_mask"), std::logic_error);
    args.key_mask = nullptr;
    args.v = host.data();
    CHECK_THROWS_WITH_AS(ops.sdpa_fused_forward(out.get(), lse.get(), args),
                         doctest::Contains("AttentionParams::v"), std::logic_error);
  }
  // Device pointers, an offset inside a block and null are accepted; the host is untouched.
  ops.add(b.get(), a.get(), a.get(), 3);
  ops.copy(b.get() + 1, a.get(), 2 * sizeof(double));
  CHECK(b.host() == std::vector<double>{2, 1, 2});
  CHECK(host == std::vector<double>{4, 5, 6});
  // Pointers::host_allowed (for tests that run kernels on host tensors) lifts the rule.
  const auto lax = emulated::make_device_ops<double>(emulated::Pointers::host_allowed);
  lax->scale(host.data(), 2.0, 3);
  CHECK(host == std::vector<double>{8, 10, 12});
}

TEST_CASE("device ops (cuda): every operation matches the CPU op") {
  if (!test::cuda_device_or_skip()) return;
  const auto ops_double = make_cuda_device_ops<double>();
  const auto ops_float = make_cuda_device_ops<float>();
  CHECK(ops_double->name().rfind("cuda: ", 0) == 0);
  check_all(*ops_double, kDoubleTol);
  check_all(*ops_float, kFloatTol);
}

TEST_CASE("device ops (cuda): make_cuda_device_ops without a device throws CudaError saying why") {
  if (cuda_available()) {
    CHECK(make_cuda_device_ops<float>() != nullptr);
    return;
  }
  std::string message;
  try {
    (void)make_cuda_device_ops<float>();
  } catch (const CudaError& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("make_cuda_device_ops") != std::string::npos);
  if (cuda_built()) {
    CHECK(message.find("no CUDA device") != std::string::npos);
  } else {
    CHECK(message.find("built without CUDA") != std::string::npos);
  }
  CHECK_THROWS_AS((void)make_cuda_device_ops<double>(), CudaError);
}
