// The checks every attention variant runs on the four paths (tests/support/attention_paths.hpp):
// the double central-difference gradient check of dq, dk, dv (and dbias with a bias), and one
// PyTorch golden case (tests/golden/make_goldens.py) compared on every path.
#pragma once

#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xtensor.hpp>

#include "attention_paths.hpp"
#include "attnlab/gradcheck.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

namespace attnlab::test {

// Random q (B,H,Tq,D), k (B,Hkv,Tk,D), v (B,Hkv,Tk,Dv), drawn from rng in that order, and a key
// mask (B,Tk) that hides keys first, first + every, ... of the last batch.
struct Inputs {
  Tensor4<double> q, k, v;
  KeyMask mask;
};

inline Inputs random_inputs(Rng& rng, std::size_t B, std::size_t H, std::size_t Hkv, std::size_t Tq,
                            std::size_t Tk, std::size_t D, std::size_t Dv, std::size_t first = 2,
                            std::size_t every = 5) {
  Inputs in{randn<double, 4>({B, H, Tq, D}, rng), randn<double, 4>({B, Hkv, Tk, D}, rng),
            randn<double, 4>({B, Hkv, Tk, Dv}, rng), xt::ones<bool>({B, Tk})};
  for (std::size_t j = first; j < Tk; j += every) in.mask(B - 1, j) = false;
  return in;
}

// dq, dk, dv (and dbias when bias is given) of loss = Σ out ⊙ r on `path` against central
// differences, to the suite's tolerance; each analytic gradient must be non-trivial.
inline void check_path_gradients(Path path, Tensor4<double>& q, Tensor4<double>& k,
                                 Tensor4<double>& v, const Tensor4<double>& r,
                                 const SdpaOptions& options, const KeyMask* mask,
                                 Tensor4<double>* bias = nullptr, double tolerance = 1e-7) {
  CAPTURE(name_of(path));
  const auto shape = [](const Tensor4<double>& t) {
    return std::vector<std::size_t>(t.shape().begin(), t.shape().end());
  };
  const auto loss = [&] {
    const Tensor4<double> out = run(path, q, k, v, nullptr, options, mask, bias).out;
    double l = 0;
    for (std::size_t i = 0; i < out.size(); ++i) l += out.data()[i] * r.data()[i];
    return l;
  };
  const Result g = run(path, q, k, v, &r, options, mask, bias);
  std::vector<GradcheckTensor> inputs = {{"dq", q.data(), g.dq.data(), shape(q)},
                                         {"dk", k.data(), g.dk.data(), shape(k)},
                                         {"dv", v.data(), g.dv.data(), shape(v)}};
  if (bias) {
    REQUIRE(g.dbias.shape() == bias->shape());
    inputs.push_back({"dbias", bias->data(), g.dbias.data(), shape(*bias)});
  }
  const auto report = check_gradients(inputs, loss);
  INFO(report.table());
  CHECK(report.max_rel_error() <= tolerance);
  for (const auto& res : report.results) CHECK(res.analytic_norm > 1e-3);
}

// One golden case: q, k, v and the upstream gradient r, the key mask when config.has_mask, the
// bias when the case stores one; every path's out, dq, dk, dv (and dbias) against PyTorch's.
inline void check_golden_case(const nlohmann::json& c, const SdpaOptions& options,
                              double tolerance = 1e-12) {
  const std::string name = c.at("name");
  CAPTURE(name);
  const Tensor4<double> q = golden_tensor(c, "q"), k = golden_tensor(c, "k"),
                        v = golden_tensor(c, "v"), r = golden_tensor(c, "r");
  KeyMask mask;
  const bool has_mask = c.at("config").at("has_mask").get<bool>();
  if (has_mask) mask = xt::cast<bool>(golden_tensor(c, "mask"));
  const bool has_bias = c.at("tensors").contains("bias");
  Tensor4<double> bias;
  if (has_bias) bias = golden_tensor(c, "bias");
  for (Path path : kPaths) {
    CAPTURE(name_of(path));
    const Result g =
        run(path, q, k, v, &r, options, has_mask ? &mask : nullptr, has_bias ? &bias : nullptr);
    // An all-zero golden (a window of 1 makes dq and dk exactly zero) is compared absolutely.
    const auto close = [&](const Tensor4<double>& got, const char* key) {
      const xt::xarray<double> want = golden_tensor(c, key);
      if (xt::amax(xt::abs(want))() == 0.0) return xt::amax(xt::abs(got))() < tolerance;
      return rel_error(got, want) < tolerance;
    };
    CHECK(close(g.out, "out"));
    CHECK(close(g.dq, "dq"));
    CHECK(close(g.dk, "dk"));
    CHECK(close(g.dv, "dv"));
    if (has_bias) CHECK(close(g.dbias, "dbias"));
  }
}

}  // namespace attnlab::test
