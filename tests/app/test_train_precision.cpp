// bf16 mixed precision in training (TrainConfig::precision, lib/README.md "Mixed precision"): a
// bf16 run's gemms round their operands to bfloat16 (so its bits differ from fp32's) while its
// loss follows fp32's closely, the same bits for a fixed thread count, the process returns to fp32
// gemms after the run, summary.json says how bf16 ran, tf32 is refused on the CPU and a misspelt
// value everywhere; on a device bf16 and tf32 runs follow fp32's; the CLI names the flag and says
// when bf16 is emulated.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "attnlab/app/context.hpp"
#include "attnlab/app/run_config.hpp"
#include "attnlab/app/trainer.hpp"
#include "attnlab/backends/emulated.hpp"
#include "attnlab/blas.hpp"
#include "temp_dir.hpp"

using namespace attnlab;
using attnlab::app::Backend;
using attnlab::app::Context;

namespace {

// A 2-layer recall model with an MLP: every kind of gemm of a step (projections, attention's
// scores and values, the MLP, the head) in both passes.
app::TrainConfig recall_run(const std::string& out, const std::string& precision) {
  app::TrainConfig c;
  c.task.kind = app::TaskKind::recall;
  c.task.keys = 8;
  c.task.values = 8;
  c.task.pairs = 4;
  c.model.block.attention.d_model = 32;
  c.model.block.attention.heads = 2;
  c.model.block.attn_only = false;
  c.model.layers = 2;
  c.lr = 1e-2;
  c.steps = 80;
  c.batch = 16;
  c.eval_every = 40;
  c.eval_size = 64;
  c.progress = false;
  c.precision = parse_gemm_precision(precision, "precision");
  c.out = out;
  return c;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("precision bf16: a run follows fp32's loss, with bf16's own bits, the same each time") {
  test::TempDir dir;
  const Context two{.threads = 2};
  const app::TrainResult fp32 = app::train_model(recall_run(dir.file("fp32"), "fp32"), two);
  const app::TrainResult bf16 = app::train_model(recall_run(dir.file("bf16"), "bf16"), two);
  const app::TrainResult again = app::train_model(recall_run(dir.file("again"), "bf16"), two);
  CHECK(blas::gemm_precision() == GemmPrecision::fp32);  // the run's scope has ended
  REQUIRE(bf16.steps_done == 80);
  CHECK(fp32.final_eval_loss < 0.9 * fp32.init_eval_loss);  // both train
  CHECK(bf16.final_eval_loss < 0.9 * bf16.init_eval_loss);
  // Rounded operands: not fp32's bits. The losses stay within 2% of each other after 80 steps
  // (bf16's relative rounding is 2^-9 per operand; measured: well inside this).
  CHECK(bf16.final_train_loss != fp32.final_train_loss);
  CHECK(bf16.init_eval_loss == doctest::Approx(fp32.init_eval_loss).epsilon(1e-3));
  CHECK(bf16.final_eval_loss == doctest::Approx(fp32.final_eval_loss).epsilon(0.02));
  CHECK(again.final_train_loss == bf16.final_train_loss);  // bit-identical at a fixed count
  CHECK(again.final_eval_loss == bf16.final_eval_loss);

  const auto summary = nlohmann::json::parse(slurp(dir.file("bf16") + "/summary.json"));
  CHECK(summary["gemm_precision"] == "bf16");
  CHECK(summary["bf16_gemm"] == blas_info().bf16_engine_name);
  CHECK(summary["config"]["precision"] == "bf16");
  const auto plain = nlohmann::json::parse(slurp(dir.file("fp32") + "/summary.json"));
  CHECK(plain["gemm_precision"] == "fp32");
  CHECK_FALSE(plain.contains("bf16_gemm"));
}

TEST_CASE("precision: a misspelt value and tf32 on the CPU backend are refused by name") {
  test::TempDir dir;
  // A TrainConfig holds a GemmPrecision: a misspelt name is refused where text becomes one.
  app::TrainConfig bad = recall_run(dir.file("bad"), "fp32");
  CHECK_THROWS_WITH_AS(app::read_json_text(R"({"precision": "fp16"})", bad),
                       doctest::Contains("precision"), std::invalid_argument);
  app::TrainConfig tf32 = recall_run(dir.file("tf32"), "tf32");
  tf32.steps = 2;
  CHECK_THROWS_WITH_AS(app::train_model(tf32, Context{.threads = 1}),
                       "train: precision expected fp32 or bf16 on the CPU backend (tf32 runs on a "
                       "CUDA device), got 'tf32'",
                       std::invalid_argument);
  CHECK(blas::gemm_precision() == GemmPrecision::fp32);
}

// On a device the precision is its backend's (DeviceOps::set_precision): bf16 GEMMs and the
// tensor-core attention (head dim 64 here), tf32 GEMMs. Each run follows the device's fp32 run
// with its own bits, the device is put back to fp32 after it, and the process's CPU gemms are
// never switched.
TEST_CASE("precision bf16 and tf32 on a device (emulated): runs follow fp32's loss") {
  test::TempDir dir;
  const auto device = emulated::make_device_ops<float>();
  const Context on_device{.threads = 1, .backend = Backend::cuda, .device = device.get()};
  const auto run = [&](const std::string& precision) {
    app::TrainConfig c = recall_run(dir.file(precision), precision);
    c.model.block.attention.d_model = 128;  // 2 heads of 64: the tensor-core kernels' head dim
    c.steps = 20;
    c.batch = 8;
    c.eval_every = 10;
    c.eval_size = 32;
    c.lr = 3e-3;
    return app::train_model(c, on_device);
  };
  const app::TrainResult fp32 = run("fp32");
  const app::TrainResult bf16 = run("bf16");
  const app::TrainResult tf32 = run("tf32");
  CHECK(device->precision() == GemmPrecision::fp32);
  CHECK(blas::gemm_precision() == GemmPrecision::fp32);
  CHECK(emulated::live_allocations(*device) == 0);
  REQUIRE(bf16.steps_done == 20);
  REQUIRE(tf32.steps_done == 20);
  CHECK(fp32.final_eval_loss < fp32.init_eval_loss);
  MESSAGE("eval loss after 20 steps: fp32 " << fp32.final_eval_loss << ", bf16 "
                                            << bf16.final_eval_loss << ", tf32 "
                                            << tf32.final_eval_loss);
  CHECK(bf16.final_train_loss != fp32.final_train_loss);
  CHECK(tf32.final_train_loss != fp32.final_train_loss);
  CHECK(tf32.final_train_loss != bf16.final_train_loss);
  CHECK(bf16.final_eval_loss == doctest::Approx(fp32.final_eval_loss).epsilon(0.02));
  CHECK(tf32.final_eval_loss == doctest::Approx(fp32.final_eval_loss).epsilon(0.005));
  const auto summary = nlohmann::json::parse(slurp(dir.file("bf16") + "/summary.json"));
  CHECK(summary["gemm_precision"] == "bf16");
  CHECK_FALSE(summary.contains("bf16_gemm"));  // the CPU's bf16 engine did not run
}

TEST_CASE("cli: --precision bf16 trains, says how its gemms run, and a bad value exits 2") {
  test::TempDir dir;
  const std::string base = std::string("env -u OPENBLAS_CORETYPE '") + ATTNLAB_CLI_PATH +
                           "' train --task recall --keys 8 --values 8 --pairs 4 --d-model 16 "
                           "--heads 1 --batch 8 --eval-size 16 --threads 1 --quiet --steps 3";
  const auto run = [&](const std::string& args, const std::string& name) {
    const std::string cmd = base + " " + args + " >'" + dir.file(name + ".out") + "' 2>'" +
                            dir.file(name + ".err") + "'";
    const int raw = std::system(cmd.c_str());
    return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  };
  REQUIRE(run("--precision bf16 --out '" + dir.file("run") + "'", "ok") == 0);
  const std::string out = slurp(dir.file("ok.out"));
  CHECK(out.find("precision: bf16 gemms, " + blas_info().bf16_engine_name) != std::string::npos);
  CHECK((out.find("bf16 is not faster here") != std::string::npos) ==
        (blas_info().bf16_engine == Bf16Engine::emulated));
  CHECK(run("--precision fp16 --out '" + dir.file("bad") + "'", "bad") == 2);
  const std::string err = slurp(dir.file("bad.err"));
  CHECK(err.rfind("attnlab: error: ", 0) == 0);
  CHECK(err.find("--precision") != std::string::npos);
}
