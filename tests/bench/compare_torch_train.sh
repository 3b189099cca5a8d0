#!/usr/bin/env bash
# Training tokens/s of attnlab and PyTorch side by side, in one run, on the same configuration, data
# and machine: nanoGPT's CPU Shakespeare run (data/configs/shakespeare_char_cpu.json, corpus from
# `bash data/fetch_shakespeare.sh`), each side at 1 and 2 threads, then the ratio of attnlab's best to
# PyTorch's. attnlab is `attnlab train`; PyTorch is tests/bench/torch_train.py in the variants of
# VARIANTS (default "eager compile nanogpt-eager nanogpt-compile"), each its own side in the table:
#   torch-eager      python/attnlab_torch.py's model (attnlab's, identical), PyTorch eager mode
#   torch-compile    the same model and loss under torch.compile (default mode, Inductor)
#   nanogpt-eager    tests/bench/nanogpt_torch.py: nanoGPT's model-code style (fused c_attn,
#                    F.scaled_dot_product_attention) with attnlab's shapes and biases, same FLOPs
#   nanogpt-compile  that model under torch.compile
#   nanogpt-bf16     that model under torch.autocast("cpu", torch.bfloat16) (not in the default)
# Every variant starts from attnlab's initial weights (exported by a 1-step run at lr 1e-12;
# nanogpt_torch stacks q, k and v into c_attn) and draws attnlab's batches with the same AdamW,
# clipping and schedule, so the last-loss column of every side should agree to about 1e-3 (bf16's to
# about 1e-2). torch.compile compiles in the first warm-up step, outside the timed steps; each
# compile variant compiles afresh at each thread count in each round (tens of seconds each on a
# 2-core machine; the "compile" line after the table gives each first step, compile included).
#
# A step is timed as summary.json's tokens_per_second times it: forward through optimizer step,
# without making the batch, evaluating, logging or checkpointing. Both sides train WARMUP_STEPS +
# TIMED_STEPS steps (default 20 + 100) and report the mean step of the last TIMED_STEPS: PyTorch
# times each step; attnlab's figure is the step time of a full run minus that of a run stopped after
# WARMUP_STEPS (--stop-after), over TIMED_STEPS. The best of REPEATS rounds (default 3, each round
# both sides at every thread count) counts; the "all steps" column is the mean over every step,
# warm-up included (attnlab's own tokens/s).
# PRECISIONS (default "fp32") are attnlab's --precision values, each its own side: "fp32 bf16" adds
# attnlab-bf16 (its gemms in bf16: oneDNN's bf16 matmul on a CPU with AMX or on AMD's AVX-512 BF16,
# emulated elsewhere, where it is slower than fp32) and a "ratio attnlab-bf16/attnlab" line; torch's counterpart is the
# nanogpt-bf16 variant.
# PyTorch runs with OPENBLAS_CORETYPE set to attnlab's core, so that a torch calling OpenBLAS
# (Debian's python3-torch) uses the same sgemm kernels; pip's torch calls MKL instead.
#
# --check first trains CHECK_STEPS (default 10) steps on attnlab and torch-eager from the same weights
# and batches and compares the losses step by step (torch_train.py --check; fails above 1e-3).
#
# PYTHON (default python3) is any python with torch, e.g. pip's in a venv (python3 -m venv V &&
# V/bin/pip install torch; on Linux PyPI's torch brings CUDA wheels, GBs) or Debian's
# /usr/bin/python3 (apt-get install python3-torch). Without torch the script prints one line and
# exits 77 (skipped); without the binary or the corpus, exit 2.
# The last line tells whether the machine was quiet: the CPU time other processes used during the
# run and the hypervisor's steal. On a shared machine, time it alone, e.g. under the builds' lock:
#   flock /tmp/attnlab_cpu.lock bash tests/bench/compare_torch_train.sh [--check] [ATTNLAB] [PYTHON]
# The table has a row per side and thread count; then "ratio attnlab/torch" sets attnlab's best
# (at its best thread count) against the best of every torch variant (each at its best thread count)
# and names the variant and thread count, then one ratio line per variant.
# Usage: tests/bench/compare_torch_train.sh [--check] [ATTNLAB_BINARY] [PYTHON]
#   (env: WARMUP_STEPS, TIMED_STEPS, REPEATS, THREADS="1 2", VARIANTS, PRECISIONS, CHECK_STEPS, CONFIG; attnlab
#   needs WARMUP_STEPS + TIMED_STEPS >= the config's LR warmup, 100; the compile variants need
#   WARMUP_STEPS >= 1)
set -euo pipefail
cd "$(dirname "$0")/../.."
check=0
positional=()
for arg in "$@"; do
  case $arg in
    --check) check=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) positional+=("$arg") ;;
  esac
done
bin=${positional[0]:-build/release/examples/attnlab}
python=${positional[1]:-python3}
config=${CONFIG:-data/configs/shakespeare_char_cpu.json}
warmup=${WARMUP_STEPS:-20}
timed=${TIMED_STEPS:-100}
repeats=${REPEATS:-3}
threads_list=${THREADS:-1 2}
variants=${VARIANTS:-eager compile nanogpt-eager nanogpt-compile}
precisions=${PRECISIONS:-fp32}
check_steps=${CHECK_STEPS:-10}
total=$((warmup + timed))

[ -x "$bin" ] || { echo "compare_torch_train: no $bin (build it: cmake --preset release && cmake --build --preset release)" >&2; exit 2; }
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "compare_torch_train: skipped: $python has no torch (pip install torch, or give a python that has it)" >&2
  exit 77
fi
json_field() {  # json_field FILE KEY...: the values, space-separated
  "$python" -c 'import json, sys; s = json.load(open(sys.argv[1])); print(*(s[k] for k in sys.argv[2:]))' "$@"
}
attnlab_train() {  # attnlab_train EXPECTED_STATUS ARGS...: attnlab train, its output shown on failure
  local expected=$1 rc=0
  shift
  "$bin" train "$@" --quiet >"$tmp/log" 2>&1 || rc=$?
  if [ "$rc" != "$expected" ]; then
    cat "$tmp/log" >&2
    echo "compare_torch_train: attnlab train $* exited $rc, expected $expected" >&2
    exit 1
  fi
}
data=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["data_file"])' "$config")
[ -f "$data" ] || { echo "compare_torch_train: no $data (make it: bash data/fetch_shakespeare.sh)" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $9 }' /proc/stat; }  # busy, steal
read -r busy0 steal0 < <(cpu_ticks)
core=$("$bin" --version | sed -n 's/^blas: .*, core \([A-Za-z0-9]*\) .*/\1/p')
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "cpu: $cpu, $(nproc) cores; attnlab $("$bin" --version | head -1 | cut -d' ' -f2-), blas core ${core:-?}"
torch_train() {  # tests/bench/torch_train.py under OPENBLAS_CORETYPE=attnlab's core
  if [ -n "$core" ]; then OPENBLAS_CORETYPE=$core "$python" tests/bench/torch_train.py "$@"; else "$python" tests/bench/torch_train.py "$@"; fi
}
echo "pytorch: $(torch_train --config "$config" --info | sed -n 's/^# //p') ($python), OPENBLAS_CORETYPE=${core}"
echo "config: $config, $warmup warm-up + $timed timed steps, best of $repeats, threads: $threads_list, torch variants: $variants"

# attnlab's initial weights, for PyTorch: one step at lr 1e-12 moves no float32 weight measurably.
attnlab_train 0 --config "$config" --steps 1 --schedule constant --lr 1e-12 --min-lr 0 --warmup 0 \
  --weight-decay 0 --eval-every 1 --eval-size 1 --threads 1 --out "$tmp/init"

if [ "$check" = 1 ]; then
  attnlab_train 130 --config "$config" --steps "$total" --stop-after "$check_steps" --eval-every 1 \
    --eval-size 1 --threads 1 --out "$tmp/check"
  echo "check: the first $check_steps training losses, same initial weights and batches (step attnlab torch)"
  torch_train --config "$config" --init "$tmp/init" --check "$tmp/check/metrics.csv" \
    --warmup-steps "$warmup" --steps "$timed" | grep -v '^#' | sed 's/^check /  /' ||
    { echo "compare_torch_train: the losses differ (see above)" >&2; exit 1; }
fi

# The repeats interleave the sides, so that a change in the machine's load hurts both alike. attnlab's
# step at each thread count: (full run - run stopped after the warm-up) / TIMED_STEPS.
results=$tmp/results
for ((r = 0; r < repeats; ++r)); do
  for precision in $precisions; do
    side=attnlab
    [ "$precision" = fp32 ] || side=attnlab-$precision
    for threads in $threads_list; do
      attnlab_train 130 --config "$config" --precision "$precision" --steps "$total" \
        --stop-after "$warmup" --eval-every "$total" --threads "$threads" --out "$tmp/short"
      attnlab_train 0 --config "$config" --precision "$precision" --steps "$total" \
        --eval-every "$total" --threads "$threads" --out "$tmp/full"
      read -r short _ < <(json_field "$tmp/short/summary.json" step_seconds steps_done)
      read -r full ran last < <(json_field "$tmp/full/summary.json" step_seconds steps_done final_train_loss)
      [ "$ran" = "$total" ] || { echo "compare_torch_train: attnlab ran $ran of $total steps" >&2; exit 1; }
      awk -v s="$short" -v f="$full" -v n="$timed" -v t="$total" -v th="$threads" -v l="$last" -v side="$side" \
        'BEGIN { print side, th, (f - s) / n, f / t, l }' >>"$results"
      rm -rf "$tmp/short" "$tmp/full"
    done
  done
  # Each variant its own side: torch-eager, torch-compile, nanogpt-eager, nanogpt-compile, nanogpt-bf16.
  # shellcheck disable=SC2086  # the thread counts and the variants are separate arguments
  torch_train --config "$config" --init "$tmp/init" --threads $threads_list --variant $variants \
    --warmup-steps "$warmup" --steps "$timed" >"$tmp/torch"
  sed -n 's/^train \(nanogpt-[^ ]*\) /\1 /p; s/^train \([^ ]*\) /torch-\1 /p' "$tmp/torch" >>"$results"
  sed -n 's/^# compile \([^ ]*\) \([0-9]*\) threads: first step \([^ ]*\) s.*/\1 \2 \3/p' "$tmp/torch" >>"$tmp/compiles"
done

tokens=$("$python" -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c["batch"] * c["task"]["block"])' "$config")
awk -v tok="$tokens" -v n="$total" '
  { key = $1 " " $2
    if (!(key in step)) { order[++rows] = key; step[key] = $3; all[key] = $4 }
    if ($3 < step[key]) step[key] = $3
    if ($4 < all[key]) all[key] = $4
    loss[key] = $5 }
  END {
    printf "%-16s %7s %9s %9s %18s %12s\n", "side", "threads", "step ms", "tokens/s", "tokens/s all steps", "loss@" n
    for (i = 1; i <= rows; ++i) {
      key = order[i]; split(key, f, " "); rate = tok / step[key]
      if (!(f[1] in best)) sides[++nsides] = f[1]
      if (rate > best[f[1]]) { best[f[1]] = rate; at[f[1]] = f[2] }
      printf "%-16s %7d %9.2f %9.0f %18.0f %12.4f\n", f[1], f[2], 1000 * step[key], rate, tok / all[key], loss[key]
    }
    top = ""
    for (i = 1; i <= nsides; ++i)
      if (sides[i] !~ /^attnlab/ && (top == "" || best[sides[i]] > best[top])) top = sides[i]
    printf "ratio attnlab/torch (each at its best: attnlab %d threads; best torch: %s, %d threads): %.2f\n", at["attnlab"], top, at[top], best["attnlab"] / best[top]
    for (i = 1; i <= nsides; ++i)
      if (sides[i] !~ /^attnlab/)
        printf "ratio attnlab/%s (attnlab %d threads, %s %d threads): %.2f\n", sides[i], at["attnlab"], sides[i], at[sides[i]], best["attnlab"] / best[sides[i]]
    if ("attnlab-bf16" in best)
      printf "ratio attnlab-bf16/attnlab (tokens/s, each at its best: %d and %d threads): %.2f\n", at["attnlab-bf16"], at["attnlab"], best["attnlab-bf16"] / best["attnlab"]
  }' "$results"
# torch.compile's first step (compile included; outside the timed steps), per variant and thread count.
if [ -s "$tmp/compiles" ]; then
  awk '{ s = s sep (($1 ~ /^nanogpt-/) ? "" : "torch-") $1 " (" $2 " threads) " $3 " s"; sep = ", " }
    END { print "compile (first step, each round): " s }' "$tmp/compiles"
fi
# Whether the measurement had the machine to itself: the CPU time that other processes used
# meanwhile (busy time less this script's) and the time the hypervisor took (steal).
read -r busy1 steal1 < <(cpu_ticks)
times >"$tmp/times"
awk -v hz="$(getconf CLK_TCK)" -v b="$((busy1 - busy0))" -v st="$((steal1 - steal0))" -v wall="$SECONDS" '
  NR == 2 { for (i = 1; i <= 2; ++i) { split($i, t, "m"); mine += 60 * t[1] + t[2] } }
  END { printf "machine: %d s wall; other processes used %.0f CPU-s meanwhile, steal %.0f s (a quiet machine: both near 0)\n", wall, b / hz - mine, st / hz }' "$tmp/times"
