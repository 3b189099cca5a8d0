#!/bin/sh
# Builds the benchmark suite (preset `bench`) and runs it: a compact table on stdout, one line per
# benchmark on stderr. Extra arguments go to attnlab_bench (--quick, --cpu-time, --no-memory,
# --no-train, --no-variants, and Google Benchmark flags such as --benchmark_filter=REGEX).
# On a shared machine, ATTNLAB_BENCH_RT=1 runs the benchmark (not the build) under the lowest
# real-time priority (chrt -f 1, needs root), so that other jobs do not distort the 2-thread
# figures; the kernel still leaves them 5% of the CPU.
set -e
cd "$(dirname "$0")/../.."
cmake --preset bench >/dev/null
cmake --build --preset bench -j2
bench=build/bench/tests/bench/attnlab_bench
if [ "${ATTNLAB_BENCH_RT:-0}" = 1 ]; then
  exec chrt -f 1 "$bench" --benchmark_min_time=0.5 "$@"
fi
exec "$bench" --benchmark_min_time=0.5 "$@"
