// Helpers of attnlab_device_bench (device_bench.cpp): its options, a report that prints Markdown
// and writes it to the results directory, timing over DeviceOps::synchronize, the dense bf16 peaks
// of known GPUs, and the detection of the CUDA strided-batched GEMM with a precision argument.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnlab/blas.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/device_ops.hpp"

namespace attnlab::device_bench {

struct Options {
  bool emulated = false;
  bool quick = false;                             // GPU: T ∈ {1024, 4096} only
  std::string out;                                // results directory; empty: none written
  GemmPrecision precision = GemmPrecision::bf16;  // the fast precision measured
  std::size_t train_batch = 0;                    // 0: the mode's default
  double peak_tflops = 0;                         // 0: from the device name
  bool attention = true, train = true;
};

inline const char* kUsage =
    "usage: attnlab_device_bench [--emulated] [--out DIR] [--precision bf16|tf32|fp32] [--quick]\n"
    "                            [--train-batch N] [--peak TFLOPS] [--no-attention] [--no-train]\n";

inline Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " expects a value");
      return argv[++i];
    };
    if (a == "--emulated")
      o.emulated = true;
    else if (a == "--quick")
      o.quick = true;
    else if (a == "--out")
      o.out = value();
    else if (a == "--precision")
      o.precision = parse_gemm_precision(value(), "--precision");
    else if (a == "--train-batch")
      o.train_batch = std::stoul(value());
    else if (a == "--peak")
      o.peak_tflops = std::stod(value());
    else if (a == "--no-attention")
      o.attention = false;
    else if (a == "--no-train")
      o.train = false;
    else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown argument '" + a + "'");
    }
  }
  return o;
}

// Everything printed goes to stdout and to OUT/device_bench.md; a table also goes to its own file
// OUT/<name>.md.
class Report {
 public:
  explicit Report(std::string dir) : dir_(std::move(dir)) {
    if (dir_.empty()) return;
    std::filesystem::create_directories(dir_);
    all_.open(dir_ + "/device_bench.md");
    if (!all_) throw std::runtime_error("cannot write " + dir_ + "/device_bench.md");
  }
  // printf to stdout, to the full report, and to the open table's file if any.
  void print(const char* format, ...) __attribute__((format(printf, 2, 3))) {
    char line[2048];
    va_list args;
    va_start(args, format);
    std::vsnprintf(line, sizeof line, format, args);
    va_end(args);
    std::fputs(line, stdout);
    std::fflush(stdout);
    if (all_) all_ << line << std::flush;
    if (table_) table_ << line << std::flush;
  }
  void begin_table(const std::string& name) {
    if (!dir_.empty()) table_.open(dir_ + "/" + name + ".md");
  }
  void end_table() {
    if (table_.is_open()) table_.close();
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::ofstream all_, table_;
};

// How long one call takes: `warmup` calls, then timed calls (each followed by synchronize) until
// at least min_reps and min_seconds, or max_reps. Returns the mean seconds of the timed calls.
struct Timing {
  int warmup = 1, min_reps = 3, max_reps = 10;
  double min_seconds = 0.1;
};

inline double time_call(DeviceMemory& ops, const Timing& t, const std::function<void()>& call) {
  for (int i = 0; i < t.warmup; ++i) call();
  ops.synchronize();
  int reps = 0;
  double elapsed = 0;
  const auto start = std::chrono::steady_clock::now();
  while (reps < t.max_reps && (reps < t.min_reps || elapsed < t.min_seconds)) {
    call();
    ops.synchronize();
    ++reps;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return elapsed / reps;
}

// Uniform in [-1, 1) (xorshift64).
inline std::vector<float> random_values(std::size_t n, std::uint64_t seed) {
  std::vector<float> x(n);
  seed = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : x) {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    v = static_cast<float>(seed >> 40) / static_cast<float>(1 << 23) - 1.0f;
  }
  return x;
}

// max |a - b| / max |b| over n values.
inline double relative_max_error(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    err = std::isnan(d) ? INFINITY : std::max(err, d);
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? err / scale : err;
}

// The dense bf16 tensor-core peak (TFLOP/s, no sparsity) of a GPU named `name` (cuda_device_name),
// and the table entry that matched; 0 and "" when unknown.
struct Peak {
  double tflops = 0;
  std::string which;
};
inline Peak dense_bf16_peak(const std::string& name) {
  const auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H200")) return {989.4, "H200 (989.4 TFLOP/s dense bf16)"};
  if (has("H100") && (has("PCIe") || has("PCIE")))
    return {756.0, "H100 PCIe (756 TFLOP/s dense bf16)"};
  if (has("H100") && (has("SXM") || has("HBM3")))
    return {989.4, "H100 SXM (989.4 TFLOP/s dense bf16)"};
  if (has("A100")) return {312.0, "A100 (312 TFLOP/s dense bf16)"};
  return {};
}

// How the GEMM floor runs its GEMMs.
enum class FloorEngine {
  ops_gemm,       // DeviceOps::gemm head by head, in the backend's precision (emulated; fallback)
  cublas_fp32,    // cuda::gemm_strided_batched<float>
  bf16_operands,  // cuda::gemm_strided_batched_bf16 on bf16 copies of the operands
  tf32_gemm,      // cuda::gemm_strided_batched_tf32
};

inline const char* describe(FloorEngine e) {
  switch (e) {
    case FloorEngine::ops_gemm:
      return "DeviceOps::gemm, head by head";
    case FloorEngine::cublas_fp32:
      return "cuda::gemm_strided_batched<float> (cuBLAS SGEMM)";
    case FloorEngine::bf16_operands:
      return "cuda::gemm_strided_batched_bf16 on bf16 operands (cuBLAS, fp32 sums)";
    case FloorEngine::tf32_gemm:
      return "cuda::gemm_strided_batched_tf32 (cuBLAS TF32)";
  }
  return "?";
}

// The engine of `precision` on a GPU (cuBLAS strided-batched; emulated: ops_gemm).
inline FloorEngine floor_engine(bool emulated, GemmPrecision precision) {
  if (emulated) return FloorEngine::ops_gemm;
  switch (precision) {
    case GemmPrecision::bf16:
      return FloorEngine::bf16_operands;
    case GemmPrecision::tf32:
      return FloorEngine::tf32_gemm;
    case GemmPrecision::fp32:
      break;
  }
  return FloorEngine::cublas_fp32;
}

// bfloat16 bits of x, rounded to nearest even (x finite).
inline std::uint16_t bf16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

}  // namespace attnlab::device_bench
