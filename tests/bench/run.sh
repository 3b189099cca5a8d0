#!/bin/sh
# Builds the benchmark suite (preset `bench`) and runs it: a compact table on stdout, one line per
# benchmark on stderr. Extra arguments go to attnlab_bench (--quick, --no-memory, --no-train, and
# Google Benchmark flags such as --benchmark_filter=REGEX).
set -e
cd "$(dirname "$0")/../.."
cmake --preset bench >/dev/null
cmake --build --preset bench -j2
exec build/bench/tests/bench/attnlab_bench --benchmark_min_time=0.2 "$@"
