// Weight decay on the 2-D parameters only (DecayParams::matrices, nanoGPT's optimizer groups):
// against two reference optimisers, one decaying everything and one decaying nothing, on the CPU
// (one update per parameter) and on the emulated device (one flat arena, one update per run of
// like parameters), for AdamW and SGD; and the names.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include <xtensor/xarray.hpp>

#include "attnlab/backends/emulated.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/optim/sgd.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

// Every kind of parameter: tables, weights, biases, norm gains and shifts, QK-norm's, log-scales.
TransformerConfig decay_config() {
  TransformerConfig c;
  c.vocab_sizes = {5};
  c.out_vocab = 4;
  c.max_len = 4;
  c.layers = 2;
  c.block.attention.d_model = 8;
  c.block.attention.heads = 2;
  c.block.attention.qk_norm = true;
  c.block.attention.learnable_scale = true;
  c.block.d_ff = 12;
  return c;
}

struct Trained {
  std::vector<std::string> names;
  std::vector<std::size_t> ranks;
  std::vector<bool> decays;
  std::vector<xt::xarray<double>> values;
};

// Four steps of AdamW (or SGD with momentum) from the same weights and the same random grads.
Trained train(bool adamw, double weight_decay, DecayParams decay, DeviceOps<double>* device) {
  Rng rng(5);
  Transformer<double> model(decay_config(), rng);
  if (device) model.to(*device);
  const ParameterList<double> params = model.parameters();
  std::unique_ptr<Optimizer<double>> opt;
  if (adamw)
    opt = std::make_unique<AdamW<double>>(params,
                                          AdamWOptions{1e-2, 0.9, 0.95, 1e-8, weight_decay, decay});
  else
    opt = std::make_unique<SGD<double>>(params, SgdOptions{0.1, 0.9, weight_decay, decay});
  Rng grads(6);
  for (int step = 0; step < 4; ++step) {
    for (const auto& p : params) {
      for (auto& g : p.param->grad) g = grads.normal();
      if (device)
        device->upload(p.param->device_grad.data(), p.param->grad.data(),
                       p.param->size() * sizeof(double));
    }
    opt->step();
  }
  model.copy_to_host();
  Trained t;
  for (std::size_t i = 0; i < params.size(); ++i) {
    t.names.push_back(params[i].name);
    t.ranks.push_back(params[i].param->value.dimension());
    t.decays.push_back(opt->decays(i));
    t.values.push_back(params[i].param->value);
  }
  return t;
}

void check_groups(bool adamw, DeviceOps<double>* device) {
  const Trained none = train(adamw, 0.0, DecayParams::all, device);
  const Trained all = train(adamw, 0.5, DecayParams::all, device);
  const Trained matrices = train(adamw, 0.5, DecayParams::matrices, device);
  std::size_t decayed = 0, kept = 0;
  for (std::size_t i = 0; i < none.values.size(); ++i) {
    CAPTURE(matrices.names[i]);
    // The references differ everywhere, so each comparison below could fail.
    CHECK(all.values[i] != none.values[i]);
    CHECK(all.decays[i]);
    if (matrices.ranks[i] >= 2) {
      CHECK(matrices.decays[i]);
      CHECK(matrices.values[i] == all.values[i]);  // exactly: the decayed update
      ++decayed;
    } else {
      CHECK_FALSE(matrices.decays[i]);
      CHECK(matrices.values[i] == none.values[i]);  // exactly: the decay-free update
      ++kept;
    }
  }
  // tables (token, position), 6 weights per block and the head; ln1, ln2 (gamma, beta), q_norm,
  // k_norm (gamma, beta), log_scale, fc1.b, fc2.b per block, and ln_f's gamma and beta.
  CHECK(decayed == 2 + 2 * 6 + 1);
  CHECK(kept == 2 * 11 + 2);
}

}  // namespace

TEST_CASE("decay_params matrices: AdamW decays exactly the rank >= 2 parameters (CPU)") {
  check_groups(true, nullptr);
}

TEST_CASE("decay_params matrices: SGD decays exactly the rank >= 2 parameters (CPU)") {
  check_groups(false, nullptr);
}

TEST_CASE("decay_params matrices: on the emulated device, one arena, as on the CPU") {
  const auto device = emulated::make_device_ops<double>();  // outlives the models on it
  check_groups(true, device.get());
  check_groups(false, device.get());
  for (const bool adamw : {true, false}) {
    CAPTURE(adamw);
    const Trained cpu = train(adamw, 0.5, DecayParams::matrices, nullptr);
    const Trained dev = train(adamw, 0.5, DecayParams::matrices, device.get());
    for (std::size_t i = 0; i < cpu.values.size(); ++i) {
      CAPTURE(cpu.names[i]);
      CHECK(test::rel_error(dev.values[i], cpu.values[i]) < 1e-14);
    }
  }
}

TEST_CASE("decay_params: names, and a bad one is refused naming the field") {
  CHECK(parse_decay_params("all") == DecayParams::all);
  CHECK(parse_decay_params("matrices") == DecayParams::matrices);
  CHECK(to_string(DecayParams::matrices) == "matrices");
  CHECK(to_string(DecayParams::all) == "all");
  CHECK_THROWS_WITH_AS(parse_decay_params("2d"),
                       "optimizer: decay_params expected all|matrices, got 2d",
                       std::invalid_argument);
}
