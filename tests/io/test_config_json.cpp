// The nested model config: JSON round trip, overlay reading (a partial file keeps the defaults of
// the value it is read into), unknown keys and bad values named by their path, validation in one
// place with the owner's name and the field's path; and the app's run config on top of it,
// including the flat layout of run directories written before the nesting.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "attnlab/app/run_config.hpp"
#include "attnlab/io/config_json.hpp"

using namespace attnlab;
using json = nlohmann::json;

namespace {

TransformerConfig odd_config() {
  TransformerConfig c;
  c.vocab_sizes = {5, 3};
  c.max_len = 9;
  c.layers = 3;
  c.out_vocab = 4;
  c.positions = PositionEncoding::sinusoidal;
  c.block.d_ff = 20;
  c.block.norm = Norm::rmsnorm;
  c.block.attention.d_model = 12;
  c.block.attention.heads = 3;
  c.block.attention.d_k = 5;
  c.block.attention.qk_norm = true;
  c.block.attention.sdpa.scaling = Scaling::dk;
  c.block.attention.sdpa.scale = 0.25;
  c.block.attention.sdpa.causal = true;
  c.block.attention.sdpa.path = SdpaPath::fused;
  return c;
}

std::string error_of(const json& j) {
  TransformerConfig c;
  try {
    j.get_to(c);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("TransformerConfig JSON: nested, round trips every field, enums by name") {
  const TransformerConfig c = odd_config();
  const json j = c;
  CHECK(j.at("block").at("attention").at("heads") == 3);
  CHECK(j.at("block").at("attention").at("sdpa").at("scaling") == "dk");
  CHECK(j.at("block").at("norm") == "rmsnorm");
  CHECK(j.at("positions") == "sinusoidal");
  TransformerConfig back;
  j.get_to(back);
  CHECK(json(back) == j);
  CHECK(back.block.attention.sdpa.scale == 0.25);
  CHECK(back.vocab_sizes == c.vocab_sizes);
  // null clears an explicit scale.
  json k = j;
  k["block"]["attention"]["sdpa"]["scale"] = nullptr;
  k.get_to(back);
  CHECK_FALSE(back.block.attention.sdpa.scale.has_value());
}

TEST_CASE("TransformerConfig JSON: a partial object overlays, keeping the owner's defaults") {
  TransformerConfig c;  // C 64, H 4, F 256
  json::parse(R"({"layers": 5, "block": {"attention": {"heads": 8}}})").get_to(c);
  CHECK(c.layers == 5);
  CHECK(c.block.attention.heads == 8);
  CHECK(c.block.attention.d_model == 64);  // not BlockConfig{}'s 0
  CHECK(c.block.d_ff == 256);
}

TEST_CASE("TransformerConfig JSON: unknown keys and bad values name their path") {
  CHECK(error_of(json::parse(R"({"block": {"attention": {"sdpa": {"scal": 1}}}})"))
            .starts_with("config key 'block.attention.sdpa.scal': unknown key in SdpaConfig"));
  CHECK(error_of(json::parse(R"({"lyers": 1})"))
            .starts_with("config key 'lyers': unknown key in "
                         "TransformerConfig (expected one "
                         "of: vocab_sizes, max_len"));
  const std::string norm = error_of(json::parse(R"({"block": {"norm": "batchnorm"}})"));
  CHECK(norm.starts_with("config key 'block.norm': parse_norm"));
  CHECK(error_of(json::parse(R"({"block": {"attention": {"heads": "two"}}})"))
            .starts_with("config key 'block.attention.heads': "));
  CHECK(error_of(json::parse(R"({"block": 3})"))
            .starts_with("config key 'block': expected a JSON "
                         "object (BlockConfig)"));
}

TEST_CASE("Config validation: one rule per field, named with the owner and the path") {
  AttentionConfig a;
  a.d_model = 30;
  a.heads = 4;
  CHECK_THROWS_WITH_AS(a.validate(),
                       "AttentionConfig: d_model expected divisible by heads (4) when d_k is 0 "
                       "(derived), got 30",
                       std::invalid_argument);
  BlockConfig b;
  b.attention = a;
  b.d_ff = 8;
  CHECK_THROWS_WITH_AS(b.validate(),
                       "BlockConfig: attention.d_model expected divisible by heads (4) when d_k "
                       "is 0 (derived), got 30",
                       std::invalid_argument);
  TransformerConfig t = odd_config();
  t.block.attention.d_context = 7;
  CHECK_THROWS_WITH_AS(t.validate(),
                       "TransformerConfig: block.attention.d_context expected 0 (a Transformer "
                       "has no cross-attention), got 7",
                       std::invalid_argument);
}

TEST_CASE(
    "app run config: the effective config round trips, and the task decides the vocabularies") {
  app::TrainConfig c;
  c.task.kind = app::TaskKind::sort;
  c.task.symbols = 6;
  c.task.length = 5;
  c.lr = 0.0123;
  c.model.block.attention.heads = 2;
  c.model = app::resolve_model(c.model, app::task_shape(c.task));
  CHECK(c.model.max_len == 5);
  CHECK(c.model.block.d_ff == 256);  // 0 -> 4 * d_model
  app::TrainConfig back;
  app::read_json_text(app::to_json_text(c), back);
  CHECK(app::to_json_text(back) == app::to_json_text(c));
  // A value the task decides may be left out (0 / []) but not contradict the task.
  TransformerConfig wrong = c.model;
  wrong.max_len = 7;
  CHECK_THROWS_WITH_AS(app::resolve_model(wrong, app::task_shape(c.task)),
                       "TransformerConfig: max_len expected 5 (decided by the task) or 0, got 7",
                       std::invalid_argument);
}

TEST_CASE("app run config: the flat layout of a run written before the nesting still loads") {
  app::TrainConfig c;
  app::read_run_config(std::string(ATTNLAB_TEST_DATA_DIR) + "/legacy_run", c);
  CHECK(c.task.kind == app::TaskKind::sort);
  CHECK(c.task.symbols == 6);
  CHECK(c.model.block.attention.d_model == 8);
  CHECK(c.model.block.attention.heads == 2);
  CHECK(c.model.block.d_ff == 16);
  CHECK_FALSE(c.model.block.attn_only);
  CHECK(c.model.positions == PositionEncoding::learned);
  CHECK(c.model.block.attention.sdpa.scaling == Scaling::sqrt_dk);
  CHECK(c.steps == 4);
  CHECK(c.eval_size == 8);
}
