// The attnlab binary, run as a user runs it: bad input gives one line and status 2, a tiny run
// learns, the micro study writes every output, data files round-trip through make-data and train,
// runs are deterministic, and resume continues exactly.
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
#include <memory>
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
#include "temp_dir.hpp"

namespace fs = std::filesystem;

namespace {

struct Run {
  int status = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh scratch folder per test case and process (ctest runs cases in parallel processes, and
// two suites, e.g. the normal and the sanitizer build, may run at once), removed when the process
// exits (TempDir).
fs::path scratch(const std::string& name) {
  static std::vector<std::unique_ptr<attnlab::test::TempDir>> made;
  made.push_back(std::make_unique<attnlab::test::TempDir>("attnlab_cli_" + name + "_"));
  return made.back()->path();
}

// `env_assignments` ("NAME=value ..."), when given, are added to the environment of the run.
// The CLI runs without a core the shell forces (OPENBLAS_CORETYPE): these tests check attnlab's
// own choice of core, and under a forced one the results can depend on the thread count, which a
// resumed run picks afresh (seen: OPENBLAS_CORETYPE=Haswell on an AVX-512 machine moved the
// attention metrics of a resumed run by an ulp). A test that needs the shell's core passes
// shell_core() in env_assignments.
// A shell command line, its output captured.
Run cli_command(const std::string& command, const fs::path& dir) {
  const std::string cmd = command + " >'" + (dir / "stdout.txt").string() + "' 2>'" +
                          (dir / "stderr.txt").string() + "'";
  const int raw = std::system(cmd.c_str());
  Run r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(dir / "stdout.txt");
  r.err = slurp(dir / "stderr.txt");
  return r;
}

Run cli(const std::string& args, const fs::path& dir, const std::string& env_assignments = "") {
  return cli_command(
      "env -u OPENBLAS_CORETYPE " + env_assignments + " '" + ATTNLAB_CLI_PATH + "' " + args, dir);
}

// "OPENBLAS_CORETYPE=<value>" when the shell forces a core, else "": for the tests that compare the
// CLI's core with this process's.
std::string shell_core() {
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  return core && *core ? std::string("OPENBLAS_CORETYPE='") + core + "'" : std::string();
}

// Exactly one line on stderr, "attnlab: error: ...", and status 2.
void check_bad_input(const std::string& args, const fs::path& dir, const std::string& needle) {
  CAPTURE(args);
  const Run r = cli(args, dir);
  CHECK(r.status == 2);
  CHECK(r.err.rfind("attnlab: error: ", 0) == 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.find(needle) != std::string::npos);
}

const char* kTinyRecall =
    "--task recall --keys 8 --values 8 --pairs 4 --d-model 16 --heads 1 --attn-only "
    "--batch 16 --eval-size 64 --threads 1 --quiet";

}  // namespace

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

TEST_CASE("cli: a tiny train run lowers the eval loss and writes its outputs") {
  const auto dir = scratch("tiny_train");
  const Run r =
      cli(std::string("train ") + kTinyRecall + " --steps 150 --lr 0.01 --eval-every 50 --out '" +
              (dir / "run").string() + "'",
          dir, shell_core());
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  for (const char* f : {"metrics.csv", "summary.json", "model.safetensors"})
    CHECK(fs::exists(dir / "run" / f));
  const auto summary = nlohmann::json::parse(slurp(dir / "run" / "summary.json"));
  CHECK(summary["final_eval_loss"].get<double>() < 0.8 * summary["init_eval_loss"].get<double>());
  CHECK(summary["status"] == "finished");
  // The same environment, so the same BLAS kernels as this process.
  CHECK(summary["blas_core"] == attnlab::blas_info().core);
  // Throughput: tokens/s of the steps' time (part of the run's time), the model's FLOPs per token,
  // and the utilisation line that relates them to the cores' FMA peak and to the sgemm peak, both
  // measured after the steps at the run's thread count; summary.json names each denominator.
  const double step_seconds = summary["step_seconds"].get<double>();
  CHECK(step_seconds > 0);
  CHECK(step_seconds < summary["seconds"].get<double>());
  const double tokens_per_second = summary["tokens_per_second"].get<double>();
  CHECK(tokens_per_second * step_seconds == doctest::Approx(150.0 * 16 * 5));  // steps·B·(pairs+1)
  CHECK(summary["flops_per_token"].get<double>() > 0);
  CHECK(r.out.find("throughput: ") != std::string::npos);
  CHECK(r.out.find("of the cores' FMA peak measured now") != std::string::npos);
  CHECK(r.out.find("MFU ") != std::string::npos);
  const auto& u = summary["utilisation"];
  const double model_gflops = u["model_gflops"].get<double>();
  CHECK(model_gflops ==
        doctest::Approx(summary["flops_per_token"].get<double>() * tokens_per_second / 1e9));
  CHECK(u["threads"] == 1);  // kTinyRecall's --threads 1
  CHECK(u["fma_peak_gflops"].get<double>() > 0);
  CHECK(!u["fma_peak_vector"].get<std::string>().empty());
  CHECK(u["of_fma_peak"].get<double>() ==
        doctest::Approx(model_gflops / u["fma_peak_gflops"].get<double>()));
  CHECK(u["of_sgemm_peak"].get<double>() ==
        doctest::Approx(model_gflops / u["sgemm_peak_gflops"].get<double>()));
  // eval reads the checkpoint back and reports the same loss.
  const Run e = cli("eval --checkpoint '" + (dir / "run").string() + "' --show 1", dir);
  REQUIRE(e.status == 0);
  CHECK(e.out.find("query attention") != std::string::npos);
  char expected[64];
  std::snprintf(expected, sizeof expected, "loss %.4f", summary["final_eval_loss"].get<double>());
  CHECK(e.out.find(expected) != std::string::npos);
  // --logits writes the eval set's logits (N, T, V) as a PyTorch-layout safetensors file.
  const auto logits_file = dir / "logits.safetensors";
  const Run l = cli("eval --checkpoint '" + (dir / "run").string() + "' --show 0 --logits '" +
                        logits_file.string() + "'",
                    dir);
  REQUIRE(l.status == 0);
  const auto logits = attnlab::load_safetensors(logits_file.string());
  CHECK(logits.metadata.at("format") == "pt");
  REQUIRE(logits.find("logits") != nullptr);
  CHECK(logits.find("logits")->shape == std::vector<std::size_t>{64, 5, 8});
}

TEST_CASE("cli: --weights-only writes the weights without the optimizer state: eval, not resume") {
  const auto dir = scratch("weights_only");
  const std::string args = std::string("train ") + kTinyRecall + " --steps 20 --eval-every 10";
  REQUIRE(cli(args + " --out '" + (dir / "full").string() + "'", dir).status == 0);
  REQUIRE(cli(args + " --weights-only --out '" + (dir / "weights").string() + "'", dir).status ==
          0);
  const auto full = attnlab::load_safetensors((dir / "full" / "model.safetensors").string());
  const auto weights = attnlab::load_safetensors((dir / "weights" / "model.safetensors").string());
  CHECK(full.metadata.at("contents") == "training state");
  CHECK(weights.metadata.at("contents") == "weights");
  std::size_t optim = 0, params = 0;
  for (const auto& t : full.tensors) (t.name.rfind("optim.", 0) == 0 ? optim : params) += 1;
  CHECK(optim > 0);
  CHECK(weights.tensors.size() == params);  // the same parameters, nothing else
  for (const auto& t : weights.tensors) {
    CAPTURE(t.name);
    REQUIRE(full.find(t.name) != nullptr);
    CHECK(full.find(t.name)->data == t.data);  // the same run: the same weights
  }
  CHECK(fs::file_size(dir / "weights" / "model.safetensors") <
        fs::file_size(dir / "full" / "model.safetensors") / 2);
  // eval reads it; resume refuses it in one line, naming the file.
  const Run e = cli("eval --checkpoint '" + (dir / "weights").string() + "'", dir);
  CHECK(e.status == 0);
  const Run r = cli("train --quiet --resume '" + (dir / "weights").string() + "' --steps 30", dir);
  CHECK(r.status != 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.find("holds the weights only") != std::string::npos);
  CHECK(r.err.find("model.safetensors") != std::string::npos);
}

TEST_CASE(
    "cli: a text run, then generate from its checkpoint alone, and bad text input is one line") {
  const auto dir = scratch("text");
  const std::string excerpt = std::string(ATTNLAB_TEST_DATA_DIR) + "/text/hamlet_excerpt.txt";
  const std::string copy = (dir / "hamlet.txt").string();
  fs::copy_file(excerpt, copy);
  const Run t = cli("train --task text --data '" + copy +
                        "' --causal --block 16 --d-model 16 --heads 2 --steps 20 --batch 8 "
                        "--eval-every 10 --eval-size 16 --threads 1 --quiet --out '" +
                        (dir / "run").string() + "'",
                    dir);
  REQUIRE(t.status == 0);
  fs::remove(copy);  // generate and eval of the vocabulary need no data file
  const std::string gen_base =
      "generate --checkpoint '" + (dir / "run").string() + "' --tokens 24 --threads 1 ";
  const std::string gen = gen_base + "--prompt 'Ham.' ";
  const Run g1 = cli(gen + "--greedy", dir), g2 = cli(gen + "--greedy --seed 9", dir);
  REQUIRE(g1.status == 0);
  CHECK(g1.out.rfind("Ham.", 0) == 0);  // the prompt, then the continuation
  CHECK(g1.out.size() >= 4 + 24 + 1);   // 24 characters (some may be multi-byte)
  CHECK(g1.out == g2.out);              // greedy is deterministic
  CHECK(g1.err.find("generated 24 tokens") != std::string::npos);
  const Run s1 = cli(gen + "--seed 3 --top-k 5", dir), s2 = cli(gen + "--seed 3 --top-k 5", dir);
  CHECK(s1.status == 0);
  CHECK(s1.out == s2.out);  // a fixed seed reproduces a sample
  CHECK(cli(gen + "--greedy --no-cache", dir).out == g1.out);
  // Bad input: one line, status 2.
  check_bad_input(gen_base + "--prompt 'Ham€'", dir, "U+20AC");
  check_bad_input(gen + "--top-p 0", dir, "--top-p");
  check_bad_input(gen + "--temperature 0", dir, "--temperature");
  check_bad_input("train --task text --causal --quiet", dir, "data_file");
  check_bad_input("train --task text --data '" + excerpt + "' --quiet", dir, "causal");
  check_bad_input("train --task text --vocab word --data '" + excerpt + "'", dir, "--vocab");
  check_bad_input("train --task text --block 0 --data '" + excerpt + "'", dir, "--block");
  std::ofstream(dir / "empty.txt").close();
  check_bad_input("train --task text --causal --data '" + (dir / "empty.txt").string() + "'", dir,
                  "is empty");
  std::ofstream(dir / "latin1.txt", std::ios::binary) << "caf\xe9 au lait\n";
  check_bad_input("train --task text --causal --data '" + (dir / "latin1.txt").string() + "'", dir,
                  "invalid UTF-8 at byte offset 3");
  // A checkpoint of another task cannot generate.
  REQUIRE(cli(std::string("train ") + kTinyRecall + " --steps 2 --out '" +
                  (dir / "recall").string() + "'",
              dir)
              .status == 0);
  check_bad_input("generate --checkpoint '" + (dir / "recall").string() + "'", dir,
                  "a run of task recall");
}

TEST_CASE("cli: same seed and threads give an identical metrics.csv") {
  const auto dir = scratch("determinism");
  for (const char* name : {"a", "b"}) {
    const Run r =
        cli(std::string("train ") + kTinyRecall + " --steps 30 --eval-every 10 --seed 7 --out '" +
                (dir / name).string() + "'",
            dir);
    REQUIRE(r.status == 0);
  }
  const std::string a = slurp(dir / "a" / "metrics.csv");
  CHECK(a.size() > 100);
  CHECK(a == slurp(dir / "b" / "metrics.csv"));
  const Run c = cli(std::string("train ") + kTinyRecall +
                        " --steps 30 --eval-every 10 --seed 8 --out '" + (dir / "c").string() + "'",
                    dir);
  REQUIRE(c.status == 0);
  CHECK(a != slurp(dir / "c" / "metrics.csv"));
}

TEST_CASE("cli: resume continues exactly (40 steps == 20 + save + resume + 20)") {
  const auto dir = scratch("resume");
  const std::string common =
      std::string("train ") + kTinyRecall + " --steps 40 --eval-every 5 --lr 0.01 --seed 3";
  REQUIRE(cli(common + " --out '" + (dir / "full").string() + "'", dir).status == 0);
  const Run first = cli(common + " --stop-after 20 --out '" + (dir / "split").string() + "'", dir);
  CHECK(first.status == 130);  // stopped early, checkpoint saved
  const Run second =
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir);
  REQUIRE(second.status == 0);
  const std::string full = slurp(dir / "full" / "metrics.csv");
  CHECK(full.size() > 100);
  CHECK(full == slurp(dir / "split" / "metrics.csv"));
  CHECK(slurp(dir / "full" / "metrics.jsonl") == slurp(dir / "split" / "metrics.jsonl"));

  // metrics.jsonl: one object per metrics.csv row, keys that do not depend on the model's size,
  // the values of the CSV (to its 7 digits), null for the step-0 training loss (NaN).
  std::istringstream csv(full), jsonl(slurp(dir / "full" / "metrics.jsonl"));
  std::string header, csv_row, json_row;
  std::getline(csv, header);
  std::size_t rows = 0;
  while (std::getline(csv, csv_row)) {
    REQUIRE(std::getline(jsonl, json_row));
    const auto j = nlohmann::json::parse(json_row);
    for (const char* key :
         {"step", "loss", "eval_loss", "eval_acc", "lr", "jacobian_mean", "heads", "layers"}) {
      CHECK(j.contains(key));
    }
    CHECK(j.size() == 8);
    CHECK(std::to_string(j["step"].get<long>()) == csv_row.substr(0, csv_row.find(',')));
    const std::string eval_loss = csv_row.substr(csv_row.find(',', csv_row.find(',') + 1) + 1);
    CHECK(j["eval_loss"].get<double>() ==
          doctest::Approx(std::stod(eval_loss.substr(0, eval_loss.find(',')))).epsilon(1e-6));
    if (rows == 0) CHECK(j["loss"].is_null());
    REQUIRE(j["heads"].size() == 1);  // one layer, one head
    CHECK(j["heads"][0]["layer"] == 0);
    CHECK(j["heads"][0].contains("recall_mass"));
    REQUIRE(j["layers"].size() == 1);
    CHECK(j["layers"][0].contains("wq_grad_norm"));
    ++rows;
  }
  CHECK(rows == 9);  // steps 0, 5, ..., 40
  CHECK_FALSE(std::getline(jsonl, json_row));
}

TEST_CASE("cli: with dropout, resume continues exactly, and dropout changes training") {
  // The masks are keyed by (seed, step, layer): a resumed run draws the ones it would have drawn.
  const auto dir = scratch("resume_dropout");
  const std::string common = std::string("train ") + kTinyRecall +
                             " --steps 30 --eval-every 5 --lr 0.01 --seed 3 --dropout 0.2 "
                             "--attn-dropout 0.1";
  REQUIRE(cli(common + " --out '" + (dir / "full").string() + "'", dir).status == 0);
  const Run first = cli(common + " --stop-after 15 --out '" + (dir / "split").string() + "'", dir);
  CHECK(first.status == 130);
  const Run second =
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir);
  REQUIRE(second.status == 0);
  const std::string full = slurp(dir / "full" / "metrics.csv");
  CHECK(full.size() > 100);
  CHECK(full == slurp(dir / "split" / "metrics.csv"));
  // The same run without dropout logs other losses; the checkpoint's config keeps both fields.
  const std::string plain_args = std::string("train ") + kTinyRecall +
                                 " --steps 30 --eval-every 5 --lr 0.01 --seed 3 --out '" +
                                 (dir / "plain").string() + "'";
  REQUIRE(cli(plain_args, dir).status == 0);
  CHECK(slurp(dir / "plain" / "metrics.csv") != full);
  const std::string config = slurp(dir / "full" / "config.json");
  CHECK(config.find("\"dropout\": 0.2") != std::string::npos);
  CHECK(config.find("\"dropout\": 0.1") != std::string::npos);
  check_bad_input("train --dropout 1", dir, "--dropout");
  check_bad_input("train --attn-dropout -0.1", dir, "--attn-dropout");
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

TEST_CASE("cli: SIGINT and SIGTERM save a checkpoint, exit with 130 and 143, and the run resumes") {
  const auto dir = scratch("sigint");
  for (const auto& [signal, status] : {std::pair{"INT", 130}, std::pair{"TERM", 143}}) {
    CAPTURE(signal);
    const fs::path run = dir / (std::string("run_") + signal);
    // Start a long run, wait until it has written its first metrics row, then signal it.
    const std::string cmd = "'" + std::string(ATTNLAB_CLI_PATH) + "' train " + kTinyRecall +
                            " --steps 100000000 --eval-every 10 --out '" + run.string() +
                            "' >/dev/null 2>'" + (dir / "stderr.txt").string() + "' & pid=$!; " +
                            "for i in $(seq 1 600); do [ -s '" + (run / "metrics.csv").string() +
                            "' ] && break; sleep 0.05; done; sleep 0.2; kill -" + signal +
                            " $pid; wait $pid; echo $? > '" + (dir / "status.txt").string() + "'";
    std::ofstream(dir / "interrupt.sh") << cmd << '\n';
    REQUIRE(std::system(("bash '" + (dir / "interrupt.sh").string() + "'").c_str()) == 0);
    CHECK(std::stoi(slurp(dir / "status.txt")) == status);
    CHECK(slurp(dir / "stderr.txt").empty());
    const auto summary = nlohmann::json::parse(slurp(run / "summary.json"));
    CHECK(summary["status"] == "interrupted");
    CHECK(fs::exists(run / "model.safetensors"));
  }
  // --save-every also leaves a checkpoint; a resumed run continues to --steps.
  const Run r = cli(std::string("train ") + kTinyRecall +
                        " --steps 30 --save-every 10 --stop-after 25 --out '" +
                        (dir / "periodic").string() + "'",
                    dir);
  CHECK(r.status == 130);
  const Run resumed = cli("train --quiet --resume '" + (dir / "periodic").string() + "'", dir);
  CHECK(resumed.status == 0);
  CHECK(nlohmann::json::parse(slurp(dir / "periodic" / "summary.json"))["steps_done"] == 30);
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

// ---- run configs (--config, OUT/config.json) and resume rules ----

const char* kTinySort =
    "--task sort --symbols 6 --length 5 --d-model 8 --heads 2 --batch 4 --eval-every 5 "
    "--eval-size 16 --threads 1 --quiet";

TEST_CASE("cli: --positions rope trains, and its effective config carries RoPE's fields") {
  const auto dir = scratch("rope_run");
  const auto out = dir / "rope";
  const Run r = cli(std::string("train ") + kTinySort +
                        " --steps 20 --positions rope --rope-theta 500 --rope-fraction 0.5 "
                        "--out '" +
                        out.string() + "'",
                    dir);
  REQUIRE(r.status == 0);
  const auto config = nlohmann::json::parse(slurp(out / "config.json"));
  CHECK(config["model"]["positions"] == "rope");
  CHECK(config["model"]["block"]["attention"]["rope_theta"] == 500.0);
  CHECK(config["model"]["block"]["attention"]["rope_fraction"] == 0.5);
  CHECK(config["model"]["block"]["attention"]["rope"] == false);  // positions is the switch
  const Run e = cli("eval --checkpoint '" + out.string() + "'", dir);
  CHECK(e.status == 0);
}

TEST_CASE("cli: --no-bias trains a model without biases, and eval reads it back") {
  const auto dir = scratch("no_bias_run");
  const auto out = dir / "run";
  const Run r = cli(std::string("train ") + kTinySort + " --steps 20 --d-ff 16 --no-bias --out '" +
                        out.string() + "'",
                    dir);
  REQUIRE(r.status == 0);
  CHECK(nlohmann::json::parse(slurp(out / "config.json"))["model"]["block"]["bias"] == false);
  const auto file = attnlab::load_safetensors((out / "model.safetensors").string());
  CHECK(file.find("blocks.0.mlp.fc1.w") != nullptr);
  CHECK(file.find("blocks.0.mlp.fc1.b") == nullptr);
  CHECK(file.find("blocks.0.ln1.beta") == nullptr);
  CHECK(file.find("ln_f.beta") == nullptr);
  CHECK(file.find("ln_f.gamma") != nullptr);
  CHECK(cli("eval --checkpoint '" + out.string() + "'", dir).status == 0);
}

TEST_CASE("cli: --attn-softcap caps the attention scores of a run, and eval reads it back") {
  const auto dir = scratch("attn_softcap_run");
  const auto capped = dir / "capped", plain = dir / "plain";
  const std::string common = std::string("train ") + kTinySort + " --steps 10 --scale 4";
  REQUIRE(cli(common + " --attn-softcap 0.5 --out '" + capped.string() + "'", dir).status == 0);
  REQUIRE(cli(common + " --out '" + plain.string() + "'", dir).status == 0);
  const auto config = nlohmann::json::parse(slurp(capped / "config.json"));
  CHECK(config["model"]["block"]["attention"]["sdpa"]["softcap"] == 0.5);
  // The same seed and data: only the cap differs, and it changes the run.
  const auto loss = [](const fs::path& run) {
    return nlohmann::json::parse(slurp(run / "summary.json")).at("final_train_loss").get<double>();
  };
  CHECK(loss(capped) != loss(plain));
  CHECK(cli("eval --checkpoint '" + capped.string() + "'", dir).status == 0);
  // --config reproduces it: the file's softcap is read back.
  const auto again = dir / "again";
  REQUIRE(cli("train --quiet --config '" + (capped / "config.json").string() + "' --out '" +
                  again.string() + "'",
              dir)
              .status == 0);
  CHECK(loss(again) == loss(capped));
}

TEST_CASE("cli: --mlp swiglu trains LLaMA's MLP at its default width, and eval reads it back") {
  const auto dir = scratch("swiglu_run");
  const auto out = dir / "run";
  REQUIRE(cli(std::string("train ") + kTinySort + " --steps 10 --mlp swiglu --out '" +
                  out.string() + "'",
              dir)
              .status == 0);
  const auto config = nlohmann::json::parse(slurp(out / "config.json"));
  CHECK(config["model"]["block"]["mlp"] == "swiglu");
  CHECK(config["model"]["block"]["d_ff"] == 32);  // int(8 · 8 / 3) = 21, up to a multiple of 16
  const auto file = attnlab::load_safetensors((out / "model.safetensors").string());
  REQUIRE(file.find("blocks.0.mlp.fc1.w") != nullptr);
  CHECK(file.find("blocks.0.mlp.fc1.w")->shape == std::vector<std::size_t>{8, 64});  // [gate | up]
  CHECK(file.find("blocks.0.mlp.fc2.w")->shape == std::vector<std::size_t>{32, 8});
  CHECK(cli("eval --checkpoint '" + out.string() + "'", dir).status == 0);
}

TEST_CASE("cli: every run writes its effective config, and --config reproduces the run from it") {
  const auto dir = scratch("config_round_trip");
  const auto a = dir / "a", b = dir / "b";
  REQUIRE(
      cli(std::string("train ") + kTinySort + " --steps 10 --lr 0.01 --out '" + a.string() + "'",
          dir)
          .status == 0);
  REQUIRE(fs::exists(a / "config.json"));
  const auto config = nlohmann::json::parse(slurp(a / "config.json"));
  CHECK(config.at("lr") == 0.01);
  CHECK(config.at("model").at("block").at("attention").at("heads") == 2);
  CHECK(config.at("model").at("block").at("d_ff") == 32);  // resolved: 4 * d_model
  CHECK(config.at("model").at("max_len") == 5);            // decided by the task
  // The file alone (with another --out) gives the same run; a flag overrides the file.
  const Run r = cli("train --quiet --config '" + (a / "config.json").string() +
                        "' --threads 1 --out '" + b.string() + "'",
                    dir);
  REQUIRE(r.status == 0);
  CHECK(slurp(a / "metrics.csv") == slurp(b / "metrics.csv"));
  auto same = nlohmann::json::parse(slurp(b / "config.json"));
  same["out"] = a.string();
  CHECK(same == config);
  REQUIRE(cli("train --quiet --config '" + (a / "config.json").string() + "' --lr 0.02 --out '" +
                  (dir / "c").string() + "'",
              dir)
              .status == 0);
  CHECK(nlohmann::json::parse(slurp(dir / "c" / "config.json")).at("lr") == 0.02);
  CHECK(slurp(a / "metrics.csv") != slurp(dir / "c" / "metrics.csv"));
  // A partial file keeps the defaults; an unknown key or a bad value is one error line naming it.
  std::ofstream(dir / "bad.json") << R"({"model": {"block": {"attention": {"d_modl": 8}}}})";
  check_bad_input("train --config '" + (dir / "bad.json").string() + "'", dir,
                  "model.block.attention.d_modl");
  std::ofstream(dir / "bad2.json") << R"({"task": {"kind": "copy"}})";
  check_bad_input("train --config '" + (dir / "bad2.json").string() + "'", dir, "task.kind");
}

TEST_CASE(
    "cli: resume writes into DIR and says so, --steps extends the run, recipe flags are refused") {
  const auto dir = scratch("resume_rules");
  const auto run = dir / "run";
  REQUIRE(cli(std::string("train ") + kTinySort + " --steps 20 --out '" + run.string() + "'", dir)
              .status == 0);
  const std::string resume = "train --quiet --resume '" + run.string() + "'";
  // Bug: the last line named the default --out (runs/train) instead of DIR.
  const Run again = cli(resume, dir);
  REQUIRE(again.status == 0);
  CHECK(again.out.find("outputs: " + run.string() + "/config.json") != std::string::npos);
  CHECK(again.out.find("runs/train") == std::string::npos);
  // Bug: --steps was silently ignored. It extends the run; the schedule is that of a 30-step run.
  const Run more = cli(resume + " --steps 30", dir);
  REQUIRE(more.status == 0);
  CHECK(more.out.find("done: 30 steps") != std::string::npos);
  const std::string metrics = slurp(run / "metrics.csv");
  CHECK(metrics.find("\n30,") != std::string::npos);
  CHECK(nlohmann::json::parse(slurp(run / "config.json")).at("steps") == 30);
  // Fewer steps than the saved step: refused, naming the field.
  check_bad_input(resume + " --steps 10", dir, "steps");
  // Run control takes effect: --out writes elsewhere and leaves DIR alone.
  const Run moved = cli(resume + " --steps 35 --out '" + (dir / "moved").string() + "'", dir);
  REQUIRE(moved.status == 0);
  CHECK(fs::exists(dir / "moved" / "model.safetensors"));
  CHECK(slurp(run / "metrics.csv") == metrics);
  // Every recipe class is refused with status 2, naming the flag: model, task, optimizer,
  // schedule, data and a whole config.
  for (const char* flag : {"--heads 1", "--causal", "--task reverse", "--lr 0.1", "--batch 8",
                           "--warmup 2", "--seed 4", "--eval-size 8"}) {
    const std::string name = std::string(flag).substr(0, std::string(flag).find(' '));
    check_bad_input(resume + " " + flag, dir, name + " cannot be given with --resume");
  }
  check_bad_input(resume + " --config '" + (run / "config.json").string() + "'", dir,
                  "--config cannot be given with --resume");
}

TEST_CASE("cli: a run directory of the flat layout (written before the nested config) loads") {
  const auto dir = scratch("legacy_run");
  const std::string legacy = std::string(ATTNLAB_TEST_DATA_DIR) + "/legacy_run";
  const Run e = cli("eval --show 0 --checkpoint '" + legacy + "'", dir);
  REQUIRE(e.status == 0);
  CHECK(e.out.find("loss 2.1781  accuracy 0.0500") != std::string::npos);  // as the old binary
  const Run r = cli(
      "train --quiet --resume '" + legacy + "' --steps 6 --out '" + (dir / "more").string() + "'",
      dir);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("done: 6 steps") != std::string::npos);
  const auto config = nlohmann::json::parse(slurp(dir / "more" / "config.json"));
  CHECK(config.at("model").at("block").at("d_ff") == 16);
  CHECK(config.at("task").at("kind") == "sort");
}

TEST_CASE("cli: a task that needs later tokens is refused with --causal") {
  const auto dir = scratch("reverse_causal");
  check_bad_input("train --task reverse --causal", dir,
                  "task reverse cannot be learned with --causal");
  check_bad_input("train --task sort --causal", dir, "task sort cannot be learned with --causal");
}

// ---- every file attnlab reads is input: configs, study grids, checkpoint metadata ----

namespace {

// Writes `text` to dir/name and returns the path, quoted for the shell.
std::string quoted_file(const fs::path& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir / name, std::ios::binary) << text;
  return "'" + (dir / name).string() + "'";
}

// {"a": {"b": value}} for the key path "a.b".
std::string json_at(const std::string& key, const std::string& value) {
  std::string open, close;
  std::size_t start = 0;
  for (;;) {
    const std::size_t dot = key.find('.', start);
    open += "{\"" + key.substr(start, dot - start) + "\": ";
    close += "}";
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return open + value + close;
}

std::string number_text(long double v, bool integer) {
  char buf[64];
  std::snprintf(buf, sizeof buf, integer ? "%.0Lf" : "%.9Lg", v);
  return buf;
}

// A tiny sort run's checkpoint whose model_config metadata is edited by `edit`.
fs::path run_with_edited_meta(const fs::path& dir, const std::string& name,
                              const std::function<void(nlohmann::json&)>& edit) {
  const fs::path run = dir / name;
  const std::string args =
      "train --task sort --symbols 6 --length 5 --d-model 8 --heads 2 "
      "--batch 4 --eval-size 16 --threads 1 --quiet --steps 2 --out '" +
      run.string() + "'";
  REQUIRE(cli(args, dir).status == 0);
  const std::string path = (run / "model.safetensors").string();
  attnlab::SafetensorsFile file = attnlab::load_safetensors(path);
  auto config = nlohmann::json::parse(file.metadata.at("model_config"));
  edit(config);
  file.metadata["model_config"] = config.dump();
  attnlab::save_safetensors(path, file.tensors, file.metadata);
  return run;
}

}  // namespace

TEST_CASE("config input: negative counts, huge sizes and out-of-range numbers name the key") {
  const auto dir = scratch("config_table");
  // Each of these once reached std::bad_alloc (a negative count wrapped to a huge size) or
  // converted 1e30 to int; now one line naming the key path and the value as written.
  const std::pair<std::string, std::string> cases[] = {
      {R"({"model": {"layers": -3}})",
       "config key 'model.layers': expected an integer in [1, 64], "
       "got -3"},
      {R"({"model": {"block": {"d_ff": -1}}})",
       "config key 'model.block.d_ff': expected an "
       "integer in [1, 65536] or 0 (4 * d_model; swiglu: 8/3 * d_model), got -1"},
      {R"({"steps": 1e30})",
       "config key 'steps': expected an integer in [1, 100000000], got 1e+30"},
      {R"({"steps": 2.5})", "config key 'steps': expected an integer in [1, 100000000], got 2.5"},
      {R"({"model": {"block": {"attention": {"heads": 1000000, "d_model": 1000000}}}})",
       "got 1000000"},
      {R"({"model": {"vocab_sizes": [3, -1]}})",
       "config key 'model.vocab_sizes[1]': expected an "
       "integer in [0, 18446744073709551615], got -1"},
      {R"({"lr": "0.1"})", "config key 'lr': expected a number, got \"0.1\""},
      {R"({"model": {"block": {"attention": {"causal": 1}}}})", "causal"},
      {R"({"model": {"block": {"attention": {"sdpa": {"causal": 1}}}}})",
       "config key 'model.block.attention.sdpa.causal': expected true or false, got 1"},
  };
  int i = 0;
  for (const auto& [text, needle] : cases)
    check_bad_input("train --config " + quoted_file(dir, "c" + std::to_string(i++) + ".json", text),
                    dir, needle);
}

TEST_CASE("config input: hostile files are one line, status 2") {
  const auto dir = scratch("config_hostile");
  const std::string nested(100000, '[');
  const std::string deep_objects = [] {
    std::string s;
    for (int i = 0; i < 100000; ++i) s += "{\"model\": ";
    return s + "1" + std::string(100000, '}');
  }();
  const std::pair<std::string, std::string> cases[] = {
      {"", "not valid JSON"},
      {"[1, 2]", "config: expected a JSON object (TrainConfig), got array"},
      {nested + std::string(100000, ']'), "nested deeper than 64 levels"},
      {deep_objects, "nested deeper than 64 levels in model.model"},
      {"{\"out\": \"\xff\xfe\"}", "not valid JSON"},
      {R"({"steps": 5, "model": {"layers": 1, "layers": 2}})",
       "the key 'layers' is given twice in model"},
      {"{\"optimizer\": \"" + std::string(10'000'000, 'a') + "\"}",
       "optimizer expected adamw|sgd|muon, got aaaa"},
      {"{\"task\": {\"kind\": \"" + std::string(10'000'000, 'b') + "\"}}", "task.kind"},
  };
  int i = 0;
  for (const auto& [text, needle] : cases) {
    const std::string file = quoted_file(dir, "h" + std::to_string(i++) + ".json", text);
    check_bad_input("train --config " + file, dir, needle);
    const Run r = cli("train --config " + file, dir);
    CHECK(r.err.size() < 2200);  // a 10 MB value is cut, not echoed
    for (const char c : r.err) CHECK(static_cast<unsigned char>(c) != 0xff);  // no raw bad UTF-8
  }
}

TEST_CASE("config input: every bounded flag refuses its out-of-range values as a file does") {
  const auto dir = scratch("config_bounds");
  int files = 0;
  for (const attnlab::app::FieldBound& b : attnlab::app::train_config_bounds()) {
    CAPTURE(b.key);
    const bool zero_allowed_in_file = !b.zero_means.empty();
    std::vector<long double> bad;
    if (b.integer)
      bad = {zero_allowed_in_file ? -1.0L : b.lo - 1, b.hi + 1};
    else
      bad = {b.lo_open && !zero_allowed_in_file ? b.lo : -1.0L,
             b.hi == std::numeric_limits<double>::max() ? 1e309L : b.hi * 2};
    const std::string expected = "expected " + attnlab::app::bound_expectation(b, false);
    for (const long double v : bad) {
      const std::string text = number_text(v, b.integer && v == std::floor(v));
      CAPTURE(text);
      if (!b.flag.empty())
        check_bad_input("train " + std::string(b.flag) + " " + text, dir,
                        std::string(b.flag) + ": " + expected + ", got " + text);
      const std::string file = quoted_file(dir, "b" + std::to_string(files++) + ".json",
                                           json_at(std::string(b.key), text));
      // Past double's range the JSON parser itself refuses the number.
      check_bad_input("train --config " + file, dir,
                      v > std::numeric_limits<double>::max()
                          ? "number overflow parsing '" + text + "'"
                          : "config key '" + std::string(b.key) + "': " + expected);
    }
  }
  // A value inside every bound is accepted both ways (the table is not stricter than the flags).
  const Run ok = cli(std::string("train ") + kTinySort + " --steps 2 --out '" +
                         (dir / "ok").string() + "' --seed 18446744073709551615",
                     dir);
  CHECK(ok.status == 0);
  const Run again = cli("train --quiet --config '" + (dir / "ok" / "config.json").string() +
                            "' --out '" + (dir / "ok2").string() + "'",
                        dir);
  CHECK(again.status == 0);
}

TEST_CASE("config input: a study group's base is checked with its path") {
  const auto dir = scratch("study_bounds");
  auto plan = nlohmann::json::parse(slurp(fs::path(ATTNLAB_TEST_DATA_DIR) / ".." / ".." / "data" /
                                          "configs" / "study_micro.json"));
  plan["groups"][0]["base"]["model"]["block"]["attention"]["heads"] = -2;
  const std::string file = quoted_file(dir, "study.json", plan.dump());
  check_bad_input("study --config " + file + " --out '" + (dir / "out").string() + "'", dir,
                  "config key 'groups[0].base.model.block.attention.heads': expected an integer in "
                  "[1, 256], got -2");
  const Run r = cli("study --config " + file + " --out '" + (dir / "out").string() + "'", dir);
  CHECK(r.out.empty());  // refused before the plan is printed
  plan = nlohmann::json::parse(slurp(fs::path(ATTNLAB_TEST_DATA_DIR) / ".." / ".." / "data" /
                                     "configs" / "study_micro.json"));
  plan["groups"][0]["lrs"][1] = "fast";
  check_bad_input("study --config " + quoted_file(dir, "study2.json", plan.dump()), dir,
                  "config key 'groups[0].lrs[1]': expected a number, got \"fast\"");
}

TEST_CASE("config input: a checkpoint's metadata is checked before the model is built") {
  const auto dir = scratch("meta_bounds");
  // The table's case: "layers": -1 in the metadata, the tensors untouched.
  const fs::path bad =
      run_with_edited_meta(dir, "neg", [](nlohmann::json& c) { c["model"]["layers"] = -1; });
  check_bad_input(
      "eval --checkpoint '" + bad.string() + "'", dir,
      "model_config: config key 'model.layers': expected an integer in [1, 64], got -1");
  check_bad_input("train --resume '" + bad.string() + "' --steps 4", dir, "'model.layers'");
  // Valid metadata that describes another model than the tensors: refused, naming the tensor.
  const fs::path more =
      run_with_edited_meta(dir, "more", [](nlohmann::json& c) { c["model"]["layers"] = 64; });
  check_bad_input("eval --checkpoint '" + more.string() + "'", dir,
                  "model_config disagrees with the file's tensors: the config's model has "
                  "'blocks.1.ln1.gamma' (8,), which the file does not hold");
  const fs::path wide = run_with_edited_meta(dir, "wide", [](nlohmann::json& c) {
    c["model"]["block"]["attention"]["d_model"] = 16;
    c["model"]["block"]["d_ff"] = 64;
  });
  check_bad_input("eval --checkpoint '" + wide.string() + "'", dir, "in the config's model and (");
  check_bad_input("generate --prompt a --checkpoint '" + wide.string() + "'", dir,
                  "model_config disagrees");
  const fs::path fewer = run_with_edited_meta(
      dir, "fewer", [](nlohmann::json& c) { c["model"]["block"]["attn_only"] = true; });
  check_bad_input("eval --checkpoint '" + fewer.string() + "'", dir,
                  "which the config's model does not have");
}

TEST_CASE("config input: a run that would not fit in memory is refused before it allocates") {
  const auto dir = scratch("memory_limit");
  const std::string big = "train --task text --data '" + std::string(ATTNLAB_TEST_DATA_DIR) +
                          "/text/hamlet_excerpt.txt' --causal --block 1024 --d-model 4096 "
                          "--heads 32 --layers 64 --d-ff 65536 --batch 64 --quiet --out '" +
                          (dir / "big").string() + "'";
  // On this machine's memory (or the ulimit): about 150 GiB of parameters alone.
  check_bad_input(big, dir, "train: the run would need about");
  check_bad_input(big, dir, "more than the");
  CHECK_FALSE(fs::exists(dir / "big"));
  // The limit can be set: 1 KiB refuses even the tiny run, naming the setting; "none" lifts it.
  const std::string tiny =
      std::string("train ") + kTinySort + " --steps 2 --out '" + (dir / "tiny").string() + "'";
  const Run limited = cli(tiny, dir, "ATTNLAB_MEMORY_LIMIT=1K");
  CHECK(limited.status == 2);
  CHECK(limited.err.find("available (ATTNLAB_MEMORY_LIMIT=1K)") != std::string::npos);
  CHECK(cli(tiny, dir, "ATTNLAB_MEMORY_LIMIT=none").status == 0);
  CHECK(cli(tiny, dir, "ATTNLAB_MEMORY_LIMIT=2G").status == 0);
  const Run nonsense = cli(tiny, dir, "ATTNLAB_MEMORY_LIMIT=lots");
  CHECK(nonsense.status == 2);
  CHECK(nonsense.err.find("ATTNLAB_MEMORY_LIMIT expected a size in bytes") != std::string::npos);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // they need the address space
  // Under ulimit -v the limit is what the address space leaves (the issue's 4 GB).
  const std::string cmd =
      "bash -c \"ulimit -v 4000000; '" + std::string(ATTNLAB_CLI_PATH) + "' " + big + "\"";
  const Run under = cli_command(cmd, dir);
  CHECK(under.status == 2);
  CHECK(under.err.find("ulimit -v") != std::string::npos);
  // Past the check (no limit), an allocation that fails says what and how much, exit 1.
  const Run oom = cli_command("bash -c \"ulimit -v 3000000; ATTNLAB_MEMORY_LIMIT=none '" +
                                  std::string(ATTNLAB_CLI_PATH) + "' " + big + "\"",
                              dir);
  CHECK(oom.status == 1);
  CHECK(oom.err.rfind("attnlab: error: train: out of memory: ", 0) == 0);
  CHECK(std::count(oom.err.begin(), oom.err.end(), '\n') == 1);
#endif
}

#endif  // ATTNLAB_CLI_PATH

TEST_CASE("cli: --tie-embeddings trains a model whose head is the token table, and eval reads it") {
  const auto dir = scratch("tied_run");
  const auto out = dir / "run";
  const Run r = cli(std::string("train ") + kTinySort + " --steps 20 --d-ff 16 --tie-embeddings " +
                        "--out '" + out.string() + "'",
                    dir);
  REQUIRE(r.status == 0);
  CHECK(nlohmann::json::parse(slurp(out / "config.json"))["model"]["tie_embeddings"] == true);
  const auto file = attnlab::load_safetensors((out / "model.safetensors").string());
  CHECK(file.find("embed.fields.0.table") != nullptr);
  CHECK(file.find("head.w") == nullptr);
  CHECK(cli("eval --checkpoint '" + out.string() + "'", dir).status == 0);
  // Two input fields (recall: keys and values) have no one table to share.
  check_bad_input(std::string("train --tie-embeddings ") + kTinyRecall, dir,
                  "vocab_sizes expected one token field when tie_embeddings is set");
  // A checkpoint whose config says the other kind: refused, naming head.w.
  const fs::path untied_as_tied = run_with_edited_meta(
      dir, "untied", [](nlohmann::json& c) { c["model"]["tie_embeddings"] = true; });
  check_bad_input("eval --checkpoint '" + untied_as_tied.string() + "'", dir,
                  "the file holds 'head.w', which the config's model does not have");
  const std::string path = (out / "model.safetensors").string();
  attnlab::SafetensorsFile tied = attnlab::load_safetensors(path);
  auto config = nlohmann::json::parse(tied.metadata.at("model_config"));
  config["model"]["tie_embeddings"] = false;
  tied.metadata["model_config"] = config.dump();
  attnlab::save_safetensors(path, tied.tensors, tied.metadata);
  check_bad_input("eval --checkpoint '" + out.string() + "'", dir,
                  "the config's model has 'head.w' (8, 6), which the file does not hold");
}

TEST_CASE("cli: --decay-params matrices decays the 2-D parameters only, and resumes exactly") {
  const auto dir = scratch("decay_params");
  const std::string common = std::string("train ") + kTinyRecall +
                             " --steps 30 --eval-every 5 --lr 0.01 --seed 3 --weight-decay 0.5";
  const Run full =
      cli(common + " --decay-params matrices --out '" + (dir / "full").string() + "'", dir);
  REQUIRE(full.status == 0);
  // recall, one attention-only layer, C 16: the tables (8 + 8 + 5 rows), w_q, w_k, w_v, w_o and
  // the head are decayed; ln1's and ln_f's gamma and beta (4 × 16 values) are not.
  CHECK(full.out.find("weight decay 0.5 (decay_params matrices): 8 of 12 parameter tensors, 1488 "
                      "of 1552 values") != std::string::npos);
  CHECK(nlohmann::json::parse(slurp(dir / "full" / "config.json"))["decay_params"] == "matrices");
  const Run first = cli(
      common + " --decay-params matrices --stop-after 15 --out '" + (dir / "split").string() + "'",
      dir);
  CHECK(first.status == 130);
  const Run second =
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir);
  REQUIRE(second.status == 0);
  CHECK(second.out.find("decay_params matrices") != std::string::npos);  // kept by the checkpoint
  const std::string metrics = slurp(dir / "full" / "metrics.csv");
  CHECK(metrics.size() > 100);
  CHECK(metrics == slurp(dir / "split" / "metrics.csv"));
  // The default decays every parameter: another run.
  const Run all = cli(common + " --out '" + (dir / "all").string() + "'", dir);
  REQUIRE(all.status == 0);
  CHECK(all.out.find("(decay_params all): 12 of 12 parameter tensors") != std::string::npos);
  CHECK(slurp(dir / "all" / "metrics.csv") != metrics);
  check_bad_input("train --decay-params biases", dir, "--decay-params");
  check_bad_input("train --resume '" + (dir / "full").string() + "' --decay-params all", dir,
                  "--decay-params cannot be given with --resume");
  std::ofstream(dir / "bad.json") << R"({"decay_params": "some"})";
  check_bad_input("train --config '" + (dir / "bad.json").string() + "'", dir, "decay_params");
}

TEST_CASE(
    "cli: --optimizer muon: Muon for the hidden matrices, AdamW for the rest, resumed exactly") {
  const auto dir = scratch("muon");
  const std::string common =
      "train --task recall --keys 8 --values 8 --pairs 4 --d-model 16 --heads 1 --attn-only "
      "--batch 16 --eval-size 64 --threads 1 --steps 30 --eval-every 5 --lr 0.01 --seed 3 "
      "--optimizer muon --muon-lr 0.05";
  // The four attention matrices (16 x 16) to Muon at 0.05 = 5 x lr; tables, head, norms to AdamW.
  const std::string groups_line =
      "param groups: muon muon lr×5 wd 0: 4 tensors (1,024 values); default adamw lr×1 wd 0: 8 "
      "tensors (528 values)\n";
  const Run full = cli(common + " --out '" + (dir / "full").string() + "'", dir);
  REQUIRE(full.status == 0);
  CHECK(full.out.find(groups_line) != std::string::npos);
  const auto config = nlohmann::json::parse(slurp(dir / "full" / "config.json"));
  CHECK(config["optimizer"] == "muon");
  CHECK(config["muon_lr"] == 0.05);
  CHECK(config["muon_ns_steps"] == 5);
  // Stopped and resumed: the momentum buffers travel in the checkpoint, so the metrics agree.
  const Run first =
      cli(common + " --stop-after 15 --quiet --out '" + (dir / "split").string() + "'", dir);
  CHECK(first.status == 130);
  const Run second = cli("train --resume '" + (dir / "split").string() + "' --threads 1", dir);
  REQUIRE(second.status == 0);
  const std::string metrics = slurp(dir / "full" / "metrics.csv");
  CHECK(metrics.size() > 100);
  CHECK(metrics == slurp(dir / "split" / "metrics.csv"));
  // AdamW alone trains otherwise.
  const Run adamw = cli(std::string("train ") + kTinyRecall +
                            " --steps 30 --eval-every 5 --lr 0.01 --seed 3 --out '" +
                            (dir / "adamw").string() + "'",
                        dir);
  REQUIRE(adamw.status == 0);
  CHECK(slurp(dir / "adamw" / "metrics.csv") != metrics);
  // Bad values: one line, status 2, naming the flag and the value.
  const std::string tiny = std::string("train ") + kTinyRecall + " --steps 2 --optimizer muon ";
  check_bad_input(tiny + "--muon-momentum -0.1", dir, "--muon-momentum");
  check_bad_input(tiny + "--muon-ns-steps 0", dir, "--muon-ns-steps");
  check_bad_input(tiny + "--muon-scale spectal", dir, "--muon-scale");
  check_bad_input(tiny + "--muon-lr 0", dir, "--muon-lr");
  check_bad_input(std::string("train ") + kTinyRecall + " --optimizer lion", dir, "--optimizer");
}

TEST_CASE("cli: param_groups in a config file: the groups are printed, and a resume is exact") {
  const auto dir = scratch("param_groups");
  std::ofstream(dir / "groups.json") << R"({"param_groups": [
    {"name": "hidden", "match": {"pattern": "blocks.*.attn.w_*", "rank": 2}, "lr_mult": 10,
     "weight_decay": 0}]})";
  // kTinyRecall without --quiet: the groups line is progress output.
  const std::string common =
      "train --config '" + (dir / "groups.json").string() +
      "' --task recall --keys 8 --values 8 --pairs 4 --d-model 16 --heads 1 --attn-only "
      "--batch 16 --eval-size 64 --threads 1 --steps 30 --eval-every 5 --lr 0.01 --seed 3 "
      "--weight-decay 0.5";
  const std::string groups_line =
      "param groups: hidden adamw lr×10 wd 0: 4 tensors (1,024 values); default adamw lr×1 wd "
      "0.5: 8 tensors (528 values)\n";
  const Run full = cli(common + " --out '" + (dir / "full").string() + "'", dir);
  REQUIRE(full.status == 0);
  const std::size_t at = full.out.find(groups_line);
  CHECK(at != std::string::npos);
  CHECK(full.out.find("param groups:", at + 1) == std::string::npos);  // once
  // The 8 parameters of "default" decay; "hidden" has weight decay 0.
  CHECK(full.out.find("8 of 12 parameter tensors, 528 of 1552 values") != std::string::npos);
  const auto config = nlohmann::json::parse(slurp(dir / "full" / "config.json"));
  CHECK(config["param_groups"][0]["name"] == "hidden");
  CHECK(config["param_groups"][0]["lr_mult"] == 10);
  // Stopped and resumed (its config, groups included, from the checkpoint): the same metrics.
  const Run first =
      cli(common + " --stop-after 15 --quiet --out '" + (dir / "split").string() + "'", dir);
  CHECK(first.status == 130);
  CHECK(first.out.find("param groups:") == std::string::npos);  // --quiet
  const Run second = cli("train --resume '" + (dir / "split").string() + "' --threads 1", dir);
  REQUIRE(second.status == 0);
  CHECK(second.out.find(groups_line) != std::string::npos);
  const std::string metrics = slurp(dir / "full" / "metrics.csv");
  CHECK(metrics.size() > 100);
  CHECK(metrics == slurp(dir / "split" / "metrics.csv"));
  // Without groups the run differs.
  const Run plain = cli(std::string("train ") + kTinyRecall +
                            " --steps 30 --eval-every 5 --lr 0.01 --seed 3 --weight-decay 0.5 "
                            "--out '" +
                            (dir / "plain").string() + "'",
                        dir);
  REQUIRE(plain.status == 0);
  CHECK(plain.out.find("param groups:") == std::string::npos);
  CHECK(slurp(dir / "plain" / "metrics.csv") != metrics);
  // Bad groups: one line, status 2, naming the key and the value.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"([{"name": "x", "match": {"pattern": "blocks.*.mlp.*"}}])",
       "train: param_groups[0].match (group 'x') expected a selector that matches a parameter, "
       "got {pattern \"blocks.*.mlp.*\"}: it matched none of the 12 parameters"},
      {R"([{"name": "x", "match": {"rank": 2}, "lr_mult": -1}])",
       "param_groups[0].lr_mult (group 'x') expected a finite value >= 0, got -1"},
      {R"([{"name": "x", "match": {"rank": 2}, "optimizer": "lion"}])",
       "param_groups[0].optimizer (group 'x') expected adamw|sgd|muon"},
      {R"([{"name": "x", "match": {"rank": 1}, "optimizer": "muon"}])",
       "param_groups[0].match (group 'x') expected matrices only for optimizer muon (route the "
       "rest to adamw), got '"},
      {R"([{"name": "x", "lr": 2}])", "config key 'param_groups[0].lr': unknown key"},
      {R"([{"name": "x", "match": {"kind": "weights"}}])", "param_groups[0].match.kind"},
  };
  int i = 0;
  for (const auto& [groups, needle] : bad) {
    const fs::path file = dir / ("bad" + std::to_string(i++) + ".json");
    std::ofstream(file) << R"({"param_groups": )" << groups << "}";
    check_bad_input(
        std::string("train ") + kTinyRecall + " --steps 2 --config '" + file.string() + "'", dir,
        needle);
  }
}

namespace {

const char* kAccumRecall =
    "--task recall --keys 8 --values 8 --pairs 4 --d-model 16 --heads 1 --attn-only "
    "--eval-size 64 --threads 1 --quiet --steps 30 --eval-every 5 --lr 0.01 --seed 3";

// metrics.csv as rows of named columns.
std::vector<std::map<std::string, std::string>> csv_rows(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> names;
  std::vector<std::map<std::string, std::string>> rows;
  const auto split = [](const std::string& s) {
    std::vector<std::string> parts;
    std::stringstream ss(s);
    std::string part;
    while (std::getline(ss, part, ',')) parts.push_back(part);
    return parts;
  };
  std::getline(in, line);
  names = split(line);
  while (std::getline(in, line)) {
    const auto values = split(line);
    REQUIRE(values.size() == names.size());
    std::map<std::string, std::string> row;
    for (std::size_t i = 0; i < names.size(); ++i) row[names[i]] = values[i];
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

TEST_CASE("cli: --schedule wsd logs the warmup, the flat part and the line, and resumes exactly") {
  const auto dir = scratch("wsd");
  const std::string recipe = std::string("train ") + kTinyRecall +
                             " --steps 40 --eval-every 5 --lr 0.01 --seed 3 --schedule wsd "
                             "--warmup 4 --warmdown 0.5 --min-lr 0.001";
  REQUIRE(cli(recipe + " --out '" + (dir / "full").string() + "'", dir).status == 0);
  const auto config = nlohmann::json::parse(slurp(dir / "full" / "config.json"));
  CHECK(config.at("schedule") == "wsd");
  CHECK(config.at("warmdown") == 0.5);
  // The LR of the step each row logs (row r: step r - 1): warmup over 4 steps, base_lr to step
  // N - D = 20, then the line to min_lr over the last D = 20 steps.
  const std::string metrics = slurp(dir / "full" / "metrics.csv");
  const auto rows = csv_rows(metrics);
  REQUIRE(rows.size() == 9);  // steps 0, 5, ..., 40
  const auto lr_of_step = [](int s) {
    if (s < 4) return 0.01 * (s + 1) / 4;
    if (s <= 20) return 0.01;
    return 0.001 + 0.009 * (40 - s) / 20.0;
  };
  for (const auto& row : rows) {
    const int step = std::stoi(row.at("step"));
    CAPTURE(step);
    CHECK(std::stod(row.at("lr")) ==
          doctest::Approx(lr_of_step(std::max(step - 1, 0))).epsilon(1e-6));
  }
  // The effective config repeats the run; a resumed run continues it exactly.
  REQUIRE(cli("train --quiet --config '" + (dir / "full" / "config.json").string() +
                  "' --threads 1 --out '" + (dir / "again").string() + "'",
              dir)
              .status == 0);
  CHECK(slurp(dir / "again" / "metrics.csv") == metrics);
  CHECK(cli(recipe + " --stop-after 20 --out '" + (dir / "split").string() + "'", dir).status ==
        130);
  REQUIRE(
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir).status ==
      0);
  CHECK(slurp(dir / "split" / "metrics.csv") == metrics);
  check_bad_input("train --resume '" + (dir / "full").string() + "' --warmdown 0.2", dir,
                  "--warmdown cannot be given with --resume");
  check_bad_input("train --warmdown 1.5", dir, "--warmdown: expected a number in [0, 1], got 1.5");
  check_bad_input("train --warmdown -0.1", dir, "--warmdown");
  check_bad_input("train --warmdown nan", dir, "--warmdown");
  std::ofstream(dir / "bad.json") << R"({"warmdown": 2})";
  check_bad_input("train --config '" + (dir / "bad.json").string() + "'", dir,
                  "config key 'warmdown': expected a number in [0, 1], got 2");
  std::ofstream(dir / "bad.json") << R"({"schedule": "linear"})";
  check_bad_input("train --config '" + (dir / "bad.json").string() + "'", dir,
                  "schedule expected constant|cosine|wsd, got linear");
}

TEST_CASE("cli: --decay independent is kept by the config and the checkpoint, sgd refuses it") {
  const auto dir = scratch("decay_mode");
  const std::string common = std::string("train ") + kTinyRecall +
                             " --steps 30 --eval-every 5 --lr 0.01 --seed 3 --weight-decay 0.1";
  const Run full =
      cli(common + " --decay independent --out '" + (dir / "full").string() + "'", dir);
  REQUIRE(full.status == 0);
  CHECK(full.out.find("weight decay 0.1 (decay_params all, independent of the base lr)") !=
        std::string::npos);
  CHECK(nlohmann::json::parse(slurp(dir / "full" / "config.json")).at("decay") == "independent");
  const std::string metrics = slurp(dir / "full" / "metrics.csv");
  CHECK(
      cli(common + " --decay independent --stop-after 15 --out '" + (dir / "split").string() + "'",
          dir)
          .status == 130);
  const Run second =
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir);
  REQUIRE(second.status == 0);
  CHECK(second.out.find("independent of the base lr") != std::string::npos);  // kept
  CHECK(slurp(dir / "split" / "metrics.csv") == metrics);
  // torch's decoupled decay (the default) is another run: 1 - lr · wd against 1 - wd per step.
  const Run plain = cli(common + " --out '" + (dir / "plain").string() + "'", dir);
  REQUIRE(plain.status == 0);
  CHECK(plain.out.find("(decay_params all): ") != std::string::npos);
  CHECK(nlohmann::json::parse(slurp(dir / "plain" / "config.json")).at("decay") == "decoupled");
  CHECK(slurp(dir / "plain" / "metrics.csv") != metrics);
  check_bad_input("train --resume '" + (dir / "full").string() + "' --decay decoupled", dir,
                  "--decay cannot be given with --resume");
  check_bad_input("train --decay coupled", dir, "--decay");
  check_bad_input("train --optimizer sgd --decay independent", dir,
                  "decay expected decoupled (the default) with optimizer sgd");
  std::ofstream(dir / "bad.json") << R"({"decay": "l2"})";
  check_bad_input("train --config '" + (dir / "bad.json").string() + "'", dir,
                  "decay expected decoupled|independent, got l2");
}

TEST_CASE("cli: --skip-outliers adds the skipped column and count, resumes, refuses bad values") {
  const auto dir = scratch("skip_outliers");
  const std::string common =
      std::string("train ") + kTinyRecall + " --steps 40 --eval-every 5 --lr 0.01 --seed 3";
  const Run full = cli(common + " --skip-outliers 4 --out '" + (dir / "full").string() + "'", dir);
  REQUIRE(full.status == 0);
  CHECK(full.out.find("skipped the update") == std::string::npos);  // 40 steps: window not full
  CHECK(nlohmann::json::parse(slurp(dir / "full" / "config.json")).at("skip_outliers") == 4);
  CHECK(nlohmann::json::parse(slurp(dir / "full" / "summary.json")).at("skipped_steps") == 0);
  const std::string metrics = slurp(dir / "full" / "metrics.csv");
  for (const auto& row : csv_rows(metrics)) CHECK(row.at("skipped") == "0");
  const std::string jsonl = slurp(dir / "full" / "metrics.jsonl");
  CHECK(nlohmann::json::parse(jsonl.substr(0, jsonl.find('\n'))).at("skipped") == 0);
  // Until the window fills nothing is skipped: the run is the run without skipping, row for row.
  REQUIRE(cli(common + " --out '" + (dir / "plain").string() + "'", dir).status == 0);
  const auto with = csv_rows(metrics), without = csv_rows(slurp(dir / "plain" / "metrics.csv"));
  REQUIRE(with.size() == without.size());
  CHECK(without[0].count("skipped") == 0);  // no column in a run without skipping
  for (std::size_t i = 0; i < with.size(); ++i) CHECK(with[i].at("loss") == without[i].at("loss"));
  CHECK(cli(common + " --skip-outliers 4 --stop-after 20 --out '" + (dir / "split").string() + "'",
            dir)
            .status == 130);
  REQUIRE(
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir).status ==
      0);
  CHECK(slurp(dir / "split" / "metrics.csv") == metrics);
  check_bad_input("train --resume '" + (dir / "full").string() + "' --skip-outliers 3", dir,
                  "--skip-outliers cannot be given with --resume");
  check_bad_input("train --skip-outliers 0", dir, "--skip-outliers: expected a number in (0, ");
  check_bad_input("train --skip-outliers -2", dir, "--skip-outliers");
  check_bad_input("train --skip-outliers nan", dir, "--skip-outliers");
  check_bad_input("train --skip-outliers inf", dir, "--skip-outliers");
  std::ofstream(dir / "bad.json") << R"({"skip_outliers": -3})";
  check_bad_input("train --config '" + (dir / "bad.json").string() + "'", dir,
                  "config key 'skip_outliers'");
  // 0 in a file is off, as other zero-means keys: a run without the column.
  std::ofstream(dir / "off.json") << R"({"skip_outliers": 0})";
  REQUIRE(cli(common + " --config '" + (dir / "off.json").string() + "' --out '" +
                  (dir / "off").string() + "'",
              dir)
              .status == 0);
  CHECK(csv_rows(slurp(dir / "off" / "metrics.csv"))[0].count("skipped") == 0);
}

TEST_CASE("cli: --z-loss adds the z_loss column beside the cross-entropy, bad values exit 2") {
  const auto dir = scratch("z_loss");
  const std::string common = std::string("train ") + kAccumRecall + " --batch 16";
  REQUIRE(cli(common + " --z-loss 1e-3 --out '" + (dir / "z").string() + "'", dir).status == 0);
  REQUIRE(cli(common + " --out '" + (dir / "plain").string() + "'", dir).status == 0);
  const auto z = csv_rows(slurp(dir / "z" / "metrics.csv"));
  const auto plain = csv_rows(slurp(dir / "plain" / "metrics.csv"));
  REQUIRE(z.size() == 7);  // steps 0, 5, ..., 30
  REQUIRE(plain.size() == z.size());
  CHECK(plain[0].count("z_loss") == 0);  // a run without z-loss keeps its columns
  REQUIRE(z[0].count("z_loss") == 1);
  CHECK(z[0].at("z_loss") == "nan");  // no training step yet
  // The same weights at step 0: the eval loss is the cross-entropy alone in both runs.
  CHECK(z[0].at("eval_loss") == plain[0].at("eval_loss"));
  for (std::size_t i = 1; i < z.size(); ++i) {
    const double z_term = std::stod(z[i].at("z_loss")), ce = std::stod(z[i].at("loss"));
    CAPTURE(i);
    CHECK(z_term > 0);
    CHECK(std::isfinite(z_term));
    CHECK(std::isfinite(ce));
  }
  CHECK(z.back().at("loss") != plain.back().at("loss"));  // the term trained the model
  const std::string jsonl = slurp(dir / "z" / "metrics.jsonl");
  CHECK(nlohmann::json::parse(jsonl.substr(0, jsonl.find('\n'))).contains("z_loss"));
  CHECK(slurp(dir / "z" / "config.json").find("\"z_loss\": 0.001") != std::string::npos);
  check_bad_input("train --z-loss -1e-4", dir, "--z-loss: expected a number in [0, 1], got -1e-4");
  check_bad_input("train --z-loss nan", dir, "--z-loss");
}

TEST_CASE("cli: --grad-accum 2 resumes exactly, and follows one batch of twice the rows") {
  const auto dir = scratch("grad_accum");
  const std::string accum = std::string("train ") + kAccumRecall + " --batch 8 --grad-accum 2";
  REQUIRE(cli(accum + " --out '" + (dir / "full").string() + "'", dir).status == 0);
  const Run first = cli(accum + " --stop-after 15 --out '" + (dir / "split").string() + "'", dir);
  CHECK(first.status == 130);  // stopped mid-run, checkpoint saved
  const Run second =
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir);
  REQUIRE(second.status == 0);
  const std::string full = slurp(dir / "full" / "metrics.csv");
  CHECK(full.size() > 100);
  CHECK(full == slurp(dir / "split" / "metrics.csv"));
  CHECK(slurp(dir / "full" / "metrics.jsonl") == slurp(dir / "split" / "metrics.jsonl"));
  CHECK(slurp(dir / "full" / "config.json").find("\"grad_accum\": 2") != std::string::npos);

  // Micro-batch k holds rows [8k, 8k + 8) of the 16 rows a step of --batch 16 draws: the same
  // data and the gradient of the same mean, so the runs agree to float rounding.
  REQUIRE(cli(std::string("train ") + kAccumRecall + " --batch 16 --out '" +
                  (dir / "one").string() + "'",
              dir)
              .status == 0);
  const auto a = csv_rows(full), b = csv_rows(slurp(dir / "one" / "metrics.csv"));
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 1; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(std::stod(a[i].at("loss")) == doctest::Approx(std::stod(b[i].at("loss"))).epsilon(1e-4));
    CHECK(std::stod(a[i].at("eval_loss")) ==
          doctest::Approx(std::stod(b[i].at("eval_loss"))).epsilon(1e-4));
  }
  // Without accumulation, --batch 8 sees half the data per step: another run.
  REQUIRE(cli(std::string("train ") + kAccumRecall + " --batch 8 --out '" +
                  (dir / "half").string() + "'",
              dir)
              .status == 0);
  CHECK(std::stod(csv_rows(slurp(dir / "half" / "metrics.csv")).back().at("loss")) !=
        doctest::Approx(std::stod(a.back().at("loss"))).epsilon(1e-4));
  CHECK(nlohmann::json::parse(slurp(dir / "full" / "summary.json")).at("steps_done") == 30);
  check_bad_input("train --grad-accum 0", dir,
                  "--grad-accum: expected an integer in [1, 4096], got 0");
  check_bad_input("train --grad-accum 1.5", dir, "--grad-accum");
}
