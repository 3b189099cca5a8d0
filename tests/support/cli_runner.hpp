// Runs the attnlab binary as a user does, for the CLI tests (tests/app/test_cli*.cpp): a command's
// status, stdout and stderr, a scratch folder per case, and the tiny runs the cases share.
#pragma once

#ifdef ATTNLAB_CLI_PATH

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/io/safetensors.hpp"
#include "temp_dir.hpp"

namespace attnlab::test {

namespace fs = std::filesystem;

struct Run {
  int status = -1;
  std::string out, err;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh scratch folder per test case and process (ctest runs cases in parallel processes, and
// two suites, e.g. the normal and the sanitizer build, may run at once), removed when the process
// exits (TempDir).
inline fs::path scratch(const std::string& name) {
  static std::vector<std::unique_ptr<TempDir>> made;
  made.push_back(std::make_unique<TempDir>("attnlab_cli_" + name + "_"));
  return made.back()->path();
}

// `env_assignments` ("NAME=value ..."), when given, are added to the environment of the run.
// The CLI runs without a core the shell forces (OPENBLAS_CORETYPE): these tests check attnlab's
// own choice of core, and under a forced one the results can depend on the thread count, which a
// resumed run picks afresh (seen: OPENBLAS_CORETYPE=Haswell on an AVX-512 machine moved the
// attention metrics of a resumed run by an ulp). A test that needs the shell's core passes
// shell_core() in env_assignments.
// A shell command line, its output captured.
inline Run cli_command(const std::string& command, const fs::path& dir) {
  const std::string cmd = command + " >'" + (dir / "stdout.txt").string() + "' 2>'" +
                          (dir / "stderr.txt").string() + "'";
  const int raw = std::system(cmd.c_str());
  Run r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(dir / "stdout.txt");
  r.err = slurp(dir / "stderr.txt");
  return r;
}

inline Run cli(const std::string& args, const fs::path& dir,
               const std::string& env_assignments = "") {
  return cli_command(
      "env -u OPENBLAS_CORETYPE " + env_assignments + " '" + ATTNLAB_CLI_PATH + "' " + args, dir);
}

// "OPENBLAS_CORETYPE=<value>" when the shell forces a core, else "": for the tests that compare the
// CLI's core with this process's.
inline std::string shell_core() {
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  return core && *core ? std::string("OPENBLAS_CORETYPE='") + core + "'" : std::string();
}

// Exactly one line on stderr, "attnlab: error: ...", and status 2.
inline void check_bad_input(const std::string& args, const fs::path& dir,
                            const std::string& needle) {
  CAPTURE(args);
  const Run r = cli(args, dir);
  CHECK(r.status == 2);
  CHECK(r.err.rfind("attnlab: error: ", 0) == 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.find(needle) != std::string::npos);
}

inline const char* kTinyRecall =
    "--task recall --keys 8 --values 8 --pairs 4 --d-model 16 --heads 1 --attn-only "
    "--batch 16 --eval-size 64 --threads 1 --quiet";

inline const char* kTinySort =
    "--task sort --symbols 6 --length 5 --d-model 8 --heads 2 --batch 4 --eval-every 5 "
    "--eval-size 16 --threads 1 --quiet";

inline const char* kAccumRecall =
    "--task recall --keys 8 --values 8 --pairs 4 --d-model 16 --heads 1 --attn-only "
    "--eval-size 64 --threads 1 --quiet --steps 30 --eval-every 5 --lr 0.01 --seed 3";

// metrics.csv as rows of named columns.
inline std::vector<std::map<std::string, std::string>> csv_rows(const std::string& text) {
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

// A tiny sort run's checkpoint whose model_config metadata is edited by `edit`.
inline fs::path run_with_edited_meta(const fs::path& dir, const std::string& name,
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

}  // namespace attnlab::test

#endif  // ATTNLAB_CLI_PATH
