// Dropout in the Modules: train()/eval(), the attention dropout of MultiHeadAttention
// (AttentionConfig::dropout) and the residual dropout of TransformerBlock (BlockConfig::dropout).
// Eval mode equals p = 0; the masks are keyed by Module::set_dropout_key (fresh per forward, the
// same after a reset, different per layer); a double gradient check with the masks held fixed; the
// CPU and the emulated device draw the same masks; the configs round-trip through JSON (and old
// configs without the fields load); bad probabilities are refused.
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "attnlab/backends/emulated.hpp"
#include "attnlab/io/config_json.hpp"
#include "attnlab/nn/gradcheck_module.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/nn/transformer_block.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

BlockConfig block_config(double attn_dropout, double residual_dropout) {
  BlockConfig c;
  c.attention.d_model = 8;
  c.attention.heads = 2;
  c.attention.sdpa.causal = true;
  c.attention.dropout = attn_dropout;
  c.d_ff = 16;
  c.dropout = residual_dropout;
  return c;
}

}  // namespace

// Whether a layer's options carry the op's dropout probability.
template <class O>
concept HasDropoutP = requires(O o) {
  o.dropout_p;
};

TEST_CASE("dropout modules: eval mode equals p = 0, train mode drops, successive forwards differ") {
  Rng data(171);
  const auto x = randn<double, 3>({2, 6, 8}, data);
  Rng r1(173), r2(173);
  TransformerBlock<double> with(block_config(0.3, 0.2), r1);
  TransformerBlock<double> without(block_config(0, 0), r2);
  CHECK(with.training());  // modules start in training mode, as torch's
  const Tensor3<double> reference = without.forward(x, nullptr);
  with.eval();
  CHECK_FALSE(with.training());
  CHECK_FALSE(with.attention().training());  // eval() reaches the children
  CHECK(with.forward(x, nullptr) == reference);
  with.train();
  with.set_dropout_key(5, 0);
  const Tensor3<double> first = with.forward(x, nullptr);
  const Tensor3<double> second = with.forward(x, nullptr);  // the next step's masks
  CHECK(test::rel_error(first, reference) > 1e-3);
  CHECK(test::rel_error(second, first) > 1e-3);
  with.set_dropout_key(5, 0);  // replays the first forward's masks
  CHECK(with.forward(x, nullptr) == first);
  with.set_dropout_key(6, 0);  // another seed, other masks
  CHECK(test::rel_error(with.forward(x, nullptr), first) > 1e-3);
  // p = 0 in training mode is the eval forward.
  without.train();
  CHECK(without.forward(x, nullptr) == reference);
}

TEST_CASE("dropout modules: the layers of a Transformer draw different masks") {
  TransformerConfig c;
  c.vocab_sizes = {11};
  c.out_vocab = 11;
  c.layers = 2;
  c.max_len = 8;
  c.block = block_config(0.5, 0.0);
  Rng rng(179);
  Transformer<double> net(c, rng);
  // Both blocks share the same weights and input, so only their masks can tell them apart.
  auto params = net.parameters();
  for (auto& np : params) {
    const std::string name = np.name;
    if (name.rfind("blocks.1.", 0) != 0) continue;
    for (auto& other : params) {
      if (other.name == "blocks.0." + name.substr(9)) np.param->value = other.param->value;
    }
  }
  net.set_dropout_key(3, 0);
  Rng data(181);
  const auto x = randn<double, 3>({1, 5, 8}, data);
  auto& b0 = net.block(0);
  auto& b1 = net.block(1);
  CHECK(test::rel_error(b0.forward(x, nullptr), b1.forward(x, nullptr)) > 1e-3);
}

TEST_CASE("dropout modules: central-difference gradient check of a block, masks held fixed") {
  Rng rng(191);
  TransformerBlock<double> block(block_config(0.3, 0.25), rng);
  Rng data(193);
  const auto x = randn<double, 3>({2, 5, 8}, data);
  const auto forward = [&](const Tensor3<double>& in) {
    block.set_dropout_key(11, 4);  // every evaluation draws the same masks
    return block.forward(in, nullptr);
  };
  const auto backward = [&](const Tensor3<double>& dy) { return block.backward(dy); };
  const auto report = check_module_gradients(block, x, forward, backward);
  INFO(report.table());
  CHECK(report.passed(1e-7));
  // The masks were active: the same input in eval mode gives another output.
  const Tensor3<double> trained = forward(x);
  block.eval();
  CHECK(test::rel_error(block.forward(x, nullptr), trained) > 1e-3);
}

TEST_CASE("dropout modules: the CPU and the emulated device draw the same masks") {
  const auto ops = emulated::make_device_ops<double>();  // outlives the module on it
  Rng r1(197), r2(197);
  TransformerBlock<double> cpu(block_config(0.3, 0.2), r1);
  TransformerBlock<double> device(block_config(0.3, 0.2), r2);
  device.to(*ops);
  Rng data(199);
  const auto x = randn<double, 3>({2, 6, 8}, data);
  const auto dy = randn<double, 3>({2, 6, 8}, data);
  for (auto* m : {&cpu, &device}) m->set_dropout_key(17, 2);
  const Tensor3<double> y_cpu = cpu.forward(x, nullptr), y_device = device.forward(x, nullptr);
  CHECK(test::rel_error(y_device, y_cpu) < 1e-12);
  CHECK(test::rel_error(device.backward(dy), cpu.backward(dy)) < 1e-12);
  device.copy_to_host(true);
  const auto pc = cpu.parameters(), pd = device.parameters();
  for (std::size_t i = 0; i < pc.size(); ++i) {
    CAPTURE(pc[i].name);
    CHECK(test::rel_error(pd[i].param->grad, pc[i].param->grad) < 1e-12);
  }
  // And both drop: eval mode differs.
  cpu.eval();
  CHECK(test::rel_error(cpu.forward(x, nullptr), y_cpu) > 1e-3);
}

TEST_CASE("dropout modules: the configs round-trip, old configs load, bad probabilities throw") {
  const BlockConfig c = block_config(0.1, 0.25);
  nlohmann::json j = c;
  CHECK(j.at("dropout").get<double>() == 0.25);
  CHECK(j.at("attention").at("dropout").get<double>() == 0.1);
  const BlockConfig back = j.get<BlockConfig>();
  CHECK(back.dropout == 0.25);
  CHECK(back.attention.dropout == 0.1);
  j.erase("dropout");  // a config written before dropout existed
  j.at("attention").erase("dropout");
  const BlockConfig old = j.get<BlockConfig>();
  CHECK(old.dropout == 0.0);
  CHECK(old.attention.dropout == 0.0);

  BlockConfig bad = c;
  bad.dropout = 1.0;
  CHECK_THROWS_WITH_AS(bad.validate(),
                       "BlockConfig: dropout expected a probability in [0, 1), got 1.000000",
                       std::invalid_argument);
  bad = c;
  bad.attention.dropout = -0.5;
  CHECK_THROWS_WITH_AS(bad.validate(),
                       doctest::Contains("attention.dropout expected a probability"),
                       std::invalid_argument);
  // The layer's dropout is stored once: its config has no op-level dropout_p (which would apply in
  // eval mode too).
  static_assert(!HasDropoutP<decltype(AttentionConfig::sdpa)>);
  static_assert(HasDropoutP<SdpaOptions>);
}
