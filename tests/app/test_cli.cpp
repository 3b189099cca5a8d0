// The attnlab binary, run as a user runs it: bad flag values give one line and status 2, --version
// and the BLAS warning, make-data, the micro study, saturation, a diverged run and gradcheck. The
// training runs are in test_cli_train.cpp, file input in test_cli_config.cpp, the modern knobs in
// test_cli_knobs.cpp.
#include <doctest/doctest.h>
#include <unistd.h>

#ifdef ATTNLAB_CLI_PATH

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/app/config_bounds.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/distributed.hpp"
#include "attnlab/io/safetensors.hpp"
#include "attnlab/threads.hpp"
#include "cli_runner.hpp"

namespace fs = std::filesystem;
using namespace attnlab::test;

TEST_CASE("cli: bad flag values print one error line and exit with status 2") {
  const auto dir = scratch("bad_flags");
  check_bad_input("train --steps -5", dir, "--steps");
  check_bad_input("train --steps 0", dir, "--steps");
  check_bad_input("train --scaling sqrt", dir, "--scaling");
  check_bad_input("train --d-model 64 --heads 3", dir, "--heads 3");
  check_bad_input("train --lr nan", dir, "--lr");
  check_bad_input("train --lr -1", dir, "--lr");
  check_bad_input("train --lr abc", dir, "--lr");
  check_bad_input("train --task copy", dir, "--task");
  check_bad_input("train --data '" + (dir / "missing.txt").string() + "'", dir, "missing.txt");
  check_bad_input("train --frobnicate", dir, "frobnicate");
  check_bad_input("study --preset huge", dir, "--preset");
  check_bad_input("study --jobs 0", dir, "--jobs");
  check_bad_input("gradcheck --layer conv", dir, "--layer");
  check_bad_input("eval --checkpoint '" + (dir / "nope").string() + "'", dir, "nope");
  check_bad_input("", dir, "subcommand");
  // --device cuda where no GPU is usable: refused up front, before any output is written.
  if (!attnlab::cuda_available()) {
    check_bad_input(std::string("train --device cuda --steps 2 --out '") +
                        (dir / "gpu_run").string() + "' " + kTinyRecall,
                    dir, "usable CUDA device");
    CHECK_FALSE(fs::exists(dir / "gpu_run" / "metrics.csv"));
  }
  // A malformed data line names the file and the line.
  std::ofstream(dir / "bad.txt") << "# header\n1 2 3 | 3 2 1\n1 2 3 3 2 1\n";
  check_bad_input(
      "train --task reverse --length 3 --symbols 4 --data '" + (dir / "bad.txt").string() + "'",
      dir, "bad.txt:3: missing '|'");
  // --help works everywhere and is not an error.
  for (const char* sub :
       {"", "train ", "eval ", "study ", "gradcheck ", "saturation ", "make-data "}) {
    const Run r = cli(std::string(sub) + "--help", dir);
    CHECK(r.status == 0);
    CHECK(r.err.empty());
    CHECK(r.out.find("Usage") != std::string::npos);
  }
}

TEST_CASE("cli: --version names the version, the git revision, the backends and the BLAS kernels") {
  const auto dir = scratch("version");
  const Run r = cli("--version", dir, shell_core());
  CHECK(r.status == 0);
  CHECK(r.err.empty());
  CHECK(r.out.rfind("attnlab ", 0) == 0);
  CHECK(r.out.find(" (git ") != std::string::npos);
  const std::string cuda = attnlab::cuda_built() ? "cuda: built" : "cuda: not built";
  CHECK(r.out.find("\nbackends: cpu (OpenMP, " + std::to_string(attnlab::default_num_threads()) +
                   " threads by default); " + cuda) != std::string::npos);
  CHECK(r.out.find(attnlab::mpi_built() ? "mpi: built (launch with mpirun -np N)"
                                        : "mpi: not built") != std::string::npos);
  const std::string blas_line = "\nblas: " + attnlab::blas_summary(attnlab::blas_info()) + "\n";
  CHECK(r.out.find(blas_line) != std::string::npos);
  CHECK(r.out.find("core " + attnlab::blas_info().core) != std::string::npos);
}

TEST_CASE("cli: a BLAS warning is printed once on stderr, and the command still runs") {
  const auto dir = scratch("blas_warning");
  const std::string make_data =
      "make-data --task sort --train-size 4 --valid-size 2 --out '" + (dir / "data").string() + "'";
  for (const std::string& args : {std::string("--version"), make_data}) {
    CAPTURE(args);
    const Run r = cli(args, dir, "ATTNLAB_BLAS_CORE=Pentium4000");
    CHECK(r.status == 0);
    CHECK(r.err.rfind("attnlab: warning: ATTNLAB_BLAS_CORE=Pentium4000 ignored", 0) == 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
}

TEST_CASE("cli: make-data then train --data round trip") {
  const auto dir = scratch("data_round_trip");
  const Run m =
      cli("make-data --task sort --length 5 --symbols 6 --train-size 300 --valid-size 50 --out '" +
              (dir / "data").string() + "'",
          dir);
  REQUIRE(m.status == 0);
  REQUIRE(fs::exists(dir / "data" / "sort" / "train.txt"));
  const Run t =
      cli("train --quiet --task sort --length 5 --symbols 6 --d-model 16 --heads 2 --attn-only "
          "--steps 20 "
          "--batch 8 --eval-every 10 --data '" +
              (dir / "data" / "sort" / "train.txt").string() + "' --out '" +
              (dir / "run").string() + "'",
          dir);
  REQUIRE(t.status == 0);
  CHECK(fs::exists(dir / "run" / "metrics.csv"));
  // The file's shape must match the task: a different length is a clear error.
  check_bad_input("train --quiet --task sort --length 6 --symbols 6 --data '" +
                      (dir / "data" / "sort" / "train.txt").string() + "'",
                  dir, "positions, the task expects 6");
}

TEST_CASE("cli: the micro study writes every output file") {
  const auto dir = scratch("micro_study");
  const Run r =
      cli("study --preset micro --jobs 2 --quiet --out '" + (dir / "study").string() + "'", dir);
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  for (const char* f :
       {"summary.csv", "summary.md", "report.html", "recall_adamw_lr_window.svg",
        "recall_adamw_lr_window.dat", "recall_adamw_lr_window.gp",
        "recall_adamw_n20_loss_vs_lr.svg", "recall_adamw_n20_loss_vs_lr.dat",
        "recall_adamw_n20_loss_vs_lr.gp", "recall_adamw_n20_curves_dk16.svg",
        "recall_adamw_n20_curves_dk16.dat", "recall_adamw_n20_curves_dk16.gp",
        "recall_adamw_n20_attention_dk16.svg", "recall_adamw_n20_attention_dk16.dat",
        "recall_adamw_n20_attention_dk16.gp", "recall_adamw_jacobian_init.svg"}) {
    CAPTURE(f);
    CHECK(fs::exists(dir / "study" / f));
  }
  const std::string csv = slurp(dir / "study" / "summary.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 1 + 3 * 2 * 2);
  const std::string md = slurp(dir / "study" / "summary.md");
  CHECK(md.find("LR sensitivity") != std::string::npos);
  CHECK(md.find("fails at every LR") != std::string::npos);
  CHECK(r.out.find("summary.md") != std::string::npos);
  CHECK(r.out.find("report.html") != std::string::npos);
}

TEST_CASE(
    "cli: study --config runs a custom grid, and --dump-config writes a preset as such a file") {
  const auto dir = scratch("study_config");
  std::ofstream(dir / "grid.json") << R"({
    "preset": "custom",
    "groups": [{
      "name": "tiny/adamw",
      "base": {"task": {"kind": "recall", "keys": 8, "values": 8, "pairs": 4},
               "model": {"block": {"attention": {"d_model": 16}}},
               "steps": 6, "batch": 8, "eval_size": 16, "eval_every": 3},
      "arms": [{"name": "sqrt_dk", "scaling": "sqrt_dk"}, {"name": "none", "scaling": "none"}],
      "d_k": [4], "lrs": [0.01], "seeds": [0]}]})";
  const Run r = cli("study --quiet --config '" + (dir / "grid.json").string() + "' --out '" +
                        (dir / "study").string() + "'",
                    dir);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("study 'custom': 2 runs") != std::string::npos);
  const std::string csv = slurp(dir / "study" / "summary.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 1 + 2);
  CHECK(fs::exists(dir / "study" / "runs" / "tiny_adamw" / "none_dk4_lr0.01_s0" / "config.json"));
  // The committed example is the micro preset, as --dump-config writes it.
  const Run dump = cli("study --preset micro --dump-config", dir);
  REQUIRE(dump.status == 0);
  CHECK(nlohmann::json::parse(dump.out) ==
        nlohmann::json::parse(slurp(fs::path(ATTNLAB_TEST_DATA_DIR) / ".." / ".." / "data" /
                                    "configs" / "study_micro.json")));
  std::ofstream(dir / "bad.json") << R"({"groups": [{"arms": [{"scaling": "sqrt"}]}]})";
  check_bad_input("study --config '" + (dir / "bad.json").string() + "'", dir, "scaling");
  check_bad_input("study --preset micro --config '" + (dir / "grid.json").string() + "'", dir,
                  "--preset");
}

TEST_CASE("cli: saturation writes its table and plot") {
  const auto dir = scratch("saturation");
  const Run r = cli("saturation --keys 16 --batch 2 --out '" + (dir / "sat").string() + "'", dir);
  REQUIRE(r.status == 0);
  for (const char* f :
       {"saturation.csv", "saturation.md", "saturation.dat", "saturation.gp", "saturation.png"})
    CHECK(fs::exists(dir / "sat" / f));
  CHECK(r.out.find("Var(q.k)/d_k") != std::string::npos);
}

TEST_CASE("cli: a diverged run stops cleanly with status 3 and names the layer") {
  const auto dir = scratch("diverged");
  // A scale of 1e38 overflows the float logits at the first step.
  const Run r = cli(std::string("train ") + kTinyRecall + " --steps 20 --scale 1e38 --out '" +
                        (dir / "run").string() + "'",
                    dir);
  CHECK(r.status == 3);
  CHECK(r.err.empty());
  const auto summary = nlohmann::json::parse(slurp(dir / "run" / "summary.json"));
  CHECK(summary["status"] == "diverged at step 1");
  CHECK(summary["first_nonfinite_layer"].get<std::string>().find("blocks.0.attn") == 0);
  CHECK_FALSE(fs::exists(dir / "run" / "model.safetensors"));  // never saves non-finite weights
}

TEST_CASE("cli: gradcheck prints a row per tensor and passes on the stack's layers") {
  const auto dir = scratch("gradcheck");
  const Run r =
      cli("gradcheck --layer mha --d-model 8 --heads 2 --d-k 5 --qk-norm --learnable-scale", dir);
  CHECK(r.status == 0);
  for (const char* row :
       {"w_q", "w_k", "w_v", "w_o", "q_norm.gamma", "k_norm.beta", "log_scale", "PASS"})
    CHECK(r.out.find(row) != std::string::npos);
  const Run t =
      cli("gradcheck --layer block --d-model 4 --heads 2 --batch 1 --seq 3 --causal", dir);
  CHECK(t.status == 0);
  CHECK(t.out.find("mlp.fc2.w") != std::string::npos);
  const Run g = cli(
      "gradcheck --layer mha --d-model 8 --heads 4 --kv-heads 2 --causal --window 3 --alibi", dir);
  CHECK(g.status == 0);
  CHECK(g.out.find("PASS") != std::string::npos);
  for (const char* layer : {"mha", "block", "transformer"}) {
    CAPTURE(layer);
    const Run rope = cli(std::string("gradcheck --layer ") + layer +
                             " --d-model 8 --heads 2 --causal --qk-norm --positions rope "
                             "--rope-theta 50 --rope-fraction 0.5 --rope-interleaved",
                         dir);
    CHECK(rope.status == 0);
    CHECK(rope.out.find("PASS") != std::string::npos);
  }
}

TEST_CASE("cli: table of bad values for every flag: one line, status 2") {
  const auto dir = scratch("flag_table");
  const std::pair<const char*, const char*> cases[] = {
      {"train --d-model 0", "--d-model"},
      {"train --heads 0", "--heads"},
      {"train --kv-heads 0", "--kv-heads"},
      {"train --window 0", "--window"},
      {"train --window 4", "sdpa.window expected 0 without causal"},
      {"train --d-model 8 --heads 4 --kv-heads 3", "kv_heads expected a divisor of heads (4)"},
      {"train --d-k 0", "--d-k"},
      {"train --d-v -1", "--d-v"},
      {"train --layers 0", "--layers"},
      {"train --d-ff 0", "--d-ff"},
      {"train --norm batchnorm", "--norm"},
      {"train --positions rotary", "--positions"},
      {"train --scaling sqrt", "--scaling"},
      {"train --scale 0", "--scale"},
      {"train --scale inf", "--scale"},
      {"train --logit-softcap -1", "--logit-softcap"},
      {"train --logit-softcap nan", "--logit-softcap"},
      {"train --logit-softcap 0", "--logit-softcap: expected a number in (0, "},
      {"train --attn-softcap 0", "--attn-softcap: expected a number in (0, "},
      {"train --attn-softcap -2", "--attn-softcap"},
      {"train --attn-softcap inf", "--attn-softcap"},
      {"train --mlp geglu", "--mlp"},
      {"train --positions rope --rope-theta 0", "--rope-theta"},
      {"train --positions rope --rope-theta -5", "--rope-theta"},
      {"train --positions rope --rope-fraction 0", "--rope-fraction"},
      {"train --positions rope --rope-fraction 1.5", "--rope-fraction"},
      {"train --positions rope --d-model 8 --heads 2 --rope-fraction 0.75",
       "rope_fraction expected floor(fraction * d_k) even and >= 2 (d_k = 4), got 0.750000 (3 "
       "dims)"},
      {"train --optimizer adam", "--optimizer"},
      {"train --lr 0", "--lr"},
      {"train --schedule linear", "--schedule"},
      {"train --warmup -1", "--warmup"},
      {"train --steps 10 --warmup 20", "warmup"},
      {"train --steps 1.5", "--steps"},
      {"train --batch 0", "--batch"},
      {"train --clip -1", "--clip"},
      {"train --weight-decay nan", "--weight-decay"},
      {"train --seed -1", "--seed"},
      {"train --threads 0", "--threads"},
      {"train --device tpu", "--device"},
      {"train --eval-every 0", "--eval-every"},
      {"train --eval-size 0", "--eval-size"},
      {"train --save-every -1", "--save-every"},
      {"train --stop-after 0", "--stop-after"},
      {"train --resume /nonexistent/run", "--resume"},
      {"train --keys 0", "--keys"},
      {"train --pairs 100", "pairs"},
      {"train --task mqar --queries 40", "queries"},
      {"train --symbols 1", "--symbols"},
      {"train --length 0", "--length"},
      {"train --steps", "--steps"},
      {"eval", "--checkpoint"},
      {"eval --checkpoint /tmp --show -1", "--show"},
      {"study --steps 0", "--steps"},
      {"gradcheck --batch 0", "--batch"},
      {"gradcheck --seq 0", "--seq"},
      {"saturation --keys 1", "--keys"},
      {"saturation --batch 0", "--batch"},
      {"make-data --train-size 0", "--train-size"},
      {"make-data --task copy", "--task"},
      {"frobnicate", "frobnicate"},
  };
  for (const auto& [args, needle] : cases) check_bad_input(args, dir, needle);
  // A directory that holds no checkpoint: the file error names it.
  check_bad_input("eval --checkpoint '" + dir.string() + "'", dir, "model.safetensors");
}

#endif  // ATTNLAB_CLI_PATH
