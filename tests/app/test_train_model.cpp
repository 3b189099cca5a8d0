// The trainer's model adapter: every scaling mode starts from the same weights for a seed (the
// study's control), the premise Var(q·k) ≈ d_k holds at step 0 with d_k decoupled from d_model,
// and the exposed logits are the scaled dot products.
#include <doctest/doctest.h>

#include <cmath>

#include "attnlab/app/model.hpp"
#include "attnlab/app/run_config.hpp"

using namespace attnlab;
using namespace attnlab::app;

namespace {
TransformerConfig study_spec(Scaling mode, int d_k, const TaskShape& shape) {
  TransformerConfig s = default_model();
  s.block.attention.d_model = 64;
  s.block.attention.heads = 1;
  s.block.attention.d_k = static_cast<std::size_t>(d_k);
  s.block.attention.d_v = 64;
  s.block.attn_only = true;
  s.positions = PositionEncoding::none;
  s.block.attention.sdpa.scaling = mode;
  return resolve_model(s, shape);
}
}  // namespace

TEST_CASE("app::Model: one seed gives every scaling mode identical initial weights") {
  TaskConfig task;
  const TaskShape shape = task_shape(task);
  Rng a(11), b(11), c(11);
  Model none(study_spec(Scaling::none, 256, shape), a);
  Model sqrt_dk(study_spec(Scaling::sqrt_dk, 256, shape), b);
  Model dk(study_spec(Scaling::dk, 256, shape), c);
  const auto pn = none.parameters(), ps = sqrt_dk.parameters(), pd = dk.parameters();
  REQUIRE(pn.size() == ps.size());
  REQUIRE(pn.size() == pd.size());
  for (std::size_t i = 0; i < pn.size(); ++i) {
    CAPTURE(pn[i].name);
    CHECK(pn[i].param->value == ps[i].param->value);
    CHECK(pn[i].param->value == pd[i].param->value);
  }
}

TEST_CASE("app::Model: Var(q.k) ~ d_k at step 0, and the logits are the scaled dots") {
  TaskConfig task;
  const TaskShape shape = task_shape(task);
  Rng data(3);
  const Batch batch = generate_batch(task, 32, data);
  for (int d_k : {16, 256}) {
    Rng init(5);
    Model model(study_spec(Scaling::sqrt_dk, d_k, shape), init);
    model.forward(batch);
    const auto dots = model.attention_dots(0);
    const auto logits = model.attention_logits(0);
    double mean = 0, sq = 0;
    for (float x : dots) mean += x;
    mean /= static_cast<double>(dots.size());
    for (float x : dots) sq += (x - mean) * (x - mean);
    const double var = sq / static_cast<double>(dots.size() - 1);
    CAPTURE(d_k);
    CHECK(var / d_k == doctest::Approx(1.0).epsilon(0.3));
    const double s = 1.0 / std::sqrt(static_cast<double>(d_k));
    for (std::size_t i = 0; i < dots.size(); i += 97)
      CHECK(logits.data()[i] == doctest::Approx(dots.data()[i] * s).epsilon(1e-5));
    CHECK(model.w_q_name(0) == "blocks.0.attn.w_q");
  }
}
