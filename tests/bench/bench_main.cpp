// attnlab_bench: registers the benchmark grid, runs it with Google Benchmark, and prints one
// compact table (times of the GEMM floor and ratios attention / floor), the peak memory of
// attention at T = 4096, and the training-step figures. Google Benchmark flags pass through
// (e.g. --benchmark_filter=fwdbwd/.*/T:256, --benchmark_min_time=0.1).
// Own flags: --quick (a small grid, for a smoke run), --cpu-time (time with the process CPU
// clock), --no-memory, --no-train, --no-variants, --no-programs, --no-generate, --no-bf16-tiles,
// --torch=FILE
// (PyTorch eager's step times from tests/bench/torch_step.py, for the training table's ratio
// column), --malloc-default (leave glibc's malloc settings alone instead of
// attnlab::keep_freed_memory()).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "attnlab/blas.hpp"
#include "attnlab/memory.hpp"
#include "attnlab/threads.hpp"
#include "bench_bf16_tiles.hpp"
#include "bench_common.hpp"
#include "bench_generate.hpp"
#include "bench_programs.hpp"
#include "bench_train.hpp"
#include "bench_variants.hpp"

namespace attnlab::bench {
namespace {

struct GridPoint {
  std::size_t bh, T, D;
  int threads;
};

// The grid of the issue, trimmed to run in minutes on 2 cores: B·H = 64 at T = 4096 is left out
// (the reference path alone needs 4 GiB for P and about a minute per step), and 1 thread runs
// D = 64 only. T = 512 (D = 64) is added: it places the `auto` threshold.
std::vector<GridPoint> grid(bool quick) {
  std::vector<GridPoint> points;
  for (int threads : {2, 1}) {
    for (std::size_t bh : {8, 64}) {
      for (std::size_t T : {64, 256, 512, 1024, 4096}) {
        for (std::size_t D : {16, 64, 128}) {
          if (bh == 64 && T == 4096) continue;
          if (T == 512 && D != 64) continue;  // T = 512: evidence for the auto threshold only
          if (threads == 1 && D != 64) continue;
          if (quick && (T > 256 || D == 128 || threads == 1)) continue;
          points.push_back({bh, T, D, threads});
        }
      }
    }
  }
  return points;
}

// Collects the per-variant minimum seconds of each grid point, prints one line per point on stderr.
class TableReporter : public benchmark::BenchmarkReporter {
 public:
  std::map<std::string, std::map<std::string, double>> seconds;  // name -> variant -> s
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred || run.run_type != Run::RT_Iteration) continue;
      auto& entry = seconds[run.run_name.function_name];
      std::fprintf(stderr, "  %-32s", run.run_name.function_name.c_str());
      for (const auto& [name, counter] : run.counters) {
        entry[name] = counter.value;
        std::fprintf(stderr, " %s %.3f ms", name.c_str(), counter.value * 1e3);
      }
      std::fprintf(stderr, "  (%lld it)\n", static_cast<long long>(run.iterations));
    }
  }
};

double lookup(const std::map<std::string, std::map<std::string, double>>& m, const Shape& s,
              const std::string& variant) {
  const auto it = m.find(name_of(s));
  if (it == m.end()) return -1;
  const auto v = it->second.find(variant);
  return v == it->second.end() ? -1 : v->second;
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

void print_table(const std::map<std::string, std::map<std::string, double>>& t,
                 const std::vector<GridPoint>& points) {
  std::printf(
      "\nSDPA, float: GEMM floor in ms, then attention / floor (fwd = forward, "
      "f+b = forward+backward; ref = reference path, fused = fused path)\n");
  std::printf("%3s %4s %5s %4s %3s | %9s %6s %6s | %9s %6s %6s\n", "thr", "B*H", "T", "D", "cau",
              "fwd floor", "ref", "fused", "f+b floor", "ref", "fused");
  for (const GridPoint& p : points) {
    const Shape fwd{Op::forward, p.bh, p.T, p.D, p.threads};
    const Shape fb{Op::forward_backward, p.bh, p.T, p.D, p.threads};
    if (lookup(t, fwd, "floor") <= 0 && lookup(t, fb, "floor") <= 0) continue;  // filtered out
    for (bool causal : {false, true}) {
      std::printf("%3d %4zu %5zu %4zu %3s |", p.threads, p.bh, p.T, p.D, causal ? "yes" : "no");
      for (const Shape& s : {fwd, fb}) {
        const double floor = lookup(t, s, "floor");
        if (floor <= 0) {
          std::printf(" %9s %6s %6s |", "-", "-", "-");
          continue;
        }
        std::printf(" %9.3f", floor * 1e3);
        for (const char* path : {"ref", "fused"}) {
          const double x = lookup(t, s, std::string(path) + (causal ? "_causal" : ""));
          if (x > 0) {
            std::printf(" %6.2f", x / floor);
          } else {
            std::printf(" %6s", "-");
          }
        }
        std::printf(" |");
      }
      std::printf("\n");
    }
  }
}

void print_memory() {
  const Shape s{Op::forward_backward, 8, 4096, 64, 2};
  // Warm up the thread pool outside the measurement.
  attention_peak_bytes({Op::forward_backward, 8, 64, 64, 2}, SdpaPath::fused, false);
  const double mib = 1024.0 * 1024.0;
  std::printf(
      "\nPeak extra heap of one forward+backward, B*H = 8, T = 4096, D = 64, 2 threads\n"
      "(inputs excluded; O, the cache and the gradients dq, dk, dv = 32 MiB included):\n");
  for (bool causal : {false, true}) {
    const double ref = static_cast<double>(attention_peak_bytes(s, SdpaPath::reference, causal));
    const double fused = static_cast<double>(attention_peak_bytes(s, SdpaPath::fused, causal));
    std::printf(
        "  causal %-3s  reference %8.1f MiB   fused %8.1f MiB   fused / reference = 1/%.1f\n",
        causal ? "yes" : "no", ref / mib, fused / mib, ref / fused);
  }
}

}  // namespace
}  // namespace attnlab::bench

int main(int argc, char** argv) {
  using namespace attnlab::bench;
  attnlab::blas::init_process(argv);  // as any program does first: the BLAS kernels for this CPU
  // As the CLI does: freed activations are reused, not page-faulted in again every step. Off with
  // --malloc-default, to measure what it saves.
  bool keep_memory = true;
  bool quick = false, memory = true, train = true, variants = true, generation = true;
  bool programs = true, bf16_tiles = true;
  std::string torch_file;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--malloc-default") == 0) {
      keep_memory = false;
    } else if (std::strncmp(argv[i], "--torch=", 8) == 0) {
      torch_file = argv[i] + 8;
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--cpu-time") == 0) {
      use_cpu_time(true);
    } else if (std::strcmp(argv[i], "--no-memory") == 0) {
      memory = false;
    } else if (std::strcmp(argv[i], "--no-train") == 0) {
      train = false;
    } else if (std::strcmp(argv[i], "--no-variants") == 0) {
      variants = false;
    } else if (std::strcmp(argv[i], "--no-programs") == 0) {
      programs = false;
    } else if (std::strcmp(argv[i], "--no-generate") == 0) {
      generation = false;
    } else if (std::strcmp(argv[i], "--no-bf16-tiles") == 0) {
      bf16_tiles = false;
    } else {
      args.push_back(argv[i]);
    }
  }
  if (keep_memory) attnlab::keep_freed_memory();
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  const auto points = grid(quick);
  for (const GridPoint& p : points) {
    for (Op op : {Op::forward, Op::forward_backward}) {
      const Shape s{op, p.bh, p.T, p.D, p.threads};
      auto* b = benchmark::RegisterBenchmark(name_of(s).c_str(), bench_attention, s)
                    ->UseRealTime()
                    ->Unit(benchmark::kMillisecond);
      // Google Benchmark stops after one iteration once that iteration alone outlasts the min
      // time, and then each ratio is one sample of each variant. A shape whose floor takes about
      // 50 ms or more (at 100 GFLOP/s) gets 3 interleaved iterations, so that the minimum of each
      // variant is taken over 3 (a disturbance of the shared machine rarely hits all three).
      // --benchmark_min_time does not apply to these; they are most of the grid's run time.
      const double floor_flops = 4.0 * double(s.bh) * double(s.T) * double(s.T) * double(s.D) *
                                 (op == Op::forward ? 1.0 : 3.0);
      if (floor_flops / 100e9 >= 0.05) b->Iterations(3);
    }
  }
  if (train) register_train_benchmarks(quick);
  if (variants) register_variant_benchmarks();
  if (programs) register_program_benchmarks();
  if (generation) register_generate_benchmarks();
  if (bf16_tiles) register_bf16_tile_benchmarks();
  std::printf("attnlab_bench on %s, %d threads available, OpenBLAS single-threaded inside\n",
              cpu_model().c_str(), attnlab::num_threads());
  const attnlab::BlasInfo& blas = attnlab::blas_info();
  std::printf("blas: %s\n", attnlab::blas_summary(blas).c_str());
  if (!blas.warning.empty()) std::printf("blas warning: %s\n", blas.warning.c_str());
  std::printf("malloc: %s\n", keep_memory
                                  ? "freed memory kept for reuse (attnlab::keep_freed_memory)"
                                  : "glibc defaults (--malloc-default)");
  std::printf("load average at start: %s\n", load_average().c_str());
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  print_table(reporter.seconds, points);
  if (train) print_train_table(reporter.seconds, torch_file);
  if (variants) print_variant_table(reporter.seconds);
  if (programs) print_program_table(reporter.seconds);
  if (generation) print_generate_table(reporter.seconds);
  if (bf16_tiles) print_bf16_tile_table(reporter.seconds);
  if (memory) print_memory();
  std::printf("load average at end: %s\n", load_average().c_str());
  benchmark::Shutdown();
  return 0;
}
