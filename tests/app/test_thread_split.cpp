// The batch-parallel training step (TrainConfig::thread_split "batch", lib/README.md "Threads in
// the training step"): each thread trains its part of the batch through the whole model, and the
// step equals gradient accumulation over those parts at one thread, dropout masks included; a
// fixed thread count gives the same bits every time.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

#include "attnlab/app/context.hpp"
#include "attnlab/app/run_config.hpp"
#include "attnlab/app/trainer.hpp"
#include "temp_dir.hpp"

using namespace attnlab;
using attnlab::app::Context;

namespace {

// A recall run with an MLP, dropout in the attention and on the residuals, and masked targets
// (only the queries' answers are labelled): every part of the step's bookkeeping is exercised.
app::TrainConfig split_run(const std::string& out, int batch, int grad_accum) {
  app::TrainConfig c;
  c.task.kind = app::TaskKind::recall;
  c.task.keys = 8;
  c.task.values = 8;
  c.task.pairs = 4;
  c.model.block.attention.d_model = 16;
  c.model.block.attention.heads = 2;
  c.model.block.attention.dropout = 0.1;
  c.model.block.dropout = 0.1;
  c.model.block.attn_only = false;
  c.model.layers = 2;
  c.lr = 1e-2;
  c.steps = 6;
  c.warmup = 0;
  c.batch = batch;
  c.grad_accum = grad_accum;
  c.eval_every = 3;
  c.eval_size = 16;
  c.progress = false;
  c.out = out;
  return c;
}

}  // namespace

TEST_CASE("thread split: batch at 2 threads equals gradient accumulation over its parts at 1") {
  test::TempDir dir;
  for (int accum : {1, 2}) {
    CAPTURE(accum);
    const std::string tag = std::to_string(accum);
    // 2 threads, micro-batches of 8 rows: parts of 4 rows, the same pieces as 2·accum
    // micro-batches of 4 rows at 1 thread.
    const app::TrainResult split =
        app::train_model(split_run(dir.file("split" + tag), 8, accum), Context{.threads = 2});
    const app::TrainResult serial =
        app::train_model(split_run(dir.file("serial" + tag), 4, 2 * accum), Context{.threads = 1});
    CHECK(split.batch_threads == 2);
    CHECK(serial.batch_threads == 1);
    REQUIRE(split.steps_done == 6);
    CHECK(serial.final_train_loss < serial.init_eval_loss);  // a training run, not a constant
    CHECK(split.final_train_loss == doctest::Approx(serial.final_train_loss).epsilon(1e-5));
    CHECK(split.final_eval_loss == doctest::Approx(serial.final_eval_loss).epsilon(1e-5));
    CHECK(split.final_eval_acc == doctest::Approx(serial.final_eval_acc).epsilon(1e-9));
  }
}

TEST_CASE("thread split: a fixed thread count gives the same bits, and ops at 2 threads agrees") {
  test::TempDir dir;
  const auto run = [&](const std::string& name, app::ThreadSplit split) {
    app::TrainConfig c = split_run(dir.file(name), 8, 1);
    c.thread_split = split;
    // Without dropout: the two splits key their masks on different pieces of the batch.
    c.model.block.dropout = 0;
    c.model.block.attention.dropout = 0;
    return app::train_model(c, Context{.threads = 2});
  };
  const app::TrainResult a = run("a", app::ThreadSplit::batch),
                         b = run("b", app::ThreadSplit::batch),
                         ops = run("ops", app::ThreadSplit::ops);
  CHECK(a.final_train_loss == b.final_train_loss);  // bit-identical
  CHECK(a.final_eval_loss == b.final_eval_loss);
  CHECK(ops.batch_threads == 1);  // every op split its own work instead
  CHECK(ops.final_eval_loss == doctest::Approx(a.final_eval_loss).epsilon(1e-5));
}

TEST_CASE("thread split: at most one thread per row of the batch, and a bad value is named") {
  test::TempDir dir;
  app::TrainConfig one_row = split_run(dir.file("one"), 1, 1);
  one_row.steps = 2;
  CHECK(app::train_model(one_row, Context{.threads = 2}).batch_threads == 1);
  app::TrainConfig three = split_run(dir.file("three"), 3, 1);
  three.steps = 2;
  CHECK(app::train_model(three, Context{.threads = 4}).batch_threads == 3);

  // A TrainConfig holds a ThreadSplit: a bad name is refused where text becomes one.
  CHECK_THROWS_WITH_AS(parse_enum<app::ThreadSplit>("rows"), doctest::Contains("thread_split"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_enum<app::ThreadSplit>("rows"), doctest::Contains("'rows'"),
                       std::invalid_argument);
}
