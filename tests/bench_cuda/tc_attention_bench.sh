#!/usr/bin/env bash
# The tensor-core fused attention on a GPU (tc_attention_bench.cu): a check against attention in
# double on small shapes, then forward and backward throughput. Builds with nvcc alone (no CMake,
# no attnlab library: the kernels are header-only) and writes its table and build log to files.
#
#   tests/bench_cuda/tc_attention_bench.sh [OUT_DIR]   (default: build/tc-attention-bench)
#   ARCH=80 to build for sm_80 (default: the first device's compute capability, else 90)
#
# Results: OUT_DIR/tc_attention_bench.md (the table), OUT_DIR/build.log (nvcc and ptxas -v).
# Exit status: 0 when the check passes, 1 when it fails, 2 without a device or nvcc.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${1:-build/tc-attention-bench}
mkdir -p "$out"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || { echo "tc_attention_bench: nvcc not found" >&2; exit 2; }
arch=${ARCH:-}
if [ -z "$arch" ] && command -v nvidia-smi >/dev/null; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
fi
arch=${arch:-90}

"$nvcc" -std=c++17 -O3 -arch="sm_$arch" --expt-relaxed-constexpr -Xptxas -v \
  -Ilib/include -Ilib/backends/cuda tests/bench_cuda/tc_attention_bench.cu \
  -o "$out/tc_attention_bench" >"$out/build.log" 2>&1 || { cat "$out/build.log" >&2; exit 2; }
status=0
"$out/tc_attention_bench" | tee "$out/tc_attention_bench.md" || status=$?
echo "tc_attention_bench: results in $out/tc_attention_bench.md, build log in $out/build.log"
exit "$status"
