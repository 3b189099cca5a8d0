#!/usr/bin/env bash
# attnlab vs PyTorch eager on the same training steps, in one run: PyTorch first (its best step at
# 1 and 2 threads, tests/bench/torch_step.py), then the training benchmarks with those times in the
# table's last columns. PyTorch runs with OpenBLAS forced to the core attnlab uses, so both call the
# same sgemm kernels. Needs the bench build (cmake --preset bench && cmake --build --preset bench)
# and a torch: Debian's `apt-get install python3-torch` (1.13, for /usr/bin/python3) or pip's.
# Usage: tests/bench/compare_torch.sh [BENCH_BINARY] [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/../.."
bench=${1:-build/bench/tests/bench/attnlab_bench}
python=${2:-/usr/bin/python3}
[ -x "$bench" ] || { echo "compare_torch: no $bench (build the bench preset first)" >&2; exit 2; }
"$python" -c "import torch" 2>/dev/null || { echo "compare_torch: $python has no torch" >&2; exit 2; }
core=$("$bench" --benchmark_filter=NONE --no-train --no-memory | sed -n 's/^blas: .*, core \([A-Za-z0-9]*\) .*/\1/p')
times=$(mktemp)
trap 'rm -f "$times"' EXIT
echo "PyTorch $("$python" -c 'import torch; print(torch.__version__)'), OPENBLAS_CORETYPE=${core}"
OPENBLAS_CORETYPE=$core "$python" tests/bench/torch_step.py | tee "$times"
"$bench" --benchmark_filter='train/.*' --no-memory --torch="$times"
