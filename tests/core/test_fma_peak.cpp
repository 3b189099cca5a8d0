// The cores' FMA peak (attnlab/fma_peak.hpp): a rate per thread count from the widest loop the CPU
// runs, never below what an sgemm reaches on the same cores, and bad arguments named; the AMX bf16
// peak where AMX is usable.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <stdexcept>
#include <string>

#include "attnlab/blas.hpp"
#include "attnlab/fma_peak.hpp"

using namespace attnlab;

namespace {
// tests/CMakeLists.txt registers this as a ctest skip marker: the AMX case is reported as skipped
// on machines without AMX, never as passed.
constexpr const char* kAmxSkipMarker = "ATTNLAB_TEST_SKIPPED_NO_AMX";
}  // namespace

TEST_CASE("measure_fma_peak: a rate per thread count, from a loop this CPU runs") {
  const CpuFeatures& cpu = blas_info().cpu;
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    const FmaPeak peak = measure_fma_peak(threads, 0.005, 2);
    CHECK(std::isfinite(peak.gflops));
    CHECK(peak.gflops > 1.0);
    CHECK(peak.threads == threads);
    if (cpu.avx512f) {
      CHECK((peak.vector == "avx512 zmm" || peak.vector == "avx2 ymm"));
    } else if (cpu.avx2 && cpu.fma) {
      CHECK(peak.vector == "avx2 ymm");
    }
    CHECK(to_string(peak).find(" GFLOP/s (" + std::to_string(threads) + " thread") !=
          std::string::npos);
  }
}

// An sgemm is FMAs on the same cores, so it cannot beat a loop that does nothing else: a loop that
// left ports idle (too few chains, spills to memory) would show here as a peak below the sgemm's.
// Each side is its best of several rounds, and the margin allows for a core taken away for a
// moment by a test running beside this one. One beside it can take a core for longer: the
// per-thread-count case above runs FMA loops on every thread for half a second (a CI run saw the
// loop at 135 GFLOP/s against an sgemm's 178 then). So the rounds go on, up to 8 (about 1.5 s),
// until the loop's best reaches the margin. Under a sanitizer the -O1 build of the loop is not the
// product's, so only the release build is held to it.
TEST_CASE("measure_fma_peak: at least what a single-threaded sgemm reaches on one core") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  MESSAGE("sanitizer build: the loop is not the optimised one; comparison not made");
#else
  double fma = 0, gemm = 0;
  for (int i = 0; i < 8 && (i < 2 || fma < 0.8 * gemm); ++i) {
    fma = std::max(fma, measure_fma_peak(1, 0.01, 3).gflops);
    gemm = std::max(gemm, measure_gemm_peak_gflops<float>(1, 512, 3));
  }
  INFO("fma " << fma << " GFLOP/s, sgemm " << gemm << " GFLOP/s");
  CHECK(fma >= 0.8 * gemm);
#endif
}

TEST_CASE("measure_fma_peak: bad arguments named") {
  CHECK_THROWS_WITH_AS((void)measure_fma_peak(0), "measure_fma_peak: threads expected >= 1, got 0",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)measure_fma_peak(1, 0.0),
                       "measure_fma_peak: seconds expected a finite time > 0, got 0.000000",
                       std::invalid_argument);
  CHECK_THROWS_AS((void)measure_fma_peak(1, std::nan("")), std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)measure_fma_peak(1, 0.01, 0),
                       "measure_fma_peak: rounds expected >= 1, got 0", std::invalid_argument);
}

// Where AMX is usable: a rate per thread count from the tile loop, above what the same cores'
// FMA loop reaches (a TDPBF16PS does 8,192 multiply-adds; a zmm FMA 16). Elsewhere the test is
// reported as skipped, with the reason, and the call refuses with that reason.
TEST_CASE("measure_amx_peak: the AMX bf16 tile peak where AMX is usable, a refusal elsewhere") {
  const AmxSupport& amx = amx_support();
  CHECK(amx.usable == amx.reason.empty());
  if (!amx.usable) {
    CHECK_THROWS_WITH_AS(measure_amx_peak(1), ("measure_amx_peak: " + amx.reason).c_str(),
                         std::runtime_error);
    std::cout << kAmxSkipMarker << ": " << amx.reason << std::endl;
    return;
  }
  const FmaPeak fma = measure_fma_peak(1, 0.005, 2);
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    const FmaPeak peak = measure_amx_peak(threads, 0.005, 2);
    CHECK(peak.threads == threads);
    CHECK(peak.vector == "amx bf16");
    CHECK(std::isfinite(peak.gflops));
    if (threads == 1) CHECK(peak.gflops > fma.gflops);
  }
  CHECK_THROWS_AS(measure_amx_peak(0), std::invalid_argument);
}
