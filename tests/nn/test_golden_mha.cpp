// MultiHeadAttention and TransformerBlock against PyTorch (tests/golden/make_goldens.py, section
// 7: autograd in float64, with W stored (in, out); the plain case is also cross-checked there
// against torch.nn.MultiheadAttention). Outputs, attention weights, dx, dcontext and every
// parameter gradient.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>

#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/nn/transformer_block.hpp"
#include "helpers.hpp"

using namespace attnlab;
using attnlab::test::golden_file;
using attnlab::test::golden_tensor;
using attnlab::test::rel_error;

namespace {
constexpr double kGoldenTol = 1e-12;

// Loads each named parameter's value from the case, returns the list for the gradient checks.
ParameterList<double> load_parameters(Module<double>& m, const nlohmann::json& c) {
  auto params = m.parameters();
  for (auto& p : params) {
    CAPTURE(p.name);
    REQUIRE(c.at("tensors").contains(p.name));
    const auto value = golden_tensor(c, p.name);
    REQUIRE(value.shape() == p.param->value.shape());
    p.param->value = value;
  }
  return params;
}

void check_parameter_grads(const ParameterList<double>& params, const nlohmann::json& c) {
  for (const auto& p : params) {
    CAPTURE(p.name);
    const auto expected = golden_tensor(c, "d" + p.name);
    if (p.name == "k_norm.beta") {
      // Exactly 0 in exact arithmetic (a shift shared by all keys cancels in the softmax): both
      // sides hold rounding noise only, so compare absolutely.
      CHECK(xt::amax(xt::abs(p.param->grad))() < 1e-12);
      CHECK(xt::amax(xt::abs(expected))() < 1e-12);
      continue;
    }
    CHECK(rel_error(p.param->grad, expected) < kGoldenTol);
  }
}
}  // namespace

TEST_CASE(
    "golden: MultiHeadAttention (self, cross, masks, QK-norm, learnable scale) matches PyTorch") {
  std::size_t checked = 0;
  for (const auto& c : golden_file("mha.json").at("cases")) {
    const auto& cfg = c.at("config");
    if (!cfg.contains("d_context")) continue;  // the block case
    const std::string name = c.at("name");
    CAPTURE(name);
    AttentionConfig config;
    config.d_model = cfg.at("d_model");
    config.d_context = cfg.at("d_context");
    config.heads = cfg.at("heads");
    config.d_k = cfg.at("d_k");
    config.d_v = cfg.at("d_v");
    config.sdpa.scaling = parse_scaling(cfg.at("scaling").get<std::string>());
    if (!cfg.at("scale").is_null()) config.sdpa.scale = cfg.at("scale").get<double>();
    config.sdpa.causal = cfg.at("causal");
    config.qk_norm = cfg.at("qk_norm");
    config.learnable_scale = cfg.at("learnable_scale");
    Rng rng(0);
    MultiHeadAttention<double> m(config, rng);
    const auto params = load_parameters(m, c);
    const Tensor3<double> x = golden_tensor(c, "x"), r = golden_tensor(c, "r");
    KeyMask mask;
    const bool has_mask = cfg.at("has_mask");
    if (has_mask) mask = xt::cast<bool>(golden_tensor(c, "mask"));
    const KeyMask* mask_ptr = has_mask ? &mask : nullptr;
    m.zero_grad();
    if (cfg.at("cross").get<bool>()) {
      const Tensor3<double> context = golden_tensor(c, "context");
      CHECK(rel_error(m.forward_cross(x, context, mask_ptr), golden_tensor(c, "y")) < kGoldenTol);
      CHECK(rel_error(m.attention_weights(), golden_tensor(c, "p")) < kGoldenTol);
      const auto g = m.backward_cross(r);
      CHECK(rel_error(g.dx, golden_tensor(c, "dx")) < kGoldenTol);
      CHECK(rel_error(g.dcontext, golden_tensor(c, "dcontext")) < kGoldenTol);
    } else {
      CHECK(rel_error(m.forward(x, mask_ptr), golden_tensor(c, "y")) < kGoldenTol);
      CHECK(rel_error(m.attention_weights(), golden_tensor(c, "p")) < kGoldenTol);
      CHECK(rel_error(m.backward(r), golden_tensor(c, "dx")) < kGoldenTol);
    }
    check_parameter_grads(params, c);
    ++checked;
  }
  CHECK(checked == 6);
}

TEST_CASE("golden: a pre-LN TransformerBlock (causal, layernorm, GELU MLP) matches PyTorch") {
  const nlohmann::json* found = nullptr;
  for (const auto& c : golden_file("mha.json").at("cases")) {
    if (c.at("name") == "block_pre_ln_causal") found = &c;
  }
  REQUIRE(found);
  const auto& c = *found;
  const auto& cfg = c.at("config");
  BlockConfig config;
  config.attention.d_model = cfg.at("d_model");
  config.attention.heads = cfg.at("heads");
  config.attention.d_k = cfg.at("d_k");
  config.attention.d_v = cfg.at("d_v");
  config.attention.sdpa.causal = cfg.at("causal");
  config.d_ff = cfg.at("d_ff");
  config.norm = parse_norm(cfg.at("norm").get<std::string>());
  Rng rng(0);
  TransformerBlock<double> block(config, rng);
  const auto params = load_parameters(block, c);
  const Tensor3<double> x = golden_tensor(c, "x"), r = golden_tensor(c, "r");
  block.zero_grad();
  CHECK(rel_error(block.forward(x), golden_tensor(c, "y")) < kGoldenTol);
  CHECK(rel_error(block.backward(r), golden_tensor(c, "dx")) < kGoldenTol);
  check_parameter_grads(params, c);
}
