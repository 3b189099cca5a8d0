#!/usr/bin/env bash
# Builds attnlab_device_bench (device_bench.cpp, README.md) and runs it, leaving its Markdown tables
# as files: on a GPU (a CUDA build: ATTNLAB_CUDA=ON), or with --emulated on the emulated device (a
# CPU-only build; the small functional shapes, a few minutes on two cores including the build).
#
#   tests/bench_cuda/device_bench.sh [--emulated] [OUT_DIR] [-- PROGRAM_ARGS...]
#     OUT_DIR default: build/device-bench-results (emulated: build/device-bench-emulated-results)
#     PROGRAM_ARGS: passed on, e.g. -- --quick, -- --precision fp32, -- --train-batch 4
#   BUILD_DIR=DIR   the CMake build directory (default build/device-bench[-emulated]); an existing
#                   configured one (e.g. .ci/device-check's) is reused as it is
#   JOBS=N          build parallelism (default: nproc)
#
# Results: OUT_DIR/device_bench.md (everything printed), check.md, attention.md, training.md, and
# build.log. Exit status: the program's (0 when every check passes, 1 when one fails or without a
# GPU under ATTNLAB_REQUIRE_GPU=1), 2 when the build fails.
set -euo pipefail
cd "$(dirname "$0")/../.."

emulated="" out="" args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --emulated) emulated=1; shift ;;
    --) shift; args=("$@"); break ;;
    -*) echo "device_bench.sh: error: unknown option '$1'" >&2; exit 2 ;;
    *) out="$1"; shift ;;
  esac
done
suffix=${emulated:+-emulated}
build=${BUILD_DIR:-build/device-bench$suffix}
out=${out:-build/device-bench$suffix-results}
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"

if [ ! -f "$build/CMakeCache.txt" ]; then
  if [ -n "$emulated" ]; then
    cfg=(-DATTNLAB_CUDA=OFF -DATTNLAB_BUILD_EMULATED=ON)
  else
    cfg=(-DATTNLAB_CUDA=ON)
  fi
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNLAB_MPI=OFF \
    -DATTNLAB_BUILD_TESTS=OFF -DATTNLAB_BUILD_EXAMPLES=OFF "${cfg[@]}" >"$out/build.log" 2>&1 ||
    { tail -n 30 "$out/build.log" >&2; exit 2; }
fi
cmake --build "$build" -j "$jobs" --target attnlab_device_bench >>"$out/build.log" 2>&1 ||
  { tail -n 30 "$out/build.log" >&2; exit 2; }

status=0
"$build/tests/bench_cuda/attnlab_device_bench" ${emulated:+--emulated} --out "$out" \
  ${args[@]+"${args[@]}"} || status=$?
echo "device_bench.sh: results in $out (build log: $out/build.log)"
exit "$status"
