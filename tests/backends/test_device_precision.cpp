// A float backend's precision (DeviceOps::set_precision, lib/backends/cuda/mixed_precision.hpp) on
// the emulated device, which runs the CUDA backend's launch glue: bf16 and tf32 GEMMs are the
// products of rounded operands summed in fp32 (against a double sum of the rounded operands written
// here); bf16 fused attention runs the tensor-core kernels for head dims 64 and 128 (bf16-sized
// errors, not fp32's) and the fp32 kernels for the others; path auto picks the fused path where
// the backend prefers it; the CPU backend and double backends refuse by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "attnlab/attention/params.hpp"
#include "attnlab/backends/cpu.hpp"
#include "attnlab/backends/emulated.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

// Rounding to nearest, ties to even, at `drop` low mantissa bits (16: bfloat16, 13: TF32).
float round_mantissa(float x, int drop) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  const std::uint32_t half = (1u << (drop - 1)) - 1, mask = (1u << drop) - 1;
  bits += half + ((bits >> drop) & 1u);
  bits &= ~mask;
  float out = 0;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

float rounded(float x, GemmPrecision p) {
  switch (p) {
    case GemmPrecision::bf16:
      return round_mantissa(x, 16);
    case GemmPrecision::tf32:
      return round_mantissa(x, 13);
    case GemmPrecision::fp32:
      break;
  }
  return x;
}

std::vector<float> normal_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// n floats of device memory holding `host`, released with the object.
struct DeviceArray {
  DeviceOps<float>& ops;
  float* data;
  std::size_t n;
  DeviceArray(DeviceOps<float>& o, const std::vector<float>& host)
      : ops(o), data(static_cast<float*>(o.allocate(host.size() * sizeof(float)))), n(host.size()) {
    ops.upload(data, host.data(), n * sizeof(float));
  }
  DeviceArray(DeviceOps<float>& o, std::size_t count) : DeviceArray(o, std::vector<float>(count)) {}
  ~DeviceArray() { ops.release(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<float> host() const {
    std::vector<float> out(n);
    ops.download(out.data(), data, n * sizeof(float));
    return out;
  }
};

double largest_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

double largest_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

double largest_diff(const std::vector<float>& a, const std::vector<float>& b) {
  return largest_diff(a, std::vector<double>(b.begin(), b.end()));
}

}  // namespace

TEST_CASE("device precision (emulated): bf16 and tf32 gemms round their operands, fp32 sums") {
  const auto ops = emulated::make_device_ops<float>();
  const std::size_t rows = 24, in = 40, out = 16;
  const auto x = normal_values(rows * in, 1), w = normal_values(in * out, 2);
  const auto dy = normal_values(rows * out, 3);
  DeviceArray xd(*ops, x), wd(*ops, w), dyd(*ops, dy), y(*ops, rows * out), dx(*ops, rows * in),
      dw(*ops, in * out);
  std::vector<float> y_fp32;
  for (GemmPrecision p : {GemmPrecision::fp32, GemmPrecision::bf16, GemmPrecision::tf32}) {
    CAPTURE(enum_name(p));
    const PrecisionScope<float> scope(*ops, p);
    CHECK(ops->precision() == p);
    ops->linear_forward(y.data, xd.data, wd.data, nullptr, rows, in, out, false);
    ops->linear_backward(dx.data, dw.data, nullptr, dyd.data, xd.data, wd.data, rows, in, out,
                         false, false);
    // y = x W, dx = dy Wᵀ, dW = xᵀ dy over the rounded operands, summed in double.
    std::vector<double> y_ref(rows * out, 0), dx_ref(rows * in, 0), dw_ref(in * out, 0);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t i = 0; i < in; ++i) {
        for (std::size_t o = 0; o < out; ++o) {
          const double xv = rounded(x[r * in + i], p), wv = rounded(w[i * out + o], p);
          const double dyv = rounded(dy[r * out + o], p);
          y_ref[r * out + o] += xv * wv;
          dx_ref[r * in + i] += dyv * wv;
          dw_ref[i * out + o] += xv * dyv;
        }
      }
    }
    const auto yh = y.host();
    // fp32 sums of 40 exact products: a few ulps of the largest partial sum.
    CHECK(largest_diff(yh, y_ref) <= 1e-5 * largest_abs(yh));
    CHECK(largest_diff(dx.host(), dx_ref) <= 1e-5 * largest_abs(yh));
    CHECK(largest_diff(dw.host(), dw_ref) <= 1e-5 * largest_abs(yh));
    if (p == GemmPrecision::fp32) {
      y_fp32 = yh;
    } else {  // the rounding is visible: bf16's 2^-9, TF32's 2^-12 per operand
      CHECK(largest_diff(yh, y_fp32) > (p == GemmPrecision::bf16 ? 1e-3 : 1e-4));
    }
  }
  CHECK(ops->precision() == GemmPrecision::fp32);  // the scopes put it back
}

TEST_CASE("device precision: the CPU backend and double backends take fp32 only, by name") {
  const auto cpu = make_cpu_device_ops<float>();
  CHECK_NOTHROW(cpu->set_precision(GemmPrecision::fp32));
  CHECK_THROWS_WITH_AS(cpu->set_precision(GemmPrecision::bf16),
                       "set_precision: expected fp32 on cpu, got 'bf16'", std::invalid_argument);
  const auto exact = emulated::make_device_ops<double>();
  CHECK_THROWS_WITH_AS(exact->set_precision(GemmPrecision::tf32),
                       "set_precision: expected fp32 on emulated (CPU), got 'tf32'",
                       std::invalid_argument);
  CHECK(exact->precision() == GemmPrecision::fp32);
  const auto ops = emulated::make_device_ops<float>();
  CHECK_FALSE(ops->fused_preferred(64, 64));  // fp32: the reference path below its threshold
  ops->set_precision(GemmPrecision::bf16);
  CHECK(ops->fused_preferred(64, 64));
  CHECK(ops->fused_preferred(128, 128));
  CHECK_FALSE(ops->fused_preferred(32, 32));  // no tensor-core kernel for these head dims
  CHECK_FALSE(ops->fused_preferred(64, 128));
}

// Fused attention in bf16 against the CPU backend's fp32 fused attention on the same inputs: for
// head dims 64 and 128 the tensor-core kernels' errors (bf16 operands, about 2^-9 relative), far
// above the fp32 kernels' and within bf16's bound; for head dim 32 the fp32 kernels, bit for bit.
TEST_CASE("device precision (emulated): bf16 fused attention runs the tensor-core kernels") {
  const auto cpu = make_cpu_device_ops<float>();
  const auto ops = emulated::make_device_ops<float>();
  for (std::size_t D : {32, 64, 128}) {
    CAPTURE(D);
    const std::size_t B = 2, H = 2, T = 70;
    const std::size_t n = B * H * T * D;
    const auto q = normal_values(n, 4), k = normal_values(n, 5), v = normal_values(n, 6);
    const auto dout = normal_values(n, 7);
    const std::vector<float> scale(H, static_cast<float>(1.0 / std::sqrt(double(D))));
    std::vector<std::vector<float>> results[2];  // [fp32, bf16] x {O, dQ, dK, dV}
    std::vector<float> reference[4];             // the CPU's
    for (int backend = 0; backend < 3; ++backend) {
      DeviceOps<float>& dev = backend == 0 ? *cpu : *ops;
      const PrecisionScope<float> scope(dev,
                                        backend == 2 ? GemmPrecision::bf16 : GemmPrecision::fp32);
      DeviceArray qd(dev, q), kd(dev, k), vd(dev, v), dod(dev, dout), sd(dev, scale), o(dev, n),
          lse(dev, B * H * T), dq(dev, n), dk(dev, n), dv(dev, n), row_dot(dev, B * H * T);
      AttentionParams<float> a;
      a.B = B, a.H = H, a.Hkv = H, a.Tq = T, a.Tk = T, a.D = D, a.Dv = D;
      a.causal = true;
      a.q = qd.data, a.k = kd.data, a.v = vd.data, a.scale = sd.data;
      dev.sdpa_fused_forward(o.data, lse.data, a);
      dev.sdpa_fused_backward(dq.data, dk.data, dv.data, row_dot.data, dod.data, o.data, lse.data,
                              a);
      const std::vector<float> got[4] = {o.host(), dq.host(), dk.host(), dv.host()};
      for (int t = 0; t < 4; ++t) {
        if (backend == 0) {
          reference[t] = got[t];
        } else {
          results[backend - 1].push_back(got[t]);
        }
      }
    }
    for (int t = 0; t < 4; ++t) {
      CAPTURE(t);  // O, dQ, dK, dV
      const double size = largest_abs(reference[t]);
      const double fp32_error = largest_diff(results[0][t], reference[t]);
      const double bf16_error = largest_diff(results[1][t], reference[t]);
      CHECK(fp32_error <= 1e-5 * size);
      if (D == 32) {
        CHECK(results[1][t] == results[0][t]);  // no tensor-core kernel: the fp32 one
      } else {
        CHECK(bf16_error > 1e-4 * size);   // bf16 operands
        CHECK(bf16_error <= 3e-2 * size);  // and bf16-sized errors only
      }
    }
  }
}

// Path auto at 40 keys (below the fused path's threshold) stays on the reference path in fp32; in
// bf16 it takes the fused path (the same bits as path fused), whose tensor cores win at any length.
TEST_CASE("device precision (emulated): path auto picks the tensor-core fused path in bf16") {
  const auto ops = emulated::make_device_ops<float>();
  Rng data(9);
  const auto x = randn<float, 3>({2, 40, 128}, data);
  const auto output = [&](SdpaPath path, GemmPrecision precision) {
    AttentionConfig c;
    c.d_model = 128;
    c.heads = 2;  // head dim 64
    c.sdpa.causal = true;
    c.sdpa.path = path;
    Rng init(3);
    MultiHeadAttention<float> m(c, init);
    m.to(*ops);
    const PrecisionScope<float> scope(*ops, precision);
    return Tensor3<float>(m.forward(x));
  };
  const auto fp32_auto = output(SdpaPath::automatic, GemmPrecision::fp32);
  CHECK(fp32_auto == output(SdpaPath::reference, GemmPrecision::fp32));
  CHECK(fp32_auto != output(SdpaPath::fused, GemmPrecision::fp32));
  const auto bf16_auto = output(SdpaPath::automatic, GemmPrecision::bf16);
  CHECK(bf16_auto == output(SdpaPath::fused, GemmPrecision::bf16));
  CHECK(bf16_auto != output(SdpaPath::reference, GemmPrecision::bf16));
  CHECK(test::rel_error(bf16_auto, fp32_auto) < 2e-2);
  CHECK(emulated::live_allocations(*ops) == 0);
}
