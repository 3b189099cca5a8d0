// BLAS kernels: on a CPU with AVX2 or AVX-512 attnlab runs kernels made for it, blas::gemm agrees
// with xtensor-blas's xt::linalg::dot (an independent matmul) for every transpose and padded
// leading dimensions, and the core choice itself works: a probe process started on OpenBLAS's
// generic Prescott kernels (OPENBLAS_CORETYPE, marked as OpenBLAS's own fallback by a test-only
// variable) is started again on the right core exactly once, a user's choice and
// ATTNLAB_BLAS_CORE=keep are respected, and a failed self-check starts it once more on OpenBLAS's
// core, with a warning.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xview.hpp>

#include "attnlab/blas.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"
#include "helpers.hpp"
#include "temp_dir.hpp"

using namespace attnlab;

namespace {

bool cpu_has_avx2_fma() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

// The core attnlab should move a generic fallback to, read independently of the library (on an
// AVX-512 BF16 CPU too: Cooperlake's sgemm and dgemm are SkylakeX's, and OpenBLAS 0.3.21 refuses
// its name in OPENBLAS_CORETYPE).
std::string expected_best_core() {
  return cpu_has_avx512() && cpu_has_avx2_fma() ? "SkylakeX" : "Haswell";
}

bool user_chose_core() {
  return std::getenv("OPENBLAS_CORETYPE") || std::getenv("ATTNLAB_BLAS_CORE");
}

struct ThreadCountGuard {
  ~ThreadCountGuard() { set_num_threads(1); }
};

// C = alpha op(A) op(B) + beta C through blas::gemm on padded buffers (ld = width + a_pad, + b_pad,
// + 5 for C), against alpha * xt::linalg::dot(op(A), op(B)) + beta * C on the unpadded views.
template <class T>
void check_gemm_against_dot(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k,
                            double tolerance, std::size_t a_pad = 5, std::size_t b_pad = 5) {
  CAPTURE(ta);
  CAPTURE(tb);
  CAPTURE(m);
  CAPTURE(n);
  CAPTURE(k);
  const std::size_t pad = 5;
  const std::size_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const std::size_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  Rng rng(17);
  const auto a = randn<T, 2>({a_rows, a_cols + a_pad}, rng);
  const auto b = randn<T, 2>({b_rows, b_cols + b_pad}, rng);
  auto c = randn<T, 2>({m, n + pad}, rng);
  const xt::xtensor<T, 2> c0 = c;
  const T alpha = T(0.75), beta = T(-0.5);

  const xt::xtensor<T, 2> a_view = xt::view(a, xt::all(), xt::range(0, a_cols));
  const xt::xtensor<T, 2> b_view = xt::view(b, xt::all(), xt::range(0, b_cols));
  const xt::xtensor<T, 2> op_a = ta ? xt::xtensor<T, 2>(xt::transpose(a_view)) : a_view;
  const xt::xtensor<T, 2> op_b = tb ? xt::xtensor<T, 2>(xt::transpose(b_view)) : b_view;
  const xt::xtensor<T, 2> expected =
      alpha * xt::linalg::dot(op_a, op_b) + beta * xt::view(c0, xt::all(), xt::range(0, n));

  blas::gemm<T>(ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha,
                a.data(), static_cast<int>(a_cols + a_pad), b.data(),
                static_cast<int>(b_cols + b_pad), beta, c.data(), static_cast<int>(n + pad));
  const xt::xtensor<T, 2> got = xt::view(c, xt::all(), xt::range(0, n));
  CHECK(test::rel_error(got, expected) < tolerance);
  // The padding of C is never written.
  const xt::xtensor<T, 2> padding = xt::view(c, xt::all(), xt::range(n, n + pad));
  const xt::xtensor<T, 2> padding0 = xt::view(c0, xt::all(), xt::range(n, n + pad));
  // Compared first: doctest would print the tensors through xtensor's printer, on which GCC 12 at
  // -O3 warns falsely (-Wrestrict).
  const bool padding_kept = padding == padding0;
  CHECK(padding_kept);
}

// ---- the probe process ----

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Probe {
  int status = -1;
  int starts = 0;                             // how many times main ran: 1, or 2 after a restart
  std::map<std::string, std::string> values;  // key=value lines of stdout
  std::string err;
  const std::string& operator[](const std::string& key) const {
    static const std::string missing = "(missing)";
    const auto it = values.find(key);
    return it == values.end() ? missing : it->second;
  }
};

// Runs the probe with the BLAS variables cleared, then `assignments` ("A=1 B=2") set, in `mode`.
Probe run_probe(const std::string& assignments, const std::string& mode = "init") {
  const test::TempDir dir;
  const std::string cmd =
      "env -u OPENBLAS_CORETYPE -u ATTNLAB_BLAS_CORE -u ATTNLAB_BLAS_SIMULATE_FALLBACK "
      "-u ATTNLAB_BLAS_SIMULATE_BAD_KERNEL -u OPENBLAS_VERBOSE -u ATTNLAB_GEMM -u ATTNLAB_BF16 "
      "-u ATTNLAB_BLAS_RESTART PROBE_STARTS_FILE='" +
      dir.file("starts") + "' " + assignments + " '" + ATTNLAB_BLAS_CORE_PROBE_PATH + "' " + mode +
      " >'" + dir.file("out") + "' 2>'" + dir.file("err") + "'";
  const int raw = std::system(cmd.c_str());
  Probe p;
  p.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  p.err = slurp(dir.file("err"));
  const std::string starts = slurp(dir.file("starts"));
  for (char ch : starts) p.starts += ch == '\n' ? 1 : 0;
  std::istringstream lines(slurp(dir.file("out")));
  std::string line;
  while (std::getline(lines, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) p.values[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return p;
}

// Every probe exits 0, prints nothing on stderr (the library never prints), computes a correct
// gemm, and reports the core OpenBLAS really runs.
void check_probe_sane(const Probe& p) {
  CHECK(p.status == 0);
  CHECK(p.err.empty());
  CHECK(p["gemm_ok"] == "1");
  CHECK(p["sgemm_ok"] == "1");
  CHECK(p["core"] == p["corename_now"]);
}

}  // namespace

TEST_CASE("blas_info: on a CPU with AVX2 + FMA or AVX-512 the kernels are made for it") {
  const BlasInfo& info = blas_info();
  INFO(blas_summary(info));
  CHECK(info.library.rfind("OpenBLAS ", 0) == 0);
  CHECK(info.cpu.avx2 == static_cast<bool>(__builtin_cpu_supports("avx2")));
  CHECK(info.cpu.avx512f == static_cast<bool>(__builtin_cpu_supports("avx512f")));
  CHECK(blas_summary(info).find("core " + info.core) != std::string::npos);
  if (user_chose_core()) {
    MESSAGE("OPENBLAS_CORETYPE or ATTNLAB_BLAS_CORE is set: the core is the user's choice");
    return;
  }
  CHECK(info.warning.empty());
  if (!cpu_has_avx2_fma()) return;
  // The cores with AVX2 + FMA kernels or better; every other one is a generic fallback here.
  const bool fast = info.core == "Haswell" || info.core == "Zen" || info.core == "SkylakeX" ||
                    info.core == "Cooperlake" || info.core == "SapphireRapids";
  CHECK(fast);
  if (cpu_has_avx512()) CHECK(info.core != "Haswell");
}

TEST_CASE("blas::gemm matches xt::linalg::dot for every transpose, padded, on 1 and 2 threads") {
  ThreadCountGuard guard;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    CAPTURE(threads);
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        check_gemm_against_dot<float>(ta, tb, 67, 45, 53, 1e-5);
        check_gemm_against_dot<double>(ta, tb, 67, 45, 53, 1e-13);
        // Large enough for blas::gemm to split rows (tall) or columns (wide) over 2 threads.
        check_gemm_against_dot<float>(ta, tb, 301, 70, 96, 1e-5);
        check_gemm_against_dot<double>(ta, tb, 40, 517, 80, 1e-13);
      }
    }
  }
}

// oneDNN reads an operand stored k rows deep whose rows lie a multiple of 2 KB apart through a
// copy at another stride (blas.cpp, kConflictStride), when k >= 128, C's other side >= 32 and the
// operand at most 8 MiB, where oneDNN's kernels are narrower than AVX-512 (elsewhere the same
// cases are read in place): each such case, the bounds, and both thread counts (the 2-thread split
// copies per part).
TEST_CASE("blas::gemm on rows a multiple of 2 KB apart, as oneDNN reads them through a copy") {
  ThreadCountGuard guard;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    CAPTURE(threads);
    // B (k x n) at ldb 512: copied.
    check_gemm_against_dot<float>(false, false, 40, 500, 130, 1e-5, 5, 12);
    check_gemm_against_dot<float>(false, false, 384, 512, 128, 1e-5, 5, 0);
    // A stored k x m at lda 512: copied; then both A and B at 512 with no padding at all (widths
    // a multiple of 512: the copy's stride moves by 16).
    check_gemm_against_dot<float>(true, false, 500, 60, 140, 1e-5, 12, 4);
    check_gemm_against_dot<float>(true, false, 512, 512, 129, 1e-5, 0, 0);
    // Untransposed A and transposed B are read along their rows: never copied.
    check_gemm_against_dot<float>(false, true, 64, 40, 512, 1e-5, 0, 0);
    // Just below the bounds (k = 127; C's other side 31): not copied.
    check_gemm_against_dot<float>(false, false, 40, 512, 127, 1e-5, 5, 0);
    check_gemm_against_dot<float>(false, false, 31, 512, 200, 1e-5, 5, 0);
    check_gemm_against_dot<float>(true, false, 512, 31, 200, 1e-5, 0, 5);
    // Over 8 MiB (1100 rows of 2048): read in place.
    check_gemm_against_dot<float>(false, false, 40, 2048, 1100, 1e-5, 5, 0);
    // A narrow slice of a wide buffer (width 24 of ld 1024): the copy takes the width only.
    check_gemm_against_dot<float>(false, false, 64, 24, 300, 1e-5, 5, 1000);
  }
}

TEST_CASE("blas core probe: a user's OPENBLAS_CORETYPE is kept") {
  const Probe p = run_probe("OPENBLAS_CORETYPE=Prescott");
  check_probe_sane(p);
  CHECK(p["core"] == "Prescott");
  CHECK(p["openblas_core"] == "Prescott");
  CHECK(p["switched"] == "0");
  CHECK(p["reason"].find("set by the user") != std::string::npos);
  CHECK(p["env_coretype"] == "Prescott");
}

TEST_CASE("blas core probe: from OpenBLAS's generic Prescott fallback to the CPU's core") {
  const Probe p = run_probe("OPENBLAS_CORETYPE=Prescott ATTNLAB_BLAS_SIMULATE_FALLBACK=1");
  check_probe_sane(p);
  CHECK(p["openblas_core"] == "Prescott");
  CHECK(p["warning"].empty());
  if (!cpu_has_avx2_fma()) {
    CHECK(p["core"] == "Prescott");
    CHECK(p.starts == 1);
    return;
  }
  // Started once more, with the core in the new image's environment: OpenBLAS loaded on it.
  CHECK(p.starts == 2);
  CHECK(p["core"] == expected_best_core());
  CHECK(p["env_coretype"] == expected_best_core());
  CHECK(p["restart"] == "Prescott:" + expected_best_core());
  CHECK(p["switched"] == "1");
  CHECK(p["reason"].find("generic fallback") != std::string::npos);
}

TEST_CASE("blas core probe: OpenBLAS's own fast core is kept without a restart") {
  const Probe p = run_probe("");
  check_probe_sane(p);
  CHECK(p["switched"] == "0");
  CHECK(p["restart"] == "(unset)");
  CHECK(p["env_coretype"] == "(unset)");
  if (p["openblas_core"] == "Haswell" || p["openblas_core"] == "Zen" ||
      p["openblas_core"] == "SkylakeX" || p["openblas_core"] == "Cooperlake")
    CHECK(p.starts == 1);
}

TEST_CASE("blas core probe: ATTNLAB_BLAS_CORE=keep leaves the fallback alone") {
  const Probe p = run_probe(
      "OPENBLAS_CORETYPE=Prescott ATTNLAB_BLAS_SIMULATE_FALLBACK=1 ATTNLAB_BLAS_CORE=keep");
  check_probe_sane(p);
  CHECK(p["core"] == "Prescott");
  CHECK(p["switched"] == "0");
  CHECK(p["reason"] == "ATTNLAB_BLAS_CORE=keep");
  CHECK(p.starts == 1);
}

TEST_CASE("blas core probe: a failed self-check starts once more on OpenBLAS's core and warns") {
  if (!cpu_has_avx2_fma()) return;
  const Probe p = run_probe(
      "OPENBLAS_CORETYPE=Prescott ATTNLAB_BLAS_SIMULATE_FALLBACK=1 "
      "ATTNLAB_BLAS_SIMULATE_BAD_KERNEL=1");
  check_probe_sane(p);
  CHECK(p.starts == 3);
  CHECK(p["restart"] == "Prescott:" + expected_best_core() + ":failed");
  CHECK(p["core"] == "Prescott");
  CHECK(p["switched"] == "0");
  CHECK(p["warning"].find("self-check") != std::string::npos);
  CHECK(p["warning"].find(expected_best_core()) != std::string::npos);
}

TEST_CASE("blas core probe: ATTNLAB_BLAS_CORE forces a core, case-insensitively") {
  const Probe slow = run_probe("ATTNLAB_BLAS_CORE=prescott");
  check_probe_sane(slow);
  CHECK(slow["core"] == "Prescott");
  CHECK(slow["switched"] == (slow["openblas_core"] == "Prescott" ? "0" : "1"));
  CHECK(slow.starts == (slow["openblas_core"] == "Prescott" ? 1 : 2));
  if (cpu_has_avx2_fma()) {
    const Probe fast = run_probe(
        "OPENBLAS_CORETYPE=Prescott ATTNLAB_BLAS_SIMULATE_FALLBACK=1 "
        "ATTNLAB_BLAS_CORE=Haswell");
    check_probe_sane(fast);
    CHECK(fast["core"] == "Haswell");
    CHECK(fast["switched"] == "1");
    CHECK(fast.starts == 2);
  }
}

TEST_CASE(
    "blas core probe: an unknown or unsupported ATTNLAB_BLAS_CORE is refused with a warning") {
  const Probe unknown = run_probe("ATTNLAB_BLAS_CORE=Pentium4000");
  check_probe_sane(unknown);
  CHECK(unknown["core"] == unknown["openblas_core"]);
  CHECK(unknown["switched"] == "0");
  CHECK(unknown["warning"].find("Pentium4000") != std::string::npos);
  CHECK(unknown.starts == 1);
  // Cooperlake is named by OpenBLAS but refused by 0.3.21 in OPENBLAS_CORETYPE: not selectable.
  const Probe cooperlake = run_probe("ATTNLAB_BLAS_CORE=Cooperlake");
  check_probe_sane(cooperlake);
  if (cooperlake["openblas_core"] != "Cooperlake")
    CHECK(cooperlake["warning"].find("ignored: expected keep or one of") != std::string::npos);
  else
    CHECK(cooperlake["warning"].empty());
  CHECK(cooperlake.starts == 1);
  if (!cpu_has_avx512()) {
    const Probe unsupported = run_probe("ATTNLAB_BLAS_CORE=SkylakeX");
    check_probe_sane(unsupported);
    CHECK(unsupported["core"] != "SkylakeX");
    CHECK(unsupported["warning"].find("AVX-512") != std::string::npos);
  }
}

TEST_CASE(
    "blas core probe: without init_process nothing restarts and the warning names init_process") {
  // A fallback init would leave (Prescott on a CPU with AVX2 + FMA), and a forced core.
  for (const char* assignments : {"OPENBLAS_CORETYPE=Prescott ATTNLAB_BLAS_SIMULATE_FALLBACK=1",
                                  "ATTNLAB_BLAS_CORE=Haswell"}) {
    CAPTURE(assignments);
    const Probe p = run_probe(assignments, "no-init");
    check_probe_sane(p);
    CHECK(p["initialized"] == "0");
    CHECK(p["switched"] == "0");
    CHECK(p["core"] == p["openblas_core"]);
    CHECK(p.starts == 1);
    if (cpu_has_avx2_fma() && p["openblas_core"] != "Haswell") {
      CHECK(p["warning"].find("blas::init_process(argv)") != std::string::npos);
      CHECK(p["reason"].find("not called") != std::string::npos);
    }
  }
  const Probe with_init = run_probe("ATTNLAB_BLAS_CORE=Haswell", "init");
  check_probe_sane(with_init);
  CHECK(with_init["initialized"] == "1");
  if (cpu_has_avx2_fma()) CHECK(with_init["core"] == "Haswell");
}

TEST_CASE("blas core probe: first gemms from 4 threads leave the environment alone (threads)") {
  // Where init_process would restart on another core, a gemm before it changes nothing: a fifth
  // thread reads OPENBLAS_CORETYPE throughout. Clean under TSan (tsan preset).
  const Probe p = run_probe("ATTNLAB_BLAS_CORE=Haswell", "threads");
  check_probe_sane(p);
  CHECK(p["env_changed"] == "0");
  CHECK(p["env_coretype"] == "(unset)");
  CHECK(p["switched"] == "0");
  CHECK(p["initialized"] == "0");
}

TEST_CASE("blas core probe: ATTNLAB_GEMM picks the float engine: oneDNN by default where built") {
  const Probe automatic = run_probe("");
  check_probe_sane(automatic);
  CHECK(automatic["warning"].empty());
  if (onednn_built()) {
    CHECK(automatic["engine"] == "onednn");
    CHECK(automatic["engine_name"].rfind("oneDNN ", 0) == 0);
  } else {
    CHECK(automatic["engine"] == "openblas");
    CHECK(automatic["engine_reason"] == "built without oneDNN");
  }
  // No init: the engine is chosen by the check of the first gemm all the same.
  const Probe no_init = run_probe("", "no-init");
  check_probe_sane(no_init);
  CHECK(no_init["engine"] == automatic["engine"]);

  const Probe openblas = run_probe("ATTNLAB_GEMM=openblas");
  check_probe_sane(openblas);
  CHECK(openblas["engine"] == "openblas");
  CHECK(openblas["engine_name"] == openblas["library"]);
  CHECK(openblas["engine_reason"] == "ATTNLAB_GEMM=openblas");
  CHECK(openblas["warning"].empty());

  const Probe onednn = run_probe("ATTNLAB_GEMM=onednn");
  check_probe_sane(onednn);
  if (onednn_built()) {
    CHECK(onednn["engine"] == "onednn");
    CHECK(onednn["engine_reason"] == "ATTNLAB_GEMM=onednn");
    CHECK(onednn["warning"].empty());
  } else {
    CHECK(onednn["engine"] == "openblas");
    CHECK(onednn["warning"].find("built without oneDNN") != std::string::npos);
  }
}

TEST_CASE("blas core probe: an unknown ATTNLAB_GEMM, or a failed oneDNN self-check, warns") {
  const Probe unknown = run_probe("ATTNLAB_GEMM=fastest");
  check_probe_sane(unknown);
  CHECK(unknown["engine"] == "openblas");
  CHECK(unknown["warning"] ==
        "ATTNLAB_GEMM=fastest ignored: expected auto, onednn or openblas; float gemms run in " +
            unknown["library"]);
  if (!onednn_built()) return;
  // The test-only bad kernel fails every self-check, OpenBLAS's core's and oneDNN's alike.
  const Probe bad = run_probe("ATTNLAB_GEMM=onednn ATTNLAB_BLAS_SIMULATE_BAD_KERNEL=1");
  check_probe_sane(bad);
  CHECK(bad["engine"] == "openblas");
  CHECK(bad["engine_reason"] == "oneDNN failed attnlab's sgemm self-check");
  CHECK(bad["warning"].find("failed attnlab's sgemm self-check (ATTNLAB_GEMM=onednn); float gemms "
                            "run in OpenBLAS") != std::string::npos);
}

TEST_CASE("blas core probe: a mode other than init, no-init or threads is refused") {
  const Probe p = run_probe("", "sideways");
  CHECK(p.status == 2);
  CHECK(p.err.find("mode expected init, no-init or threads, got sideways") != std::string::npos);
}

TEST_CASE(
    "measure_gemm_peak_gflops: a positive finite rate per thread count; bad arguments named") {
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    const double single = measure_gemm_peak_gflops<float>(threads, 256, 2);
    const double dbl = measure_gemm_peak_gflops<double>(threads, 256, 2);
    CHECK(std::isfinite(single));
    // Any optimised BLAS core does well over 1 GFLOP/s on a 256³ product (a plain loop does not).
    CHECK(single > 1.0);
    CHECK(dbl > 1.0);
  }
  CHECK_THROWS_WITH_AS((void)measure_gemm_peak_gflops<float>(0),
                       "measure_gemm_peak_gflops: threads expected >= 1, got 0",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)measure_gemm_peak_gflops<float>(1, 8),
                       "measure_gemm_peak_gflops: n expected >= 16, got 8", std::invalid_argument);
  CHECK_THROWS_AS((void)measure_gemm_peak_gflops<double>(1, 64, 0), std::invalid_argument);
}

TEST_CASE(
    "blas core probe: ATTNLAB_BF16 picks how bf16 gemms run: oneDNN with bf16 units by default") {
  const Probe automatic = run_probe("");
  check_probe_sane(automatic);
  CHECK(automatic["warning"].empty());  // auto never warns: a failed check only emulates
  if (automatic["bf16_units"] == "1") {
    const std::string units = automatic["amx"] == "1" ? "AMX" : "AVX-512 BF16";
    CHECK((automatic["bf16_engine"] == "onednn"
               ? automatic["bf16_reason"] == units
               : automatic["bf16_reason"].find("self-check") != std::string::npos));
  } else {
    CHECK(automatic["amx"] == "0");
    CHECK(automatic["bf16_engine"] == "emulated");
    CHECK(automatic["bf16_reason"] ==
          "no AMX, nor AMD's AVX-512 BF16: oneDNN's bf16 gemms would be slower than the emulation");
    CHECK(automatic["bf16_engine_name"] ==
          "emulated: operands rounded to bf16, fp32 gemm in " + automatic["engine_name"]);
  }
  const Probe emulated = run_probe("ATTNLAB_BF16=emulated");
  check_probe_sane(emulated);
  CHECK(emulated["bf16_engine"] == "emulated");
  CHECK(emulated["bf16_reason"] == "ATTNLAB_BF16=emulated");
  CHECK(emulated["warning"].empty());

  // onednn where oneDNN has a bf16 matmul that passes the self-check; else a warning, emulated.
  const Probe onednn = run_probe("ATTNLAB_BF16=onednn");
  check_probe_sane(onednn);
  if (onednn["bf16_engine"] == "onednn") {
    CHECK(onednn_built());
    CHECK(onednn["bf16_reason"] == "ATTNLAB_BF16=onednn");
    CHECK(onednn["warning"].empty());
    CHECK(onednn["bf16_engine_name"].find("bf16 matmul") != std::string::npos);
  } else {
    CHECK(onednn["warning"].find("ATTNLAB_BF16=onednn ignored (") == 0);
    CHECK(onednn["warning"].find("); bf16 gemms are emulated") != std::string::npos);
  }

  const Probe unknown = run_probe("ATTNLAB_BF16=fp8");
  check_probe_sane(unknown);
  CHECK(unknown["bf16_engine"] == "emulated");
  CHECK(unknown["warning"] ==
        "ATTNLAB_BF16=fp8 ignored: expected auto, onednn or emulated; bf16 gemms are emulated");
}

TEST_CASE("blas::init_process refuses an argv without a program name, naming itself") {
  CHECK_THROWS_WITH_AS(
      blas::init_process(nullptr),
      "blas::init_process: argv expected main's argv (argv[0] set), got a null pointer",
      std::invalid_argument);
  char* empty[] = {nullptr};
  CHECK_THROWS_AS(blas::init_process(empty), std::invalid_argument);
}
