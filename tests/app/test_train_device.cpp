// `attnlab train --device cuda` end to end, on the emulated device (attnlab/backends/emulated.hpp)
// everywhere and on the CUDA backend where a GPU exists: the trainer's device path follows the CPU
// run, writes checkpoints the CPU side reads, resumes across devices, and refuses a missing device.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attnlab/app/context.hpp"
#include "attnlab/app/trainer.hpp"
#include "attnlab/backends/emulated.hpp"
#include "attnlab/cuda.hpp"
#include "cuda_helpers.hpp"
#include "temp_dir.hpp"

using namespace attnlab;
using attnlab::app::Backend;
using attnlab::app::Context;
using attnlab::app::parse_backend;

namespace {

// One thread: the CPU and device runs compare at a fixed thread count.
const Context kCpu{.threads = 1, .backend = Backend::cpu};
const Context kCuda{.threads = 1, .backend = Backend::cuda};

// The CUDA backend `ops` (null: one the run makes on the real device).
Context on_cuda(DeviceOps<float>* ops) {
  return {.threads = 1, .backend = Backend::cuda, .device = ops};
}

app::TrainConfig tiny_run(const std::string& out) {
  app::TrainConfig c;
  c.task.kind = app::TaskKind::recall;
  c.task.keys = 8;
  c.task.values = 8;
  c.task.pairs = 4;
  c.model.block.attention.d_model = 16;
  c.model.block.attention.heads = 2;
  c.model.layers = 2;
  c.model.block.attn_only = false;
  c.model.block.d_ff = 32;
  c.lr = 1e-2;
  c.clip = 1.0;
  c.warmup = 2;
  c.steps = 24;
  c.batch = 8;
  c.eval_every = 8;
  c.eval_size = 32;
  c.progress = false;
  c.out = out;
  return c;
}

// Column `name` of a metrics.csv, one value per logged row.
std::vector<double> column(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  std::string line, cell;
  std::getline(in, line);
  std::stringstream header(line);
  int index = -1;
  for (int i = 0; std::getline(header, cell, ','); ++i)
    if (cell == name) index = i;
  REQUIRE(index >= 0);
  std::vector<double> out;
  while (std::getline(in, line)) {
    std::stringstream row(line);
    for (int i = 0; std::getline(row, cell, ','); ++i)
      if (i == index) out.push_back(cell == "nan" ? NAN : std::stod(cell));
  }
  return out;
}

// tolerance: relative, per logged metric (the emulated device differs from the CPU only in the
// kernels' summation order; a GPU adds FMA contraction and cuBLAS's blocking).
void check_follows_cpu(DeviceOps<float>* ops, double tolerance) {
  test::TempDir dir;
  auto cpu = tiny_run(dir.file("cpu"));
  const auto r_cpu = app::train_model(cpu, kCpu);
  auto gpu = tiny_run(dir.file("device"));
  const auto r_dev = app::train_model(gpu, on_cuda(ops));
  CHECK(r_dev.device != "cpu");
  CHECK(r_cpu.device == "cpu");
  REQUIRE_FALSE(r_dev.diverged);
  CHECK(r_dev.steps_done == 24);
  double largest = 0;  // the largest relative difference over the compared columns
  for (const char* name :
       {"loss", "eval_loss", "eval_acc", "l0_wq_grad_norm", "l1_wk_norm", "l0h1_entropy"}) {
    INFO("column " << name);
    const auto a = column(cpu.out + "/metrics.csv", name);
    const auto b = column(gpu.out + "/metrics.csv", name);
    REQUIRE(a.size() == b.size());
    REQUIRE(a.size() == 4);  // steps 0, 8, 16, 24
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(a[i])) {
        CHECK(std::isnan(b[i]));  // the step-0 row has no training loss
      } else {
        const double diff = std::abs(a[i] - b[i]) / std::max(1.0, std::abs(a[i]));
        CHECK(diff <= tolerance);
        largest = std::max(largest, diff);
      }
    }
  }
  MESSAGE("train on " << r_dev.device << " vs cpu: largest metrics difference " << largest);
  CHECK(std::abs(r_dev.final_eval_loss - r_cpu.final_eval_loss) <=
        tolerance * r_cpu.final_eval_loss);
  CHECK(r_dev.final_eval_loss < r_dev.init_eval_loss);  // it trains

  // The device run's checkpoint is an ordinary one: the CPU evaluates it to the same loss.
  const auto report = app::evaluate_run(gpu.out);
  CHECK(std::abs(report.loss - r_dev.final_eval_loss) <= 1e-6 * r_dev.final_eval_loss);

  // A device run stopped at step 12 and resumed on the CPU ends where an unbroken device run
  // ended, to float tolerance (optimizer state and data stream travel in the checkpoint).
  auto half = tiny_run(dir.file("half"));
  half.stop_after = 12;
  CHECK(app::train_model(half, on_cuda(ops)).interrupted);
  auto rest = tiny_run(dir.file("half"));
  rest.resume = half.out;
  const auto r_rest = app::train_model(rest, kCpu);
  CHECK(r_rest.steps_done == 24);
  CHECK(std::abs(r_rest.final_eval_loss - r_dev.final_eval_loss) <=
        tolerance * r_dev.final_eval_loss);
}

}  // namespace

TEST_CASE("train --device cuda (emulated device): follows the CPU run, checkpoints interchange") {
  const auto device = emulated::make_device_ops<float>();
  auto& ops = *device;
  check_follows_cpu(&ops, 1e-5);
}

TEST_CASE("train --device cuda (CUDA): follows the CPU run, checkpoints interchange") {
  if (!test::cuda_device_or_skip()) return;
  check_follows_cpu(nullptr, 2e-3);
}

// Packed documents on the device: each layer runs the backend's document mask program on ids it
// uploads (attnlab/nn/multi_head_attention.hpp, SequenceLayout), RoPE restarting per document.
TEST_CASE("train --device cuda (emulated device): packed documents follow the CPU run") {
  const auto device = emulated::make_device_ops<float>();
  test::TempDir dir;
  const auto packed = [&](const std::string& out) {
    auto c = tiny_run(out);
    c.task.kind = app::TaskKind::text;
    c.data_file = std::string(ATTNLAB_TEST_DATA_DIR) + "/text/hamlet_excerpt.txt";
    c.task.block = 24;
    c.model.positions = PositionEncoding::rope;
    c.model.block.attention.sdpa.causal = true;
    c.pack_documents = "\n\n";
    c.pack_rope_restart = true;
    c.steps = 12;
    c.eval_every = 6;
    c.eval_size = 16;
    return c;
  };
  auto cpu = packed(dir.file("cpu"));
  const auto r_cpu = app::train_model(cpu, kCpu);
  auto gpu = packed(dir.file("device"));
  const auto r_dev = app::train_model(gpu, on_cuda(device.get()));
  REQUIRE_FALSE(r_dev.diverged);
  CHECK(r_dev.device != "cpu");
  const auto a = column(cpu.out + "/metrics.csv", "eval_loss");
  const auto b = column(gpu.out + "/metrics.csv", "eval_loss");
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(a[i] - b[i]) <= 1e-5 * a[i]);
  }
  CHECK(r_dev.final_eval_loss < r_dev.init_eval_loss);

  // Packing changes the run: without it the same run ends elsewhere.
  auto plain = packed(dir.file("plain"));
  plain.pack_documents.clear();
  plain.pack_rope_restart = false;
  const auto r_plain = app::train_model(plain, kCpu);
  CHECK(std::abs(r_plain.final_eval_loss - r_dev.final_eval_loss) > 1e-3);
  CHECK(emulated::live_allocations(*device) == 0);
}

TEST_CASE("train --device: bad values and a missing device are refused before anything runs") {
  test::TempDir dir;
  auto c = tiny_run(dir.file("run"));
  CHECK_THROWS_WITH_AS(parse_backend("tpu", "train", "device"),
                       "train: device expected 'cpu' or 'cuda', got 'tpu'", std::invalid_argument);
  CHECK_THROWS_WITH_AS(app::train_model(c, Context{.threads = 0}),
                       "train: threads expected >= 1, got 0", std::invalid_argument);
  if (!cuda_available()) {
    CHECK_THROWS_WITH_AS(app::train_model(c, kCuda), doctest::Contains("usable CUDA device"),
                         std::invalid_argument);
  }
  CHECK_FALSE(std::filesystem::exists(c.out + "/metrics.csv"));
}

TEST_CASE("train --device cuda (emulated device): a divergence is located and never saved") {
  const auto device = emulated::make_device_ops<float>();
  auto& ops = *device;
  test::TempDir dir;
  auto c = tiny_run(dir.file("run"));
  c.model.block.attention.sdpa.scale = 1e38;  // overflows the attention logits at the first step
  const auto r = app::train_model(c, on_cuda(&ops));
  CHECK(r.diverged);
  CHECK(r.diverged_step == 1);
  CHECK(r.diverged_where.find("blocks.0.attn") == 0);  // found by replaying on the host model
  CHECK_FALSE(std::filesystem::exists(c.out + "/model.safetensors"));
  CHECK(emulated::live_allocations(ops) == 0);
}
