#!/usr/bin/env bash
# Builds the fuzz targets (preset `fuzz`: clang + libFuzzer + ASan + UBSan) and runs each for
# SECONDS (default 60), starting from the committed seeds. New corpus entries go to
# build/fuzz/corpus/<target>; a crash is written to build/fuzz/crash-<target>-* and makes the script
# exit non-zero. Needs clang and libclang-rt-14-dev (Debian 12):
#   apt-get install -y clang libclang-rt-14-dev libomp-14-dev
# FUZZ_RUNS=N in the environment also stops each target after N inputs.
# Usage: tests/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]   (targets: safetensors checkpoint
# data_file run_config study_config checkpoint_meta token_header tokenizer_model)
set -uo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.cpp; do targets+=("$(basename "$f" .cpp | sed 's/^fuzz_//')"); done
fi
cmake --preset fuzz >/dev/null && cmake --build --preset fuzz || exit 2
failed=()
for t in "${targets[@]}"; do
  corpus=build/fuzz/corpus/$t
  mkdir -p "$corpus"
  echo "== fuzz_$t: ${seconds}s"
  log=build/fuzz/fuzz_$t.log
  # The config readers take the config dictionary, and any single allocation over 256 MB counts
  # as a crash (-malloc_limit_mb): a config must never make its reader allocate without bound.
  case $t in
    run_config | study_config | checkpoint_meta | token_header)
      limits=(-dict=tests/fuzz/config.dict -malloc_limit_mb=256) ;;
    tokenizer_model) limits=(-malloc_limit_mb=256) ;;
    *) limits=(-dict=tests/fuzz/safetensors.dict) ;;
  esac
  [ -n "${FUZZ_RUNS:-}" ] && limits+=(-runs="$FUZZ_RUNS")
  build/fuzz/tests/fuzz/fuzz_"$t" "$corpus" "tests/fuzz/corpus/$t" \
    -max_total_time="$seconds" -max_len=16384 -timeout=10 -rss_limit_mb=2048 "${limits[@]}" \
    -artifact_prefix="build/fuzz/crash-$t-" -print_final_stats=1 >"$log" 2>&1
  status=$?
  grep -E "INITED|DONE|stat::number_of_executed_units|ERROR|SUMMARY|Test unit written" "$log"
  [ "$status" -eq 0 ] || failed+=("$t")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (inputs in build/fuzz/crash-*)"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, no crash"
