// Model checkpoints: round trips (float, double, optimizer state, metadata, RNG), every validation
// failure leaving the model untouched, refusal to save non-finite values, and crash safety (a
// writer killed at random points never leaves a torn checkpoint).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include "attnlab/io/checkpoint.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"
#include "temp_dir.hpp"

using namespace attnlab;

namespace {

// A stand-in for a Module: named parameters with fixed shapes.
template <class T>
struct TinyModel {
  Parameter<T> w, b;
  explicit TinyModel(std::size_t rows = 3, std::size_t cols = 4) {
    w.value = xt::zeros<T>({rows, cols});
    w.grad = xt::zeros<T>({rows, cols});
    b.value = xt::zeros<T>({cols});
    b.grad = xt::zeros<T>({cols});
  }
  ParameterList<T> params() { return {{"layer.w", &w}, {"layer.b", &b}}; }
  void fill_random(std::uint64_t seed) {
    Rng rng(seed);
    for (auto& x : w.value) x = static_cast<T>(rng.normal());
    for (auto& x : b.value) x = static_cast<T>(rng.normal());
  }
};

const std::string kConfig = R"({"layers":2,"heads":4,"d_model":64,"scaling":"sqrt_dk"})";

CheckpointMeta sample_meta(std::uint64_t step) {
  Rng rng(99);
  for (int i = 0; i < 3; ++i) rng.normal();  // leaves a cached normal draw in the state
  CheckpointMeta meta;
  meta.model_config = kConfig;
  meta.step = step;
  meta.rng = rng.state();
  meta.extra = {{"task", "copy"}};
  return meta;
}

template <class T>
TensorList<T> sample_optimizer_state(TinyModel<T>& m) {
  return {{"layer.w.exp_avg", xt::xarray<T>(m.w.value * T(0.1))},
          {"layer.w.exp_avg_sq", xt::xarray<T>(m.w.value * m.w.value)},
          {"layer.b.momentum", xt::xarray<T>({T(7), T(6), T(5), T(4)})}};
}

}  // namespace

TEST_CASE_TEMPLATE("checkpoint: round trip of parameters, optimizer state and metadata", T, float,
                   double) {
  test::TempDir dir;
  const auto path = dir.file("ckpt.safetensors");
  TinyModel<T> model;
  model.fill_random(1);
  const auto optim = sample_optimizer_state(model);
  save_checkpoint(path, model.params(), optim, sample_meta(1234));

  // The file is plain safetensors: parameters by name, optimizer state under "optim.".
  const auto raw = load_safetensors(path);
  REQUIRE(raw.find("layer.w") != nullptr);
  CHECK(raw.find("layer.w")->dtype == dtype_of<T>());
  CHECK(raw.find("optim.layer.w.exp_avg") != nullptr);
  CHECK(raw.metadata.at("format_version") == "attnlab-1");
  CHECK(raw.metadata.at("dtype") == std::string(to_string(dtype_of<T>())));

  TinyModel<T> fresh;
  TensorList<T> loaded_optim;  // empty: filled with every optimizer tensor of the file
  const auto loaded = load_checkpoint(path, fresh.params(), &loaded_optim);
  CHECK(fresh.w.value == model.w.value);
  CHECK(fresh.b.value == model.b.value);
  CHECK(loaded.meta.model_config == kConfig);
  CHECK(loaded.meta.step == 1234);
  CHECK(loaded.meta.extra == std::map<std::string, std::string>{{"task", "copy"}});
  REQUIRE(loaded.meta.rng.has_value());
  const auto expected_rng = *sample_meta(0).rng;
  CHECK(loaded.meta.rng->s0 == expected_rng.s0);
  CHECK(loaded.meta.rng->s1 == expected_rng.s1);
  CHECK(loaded.meta.rng->cached_bits == expected_rng.cached_bits);
  CHECK(loaded.meta.rng->has_cached == expected_rng.has_cached);
  CHECK(loaded.ignored_tensors.empty());
  REQUIRE(loaded_optim.size() == optim.size());
  for (const auto& [name, values] : optim) {
    const auto it = std::find_if(loaded_optim.begin(), loaded_optim.end(),
                                 [&](const auto& e) { return e.first == name; });
    REQUIRE(it != loaded_optim.end());
    CHECK(it->second == values);
  }

  // With an expected optimizer state, exactly those tensors are loaded.
  TensorList<T> expected = {{"layer.w.exp_avg", xt::xarray<T>(xt::zeros<T>({3, 4}))}};
  TinyModel<T> again;
  const auto partial = load_checkpoint(path, again.params(), &expected,
                                       CheckpointLoadOptions{.allow_extra_tensors = true});
  CHECK(expected[0].second == optim[0].second);
  CHECK(partial.ignored_tensors.size() == 2);

  // Without an optimizer, its tensors are skipped and listed.
  TinyModel<T> eval;
  const auto eval_load = load_checkpoint(path, eval.params());
  CHECK(eval_load.ignored_tensors.size() == 3);
  CHECK(eval.w.value == model.w.value);
}

TEST_CASE("checkpoint: a restored Rng continues the same sequence") {
  Rng rng(5);
  for (int i = 0; i < 11; ++i) rng.normal();
  const auto text = format_rng_state(rng.state());
  const auto parsed = parse_rng_state(text);
  REQUIRE(parsed.has_value());
  Rng restored(0);
  restored.set_state(*parsed);
  for (int i = 0; i < 5; ++i) CHECK(restored.normal() == rng.normal());
  for (const char* bad : {"", "1 2 3", "1 2 3 2", "1 2 3 1 5", "a b c 0", "-1 2 3 0", "0 0 5 0",
                          "1  2 3 0", "1 2 3 0 ", "99999999999999999999 1 1 0"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_rng_state(bad).has_value());
  }
}

TEST_CASE("checkpoint: every load failure names the file and leaves the model unchanged") {
  test::TempDir dir;
  const auto path = dir.file("ckpt.safetensors");
  TinyModel<float> saved;
  saved.fill_random(2);
  save_checkpoint(path, saved.params(), {}, sample_meta(10));

  TinyModel<float> target;
  target.fill_random(3);
  const auto w_before = target.w.value;
  const auto b_before = target.b.value;
  const auto expect_failure = [&](const std::string& file, ParameterList<float> params,
                                  const std::string& expected, TensorList<float>* optim = nullptr) {
    CAPTURE(expected);
    try {
      load_checkpoint(file, params, optim);
      FAIL("load_checkpoint accepted a bad checkpoint");
    } catch (const CheckpointError& e) {
      const std::string message = e.what();
      CAPTURE(message);
      CHECK(message.rfind(file + ": ", 0) == 0);
      CHECK(message.find(expected) != std::string::npos);
    }
    CHECK(target.w.value == w_before);
    CHECK(target.b.value == b_before);
  };
  // Rewrites the checkpoint's file with changed tensors or metadata.
  const auto variant = [&](const std::string& name, auto&& edit) {
    auto f = load_safetensors(path);
    edit(f);
    const auto out = dir.file(name);
    save_safetensors(out, f.tensors, f.metadata);
    return out;
  };

  SUBCASE("a parameter the file lacks") {
    Parameter<float> extra{xt::zeros<float>({2}), xt::zeros<float>({2})};
    auto params = target.params();
    params.push_back({"layer.extra", &extra});
    expect_failure(path, params, "missing 1 of 3 model parameters: 'layer.extra'");
  }
  SUBCASE("a parameter of another shape") {
    TinyModel<float> other(4, 3);
    ParameterList<float> params = {{"layer.w", &target.w}, {"layer.b", &other.b}};
    expect_failure(path, params,
                   "tensor 'layer.b' has shape (4,), but the model's parameter has shape (3,)");
  }
  SUBCASE("a double checkpoint into a float model") {
    TinyModel<double> d;
    const auto dpath = dir.file("double.safetensors");
    save_checkpoint(dpath, d.params(), {}, sample_meta(1));
    expect_failure(dpath, target.params(), "tensor 'layer.w' has dtype F64, but the model is F32");
  }
  SUBCASE("an unknown format version") {
    const auto file = variant(
        "v99.safetensors", [](SafetensorsFile& f) { f.metadata["format_version"] = "attnlab-99"; });
    expect_failure(file, target.params(),
                   "unknown checkpoint format_version 'attnlab-99' (this attnlab reads attnlab-1)");
  }
  SUBCASE("no format version: a safetensors file that is not an attnlab checkpoint") {
    expect_failure(test::data_path("interop/torch_written.safetensors"), target.params(),
                   "not an attnlab checkpoint: __metadata__ has no format_version");
  }
  SUBCASE("a step that is not a count") {
    for (const char* bad : {"", "-1", "12a", " 12", "1e3", "18446744073709551616"}) {
      const auto file =
          variant("step.safetensors", [&](SafetensorsFile& f) { f.metadata["step"] = bad; });
      expect_failure(file, target.params(), "is not a count");
    }
    const auto file =
        variant("nostep.safetensors", [](SafetensorsFile& f) { f.metadata.erase("step"); });
    expect_failure(file, target.params(), "__metadata__ has no step");
  }
  SUBCASE("an RNG state that does not parse") {
    const auto file = variant("rng.safetensors",
                              [](SafetensorsFile& f) { f.metadata["rng_state"] = "1 2 three 0"; });
    expect_failure(file, target.params(), "metadata rng_state '1 2 three 0' is not");
  }
  SUBCASE("a tensor that the model does not have") {
    const auto file = variant("extra.safetensors", [](SafetensorsFile& f) {
      f.tensors.push_back(make_stored_tensor<float>("layer.stray", xt::xarray<float>({1.0f})));
    });
    expect_failure(file, target.params(),
                   "1 tensors in the file are not in the model: 'layer.stray'");
    // Accepted on request, and reported.
    const auto loaded = load_checkpoint<float>(file, target.params(), nullptr,
                                               CheckpointLoadOptions{.allow_extra_tensors = true});
    CHECK(loaded.ignored_tensors == std::vector<std::string>{"layer.stray"});
    CHECK(target.w.value == saved.w.value);
  }
  SUBCASE("a NaN or an infinity in a stored parameter") {
    for (const float bad :
         {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      const auto file = variant("nan.safetensors", [&](SafetensorsFile& f) {
        xt::xarray<float> w = tensor_values<float>(*f.find("layer.w"));
        w(1, 2) = bad;
        for (auto& t : f.tensors) {
          if (t.name == "layer.w") t = make_stored_tensor<float>("layer.w", w);
        }
      });
      expect_failure(file, target.params(), "rejected: tensor 'layer.w' has the non-finite value");
      expect_failure(file, target.params(), "at flat index 6");
    }
  }
  SUBCASE("expected optimizer state that is missing or has another shape") {
    TensorList<float> optim = {{"layer.w.exp_avg", xt::xarray<float>(xt::zeros<float>({3, 4}))}};
    expect_failure(path, target.params(),
                   "missing tensor 'optim.layer.w.exp_avg' (optimizer state)", &optim);
    CHECK(optim.size() == 1);  // untouched too
    const auto with_optim = dir.file("optim.safetensors");
    save_checkpoint(with_optim, saved.params(),
                    {{"layer.w.exp_avg", xt::xarray<float>(xt::zeros<float>({4, 3}))}},
                    sample_meta(1));
    expect_failure(
        with_optim, target.params(),
        "tensor 'optim.layer.w.exp_avg' has shape (4, 3), but the model's optimizer state "
        "has shape (3, 4)",
        &optim);
  }
  SUBCASE("a directory, an empty file and a truncated file") {
    expect_failure(dir.path().string(), target.params(), "is a directory");
    const auto empty = dir.file("empty.safetensors");
    { std::ofstream touch(empty); }
    expect_failure(empty, target.params(), "file is empty");
    const auto truncated = dir.file("truncated.safetensors");
    std::filesystem::copy_file(path, truncated);
    std::filesystem::resize_file(truncated, std::filesystem::file_size(path) - 5);
    expect_failure(truncated, target.params(), "run past the data area");
  }
}

TEST_CASE("checkpoint: saving refuses non-finite values and reserved names, keeping the old file") {
  test::TempDir dir;
  const auto path = dir.file("ckpt.safetensors");
  TinyModel<double> model;
  model.fill_random(4);
  save_checkpoint(path, model.params(), {}, sample_meta(1));
  const auto before = std::filesystem::file_size(path);
  const auto before_w = model.w.value;

  model.w.value(2, 1) = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH_AS(
      save_checkpoint(path, model.params(), {}, sample_meta(2)),
      doctest::Contains("refusing to save: parameter 'layer.w' has the non-finite value nan at "
                        "flat index 9"),
      CheckpointError);
  model.w.value(2, 1) = 0.0;
  CHECK_THROWS_WITH_AS(
      save_checkpoint(path, model.params(),
                      {{"v", xt::xarray<double>({1.0, std::numeric_limits<double>::infinity()})}},
                      sample_meta(2)),
      doctest::Contains("refusing to save: optimizer state 'optim.v' has the non-finite value inf"),
      CheckpointError);
  CheckpointMeta reserved = sample_meta(2);
  reserved.extra["step"] = "5";
  CHECK_THROWS_WITH_AS(save_checkpoint(path, model.params(), {}, reserved),
                       doctest::Contains("metadata key 'step' is reserved"), CheckpointError);
  Parameter<double> p{xt::zeros<double>({1}), xt::zeros<double>({1})};
  CHECK_THROWS_WITH_AS(
      save_checkpoint(path, ParameterList<double>{{"optim.x", &p}}, {}, sample_meta(2)),
      doctest::Contains("the prefix 'optim.' is reserved"), CheckpointError);
  CHECK_THROWS_AS(save_checkpoint(path, ParameterList<double>{{"x", nullptr}}, {}, sample_meta(2)),
                  std::invalid_argument);

  // The previous checkpoint is intact and still loads.
  CHECK(std::filesystem::file_size(path) == before);
  TinyModel<double> fresh;
  CHECK(load_checkpoint(path, fresh.params()).meta.step == 1);
  CHECK(fresh.w.value == before_w);
}

TEST_CASE("checkpoint: a writer killed at random points never leaves a torn checkpoint") {
  test::TempDir dir;
  const auto path = dir.file("ckpt.safetensors");
  // Half a MiB, so that a write takes long enough to be interrupted in the middle.
  TinyModel<float> model(128, 1024);
  const auto fill = [&](std::uint64_t step) {
    model.w.value.fill(static_cast<float>(step));
    model.b.value.fill(-static_cast<float>(step));
  };
  // Kills land uniformly within three save durations of the fork, so that they hit the middle of
  // the first write as well as later ones, whatever the machine's (or the sanitizer's) speed.
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    fill(0);
    save_checkpoint(path, model.params(), {}, sample_meta(0));
  }
  const double save_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 3;

  constexpr int kKills = 50;
  Rng rng(2024);
  std::uint64_t last = 0;
  int progressed = 0;
  // A kill between creating the temporary file and renaming it leaves that file behind (the next
  // writer of the same file removes it).
  const auto temporaries = [&] {
    std::size_t n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
      n += entry.path().filename().string().find(".tmp-") != std::string::npos;
    }
    return n;
  };
  std::size_t mid_write = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < kKills; ++round) {
    const std::uint64_t first = last + 1;
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Child: rewrite the checkpoint forever with step first, first + 1, ... until killed.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      try {
        for (std::uint64_t step = first;; ++step) {
          fill(step);
          save_checkpoint(path, model.params(), {}, sample_meta(step));
        }
      } catch (...) {
        ::_exit(3);
      }
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(3 * save_seconds * rng.uniform()));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    REQUIRE(WIFSIGNALED(status));  // the writer did not fail on its own
    mid_write += temporaries() > 0;
    CHECK(temporaries() <= 1);  // earlier ones were removed by the writers that followed

    TinyModel<float> probe(128, 1024);
    const auto loaded = load_checkpoint(path, probe.params());  // throws if torn
    const auto step = loaded.meta.step;
    CHECK(step >= last);
    // Every value belongs to that one step: the old file or the new one, never a mixture.
    CHECK(std::all_of(probe.w.value.begin(), probe.w.value.end(),
                      [&](float x) { return x == static_cast<float>(step); }));
    CHECK(std::all_of(probe.b.value.begin(), probe.b.value.end(),
                      [&](float x) { return x == -static_cast<float>(step); }));
    if (step > last) ++progressed;
    last = step;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The next save removes whatever temporary the last kill left.
  fill(last + 1);
  save_checkpoint(path, model.params(), {}, sample_meta(last + 1));
  CHECK(temporaries() == 0);
  MESSAGE("one save takes " << save_seconds * 1e3 << " ms; " << kKills << " kills: " << mid_write
                            << " in the middle of a write, " << progressed
                            << " after a newer save; last step " << last << "; " << seconds
                            << " s");
  // For the test to mean much, kills must land both in the middle of writes and after saves.
  CHECK(mid_write >= 5);
  CHECK(progressed >= 5);
}
