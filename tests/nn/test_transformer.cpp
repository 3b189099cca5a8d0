// TransformerBlock and Transformer: gradient checks (block input and parameters; the whole
// model's parameter gradients of the cross-entropy loss), parameter names, initialisation,
// the Module contract, the non-finite hook, bad configuration, and overfitting one batch.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <unordered_map>

#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>

#include "attnlab/backends/emulated.hpp"
#include "attnlab/nn/gradcheck_module.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

constexpr double kGradTol = 1e-6;

// See test_multi_head_attention.cpp: k_norm.beta has an exactly zero gradient, unless RoPE turns
// the shift by each key's position (then it no longer moves a row's scores alike).
void expect_passed(const GradcheckReport& report, bool k_shift_cancels = true) {
  INFO(report.table());
  for (const auto& r : report.results) {
    CAPTURE(r.name);
    if (r.name.ends_with("k_norm.beta") && k_shift_cancels) {
      CHECK(r.analytic_norm < 1e-12);
      CHECK(r.max_abs_error < 1e-8);
      continue;
    }
    CHECK(r.rel_error <= kGradTol);
    CHECK(r.analytic_norm > 1e-8);
  }
}

TransformerConfig tiny_config() {
  TransformerConfig c;
  c.vocab_sizes = {5, 3};
  c.max_len = 6;
  c.block.attention.d_model = 8;
  c.block.attention.heads = 2;
  c.block.d_ff = 12;
  c.layers = 2;
  c.out_vocab = 4;
  return c;
}

// Two fields: field 1 is absent (-1) at some positions.
std::vector<TokenIds> tiny_fields() {
  return {TokenIds{{1, 4, 0, 2, 3}, {2, 2, 1, 0, 4}},
          TokenIds{{kNoToken, 1, kNoToken, 2, 0}, {0, kNoToken, 1, kNoToken, kNoToken}}};
}

// Targets with unlabelled positions.
TokenIds tiny_targets() {
  return {{kIgnoreIndex, 3, 0, kIgnoreIndex, 1}, {2, 0, 3, 1, kIgnoreIndex}};
}

std::vector<std::string> names_of(Module<double>& m) {
  std::vector<std::string> out;
  for (const auto& p : m.parameters()) out.push_back(p.name);
  return out;
}

void jitter_norms(Module<double>& m, Rng& rng) {
  for (auto& p : m.parameters()) {
    const bool trained_from_constant =
        p.name.find("gamma") != std::string::npos || p.name.find("beta") != std::string::npos ||
        p.name.find("log_scale") != std::string::npos || p.name.ends_with(".b");
    if (!trained_from_constant) continue;
    for (auto& v : p.param->value) v += 0.2 * rng.normal();
  }
}

GradcheckReport check_transformer(Transformer<double>& model, const KeyMask* mask = nullptr) {
  const auto fields = tiny_fields();
  const auto targets = tiny_targets();
  return check_parameter_gradients(model, [&](bool with_backward) {
    const auto logits = model.forward(fields, mask);
    CrossEntropyCache<double, 3> cache;
    const double loss = cross_entropy_forward<double, 3>(cache, logits, targets);
    if (with_backward) model.backward(cross_entropy_backward<double, 3>(cache));
    return loss;
  });
}

}  // namespace

TEST_CASE("TransformerBlock gradcheck: layernorm, rmsnorm, no norm, attention-only, masked") {
  Rng rng(41);
  BlockConfig c;
  c.attention.d_model = 6;
  c.attention.heads = 2;
  c.attention.d_k = 4;
  c.attention.sdpa.causal = true;
  c.d_ff = 10;
  std::vector<std::string> expected{"ln1.gamma", "ln1.beta",  "attn.w_q",  "attn.w_k",
                                    "attn.w_v",  "attn.w_o",  "ln2.gamma", "ln2.beta",
                                    "mlp.fc1.w", "mlp.fc1.b", "mlp.fc2.w", "mlp.fc2.b"};
  SUBCASE("layernorm") {}
  SUBCASE("rmsnorm") {
    c.norm = Norm::rmsnorm;
    expected = {"ln1.gamma", "attn.w_q",  "attn.w_k",  "attn.w_v",  "attn.w_o",
                "ln2.gamma", "mlp.fc1.w", "mlp.fc1.b", "mlp.fc2.w", "mlp.fc2.b"};
  }
  SUBCASE("none") {
    c.norm = Norm::none;
    expected = {"attn.w_q",  "attn.w_k",  "attn.w_v",  "attn.w_o",
                "mlp.fc1.w", "mlp.fc1.b", "mlp.fc2.w", "mlp.fc2.b"};
  }
  SUBCASE("attention only") {
    c.attn_only = true;
    expected = {"ln1.gamma", "ln1.beta", "attn.w_q", "attn.w_k", "attn.w_v", "attn.w_o"};
  }
  SUBCASE("no biases") {
    c.bias = false;
    expected = {"ln1.gamma", "attn.w_q",  "attn.w_k",  "attn.w_v",
                "attn.w_o",  "ln2.gamma", "mlp.fc1.w", "mlp.fc2.w"};
  }
  TransformerBlock<double> block(c, rng);
  CHECK(names_of(block) == expected);
  jitter_norms(block, rng);
  const auto x = randn<double, 3>({2, 4, 6}, rng);
  const KeyMask mask = {{true, true, false, true}, {false, true, true, true}};
  const auto report = check_module_gradients(
      block, x, [&](const Tensor3<double>& in) { return block.forward(in, &mask); },
      [&](const Tensor3<double>& dy) { return block.backward(dy); });
  CHECK(report.results.size() == expected.size() + 1);
  expect_passed(report);
}

TEST_CASE("Transformer gradcheck: every parameter of the cross-entropy loss, tiny size") {
  Rng rng(42);
  TransformerConfig c = tiny_config();
  SUBCASE("defaults: learned positions, layernorm, sqrt_dk") {}
  SUBCASE("causal, rmsnorm, d_k and d_v free, sinusoidal positions") {
    c.block.attention.sdpa.causal = true;
    c.block.norm = Norm::rmsnorm;
    c.block.attention.d_k = 5;
    c.block.attention.d_v = 3;
    c.positions = PositionEncoding::sinusoidal;
  }
  SUBCASE("attention-only, QK-norm, learnable scale, scaling none") {
    c.block.attn_only = true;
    c.block.attention.qk_norm = true;
    c.block.attention.learnable_scale = true;
    c.block.attention.sdpa.scaling = Scaling::none;
  }
  SUBCASE("output-logit softcap 0.5: the logits reach the cap's curved part at this size") {
    c.logit_softcap = 0.5;
  }
  SUBCASE("rotary positions, and with QK-norm (RoPE after the norm), partial, interleaved") {
    c.positions = PositionEncoding::rope;
    c.block.attention.rope_theta = 100.0;
    c.block.attention.qk_norm = true;
    c.block.attention.rope_fraction = 0.5;
    c.block.attention.rope_interleaved = true;
  }
  SUBCASE("ReLU² MLP") {
    c.block.mlp = MlpActivation::relu2;
  }
  SUBCASE("no biases (bias false): the MLP's and the LayerNorms' beta") {
    c.block.bias = false;
  }
  SUBCASE("SwiGLU MLP") {
    c.block.mlp = MlpActivation::swiglu;
  }
  SUBCASE("attention softcap 0.3 with an explicit scale 3, causal") {
    c.block.attention.sdpa.softcap = 0.3;
    c.block.attention.sdpa.scale = 3.0;
    c.block.attention.sdpa.causal = true;
  }
  SUBCASE("no norm, scaling dk, one layer") {
    c.block.norm = Norm::none;
    c.block.attention.sdpa.scaling = Scaling::dk;
    c.layers = 1;
  }
  Transformer<double> model(c, rng);
  jitter_norms(model, rng);
  expect_passed(check_transformer(model), c.positions != PositionEncoding::rope);
}

TEST_CASE("Transformer gradcheck with a key padding mask") {
  Rng rng(43);
  Transformer<double> model(tiny_config(), rng);
  const KeyMask mask = {{true, true, true, false, false}, {true, true, true, true, false}};
  expect_passed(check_transformer(model, &mask));
}

TEST_CASE("Transformer parameter names are hierarchical and stable") {
  Rng rng(44);
  TransformerConfig c = tiny_config();
  c.layers = 1;
  c.block.attention.learnable_scale = true;
  Transformer<double> model(c, rng);
  CHECK(names_of(model) == std::vector<std::string>{
                               "embed.fields.0.table", "embed.fields.1.table", "pos.table",
                               "blocks.0.ln1.gamma", "blocks.0.ln1.beta", "blocks.0.attn.w_q",
                               "blocks.0.attn.w_k", "blocks.0.attn.w_v", "blocks.0.attn.w_o",
                               "blocks.0.attn.log_scale", "blocks.0.ln2.gamma", "blocks.0.ln2.beta",
                               "blocks.0.mlp.fc1.w", "blocks.0.mlp.fc1.b", "blocks.0.mlp.fc2.w",
                               "blocks.0.mlp.fc2.b", "ln_f.gamma", "ln_f.beta", "head.w"});
  CHECK(model.parameters("model.").front().name == "model.embed.fields.0.table");
  const auto logits = model.forward(tiny_fields());
  CHECK(logits.shape() == std::array<std::size_t, 3>{2, 5, 4});
  CHECK(model.block(0).attention().attention_weights().shape() ==
        std::array<std::size_t, 4>{2, 2, 5, 5});
}

TEST_CASE("Transformer init: identical weights for every scaling mode and attention option") {
  TransformerConfig a = tiny_config();
  std::vector<TransformerConfig> others(4, a);
  others[0].block.attention.sdpa.scaling = Scaling::none;
  others[1].block.attention.sdpa.scaling = Scaling::dk;
  others[2].block.attention.sdpa.scale = 0.25;
  others[3].block.attention.sdpa.causal = true;
  others[3].block.attention.qk_norm = true;
  others[3].block.attention.learnable_scale = true;
  Rng ra(45);
  Transformer<float> reference(a, ra);
  std::unordered_map<std::string, xt::xarray<float>> values;
  for (auto& p : reference.parameters()) values[p.name] = p.param->value;
  for (const auto& c : others) {
    Rng rb(45);
    Transformer<float> model(c, rb);
    for (auto& p : model.parameters()) {
      CAPTURE(p.name);
      if (values.count(p.name)) CHECK(p.param->value == values[p.name]);
    }
  }
  // Documented statistics: embeddings N(0, 1), projections N(0, 1/fan_in).
  TransformerConfig big = a;
  big.vocab_sizes = {4096};
  big.block.attention.d_model = 64;
  big.out_vocab = 4;
  Rng rng(46);
  Transformer<double> model(big, rng);
  for (auto& p : model.parameters()) {
    double var = 0;
    for (double v : p.param->value) var += v * v / double(p.param->value.size());
    if (p.name == "embed.fields.0.table") CHECK(var == doctest::Approx(1.0).epsilon(0.02));
    if (p.name == "blocks.0.attn.w_q") CHECK(var == doctest::Approx(1.0 / 64).epsilon(0.05));
  }
}

TEST_CASE("Transformer contract: backward twice doubles grads, backward before forward throws") {
  Rng rng(47);
  Transformer<double> model(tiny_config(), rng);
  const Tensor3<double> dlogits = randn<double, 3>({2, 5, 4}, rng);
  CHECK_THROWS_WITH_AS(model.backward(dlogits), "Transformer::backward: called before forward",
                       std::logic_error);
  model.forward(tiny_fields());
  model.backward(dlogits);
  std::vector<xt::xarray<double>> once;
  for (auto& p : model.parameters()) once.push_back(p.param->grad);
  model.backward(dlogits);
  std::size_t i = 0;
  for (auto& p : model.parameters()) {
    CAPTURE(p.name);
    CHECK(test::rel_error(p.param->grad, xt::xarray<double>(2.0 * once[i++])) < 1e-13);
  }
  model.zero_grad();
  CHECK_THROWS_AS(model.backward(randn<double, 3>({2, 4, 4}, rng)), ShapeError);
}

TEST_CASE("Transformer whose parameters read another's values: its forward, its own grads") {
  // As a batch replica reads the model's weights (TrainBackend::use_batch_threads).
  for (const bool tied : {false, true}) {
    CAPTURE(tied);
    TransformerConfig c = tiny_config();
    c.block.attention.learnable_scale = true;  // read on the host, not through a kernel
    c.tie_embeddings = tied;
    if (tied) c.vocab_sizes = {5}, c.out_vocab = 5;  // one field, its table the head
    const std::vector<TokenIds> fields =
        tied ? std::vector<TokenIds>{tiny_fields()[0]} : tiny_fields();
    Rng ra(48), rb(49);
    Transformer<double> model(c, ra), replica(c, rb);
    jitter_norms(model, ra);
    const ParameterList<double> mine = model.parameters(), theirs = replica.parameters();
    REQUIRE(mine.size() == theirs.size());
    for (std::size_t i = 0; i < mine.size(); ++i) theirs[i].param->read_values_of(*mine[i].param);
    for (std::size_t i = 0; i < mine.size(); ++i) {
      CAPTURE(mine[i].name);
      CHECK(theirs[i].param->value.size() == 0);  // its own values freed
      CHECK(theirs[i].param->size() == mine[i].param->size());
      CHECK(theirs[i].param->value_data() == mine[i].param->value_data());
    }
    CHECK(replica.num_parameters() == model.num_parameters());
    CHECK(replica.block(1).attention().head_scales() == model.block(1).attention().head_scales());
    Rng rd(50);
    const auto logits = model.forward(fields);
    const Tensor3<double> dlogits = randn<double, 3>(logits.shape(), rd);
    model.backward(dlogits);
    // The model's weights change (an optimiser step); the replica reads the new ones.
    for (const auto& p : mine) p.param->value += 0.01;
    model.zero_grad();
    const auto logits2 = model.forward(fields);
    model.backward(dlogits);
    CHECK(xt::amax(xt::abs(logits2 - logits))() > 1e-6);
    CHECK(replica.forward(fields) == logits2);  // bit for bit
    replica.backward(dlogits);
    for (std::size_t i = 0; i < mine.size(); ++i) {
      CAPTURE(mine[i].name);
      CHECK(theirs[i].param->grad == mine[i].param->grad);
      CHECK(theirs[i].param->grad_data() != mine[i].param->grad_data());
    }
  }
}

TEST_CASE("Parameter reading another's values refuses a wrong model and then changes nothing") {
  Rng rng(51);
  Parameter<double> model(randn<double, 2>({4, 5}, rng), xt::zeros<double>({4, 5}));
  Parameter<double> wide(randn<double, 2>({5, 4}, rng), xt::zeros<double>({5, 4}));
  Parameter<double> reader(randn<double, 2>({4, 5}, rng), xt::zeros<double>({4, 5}));
  const xt::xarray<double> own = reader.value;
  const auto unchanged = [&] {
    CHECK(reader.values_of == nullptr);
    CHECK(reader.value == own);
    CHECK(reader.value_data() == reader.value.data());
  };
  CHECK_THROWS_WITH_AS(reader.read_values_of(wide),
                       "Parameter::read_values_of: model expected another host parameter of shape "
                       "(4, 5) that holds its own values, got one of shape (5, 4)",
                       std::invalid_argument);
  unchanged();
  CHECK_THROWS_WITH_AS(reader.read_values_of(reader),
                       "Parameter::read_values_of: model expected another host parameter of shape "
                       "(4, 5) that holds its own values, got itself of shape (4, 5)",
                       std::invalid_argument);
  unchanged();
  // A chain would outlive its middle link unseen; the model must hold its values itself.
  Parameter<double> middle(randn<double, 2>({4, 5}, rng), xt::zeros<double>({4, 5}));
  middle.read_values_of(model);
  CHECK_THROWS_WITH_AS(reader.read_values_of(middle),
                       "Parameter::read_values_of: model expected another host parameter of shape "
                       "(4, 5) that holds its own values, got one that reads a third's values of "
                       "shape (4, 5)",
                       std::invalid_argument);
  unchanged();
  // The host reads no device's values, and a device parameter reads none of the host's.
  const auto ops = emulated::make_device_ops<double>();  // outlives the modules on it
  TransformerConfig c = tiny_config();
  Rng ra(52), rb(53);
  Transformer<double> host(c, ra), device(c, rb);
  device.to(*ops);
  Parameter<double>& on_host = *host.parameters()[0].param;
  Parameter<double>& on_device = *device.parameters()[0].param;
  CHECK_THROWS_WITH_AS(on_host.read_values_of(on_device),
                       doctest::Contains("got one on a device backend of shape"),
                       std::invalid_argument);
  CHECK(on_host.values_of == nullptr);
  CHECK_THROWS_WITH_AS(on_device.read_values_of(on_host),
                       "Parameter::read_values_of: this expected a parameter on the host, got one "
                       "on a device backend",
                       std::invalid_argument);
  CHECK(on_device.values_of == nullptr);
  // The right model is taken, once or again.
  reader.read_values_of(model);
  CHECK(reader.value_data() == model.value_data());
  CHECK(reader.value.size() == 0);
  reader.read_values_of(model);
  CHECK(reader.size() == model.size());
}

TEST_CASE("Transformer bad configuration and input name the field") {
  {
    TransformerConfig bad = tiny_config();
    bad.logit_softcap = -1;
    CHECK_THROWS_WITH_AS(
        bad.validate(), "TransformerConfig: logit_softcap expected a finite cap > 0, got -1.000000",
        std::invalid_argument);
  }
  Rng rng(48);
  const auto expect_error = [&](const TransformerConfig& c, const std::string& message) {
    CHECK_THROWS_WITH_AS(Transformer<float>(c, rng), message.c_str(), std::invalid_argument);
  };
  TransformerConfig c = tiny_config();
  c.block.attention.d_model = 10;
  c.block.attention.heads = 4;
  expect_error(
      c,
      "TransformerConfig: block.attention.d_model expected divisible by heads (4) when d_k is 0 "
      "(derived), got 10");
  c.block.attention.d_k = 4;
  expect_error(
      c,
      "TransformerConfig: block.attention.d_model expected divisible by heads (4) when d_v is "
      "0 "
      "(derived), got 10");
  c.block.attention.d_v = 4;
  CHECK_NOTHROW(Transformer<float>(c, rng));
  c = tiny_config();
  c.vocab_sizes = {};
  expect_error(c, "TransformerConfig: vocab_sizes expected at least one field, got none");
  c.vocab_sizes = {5, 0};
  expect_error(c, "TransformerConfig: vocab_sizes[1] expected > 0, got 0");
  c = tiny_config();
  c.layers = 0;
  expect_error(c, "TransformerConfig: layers expected > 0, got 0");
  c = tiny_config();
  c.out_vocab = 0;
  expect_error(c, "TransformerConfig: out_vocab expected > 0, got 0");
  c = tiny_config();
  c.block.d_ff = 0;
  expect_error(c, "TransformerConfig: block.d_ff expected > 0 (or attn_only), got 0");
  c.block.attn_only = true;
  CHECK_NOTHROW(Transformer<float>(c, rng));
  c = tiny_config();
  c.max_len = 0;
  expect_error(c, "TransformerConfig: max_len expected > 0, got 0");
  c = tiny_config();
  c.positions = PositionEncoding::rope;
  c.block.attention.rope_fraction = 0.75;  // 3 of d_k = 4 dims: pairs need an even count
  expect_error(c,
               "TransformerConfig: block.attention.rope_fraction expected floor(fraction * d_k) "
               "even and >= 2 (d_k = 4), got 0.750000 (3 dims)");
  c.block.attention.rope_fraction = 1.0;
  c.block.attention.rope_theta = 0.0;
  expect_error(c,
               "TransformerConfig: block.attention.rope_theta expected a finite base > 0, got "
               "0.000000");
  c = tiny_config();
  c.block.attention.rope = true;  // the switch is positions = rope, its one home
  expect_error(c,
               "TransformerConfig: block.attention.rope expected false (positions = rope turns "
               "RoPE on in every block), got true");
  c = tiny_config();
  c.block.attention.sdpa.scale = 0.0;
  expect_error(c,
               "TransformerConfig: block.attention.sdpa.scale expected a finite scale > 0, got "
               "0.000000");
  CHECK_THROWS_WITH_AS(parse_scaling("sqrt"),
                       "parse_scaling: mode expected none|sqrt_dk|dk, got 'sqrt'",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_norm("batchnorm"),
                       "parse_norm: norm expected layernorm|rmsnorm|none, got 'batchnorm'",
                       std::invalid_argument);
  CHECK(parse_norm("rmsnorm") == Norm::rmsnorm);
  CHECK(to_string(Norm::layernorm) == "layernorm");

  Transformer<float> model(tiny_config(), rng);
  CHECK_THROWS_WITH_AS(model.forward({tiny_fields()[0]}),
                       "Transformer::forward: fields expected 2 id tensors (one per vocabulary), "
                       "got 1",
                       std::invalid_argument);
  const std::vector<TokenIds> too_long{xt::zeros<int>({1, 7}), xt::zeros<int>({1, 7})};
  CHECK_THROWS_AS(model.forward(too_long), std::invalid_argument);
  const std::vector<TokenIds> out_of_range{TokenIds{{5}}, TokenIds{{0}}};
  CHECK_THROWS_AS(model.forward(out_of_range), std::invalid_argument);
}

TEST_CASE("Transformer non-finite hook names the first module, and is silent when finite") {
  Rng rng(49);
  Transformer<float> model(tiny_config(), rng);
  CHECK_FALSE(model.first_nonfinite());
  model.set_nonfinite_check(true);
  model.forward(tiny_fields());
  CHECK_FALSE(model.first_nonfinite());
  // A NaN in one block's query weights: the first bad output is that block's attention.
  auto params = model.parameters();
  for (auto& p : params) {
    if (p.name == "blocks.1.attn.w_q")
      p.param->value(0, 0) = std::numeric_limits<float>::quiet_NaN();
  }
  model.forward(tiny_fields());
  REQUIRE(model.first_nonfinite());
  CHECK(model.first_nonfinite()->starts_with("blocks.1.attn"));
  // A non-finite gradient only: an infinite upstream gradient is caught at the head.
  Transformer<float> clean(tiny_config(), rng);
  clean.set_nonfinite_check(true);
  clean.forward(tiny_fields());
  Tensor3<float> dlogits = xt::zeros<float>({2, 5, 4});
  dlogits(0, 0, 0) = std::numeric_limits<float>::infinity();
  clean.backward(dlogits);
  REQUIRE(clean.first_nonfinite());
  CHECK(*clean.first_nonfinite() == "head (gradient)");
  // Disabled: nothing is recorded.
  model.set_nonfinite_check(false);
  model.forward(tiny_fields());
  CHECK_FALSE(model.first_nonfinite());
}

TEST_CASE("A tiny Transformer overfits one fixed batch (loss < 1e-3) within 300 Adam steps") {
  // Plain Adam (β1 0.9, β2 0.999, lr 1e-2, no weight decay), written here so that this test does
  // not depend on the optimizer library.
  Rng rng(50);
  Transformer<float> model(test::transformer_config(8, 8, 16, 2, 32, 1, 8, true), rng);
  TokenIds ids({4, 8});
  TokenIds targets({4, 8});
  for (std::size_t b = 0; b < 4; ++b) {
    for (std::size_t t = 0; t < 8; ++t) {
      ids(b, t) = static_cast<int>(rng.below(8));
      targets(b, t) = static_cast<int>(rng.below(8));
    }
  }
  auto params = model.parameters();
  std::vector<xt::xarray<float>> m1, m2;
  for (auto& p : params) {
    m1.push_back(xt::zeros<float>(p.param->value.shape()));
    m2.push_back(xt::zeros<float>(p.param->value.shape()));
  }
  constexpr float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  float loss = 0;
  int steps = 0;
  for (; steps < 300; ++steps) {
    model.zero_grad();
    const auto logits = model.forward({ids});
    CrossEntropyCache<float, 3> cache;
    loss = cross_entropy_forward<float, 3>(cache, logits, targets);
    if (loss < 1e-3f) break;
    model.backward(cross_entropy_backward<float, 3>(cache));
    const float c1 = 1 - std::pow(b1, float(steps + 1)), c2 = 1 - std::pow(b2, float(steps + 1));
    for (std::size_t i = 0; i < params.size(); ++i) {
      float* w = params[i].param->value.data();
      const float* g = params[i].param->grad.data();
      for (std::size_t j = 0; j < params[i].param->value.size(); ++j) {
        m1[i].data()[j] = b1 * m1[i].data()[j] + (1 - b1) * g[j];
        m2[i].data()[j] = b2 * m2[i].data()[j] + (1 - b2) * g[j] * g[j];
        w[j] -= lr * (m1[i].data()[j] / c1) / (std::sqrt(m2[i].data()[j] / c2) + eps);
      }
    }
  }
  MESSAGE("overfit: loss " << loss << " after " << steps << " steps");
  CHECK(loss < 1e-3f);
}

TEST_CASE("Transformer float and double agree on logits and gradients") {
  TransformerConfig c = tiny_config();
  c.block.attention.sdpa.causal = true;
  c.block.attention.qk_norm = true;
  c.block.attention.learnable_scale = true;
  Rng rf(51), rd(51);
  Transformer<float> mf(c, rf);
  Transformer<double> md(c, rd);
  const auto fields = tiny_fields();
  const auto targets = tiny_targets();
  const auto lf = mf.forward(fields);
  const auto ld = md.forward(fields);
  CHECK(test::rel_error(lf, ld) < 1e-5);
  mf.backward(softmax_cross_entropy<float, 3>(lf, targets).dlogits);
  md.backward(softmax_cross_entropy<double, 3>(ld, targets).dlogits);
  auto pf = mf.parameters();
  auto pd = md.parameters();
  REQUIRE(pf.size() == pd.size());
  for (std::size_t i = 0; i < pf.size(); ++i) {
    CAPTURE(pf[i].name);
    if (pf[i].name.ends_with("k_norm.beta")) continue;  // exactly 0 up to rounding
    CHECK(test::rel_error(pf[i].param->grad, pd[i].param->grad) < 1e-4);
  }
}

TEST_CASE("transformer_flops_per_token: 6 x the matmul weights counted from parameters() + QK/PV") {
  // nanoGPT's CPU Shakespeare shape: 4 layers, 4 heads, C 128, T 64, 65 characters.
  TransformerConfig c;
  c.vocab_sizes = {65};
  c.max_len = 64;
  c.layers = 4;
  c.out_vocab = 65;
  c.block.attention.d_model = 128;
  c.block.attention.heads = 4;
  c.block.d_ff = 512;
  const auto matmul_weights = [](Transformer<double>& model) {
    double n = 0;
    for (const auto& p : model.parameters()) {
      const std::string& name = p.name;
      const auto ends = [&name](const std::string& tail) {
        return name.size() >= tail.size() &&
               name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
      };
      if (ends("attn.w_q") || ends("attn.w_k") || ends("attn.w_v") || ends("attn.w_o") ||
          ends("fc1.w") || ends("fc2.w") || name == "head.w")
        n += static_cast<double>(p.param->value.size());
    }
    return n;
  };
  for (bool attn_only : {false, true}) {
    for (std::size_t d_k : {std::size_t{0}, std::size_t{48}}) {
      CAPTURE(attn_only);
      CAPTURE(d_k);
      TransformerConfig v = c;
      v.block.attn_only = attn_only;
      v.block.attention.d_k = d_k;
      v.block.attention.d_v = d_k ? 40 : 0;
      Rng rng(1);
      Transformer<double> model(v, rng);
      const double D = d_k ? 48.0 : 32.0, Dv = d_k ? 40.0 : 32.0;
      const double want = 6 * matmul_weights(model) + 6.0 * 4 * 4 * 64 * (D + Dv);
      CHECK(transformer_flops_per_token(v, 64) == doctest::Approx(want).epsilon(1e-15));
    }
  }
  // nanoGPT's estimate_mfu formula with N = the 794,752 matmul weights: 6 · N + 12 · 4 · 4 · 32 ·
  // 64 (nanoGPT's own N also counts the LayerNorm gains: 5,168,640, 0.13% more).
  CHECK(transformer_flops_per_token(c, 64) == 5161728.0);
  // Doubling T adds only the attention term.
  CHECK(transformer_flops_per_token(c, 128) - transformer_flops_per_token(c, 64) == 393216.0);
  CHECK_THROWS_WITH_AS(transformer_flops_per_token(c, 0),
                       "transformer_flops_per_token: seq_len expected >= 1, got 0",
                       std::invalid_argument);
  c.block.attention.heads = 3;  // does not divide 128
  CHECK_THROWS_AS(transformer_flops_per_token(c, 64), std::invalid_argument);
}

TEST_CASE("transformer_parameter_shapes lists what the built model holds, in its order") {
  std::vector<TransformerConfig> configs;
  TransformerConfig c = tiny_config();
  configs.push_back(c);
  c.vocab_sizes = {5, 7, 3};
  c.block.norm = Norm::rmsnorm;
  c.block.attention.qk_norm = true;
  c.block.attention.learnable_scale = true;
  configs.push_back(c);
  c.block.norm = Norm::none;
  c.block.attn_only = true;
  c.positions = PositionEncoding::rope;
  c.block.attention.heads = 4;
  c.block.attention.kv_heads = 2;
  c.block.attention.d_k = 6;
  c.block.attention.d_v = 3;
  configs.push_back(c);
  c = tiny_config();
  c.block.bias = false;
  c.block.attention.qk_norm = true;
  configs.push_back(c);
  c = tiny_config();
  c.layers = 3;
  c.block.mlp = MlpActivation::relu2;
  c.positions = PositionEncoding::sinusoidal;
  configs.push_back(c);
  c = tiny_config();
  c.block.mlp = MlpActivation::swiglu;  // fc1 is (C, 2F): [gate | up]
  configs.push_back(c);
  c.block.bias = false;
  configs.push_back(c);
  for (const TransformerConfig& config : configs) {
    Rng rng(1);
    Transformer<float> model(config, rng);
    std::vector<ParameterShape> built;
    double count = 0;
    for (const auto& p : model.parameters()) {
      built.push_back({p.name, {p.param->value.shape().begin(), p.param->value.shape().end()}});
      count += static_cast<double>(p.param->value.size());
    }
    CHECK(transformer_parameter_shapes(config) == built);
    CHECK(transformer_parameter_count(config) == count);
  }
  TransformerConfig bad = tiny_config();
  bad.layers = 0;
  CHECK_THROWS_AS(transformer_parameter_shapes(bad), std::invalid_argument);
}
