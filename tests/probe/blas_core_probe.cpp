// attnlab_blas_core_probe [init | no-init | threads]: runs blas::init_process(argv) as a program
// does first (init, the default; it may start the probe again on another core), or not (no-init),
// then one blas::gemm, and prints blas_info() as key=value lines with what OpenBLAS itself reports
// afterwards, the float engine (ATTNLAB_GEMM), the bf16 engine (ATTNLAB_BF16) and whether a float
// gemm through it matched a plain loop. `threads` runs no init and makes the process's first gemms
// from 4 threads at once while a fifth reads OPENBLAS_CORETYPE in a loop, and prints env_changed=1
// if that thread ever saw another value. It also prints ATTNLAB_BLAS_RESTART (what a restart handed
// down); with PROBE_STARTS_FILE set, every start of main appends a line to that file, so a test
// counts the restarts. tests/core/test_blas_core.cpp starts it with different environments: the
// core is chosen once per process.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "attnlab/blas.hpp"

extern "C" char* openblas_get_corename(void);

namespace {

// blas::gemm on a 45 x 38 x 53 product against a plain loop, relative to the largest |entry|
// (double: OpenBLAS; float: the float engine, BlasInfo::engine).
template <class T = double>
bool gemm_matches_loop() {
  constexpr int m = 45, n = 38, k = 53;
  std::vector<T> a(m * k), b(k * n), c(m * n);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = T(std::sin(0.37 * static_cast<double>(i)));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = T(std::cos(0.11 * static_cast<double>(i)));
  attnlab::blas::gemm<T>(false, false, m, n, k, T(1), a.data(), k, b.data(), n, T(0), c.data(), n);
  const double tolerance = sizeof(T) == 4 ? 1e-5 : 1e-12;
  double worst = 0, scale = 0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int p = 0; p < k; ++p) sum += a[i * k + p] * b[p * n + j];
      worst = std::max(worst, std::abs(sum - double(c[i * n + j])));
      scale = std::max(scale, std::abs(sum));
    }
  }
  return worst <= tolerance * scale;
}

// The first gemms of the process from 4 threads while another reads the environment: true when
// every gemm matched; `changed` tells whether the reader saw OPENBLAS_CORETYPE change.
bool gemms_while_reading_environment(bool& changed) {
  const char* start = std::getenv("OPENBLAS_CORETYPE");
  const std::string initial = start ? start : "(unset)";
  std::atomic<bool> done{false}, seen_change{false}, all_ok{true};
  std::thread reader([&] {
    while (!done.load()) {
      const char* now = std::getenv("OPENBLAS_CORETYPE");
      if (initial != (now ? now : "(unset)")) seen_change = true;
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < 8; ++i)
        if (!gemm_matches_loop()) all_ok = false;
    });
  }
  for (auto& w : workers) w.join();
  done = true;
  reader.join();
  changed = seen_change.load();
  return all_ok.load();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "init";
  if (mode != "init" && mode != "no-init" && mode != "threads") {
    std::fprintf(stderr,
                 "attnlab_blas_core_probe: mode expected init, no-init or threads, got %s\n",
                 mode.c_str());
    return 2;
  }
  bool env_changed = false;
  if (const char* starts = std::getenv("PROBE_STARTS_FILE")) {
    if (std::FILE* f = std::fopen(starts, "a")) {
      std::fprintf(f, "start\n");
      std::fclose(f);
    }
  }
  if (mode == "init") attnlab::blas::init_process(argv);
  const bool gemm_ok =
      mode == "threads" ? gemms_while_reading_environment(env_changed) : gemm_matches_loop();
  const attnlab::BlasInfo& info = attnlab::blas_info();
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("library=%s\n", info.library.c_str());
  std::printf("core=%s\n", info.core.c_str());
  std::printf("openblas_core=%s\n", info.openblas_core.c_str());
  std::printf("switched=%d\n", info.switched ? 1 : 0);
  std::printf("reason=%s\n", info.reason.c_str());
  std::printf("warning=%s\n", info.warning.c_str());
  std::printf("cpu=%s\n", attnlab::to_string(info.cpu).c_str());
  std::printf("corename_now=%s\n", openblas_get_corename());
  std::printf("gemm_ok=%d\n", gemm_ok ? 1 : 0);
  std::printf("env_coretype=%s\n", coretype ? coretype : "(unset)");
  std::printf("initialized=%d\n", attnlab::blas::initialized() ? 1 : 0);
  std::printf("env_changed=%d\n", env_changed ? 1 : 0);
  const char* restart = std::getenv("ATTNLAB_BLAS_RESTART");
  std::printf("restart=%s\n", restart ? restart : "(unset)");
  std::printf("engine=%s\n", attnlab::to_string(info.engine));
  std::printf("engine_name=%s\n", info.engine_name.c_str());
  std::printf("engine_reason=%s\n", info.engine_reason.c_str());
  std::printf("sgemm_ok=%d\n", gemm_matches_loop<float>() ? 1 : 0);
  std::printf("bf16_engine=%s\n", attnlab::to_string(info.bf16_engine));
  std::printf("bf16_engine_name=%s\n", info.bf16_engine_name.c_str());
  std::printf("bf16_reason=%s\n", info.bf16_reason.c_str());
  std::printf("amx=%d\n", info.amx ? 1 : 0);
  std::printf("bf16_units=%d\n", info.bf16_units ? 1 : 0);
  return 0;
}
