// The tied embedding and head (TransformerConfig::tie_embeddings): the head reads the token table
// W_e (V, C) as its weight, logits = h W_eᵀ. Tests: a double gradient check of every parameter
// (the shared table's gradient included), the shared gradient against the sum of an untied
// model's two (its head set to W_eᵀ), the parameter list and count (one matrix fewer), the
// initialisation, the configs that cannot tie, and a checkpoint of the other kind refused.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <xtensor/xmanipulation.hpp>

#include "attnlab/io/checkpoint.hpp"
#include "attnlab/nn/gradcheck_module.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

TransformerConfig tied_config() {
  TransformerConfig c;
  c.vocab_sizes = {6};
  c.out_vocab = 6;
  c.max_len = 6;
  c.block.attention.d_model = 8;
  c.block.attention.heads = 2;
  c.block.d_ff = 12;
  c.layers = 2;
  c.tie_embeddings = true;
  return c;
}

// One field with an absent token (its row gets no embedding gradient, only the head's).
std::vector<TokenIds> fields() {
  return {TokenIds{{1, 4, 0, 2, kNoToken}, {5, 2, 1, 0, 4}}};
}

TokenIds targets() {
  return {{kIgnoreIndex, 3, 0, 5, 1}, {2, 0, 3, 1, kIgnoreIndex}};
}

double loss_and_backward(Transformer<double>& model, bool with_backward) {
  const auto logits = model.forward(fields());
  CrossEntropyCache<double, 3> cache;
  const double loss = cross_entropy_forward<double, 3>(cache, logits, targets());
  if (with_backward) model.backward(cross_entropy_backward<double, 3>(cache));
  return loss;
}

Parameter<double>& param_of(Transformer<double>& model, const std::string& name) {
  for (const auto& p : model.parameters())
    if (p.name == name) return *p.param;
  FAIL("no parameter " << name);
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("tied embedding and head: double gradient check of every parameter, the shared table's") {
  TransformerConfig c = tied_config();
  SUBCASE("learned positions, LayerNorm") {}
  SUBCASE("causal, RMSNorm, logit softcap, attention-only") {
    c.block.attention.sdpa.causal = true;
    c.block.norm = Norm::rmsnorm;
    c.logit_softcap = 0.8;
    c.block.attn_only = true;
  }
  SUBCASE("no final norm: the head reads the last block's output") {
    c.block.norm = Norm::none;
    c.layers = 1;
  }
  Rng rng(31);
  Transformer<double> model(c, rng);
  for (auto& p : model.parameters())  // norms off their constant init
    if (p.name.find("gamma") != std::string::npos || p.name.find("beta") != std::string::npos)
      for (auto& v : p.param->value) v += 0.2 * rng.normal();
  const GradcheckReport report =
      check_parameter_gradients(model, [&](bool with) { return loss_and_backward(model, with); });
  INFO(report.table());
  bool saw_table = false;
  for (const auto& r : report.results) {
    CAPTURE(r.name);
    CHECK(r.name != "head.w");
    saw_table = saw_table || r.name == "embed.fields.0.table";
    CHECK(r.rel_error <= 1e-6);
    CHECK(r.analytic_norm > 1e-8);
  }
  CHECK(saw_table);
}

TEST_CASE(
    "tied embedding and head: the shared gradient is the sum of the embedding's and the "
    "head's") {
  // An untied model with the same weights and its head set to W_eᵀ computes the same function;
  // its two gradients (embed table + head.wᵀ) must add up to the tied model's one.
  TransformerConfig c = tied_config();
  c.block.attention.sdpa.causal = true;
  Rng rng(32);
  Transformer<double> tied(c, rng);
  TransformerConfig u = c;
  u.tie_embeddings = false;
  Rng rng2(33);
  Transformer<double> untied(u, rng2);
  for (const auto& p : tied.parameters()) param_of(untied, p.name).value = p.param->value;
  const auto& table = param_of(tied, "embed.fields.0.table").value;  // (V, C)
  param_of(untied, "head.w").value = xt::transpose(table);           // (C, V)
  const auto a = tied.forward(fields()), b = untied.forward(fields());
  CHECK(test::rel_error(a, b) < 1e-13);

  tied.zero_grad();
  untied.zero_grad();
  loss_and_backward(tied, true);
  loss_and_backward(untied, true);
  const xt::xarray<double> embed_part = param_of(untied, "embed.fields.0.table").grad;
  const xt::xarray<double> head_part = xt::transpose(param_of(untied, "head.w").grad);
  const xt::xarray<double> sum = embed_part + head_part;
  CHECK(test::rel_error(param_of(tied, "embed.fields.0.table").grad, sum) < 1e-12);
  // Both uses contribute: neither part is the whole.
  CHECK(test::rel_error(embed_part, sum) > 1e-3);
  CHECK(test::rel_error(head_part, sum) > 1e-3);
  // Every other gradient is the untied model's.
  for (const auto& p : tied.parameters()) {
    if (p.name == "embed.fields.0.table") continue;
    CAPTURE(p.name);
    CHECK(test::rel_error(p.param->grad, param_of(untied, p.name).grad) < 1e-12);
  }
}

TEST_CASE("tied embedding and head: the shared table is listed once, one matrix fewer") {
  TransformerConfig c = tied_config();
  Rng rng(34);
  Transformer<float> tied(c, rng);
  TransformerConfig u = c;
  u.tie_embeddings = false;
  std::vector<ParameterShape> built;
  for (const auto& p : tied.parameters())
    built.push_back({p.name, {p.param->value.shape().begin(), p.param->value.shape().end()}});
  std::vector<ParameterShape> want = transformer_parameter_shapes(u);
  REQUIRE(want.back().name == "head.w");
  want.pop_back();
  CHECK(transformer_parameter_shapes(c) == built);
  CHECK(built == want);
  const double C = 8, V = 6;
  CHECK(transformer_parameter_count(u) - transformer_parameter_count(c) == C * V);
  CHECK(static_cast<double>(tied.num_parameters()) == transformer_parameter_count(c));
  // The head's matmul still runs: the FLOPs are the untied model's.
  CHECK(transformer_flops_per_token(c, 6) == transformer_flops_per_token(u, 6));
}

TEST_CASE("tied embedding and head: the shared table starts at the head's variance 1/C") {
  TransformerConfig c = tied_config();
  c.vocab_sizes = {64};
  c.out_vocab = 64;
  c.block.attention.d_model = 32;
  c.block.attention.heads = 4;
  Rng rng(35);
  Transformer<double> model(c, rng);
  const auto& table = param_of(model, "embed.fields.0.table").value;
  double sum_sq = 0;
  for (double v : table) sum_sq += v * v;
  const double variance = sum_sq / static_cast<double>(table.size());  // 2048 draws
  CHECK(variance == doctest::Approx(1.0 / 32).epsilon(0.1));
  // The draws before it and after it are the untied model's (the head's draw is the last).
  c.tie_embeddings = false;
  Rng rng2(35);
  Transformer<double> untied(c, rng2);
  CHECK(param_of(untied, "blocks.1.mlp.fc2.w").value ==
        param_of(model, "blocks.1.mlp.fc2.w").value);
  CHECK(test::rel_error(param_of(untied, "embed.fields.0.table").value / std::sqrt(32.0), table) <
        1e-14);
}

TEST_CASE("tied embedding and head: a config that cannot tie is refused, naming the field") {
  TransformerConfig c = tied_config();
  c.vocab_sizes = {6, 3};
  CHECK_THROWS_WITH_AS(c.validate(),
                       "TransformerConfig: vocab_sizes expected one token field when "
                       "tie_embeddings is set (the head shares that field's table), got 2 fields",
                       std::invalid_argument);
  c = tied_config();
  c.out_vocab = 4;
  CHECK_THROWS_WITH_AS(c.validate(),
                       "TransformerConfig: out_vocab expected vocab_sizes[0] = 6 when "
                       "tie_embeddings is set (the head's classes are the table's tokens), got 4",
                       std::invalid_argument);
  Rng rng(36);
  CHECK_THROWS_AS(Transformer<float>(c, rng), std::invalid_argument);
  CHECK_THROWS_AS(transformer_parameter_shapes(c), std::invalid_argument);
}

TEST_CASE("tied embedding and head: a checkpoint of the other kind is refused, naming head.w") {
  const auto dir = std::filesystem::temp_directory_path() / "attnlab_test_tied_checkpoint";
  std::filesystem::create_directories(dir);
  const std::string untied_file = (dir / "untied.safetensors").string();
  const std::string tied_file = (dir / "tied.safetensors").string();
  TransformerConfig c = tied_config();
  Rng rng(37);
  Transformer<float> tied(c, rng);
  c.tie_embeddings = false;
  Transformer<float> untied(c, rng);
  save_checkpoint<float>(untied_file, untied.parameters(), {}, {});
  save_checkpoint<float>(tied_file, tied.parameters(), {}, {});
  // Untied file into the tied model: head.w is not one of its parameters.
  const auto before = tied.parameters().front().param->value;
  try {
    load_checkpoint<float>(untied_file, tied.parameters());
    FAIL("expected a CheckpointError");
  } catch (const CheckpointError& e) {
    CAPTURE(e.what());
    CHECK(std::string(e.what()).find("head.w") != std::string::npos);
  }
  CHECK(tied.parameters().front().param->value == before);  // unchanged
  // Tied file into the untied model: head.w is missing.
  try {
    load_checkpoint<float>(tied_file, untied.parameters());
    FAIL("expected a CheckpointError");
  } catch (const CheckpointError& e) {
    CAPTURE(e.what());
    CHECK(std::string(e.what()).find("head.w") != std::string::npos);
  }
  load_checkpoint<float>(tied_file, tied.parameters());  // its own kind loads
  std::filesystem::remove_all(dir);
}
