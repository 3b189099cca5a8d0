// attnlab_bench: registers the benchmark grid, runs it with Google Benchmark, and prints one
// compact table (times of the GEMM floor and ratios attention / floor), the peak memory of
// attention at T = 4096, and the training-step figures. Google Benchmark flags pass through
// (e.g. --benchmark_filter=fwdbwd/.*/T:256, --benchmark_min_time=0.1).
// Own flags: --quick (a small grid, for a smoke run), --no-memory, --no-train.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "attnlab/threads.hpp"
#include "bench_common.hpp"
#include "bench_train.hpp"

namespace attnlab::bench {
namespace {

struct GridPoint {
  std::size_t bh, T, D;
  int threads;
};

// The grid of the issue, trimmed to run in minutes on 2 cores: B·H = 64 at T = 4096 is left out
// (the reference path alone needs 4 GiB for P and about a minute per step), and 1 thread runs
// D = 64 only.
std::vector<GridPoint> grid(bool quick) {
  std::vector<GridPoint> points;
  for (int threads : {2, 1}) {
    for (std::size_t bh : {8, 64}) {
      for (std::size_t T : {64, 256, 1024, 4096}) {
        for (std::size_t D : {16, 64, 128}) {
          if (bh == 64 && T == 4096) continue;
          if (threads == 1 && D != 64) continue;
          if (quick && (T > 256 || D == 128 || threads == 1)) continue;
          points.push_back({bh, T, D, threads});
        }
      }
    }
  }
  return points;
}

// Collects seconds per iteration by benchmark name, prints one line per run on stderr.
class TableReporter : public benchmark::BenchmarkReporter {
 public:
  std::map<std::string, double> seconds;
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred || run.run_type != Run::RT_Iteration) continue;
      const double s = run.real_accumulated_time / static_cast<double>(run.iterations);
      seconds[run.run_name.function_name] = s;
      std::fprintf(stderr, "  %-48s %10.3f ms  (%lld it)\n", run.run_name.function_name.c_str(),
                   s * 1e3, static_cast<long long>(run.iterations));
    }
  }
};

double lookup(const std::map<std::string, double>& m, const Shape& s) {
  const auto it = m.find(name_of(s));
  return it == m.end() ? -1 : it->second;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

void print_table(const std::map<std::string, double>& t, const std::vector<GridPoint>& points) {
  std::printf(
      "\nSDPA, float: GEMM floor in ms, then attention / floor (fwd = forward, "
      "f+b = forward+backward; ref = reference path, fused = fused path)\n");
  std::printf("%3s %4s %5s %4s %3s | %9s %6s %6s | %9s %6s %6s\n", "thr", "B*H", "T", "D", "cau",
              "fwd floor", "ref", "fused", "f+b floor", "ref", "fused");
  for (const GridPoint& p : points) {
    const Shape any_floor{Op::forward, Variant::floor, p.bh, p.T, p.D, false, p.threads};
    const Shape any_fb{Op::forward_backward, Variant::floor, p.bh, p.T, p.D, false, p.threads};
    if (lookup(t, any_floor) <= 0 && lookup(t, any_fb) <= 0) continue;  // filtered out
    for (bool causal : {false, true}) {
      std::printf("%3d %4zu %5zu %4zu %3s |", p.threads, p.bh, p.T, p.D, causal ? "yes" : "no");
      for (Op op : {Op::forward, Op::forward_backward}) {
        const double floor = lookup(t, {op, Variant::floor, p.bh, p.T, p.D, false, p.threads});
        const double ref = lookup(t, {op, Variant::reference, p.bh, p.T, p.D, causal, p.threads});
        const double fused = lookup(t, {op, Variant::fused, p.bh, p.T, p.D, causal, p.threads});
        if (floor <= 0) {
          std::printf(" %9s %6s %6s |", "-", "-", "-");
          continue;
        }
        std::printf(" %9.3f", floor * 1e3);
        for (double x : {ref, fused}) {
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
  const Shape s{Op::forward_backward, Variant::fused, 8, 4096, 64, false, 2};
  attention_peak_bytes({Op::forward_backward, Variant::fused, 8, 64, 64, false, 2},
                       SdpaPath::fused);  // warm up the thread pool outside the measurement
  const double mib = 1024.0 * 1024.0;
  std::printf(
      "\nPeak extra heap of one forward+backward, B*H = 8, T = 4096, D = 64, 2 threads\n"
      "(inputs excluded; O, the cache and the gradients dq, dk, dv = 32 MiB included):\n");
  double ref_bytes = 0;
  for (bool causal : {false, true}) {
    Shape c = s;
    c.causal = causal;
    const double ref = static_cast<double>(attention_peak_bytes(c, SdpaPath::reference));
    const double fused = static_cast<double>(attention_peak_bytes(c, SdpaPath::fused));
    if (!causal) ref_bytes = ref;
    std::printf(
        "  causal %-3s  reference %8.1f MiB   fused %8.1f MiB   fused / reference = 1/%.1f\n",
        causal ? "yes" : "no", ref / mib, fused / mib, ref / fused);
  }
  (void)ref_bytes;
}

}  // namespace
}  // namespace attnlab::bench

int main(int argc, char** argv) {
  using namespace attnlab::bench;
  bool quick = false, memory = true, train = true;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--no-memory") == 0) {
      memory = false;
    } else if (std::strcmp(argv[i], "--no-train") == 0) {
      train = false;
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  const auto points = grid(quick);
  for (const GridPoint& p : points) {
    for (Op op : {Op::forward, Op::forward_backward}) {
      for (Variant variant : {Variant::floor, Variant::reference, Variant::fused}) {
        for (bool causal : {false, true}) {
          if (variant == Variant::floor && causal) continue;
          const Shape s{op, variant, p.bh, p.T, p.D, causal, p.threads};
          benchmark::RegisterBenchmark(name_of(s).c_str(), bench_attention, s)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
  if (train) register_train_benchmarks(quick);
  std::printf("attnlab_bench on %s, %d threads available, OpenBLAS single-threaded inside\n",
              cpu_model().c_str(), attnlab::num_threads());
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  print_table(reporter.seconds, points);
  if (train) print_train_table(reporter.seconds);
  if (memory) print_memory();
  benchmark::Shutdown();
  return 0;
}
