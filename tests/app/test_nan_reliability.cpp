// Numerical faults: a NaN injected into a weight is reported naming the layer (and the head, in
// attention), a diverged run names its step, and a non-finite value never reaches a saved
// checkpoint.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>

#include <xtensor/xarray.hpp>

#include "attnlab/app/trainer.hpp"
#include "attnlab/io/checkpoint.hpp"
#include "attnlab/nn/transformer.hpp"
#include "temp_dir.hpp"

using namespace attnlab;
using attnlab::app::Context;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TransformerConfig nan_config() {
  TransformerConfig c;
  c.vocab_sizes = {6};
  c.max_len = 8;
  c.block.attention.d_model = 16;
  c.block.attention.heads = 4;  // D = 4: head h owns columns [4h, 4h + 4) of w_q
  c.block.d_ff = 32;
  c.layers = 2;
  c.out_vocab = 6;
  return c;
}

std::vector<TokenIds> some_tokens() {
  return {TokenIds{{0, 1, 2, 3, 4}, {5, 4, 3, 2, 1}}};
}

Parameter<float>& find_param(const ParameterList<float>& params, const std::string& name) {
  for (const auto& p : params) {
    if (p.name == name) return *p.param;
  }
  FAIL("no parameter " << name);
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("NaN in one head's query weights: reported as that layer and head, never saved") {
  test::TempDir dir;
  const auto path = dir.file("model.safetensors");
  Rng rng(11);
  Transformer<float> model(nan_config(), rng);
  model.set_nonfinite_check(true);
  const auto params = model.parameters();
  CheckpointMeta meta;
  meta.step = 7;
  save_checkpoint(path, params, {}, meta);  // a good checkpoint from before the fault
  const xt::xarray<float> good_w_q = find_param(params, "blocks.1.attn.w_q").value;

  model.forward(some_tokens());
  CHECK_FALSE(model.first_nonfinite());

  // Column 9 of w_q feeds only head 2's queries (D = 4).
  auto& w_q = find_param(params, "blocks.1.attn.w_q");
  w_q.value(3, 9) = kNaN;
  model.forward(some_tokens());
  REQUIRE(model.first_nonfinite());
  CHECK(*model.first_nonfinite() == "blocks.1.attn (head 2)");

  // Saving is refused, naming the parameter and where the NaN is; the good checkpoint survives.
  CHECK_THROWS_WITH_AS(
      save_checkpoint(path, params, {},
                      CheckpointMeta{.model_config = "", .step = 8, .rng = {}, .extra = {}}),
      doctest::Contains("refusing to save: parameter 'blocks.1.attn.w_q' has the "
                        "non-finite value nan at flat index 57"),
      CheckpointError);
  Rng other(12);
  Transformer<float> restored(nan_config(), other);
  const auto loaded = load_checkpoint<float>(path, restored.parameters());
  CHECK(loaded.meta.step == 7);
  CHECK(find_param(restored.parameters(), "blocks.1.attn.w_q").value == good_w_q);
}

TEST_CASE("NaN in an embedding row or the head: the first stage that saw it is named") {
  Rng rng(13);
  Transformer<float> model(nan_config(), rng);
  model.set_nonfinite_check(true);
  const auto params = model.parameters();
  SUBCASE("an embedding row of a token in the batch") {
    find_param(params, "embed.fields.0.table").value(4, 0) = kNaN;
    model.forward(some_tokens());
    REQUIRE(model.first_nonfinite());
    CHECK(*model.first_nonfinite() == "embed");
  }
  SUBCASE("an embedding row of a token not in the batch is harmless") {
    Rng r(1);
    Transformer<float> m(nan_config(), r);
    m.set_nonfinite_check(true);
    find_param(m.parameters(), "embed.fields.0.table").value(5, 0) = kNaN;
    m.forward({TokenIds{{0, 1, 2, 3, 4}}});
    CHECK_FALSE(m.first_nonfinite());
  }
  SUBCASE("the output head") {
    find_param(params, "head.w").value(0, 0) = kNaN;
    model.forward(some_tokens());
    REQUIRE(model.first_nonfinite());
    CHECK(*model.first_nonfinite() == "head");
  }
}

TEST_CASE("a diverging run names its step, layer and head, and never overwrites a checkpoint") {
  test::TempDir dir;
  app::TrainConfig c;
  c.task.kind = app::TaskKind::sort;
  c.task.symbols = 6;
  c.task.length = 5;
  c.model.block.attention.d_model = 16;
  c.model.block.attention.heads = 2;
  c.model.layers = 1;
  c.optimizer = OptimizerKind::sgd;
  c.momentum = 0;
  c.lr = 1e-3;
  c.schedule = LrScheduleKind::constant;
  c.steps = 2;
  c.batch = 4;
  c.eval_every = 1;
  c.eval_size = 8;
  c.save_every = 1;
  c.progress = false;
  const Context one_thread{.threads = 1};
  c.out = dir.file("run");
  // A healthy run leaves a checkpoint ...
  REQUIRE_FALSE(app::train_model(c, one_thread).diverged);
  const auto ckpt = c.out + "/model.safetensors";
  REQUIRE(std::filesystem::exists(ckpt));
  const auto before = load_safetensors(ckpt);

  // ... that a diverging run into the same directory must not replace.
  c.lr = 1e30;  // the first update blows the weights up
  c.steps = 6;
  const auto result = app::train_model(c, one_thread);
  REQUIRE(result.diverged);
  INFO("diverged at step " << result.diverged_step << " in " << result.diverged_where);
  CHECK(result.diverged_step >= 1);
  CHECK(result.diverged_step <= c.steps);
  CHECK(result.diverged_where.starts_with("blocks.0.attn (head "));

  const auto after = load_safetensors(ckpt);
  CHECK(after.metadata == before.metadata);
  REQUIRE(after.tensors.size() == before.tensors.size());
  for (std::size_t i = 0; i < after.tensors.size(); ++i) {
    const auto& t = after.tensors[i];
    CAPTURE(t.name);
    CHECK(t.data == before.tensors[i].data);
    if (t.dtype != Dtype::F32) continue;
    const auto values = tensor_values<float>(t, ckpt);
    CHECK(std::all_of(values.begin(), values.end(), [](float x) { return std::isfinite(x); }));
  }
}
