// sdpa and softmax against golden values from PyTorch (tests/golden/make_goldens.py): an
// independent implementation, F.scaled_dot_product_attention and autograd, in float64.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>

#include "attnlab/ops/attention.hpp"
#include "attnlab/ops/softmax.hpp"
#include "helpers.hpp"
#include "sdpa_paths.hpp"

using namespace attnlab;
using attnlab::test::FusedPath;
using attnlab::test::golden_file;
using attnlab::test::golden_tensor;
using attnlab::test::ReferencePath;
using attnlab::test::rel_error;
using attnlab::test::weights_of;

namespace {
constexpr double kGoldenTol = 1e-12;  // float64 on both sides; only summation order differs
}

TEST_CASE_TEMPLATE("golden: sdpa forward and backward match PyTorch", TestType, ReferencePath,
                   FusedPath) {
  const auto& file = golden_file("sdpa.json");
  REQUIRE(file.at("cases").size() >= 10);
  for (const auto& c : file.at("cases")) {
    const std::string name = c.at("name");
    CAPTURE(name);
    const auto& config = c.at("config");
    SdpaOptions options = attnlab::test::with_path({}, TestType::value);
    options.scaling = parse_scaling(config.at("scaling").get<std::string>());
    if (!config.at("scale").is_null()) options.scale = config.at("scale").get<double>();
    options.causal = config.at("causal").get<bool>();
    const Tensor4<double> q = golden_tensor(c, "q"), k = golden_tensor(c, "k"),
                          v = golden_tensor(c, "v"), r = golden_tensor(c, "r");
    KeyMask mask;
    const bool has_mask = config.at("has_mask").get<bool>();
    if (has_mask) mask = xt::cast<bool>(golden_tensor(c, "mask"));
    SdpaCache<double> cache;
    const auto out = sdpa_forward(cache, q, k, v, options, has_mask ? &mask : nullptr);
    CHECK(resolve_scale(options, q.shape()[3]) ==
          doctest::Approx(config.at("effective_scale").get<double>()).epsilon(1e-15));
    CHECK(rel_error(out, golden_tensor(c, "out")) < kGoldenTol);
    CHECK(cache.has_weights() == (TestType::value == SdpaPath::reference));
    const auto p = weights_of(cache, q, k, options, has_mask ? &mask : nullptr);
    CHECK(rel_error(p, golden_tensor(c, "p")) < kGoldenTol);
    const auto g = sdpa_backward(r, cache, q, k, v);
    CHECK(rel_error(g.dq, golden_tensor(c, "dq")) < kGoldenTol);
    CHECK(rel_error(g.dk, golden_tensor(c, "dk")) < kGoldenTol);
    CHECK(rel_error(g.dv, golden_tensor(c, "dv")) < kGoldenTol);
  }
}

TEST_CASE("golden: softmax forward and backward match PyTorch, including logits of 1e4") {
  const auto& file = golden_file("softmax.json");
  REQUIRE(file.at("cases").size() >= 2);
  for (const auto& c : file.at("cases")) {
    const std::string name = c.at("name");
    CAPTURE(name);
    const Tensor2<double> logits = golden_tensor(c, "logits");
    const Tensor2<double> dp = golden_tensor(c, "dp");
    const auto p = softmax_forward(logits);
    CHECK(rel_error(p, golden_tensor(c, "p")) < kGoldenTol);
    const auto ds = softmax_backward(dp, p);
    const auto expected = golden_tensor(c, "ds");
    // A one-hot row has ds = 0 exactly on both sides; compare absolutely where the norm is zero.
    CHECK(rel_error(ds, expected) < 1e-10);
  }
}
