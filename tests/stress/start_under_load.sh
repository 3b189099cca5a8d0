#!/usr/bin/env bash
# Start-up under load: STARTS short `attnlab train` runs, one after another, while LOAD busy
# processes keep every core busy (a loaded machine is where OpenBLAS's worker threads start late).
# Every start must exit 0, print nothing on stderr and write its summary. The starts cycle through
# OpenBLAS's own core and two asked for with ATTNLAB_BLAS_CORE (Haswell, Sandybridge), so that on any
# CPU with AVX2 at least two starts in three restart the program on another core
# (blas::init_process); the summary must then name the asked core.
#
# Usage: start_under_load.sh ATTNLAB_BINARY STARTS [LOAD]   LOAD: busy processes (default: nproc)
# ctest runs a short form (label stress); the long form is the same script with a larger STARTS.
set -uo pipefail
if [ $# -lt 2 ] || ! [[ $2 =~ ^[1-9][0-9]*$ ]]; then
  echo "start_under_load.sh: expected ATTNLAB_BINARY STARTS [LOAD] with STARTS >= 1, got: $*" >&2
  exit 2
fi
bin=$1
starts=$2
load=${3:-$(nproc)}
if ! [ -x "$bin" ]; then
  echo "start_under_load.sh: ATTNLAB_BINARY expected an executable, got '$bin'" >&2
  exit 2
fi

work=$(mktemp -d)
busy=()
cleanup() {
  for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
for ((i = 0; i < load; ++i)); do
  (while :; do :; done) &
  busy+=($!)
done

cores=(own Haswell Sandybridge)
passed=0
failed=0
crashed=0
begin=$(date +%s)
for ((i = 0; i < starts; ++i)); do
  core=${cores[i % 3]}
  out="$work/run$i"
  env_args=(-u OPENBLAS_CORETYPE -u ATTNLAB_BLAS_RESTART -u ATTNLAB_BLAS_CORE)
  [ "$core" = own ] || env_args+=("ATTNLAB_BLAS_CORE=$core")
  env "${env_args[@]}" "$bin" train --task recall --keys 8 --values 8 --pairs 4 --d-model 16 \
    --heads 1 --attn-only --batch 16 --eval-size 64 --threads 1 --quiet --steps 2 --seed "$i" \
    --out "$out" >"$work/stdout" 2>"$work/stderr"
  status=$?
  problem=""
  if [ $status -ne 0 ]; then
    problem="exit status $status"
    [ $status -gt 128 ] && problem+=" (signal $((status - 128)))" && crashed=$((crashed + 1))
  elif [ -s "$work/stderr" ]; then
    problem="stderr: $(head -c 300 "$work/stderr")"
  elif ! [ -s "$out/summary.json" ]; then
    problem="no summary.json"
  elif [ "$core" != own ] && ! grep -q "\"blas_core\": \"$core\"" "$out/summary.json"; then
    problem="asked for core $core, summary says $(grep -o '"blas_core": "[^"]*"' "$out/summary.json")"
  fi
  if [ -n "$problem" ]; then
    failed=$((failed + 1))
    echo "start $i (core $core): $problem"
  else
    passed=$((passed + 1))
  fi
  rm -rf "$out"
done
echo "start_under_load: $starts starts of attnlab train beside $load busy processes on $(nproc)" \
  "cores in $(($(date +%s) - begin)) s; $crashed crashed"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
