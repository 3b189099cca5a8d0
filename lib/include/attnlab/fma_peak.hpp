// The cores' measured FMA peak: the honest denominator of a utilisation figure.
//
// A register-only loop of fused multiply-adds (no loads, no stores, enough independent chains to
// hide the FMA latency) on the widest vectors the CPU runs, in every thread of a team, timed on
// the wall clock. It is what the cores can do at all, where measure_gemm_peak_gflops (blas.hpp)
// is what one BLAS sgemm does on them, which can be well below it (tests/bench/README.md), so a
// "model FLOPs utilisation" against the sgemm alone hides headroom.
// attnlab reports both and names the denominator wherever a percentage appears.
#pragma once

#include <string>

namespace attnlab {

struct FmaPeak {
  double gflops = 0;  // float FLOP/s of the team, in GFLOP/s (an FMA counts 2)
  int threads = 0;    // the OpenMP threads that ran (fewer inside a parallel region)
  // The widest loop within 3% of the fastest (a tie keeps the wider name): "avx512 zmm",
  // "avx2 ymm", "sse xmm" or "scalar".
  std::string vector;
};

// `threads` OpenMP threads (>= 1, std::invalid_argument otherwise) each run the loop for about
// `seconds` (> 0, finite) per round; the best of `rounds` (>= 1) rounds after one warm-up round.
// On a CPU with AVX-512 both the zmm and the ymm loop run (cores that split zmm into two halves
// are as fast on ymm) and the faster one counts. Takes about (rounds + 1) · seconds per loop.
FmaPeak measure_fma_peak(int threads, double seconds = 0.02, int rounds = 3);

// "512.3 GFLOP/s (2 threads, avx512 zmm)".
std::string to_string(const FmaPeak& peak);

// Whether this process can run AMX bf16 tiles: the CPU has them (amx_tile and amx_bf16 in
// /proc/cpuinfo) and the kernel granted the tile data state (Linux asks for it per process:
// arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, requested here once). `reason` says why not.
struct AmxSupport {
  bool usable = false;
  std::string reason;  // "" when usable
};
const AmxSupport& amx_support();

// The cores' AMX bf16 peak, measured as measure_fma_peak measures the FMA peak: a register-only
// loop of TDPBF16PS (bf16 products summed in fp32: 16 x 16 x 32 multiply-adds each) into four
// independent accumulator tiles, in every thread of a team; FmaPeak::vector is "amx bf16". The
// denominator of a bf16 step's utilisation where AMX runs its GEMMs. Throws std::runtime_error
// with amx_support().reason where AMX is not usable, std::invalid_argument for bad arguments.
FmaPeak measure_amx_peak(int threads, double seconds = 0.02, int rounds = 3);

}  // namespace attnlab
