#!/usr/bin/env bash
# Data-parallel scaling on one machine, in one run: training tokens/s of 1 process with T threads
# against T processes (mpirun) with 1 thread each, on the study model and the 2-layer model of
# tests/bench/train_models.hpp, with the time each step spends in the gradient allreduce.
# Needs a CLI built with MPI (the release or test preset finds Open MPI when .ci/deps.sh installed
# it). Usage: tests/bench/mpi_scaling.sh [ATTNLAB_CLI] [STEPS] [PROCESSES]
set -euo pipefail
cd "$(dirname "$0")/../.."
cli=${1:-build/release/examples/attnlab}
steps=${2:-100}
n=${3:-2}
[ -x "$cli" ] || { echo "mpi_scaling: no $cli (build the release preset first)" >&2; exit 2; }
"$cli" --version | grep -q "mpi: not built" && { echo "mpi_scaling: $cli was built without MPI" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
text=data/shakespeare/plays.txt
[ -f "$text" ] || text=tests/data/text/hamlet_excerpt.txt

# name | flags (the shapes of train_models.hpp: study B 64, T 33; small B 16, T 256)
models=(
  "study|--task recall --pairs 16 --batch 64 --d-model 64 --heads 1 --d-k 256 --d-v 64 --layers 1 --attn-only"
  "2-layer|--task text --data $text --vocab byte --block 256 --batch 16 --d-model 128 --heads 4 --d-ff 512 --layers 2 --causal"
)
field() { sed -n "s/^  \"$2\": \\([^,]*\\),\\{0,1\\}\$/\\1/p" "$1"; }
echo "cpu: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores"
"$cli" --version | sed -n 's/^blas: /blas: /p;s/^backends: .*mpi: /mpi: /p'
echo "mpirun: $(mpirun --version | head -1); $steps steps per run, evals excluded"
printf "\n| model | layout | tokens/s | vs 1 process | allreduce ms/step | step ms |\n|---|---|---:|---:|---:|---:|\n"
for m in "${models[@]}"; do
  name=${m%%|*} flags=${m#*|}
  # shellcheck disable=SC2206 # the flags are words, split on purpose
  common=(train $flags --steps "$steps" --eval-every 100000 --eval-size 64 --lr 1e-3 --quiet)
  "$cli" "${common[@]}" --threads "$n" --out "$work/one" > /dev/null
  mpirun -np "$n" "$cli" "${common[@]}" --threads 1 --out "$work/many" > /dev/null
  base=$(field "$work/one/summary.json" tokens_per_second)
  for run in one many; do
    s="$work/$run/summary.json"
    tps=$(field "$s" tokens_per_second)
    step_ms=$(awk -v a="$(field "$s" step_seconds)" -v n="$steps" 'BEGIN { printf "%.2f", 1e3 * a / n }')
    ar=$(field "$s" allreduce_seconds_per_step)
    layout="1 process x $n threads"
    [ $run = many ] && layout="$n processes x 1 thread"
    awk -v m="$name" -v l="$layout" -v t="$tps" -v b="$base" -v a="${ar:-0}" -v s="$step_ms" \
      'BEGIN { printf "| %s | %s | %.0f | %.2fx | %s | %s |\n", m, l, t, t / b,
               (a > 0 ? sprintf("%.2f", 1e3 * a) : "-"), s }'
  done
done
