// The four attention paths as one function, for the tests of a variant on every path: the CPU
// reference and fused paths (the tests' tiny tiles unless the options set others), and the CUDA
// reference and fused kernels run on the CPU by the emulated backend
// (attnlab/backends/emulated.hpp), on the AttentionParams that the CPU op resolves the options
// into. Every output the kernels must write starts as NaN.
#pragma once

#include <array>
#include <limits>
#include <string>

#include <xtensor/xbuilder.hpp>

#include "attnlab/backends/emulated.hpp"
#include "attnlab/ops/attention.hpp"
#include "sdpa_paths.hpp"

namespace attnlab::test {

enum class Path { cpu_reference, cpu_fused, emulated_reference, emulated_fused };
inline constexpr Path kPaths[] = {Path::cpu_reference, Path::cpu_fused, Path::emulated_reference,
                                  Path::emulated_fused};

inline std::string name_of(Path path) {
  switch (path) {
    case Path::cpu_reference:
      return "CPU reference";
    case Path::cpu_fused:
      return "CPU fused";
    case Path::emulated_reference:
      return "emulated CUDA reference";
    case Path::emulated_fused:
      return "emulated CUDA fused";
  }
  return "?";
}

struct Result {
  Tensor4<double> out, dq, dk, dv;
  Tensor4<double> dbias;  // with a bias that requires a gradient
};

template <std::size_t N>
xt::xtensor<double, N> nan_filled(const std::array<std::size_t, N>& shape) {
  xt::xtensor<double, N> x(shape);
  x.fill(std::numeric_limits<double>::quiet_NaN());
  return x;
}

// One forward (and, when dout is given, backward) on `path`. The CPU paths use the fused path's
// test tiles (2 x 3, tests/support/sdpa_paths.hpp) unless options set others; the emulated paths
// run the CUDA kernels on the AttentionParams that the CPU op's cache resolves the options into,
// and sum their dS (AttentionParams::dscores) to the bias's shape as the CPU op does.
inline Result run(Path path, const Tensor4<double>& q, const Tensor4<double>& k,
                  const Tensor4<double>& v, const Tensor4<double>* dout, SdpaOptions options,
                  const KeyMask* mask, const Tensor4<double>* bias = nullptr) {
  Result r;
  SdpaCache<double> cache;
  if (path == Path::cpu_reference || path == Path::cpu_fused) {
    const bool fused = path == Path::cpu_fused;
    const std::size_t rows = options.tile_rows, keys = options.tile_keys;
    options = test::with_path(options, fused ? SdpaPath::fused : SdpaPath::reference);
    if (rows != 0) options.tile_rows = rows, options.tile_keys = keys;
    r.out = sdpa_forward(cache, q, k, v, options, mask, bias);
    if (dout) {
      auto g = sdpa_backward(*dout, cache, q, k, v);
      r.dq = std::move(g.dq), r.dk = std::move(g.dk), r.dv = std::move(g.dv);
      r.dbias = std::move(g.dbias);
    }
    return r;
  }
  options.path = SdpaPath::reference;
  sdpa_forward(cache, q, k, v, options, mask, bias);  // resolves and checks the options
  AttentionParams<double> p = cache.params(q.data(), k.data(), v.data());
  Tensor4<double> dscores;  // zeroed: the fused kernels skip hidden tiles
  if (dout && cache.bias_grad) {
    dscores = xt::zeros<double>({p.B, p.H, p.Tq, p.Tk});
    p.dscores = dscores.data();
  }
  // The kernels run on the host tensors of this function: no device copies to check pointers into.
  const auto device = emulated::make_device_ops<double>(emulated::Pointers::host_allowed);
  auto& ops = *device;
  const std::size_t B = p.B, H = p.H, Tq = p.Tq, Tk = p.Tk;
  r.out = nan_filled<4>({B, H, Tq, p.Dv});  // every element must be written
  r.dq = nan_filled<4>({B, H, Tq, p.D});
  r.dk = nan_filled<4>({B, p.Hkv, Tk, p.D});
  r.dv = nan_filled<4>({B, p.Hkv, Tk, p.Dv});
  if (path == Path::emulated_reference) {
    auto probs = nan_filled<4>({B, H, Tq, Tk});
    auto ds = nan_filled<4>({B, H, Tq, Tk});
    ops.sdpa_reference_forward(r.out.data(), probs.data(), p);
    if (dout) {
      ops.sdpa_reference_backward(r.dq.data(), r.dk.data(), r.dv.data(), ds.data(), dout->data(),
                                  probs.data(), p);
    }
  } else {
    auto lse = nan_filled<3>({B, H, Tq});
    auto row_dot = nan_filled<3>({B, H, Tq});
    ops.sdpa_fused_forward(r.out.data(), lse.data(), p);
    if (dout) {
      ops.sdpa_fused_backward(r.dq.data(), r.dk.data(), r.dv.data(), row_dot.data(), dout->data(),
                              r.out.data(), lse.data(), p);
    }
  }
  if (dscores.size() != 0) {
    const auto& b = cache.bias.shape();
    r.dbias = sum_to_bias_shape(dscores, {b[0], b[1], b[2], b[3]});
  }
  return r;
}

}  // namespace attnlab::test
