#!/usr/bin/env bash
# The shape sweep: compare_torch_train.sh over four model sizes, fp32 and bf16, in one run, then one
# table of the best of each kind per shape. The shapes (SHAPES, one "config:warmup:timed:repeats:threads"
# entry each, threads comma-separated):
#   nanoGPT's CPU Shakespeare shape   data/configs/shakespeare_char_cpu.json   C 128, T 64, 4 layers
#   the 2-layer T 256 model           data/configs/shakespeare_char_t256.json  C 128, T 256, 2 layers
#   C 512 / T 256 / 4 layers          tests/bench/configs/mid_c512_t256.json   8 heads, batch 8
#   C 768 / T 512 / 4 layers          tests/bench/configs/mid_c768_t512.json   12 heads, batch 4
# Each shape runs attnlab --precision fp32 and bf16 beside torch's eager, compile, nanoGPT-style eager
# and compile (fp32) and nanoGPT-style bf16 autocast, every side at each thread count of its entry,
# interleaved (see compare_torch_train.sh). The table then sets attnlab fp32's best against the best
# fp32 torch variant, attnlab bf16's best against torch's bf16 autocast, and attnlab bf16 against its
# own fp32; each side at its best thread count. The mid-sized shapes default to fewer steps and
# rounds (a step there takes seconds on two cores) and the largest to 2 threads only.
# Each shape's full output goes to OUT/<config name>.txt; the table to OUT/table.md and stdout. A
# shape whose output in OUT is complete (its "machine:" line) is not run again, so a sweep that
# stopped resumes where it stopped.
# Usage: tests/bench/sweep_torch_train.sh [ATTNLAB_BINARY] [PYTHON]
#   (env: SHAPES, OUT (default sweep-out), LOCK: a file to hold with flock during each shape, so that
#   builds that take the same lock wait)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build/release/examples/attnlab}
python=${2:-python3}
out=${OUT:-sweep-out}
shapes=${SHAPES:-data/configs/shakespeare_char_cpu.json:20:100:2:1,2 data/configs/shakespeare_char_t256.json:20:80:2:1,2 tests/bench/configs/mid_c512_t256.json:3:10:1:1,2 tests/bench/configs/mid_c768_t512.json:3:8:1:2}
mkdir -p "$out"
: >"$out/rows"
for entry in $shapes; do
  IFS=: read -r config warmup timed repeats threads <<<"$entry"
  name=$(basename "$config" .json)
  run=(env CONFIG="$config" WARMUP_STEPS="$warmup" TIMED_STEPS="$timed" REPEATS="$repeats"
    THREADS="${threads//,/ }" PRECISIONS="fp32 bf16"
    VARIANTS="eager compile nanogpt-eager nanogpt-compile nanogpt-bf16"
    bash tests/bench/compare_torch_train.sh "$bin" "$python")
  if grep -q '^machine:' "$out/$name.txt" 2>/dev/null; then
    echo "sweep: $name already in $out" >&2
  else
    echo "sweep: $name ($warmup warm-up + $timed timed steps, best of $repeats, threads ${threads//,/ })" >&2
    if [ -n "${LOCK:-}" ]; then flock "$LOCK" "${run[@]}" >"$out/$name.txt"; else "${run[@]}" >"$out/$name.txt"; fi
  fi
  # The rows of compare_torch_train.sh's table: side, threads, step ms, tokens/s, ...
  awk -v shape="$name" '$1 ~ /^(attnlab|torch-|nanogpt-)/ && $2 ~ /^[0-9]+$/ { print shape, $1, $2, $4 }' \
    "$out/$name.txt" >>"$out/rows"
done
{
  head -1 "$out/$(basename "${shapes%%:*}" .json).txt"
  echo
  echo "| shape | attnlab fp32 | best torch fp32 | ratio | attnlab bf16 | torch bf16 autocast | ratio | bf16 / fp32 (attnlab) |"
  echo "|---|---:|---|---:|---:|---:|---:|---:|"
  awk '
    { key = $1 SUBSEP $2
      if (!(key in best) || $4 > best[key]) { best[key] = $4; at[key] = $3 }
      if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
    function cell(s, side) { return sprintf("%.0f (%d t)", best[s SUBSEP side], at[s SUBSEP side]) }
    END {
      for (i = 1; i <= n; ++i) {
        s = order[i]; top = ""
        split("torch-eager torch-compile nanogpt-eager nanogpt-compile", fp32, " ")
        for (v in fp32) if ((s SUBSEP fp32[v]) in best && (top == "" || best[s SUBSEP fp32[v]] > best[s SUBSEP top])) top = fp32[v]
        a = best[s SUBSEP "attnlab"]; b = best[s SUBSEP "attnlab-bf16"]; tb = best[s SUBSEP "nanogpt-bf16"]
        printf "| %s | %s | %s: %s | %.2f | %s | %s | %.2f | %.2f |\n", s, cell(s, "attnlab"), top, cell(s, top),
          a / best[s SUBSEP top], cell(s, "attnlab-bf16"), cell(s, "nanogpt-bf16"), b / tb, b / a
      }
    }' "$out/rows"
  echo
  echo "tokens/s, each side at its best thread count (t); the ratios set attnlab's best against torch's."
} | tee "$out/table.md"
