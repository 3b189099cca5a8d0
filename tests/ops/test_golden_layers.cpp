// linear, layernorm, rmsnorm, gelu, relu, embedding and cross-entropy against golden values from
// PyTorch (tests/golden/make_goldens.py: F.linear, F.layer_norm, F.gelu, F.embedding,
// F.cross_entropy and autograd, in float64).
#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>

#include "attnlab/nn/feed_forward.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/ops/embedding.hpp"
#include "attnlab/ops/gelu.hpp"
#include "attnlab/ops/layernorm.hpp"
#include "attnlab/ops/linear.hpp"
#include "attnlab/ops/relu.hpp"
#include "attnlab/ops/rmsnorm.hpp"
#include "attnlab/ops/softcap.hpp"
#include "attnlab/ops/swiglu.hpp"
#include "helpers.hpp"

using namespace attnlab;
using attnlab::test::golden_file;
using attnlab::test::golden_tensor;
using attnlab::test::rel_error;

namespace {
constexpr double kGoldenTol = 1e-12;  // float64 on both sides; only summation order differs

const nlohmann::json& layer_case(std::string_view name) {
  for (const auto& c : golden_file("layers.json").at("cases")) {
    if (c.at("name").get<std::string>() == name) return c;
  }
  throw std::runtime_error("layers.json has no case " + std::string(name));
}
}  // namespace

TEST_CASE("golden: linear y = x W + b with W stored (in, out) matches PyTorch") {
  const auto& c = layer_case("linear");
  REQUIRE(c.at("config").at("weight_layout") == "in_out");
  const Tensor3<double> x = golden_tensor(c, "x"), r = golden_tensor(c, "r");
  const Tensor2<double> w = golden_tensor(c, "w");
  const Tensor1<double> b = golden_tensor(c, "b");
  LinearCache<double, 3> cache;
  const auto y = linear_forward<double, 3>(cache, x, w, &b);
  CHECK(rel_error(y, golden_tensor(c, "y")) < kGoldenTol);
  const auto g = linear_backward<double, 3>(r, cache, w, true);
  CHECK(rel_error(g.dx, golden_tensor(c, "dx")) < kGoldenTol);
  CHECK(rel_error(g.dw, golden_tensor(c, "dw")) < kGoldenTol);
  CHECK(rel_error(g.db, golden_tensor(c, "db")) < kGoldenTol);
}

TEST_CASE("golden: layernorm and rmsnorm match PyTorch (eps 1e-5)") {
  {
    const auto& c = layer_case("layernorm");
    CHECK(c.at("config").at("eps").get<double>() == kLayerNormEps);
    const Tensor3<double> x = golden_tensor(c, "x"), r = golden_tensor(c, "r");
    const Tensor1<double> gamma = golden_tensor(c, "gamma"), beta = golden_tensor(c, "beta");
    LayerNormCache<double, 3> cache;
    CHECK(rel_error(layernorm_forward<double, 3>(cache, x, gamma, beta), golden_tensor(c, "y")) <
          kGoldenTol);
    const auto g = layernorm_backward<double, 3>(r, cache, gamma);
    CHECK(rel_error(g.dx, golden_tensor(c, "dx")) < kGoldenTol);
    CHECK(rel_error(g.dgamma, golden_tensor(c, "dgamma")) < kGoldenTol);
    CHECK(rel_error(g.dbeta, golden_tensor(c, "dbeta")) < kGoldenTol);
  }
  {
    const auto& c = layer_case("rmsnorm");
    CHECK(c.at("config").at("eps").get<double>() == kRmsNormEps);
    const Tensor3<double> x = golden_tensor(c, "x"), r = golden_tensor(c, "r");
    const Tensor1<double> gamma = golden_tensor(c, "gamma");
    RmsNormCache<double, 3> cache;
    CHECK(rel_error(rmsnorm_forward<double, 3>(cache, x, gamma), golden_tensor(c, "y")) <
          kGoldenTol);
    const auto g = rmsnorm_backward<double, 3>(r, cache, gamma);
    CHECK(rel_error(g.dx, golden_tensor(c, "dx")) < kGoldenTol);
    CHECK(rel_error(g.dgamma, golden_tensor(c, "dgamma")) < kGoldenTol);
  }
}

TEST_CASE("golden: gelu (tanh and exact) and relu match PyTorch") {
  for (const auto& [name, approximation] : {std::pair{"gelu_tanh", GeluApproximation::tanh},
                                            std::pair{"gelu_none", GeluApproximation::exact}}) {
    CAPTURE(name);
    const auto& c = layer_case(name);
    const Tensor3<double> x = golden_tensor(c, "x"), r = golden_tensor(c, "r");
    GeluCache<double, 3> cache;
    CHECK(rel_error(gelu_forward<double, 3>(cache, x, approximation), golden_tensor(c, "y")) <
          kGoldenTol);
    CHECK(rel_error(gelu_backward<double, 3>(r, cache), golden_tensor(c, "dx")) < kGoldenTol);
  }
  const auto& c = layer_case("relu");
  const Tensor3<double> x = golden_tensor(c, "x"), r = golden_tensor(c, "r");
  ReluCache<double, 3> cache;
  CHECK(rel_error(relu_forward<double, 3>(cache, x), golden_tensor(c, "y")) == 0);
  CHECK(rel_error(relu_backward<double, 3>(r, cache), golden_tensor(c, "dx")) == 0);
}

TEST_CASE("golden: SwiGLU silu(a)·b and LLaMA's MLP match PyTorch, biases or not") {
  // tests/golden/make_goldens.py swiglu.json: F.silu(a) * b on h.chunk(2), and
  // w2(silu(w1 x) * w3 x) with attnlab's fused fc1.w = [W_gate | W_up].
  const auto& file = golden_file("swiglu.json");
  const auto& op = file.at("cases").at(0);
  REQUIRE(op.at("name") == "swiglu_op");
  const Tensor3<double> h = golden_tensor(op, "h"), r = golden_tensor(op, "r");
  SwigluCache<double, 3> cache;
  CHECK(rel_error(swiglu_forward<double, 3>(cache, h), golden_tensor(op, "y")) < kGoldenTol);
  CHECK(rel_error(swiglu_backward<double, 3>(r, cache), golden_tensor(op, "dh")) < kGoldenTol);
  for (std::size_t i = 1; i < 3; ++i) {
    const auto& c = file.at("cases").at(i);
    CAPTURE(c.at("name").get<std::string>());
    const std::size_t C = c.at("config").at("C"), F = c.at("config").at("F");
    const bool bias = c.at("config").at("bias");
    Rng rng(1);
    FeedForward<double> m(C, F, rng, MlpActivation::swiglu, GeluApproximation::tanh, bias);
    m.fc1.w.value = golden_tensor(c, "fc1_w");
    m.fc2.w.value = golden_tensor(c, "fc2_w");
    if (bias) {
      m.fc1.b.value = golden_tensor(c, "fc1_b");
      m.fc2.b.value = golden_tensor(c, "fc2_b");
    }
    const Tensor3<double> x = golden_tensor(c, "x");
    CHECK(rel_error(m.forward(x), golden_tensor(c, "y")) < kGoldenTol);
    m.zero_grad();
    CHECK(rel_error(m.backward(Tensor3<double>(golden_tensor(c, "r"))), golden_tensor(c, "dx")) <
          kGoldenTol);
    CHECK(rel_error(m.fc1.w.grad, golden_tensor(c, "dfc1_w")) < kGoldenTol);
    CHECK(rel_error(m.fc2.w.grad, golden_tensor(c, "dfc2_w")) < kGoldenTol);
    if (bias) {
      CHECK(rel_error(m.fc1.b.grad, golden_tensor(c, "dfc1_b")) < kGoldenTol);
      CHECK(rel_error(m.fc2.b.grad, golden_tensor(c, "dfc2_b")) < kGoldenTol);
    }
  }
}

TEST_CASE("golden: ReLU² max(x, 0)² and its backward match PyTorch's relu().square()") {
  const auto& c = layer_case("relu_squared");
  const Tensor3<double> x = golden_tensor(c, "x"), r = golden_tensor(c, "r");
  ReluCache<double, 3> cache;
  CHECK(rel_error(relu_squared_forward<double, 3>(cache, x), golden_tensor(c, "y")) < kGoldenTol);
  CHECK(rel_error(relu_squared_backward<double, 3>(r, cache), golden_tensor(c, "dx")) < kGoldenTol);
}

TEST_CASE("golden: softcap c·tanh(x/c) and its backward match PyTorch's autograd") {
  const auto& c = layer_case("softcap");
  const Tensor3<double> x = golden_tensor(c, "x"), r = golden_tensor(c, "r");
  SoftcapCache<double, 3> cache;
  CHECK(rel_error(softcap_forward<double, 3>(cache, x, c.at("config").at("cap").get<double>()),
                  golden_tensor(c, "y")) < kGoldenTol);
  CHECK(rel_error(softcap_backward<double, 3>(r, cache), golden_tensor(c, "dx")) < kGoldenTol);
}

TEST_CASE("golden: embedding gather and scatter-add with repeated ids match PyTorch") {
  const auto& c = layer_case("embedding");
  const Tensor2<double> table = golden_tensor(c, "table");
  const TokenIds ids = xt::cast<int>(golden_tensor(c, "ids"));
  const Tensor3<double> r = golden_tensor(c, "r");
  EmbeddingCache cache;
  CHECK(rel_error(embedding_forward<double>(cache, ids, table), golden_tensor(c, "y")) == 0);
  const auto dtable = embedding_backward<double>(r, cache);
  CHECK(rel_error(dtable, golden_tensor(c, "dtable")) < kGoldenTol);
  // ids 0 and 6 are unused: their rows get exactly zero gradient.
  for (std::size_t j = 0; j < 3; ++j) {
    CHECK(dtable(0, j) == 0);
    CHECK(dtable(6, j) == 0);
  }
}

TEST_CASE("golden: cross-entropy with ignore_index and logits of +-50 matches PyTorch") {
  const auto& file = golden_file("cross_entropy.json");
  REQUIRE(file.at("cases").size() >= 3);
  for (const auto& c : file.at("cases")) {
    const std::string name = c.at("name");
    CAPTURE(name);
    const Tensor3<double> logits = golden_tensor(c, "logits");
    const TokenIds targets = xt::cast<int>(golden_tensor(c, "targets"));
    CrossEntropyCache<double, 3> cache;
    const double loss = cross_entropy_forward<double, 3>(cache, logits, targets);
    CHECK(cache.labelled == c.at("config").at("num_labelled").get<std::size_t>());
    CHECK(loss == doctest::Approx(golden_tensor(c, "loss")()).epsilon(1e-13));
    CHECK(rel_error(cross_entropy_backward<double, 3>(cache), golden_tensor(c, "dlogits")) <
          kGoldenTol);
  }
}

TEST_CASE("golden: cross-entropy with PaLM's z-loss, also after a softcap, matches PyTorch") {
  // torch: F.cross_entropy + z · mean over labelled positions of logsumexp(logits)², by autograd.
  const auto& file = golden_file("z_loss.json");
  REQUIRE(file.at("cases").size() >= 3);
  for (const auto& c : file.at("cases")) {
    const std::string name = c.at("name");
    CAPTURE(name);
    const auto& config = c.at("config");
    const double z = config.at("z_loss"), cap = config.at("softcap");
    const Tensor3<double> raw = golden_tensor(c, "logits");
    const TokenIds targets = xt::cast<int>(golden_tensor(c, "targets"));
    SoftcapCache<double, 3> capped;
    const Tensor3<double> logits = cap > 0 ? softcap_forward<double, 3>(capped, raw, cap) : raw;
    CrossEntropyCache<double, 3> cache;
    const double loss = cross_entropy_forward<double, 3>(cache, logits, targets, kIgnoreIndex, z);
    CHECK(cache.labelled == config.at("num_labelled").get<std::size_t>());
    CHECK(loss == doctest::Approx(golden_tensor(c, "loss")()).epsilon(1e-13));
    CHECK(cache.cross_entropy ==
          doctest::Approx(golden_tensor(c, "cross_entropy")()).epsilon(1e-13));
    CHECK(cache.z_term == doctest::Approx(golden_tensor(c, "z_term")()).epsilon(1e-13));
    Tensor3<double> dlogits = cross_entropy_backward<double, 3>(cache);
    if (cap > 0) dlogits = softcap_backward<double, 3>(dlogits, capped);
    CHECK(rel_error(dlogits, golden_tensor(c, "dlogits")) < kGoldenTol);
  }
}
