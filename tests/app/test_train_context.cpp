// The trainer and the study take their run control from an explicit Context
// (attnlab/app/context.hpp): the stop flag belongs to the caller and ends a run before its next
// step with a checkpoint; a run sets its thread count on its own thread only (the caller's count is
// untouched afterwards); the study's jobs, each with a context of its own, give the same results on
// 1 or 2 std::threads. Under the tsan preset these cases also check that the runs share no
// unsynchronised state.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "attnlab/app/context.hpp"
#include "attnlab/app/study.hpp"
#include "attnlab/app/trainer.hpp"
#include "attnlab/threads.hpp"
#include "temp_dir.hpp"

using namespace attnlab;
using attnlab::app::Context;

namespace {

app::TrainConfig tiny_run(const std::string& out, int steps) {
  app::TrainConfig c;
  c.task.kind = app::TaskKind::recall;
  c.task.keys = 8;
  c.task.values = 8;
  c.task.pairs = 4;
  c.model.block.attention.d_model = 16;
  c.steps = steps;
  c.warmup = 0;
  c.batch = 4;
  c.eval_every = 5;
  c.eval_size = 8;
  c.progress = false;
  c.out = out;
  return c;
}

}  // namespace

TEST_CASE("train: the context's stop flag ends the run before its next step, with a checkpoint") {
  test::TempDir dir;
  std::atomic<bool> stop{true};  // set before the run: it stops before step 0
  const app::TrainResult before =
      app::train_model(tiny_run(dir.file("before"), 50), Context{.threads = 1, .stop = &stop});
  CHECK(before.interrupted);
  CHECK(before.steps_done == 0);
  CHECK(std::filesystem::exists(dir.file("before") + "/model.safetensors"));

  // Set from another thread while the run trains (the app's signal handler does the same).
  stop.store(false);
  const auto out = dir.file("during");
  const int steps = 1000000;  // never reached: the flag ends the run
  app::TrainResult during;
  std::thread run([&] {
    during = app::train_model(tiny_run(out, steps), Context{.threads = 1, .stop = &stop});
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(out + "/metrics.csv") &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop.store(true);
  run.join();
  CHECK(during.interrupted);
  CHECK(during.steps_done < steps);
  CHECK(std::filesystem::exists(out + "/model.safetensors"));
}

TEST_CASE("train: a run's thread count holds on its thread for the run only") {
  test::TempDir dir;
  const ThreadScope caller(3);
  const auto r = app::train_model(tiny_run(dir.file("run"), 4), Context{.threads = 2});
  CHECK(r.steps_done == 4);
  CHECK(num_threads() == 3);  // the run's count did not leak into its caller's
}

TEST_CASE("study: jobs on 2 threads, each with its own context, equal the jobs on 1 thread") {
  test::TempDir dir;
  const app::StudyPlan plan = app::study_preset("micro");
  const ThreadScope caller(3);
  app::StudyOptions options;
  options.progress = false;
  options.jobs = 1;
  options.out = dir.file("one");
  const auto one = app::run_study(plan, options, Context{});
  options.jobs = 2;
  options.out = dir.file("two");
  const auto two = app::run_study(plan, options, Context{});
  CHECK(num_threads() == 3);
  REQUIRE(one.runs.size() == 12);
  REQUIRE(two.runs.size() == one.runs.size());
  for (std::size_t i = 0; i < one.runs.size(); ++i) {
    CAPTURE(i);
    CHECK(two.runs[i].dir == one.runs[i].dir);
    CHECK(two.runs[i].diverged == one.runs[i].diverged);
    // Bit-identical: every job ran at 1 thread, whichever std::thread ran it.
    if (!one.runs[i].diverged) CHECK(two.runs[i].final_eval_loss == one.runs[i].final_eval_loss);
    CHECK(two.runs[i].init_eval_loss == one.runs[i].init_eval_loss);
  }
}

TEST_CASE("train: a resume whose recipe differs names the nested key and both values") {
  test::TempDir dir;
  const auto out = dir.file("run");
  REQUIRE(app::train_model(tiny_run(out, 2), Context{.threads = 1}).steps_done == 2);
  app::TrainConfig again = tiny_run(out, 4);
  again.resume = out;
  again.model.block.attention.d_model = 32;
  CHECK_THROWS_WITH_AS(app::train_model(again, Context{.threads = 1}),
                       doctest::Contains("resume: model.block.attention.d_model"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(app::train_model(again, Context{.threads = 1}),
                       doctest::Contains("expected 16 (the saved run's"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(app::train_model(again, Context{.threads = 1}), doctest::Contains("got 32"),
                       std::invalid_argument);
}
