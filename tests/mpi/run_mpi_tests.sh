#!/usr/bin/env bash
# The CLI's data-parallel training under `mpirun -np 2` (issue 15's checks), one case per call:
#   run_mpi_tests.sh ATTNLAB_CLI MPI_TEST_BINARY CASE
# CASE: lib | equivalence | grad-accum | muon | eval | resume | killed | rank-error | bad-input. Exit 77 (ctest: skipped) when the
# CLI was built without MPI or mpirun is missing. Needs no Python.
#
# Open MPI as root (CI runs as root) needs its two permission variables; 2 ranks on a 2-core machine
# need --oversubscribe once anything else runs. In containers without ptrace rights the shared-memory
# transport's single-copy mechanism (CMA) fails; it is turned off here (tests move small buffers).
set -euo pipefail
cli=$(realpath "$1") mpi_tests=$2 case=$3
[ "$mpi_tests" = none ] || mpi_tests=$(realpath "$mpi_tests")
command -v mpirun > /dev/null || { echo "mpirun not found: skipped"; exit 77; }
"$cli" --version | grep -q "mpi: not built" && { echo "attnlab built without MPI: skipped"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
mpi() { mpirun --oversubscribe --bind-to none -np "$@"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

# Rows of two metrics.csv files agree in step, loss, eval_loss and eval_acc to a relative `tol`.
same_curves() {
  local a=$1 b=$2 tol=$3
  [ "$(wc -l < "$a")" -eq "$(wc -l < "$b")" ] || fail "$a and $b have different row counts"
  paste -d, <(cut -d, -f1-4 "$a") <(cut -d, -f1-4 "$b") | awk -F, -v tol="$tol" '
    NR == 1 { next }
    function rel(x, y) { d = x - y; if (d < 0) d = -d; m = (x < 0 ? -x : x); if (m < 1e-30) m = 1; return d / m }
    { if ($1 != $5) { print "step " $1 " vs " $5; bad = 1 }
      for (i = 2; i <= 4; i++) {
        if ($i == "nan" && $(i + 4) == "nan") continue
        r = rel($i, $(i + 4)); if (r > worst) worst = r
        if (r > tol) { print "step " $1 " column " i ": " $i " vs " $(i + 4); bad = 1 } } }
    END { printf "worst relative difference %.3g over %d rows (tolerance %g)\n", worst, NR - 1, tol; exit bad }'
}
# The background mpirun job $1 ends within 60 s of what $2 says happened, with a non-zero status.
job_ends_failed() {
  local job=$1 what=$2 start rc took
  start=$(date +%s)
  set +e
  timeout 120 tail --pid="$job" -f /dev/null
  # A job still alive here has failed the check; end it so that the test reports instead of hanging.
  kill -0 "$job" 2> /dev/null && { pkill -9 -P "$job" 2> /dev/null; kill -9 "$job" 2> /dev/null; }
  wait "$job"; rc=$?
  set -e
  took=$(( $(date +%s) - start ))
  echo "mpirun exited $rc, $took s after $what"
  [ $rc -ne 0 ] || fail "mpirun exited 0 after $what"
  [ $took -le 60 ] || fail "the job took $took s to end after $what"
}
json_field() { sed -n "s/^  \"$2\": \\([^,]*\\),\\{0,1\\}\$/\\1/p" "$1"; }

common=(--task recall --steps 50 --batch 32 --eval-every 5 --threads 1 --quiet)
case $case in
lib)
  mpi 2 "$mpi_tests"
  ;;
equivalence)
  # -np 2 with --batch 32 follows -np 1 with --batch 32 to float rounding, over 50 steps.
  "$cli" train "${common[@]}" --out one > one.txt
  mpi 2 "$cli" train "${common[@]}" --out two > two.txt
  same_curves one/metrics.csv two/metrics.csv 1e-5
  [ "$(json_field two/summary.json world_size)" = 2 ] || fail "summary.json lacks world_size 2"
  [ "$(json_field one/summary.json world_size)" = 1 ] || fail "summary.json lacks world_size 1"
  [ "$(grep -c '^done:' two.txt)" = 1 ] || fail "expected one done line (rank 0's): $(cat two.txt)"
  grep -q '^done: .*2 processes' two.txt || fail "the done line does not say 2 processes"
  ;;
grad-accum)
  # Each rank accumulates its shards of 2 micro-batches of 16, then the one all-reduce: -np 2 with
  # --batch 16 --grad-accum 2 follows one process with --batch 32 (the same 32 rows per step) and
  # one process with --grad-accum 2, to float rounding; with --z-loss, its column too.
  acc=(--task recall --steps 50 --eval-every 5 --threads 1 --quiet --z-loss 1e-3)
  "$cli" train "${acc[@]}" --batch 32 --out one > /dev/null
  "$cli" train "${acc[@]}" --batch 16 --grad-accum 2 --out accum > /dev/null
  mpi 2 "$cli" train "${acc[@]}" --batch 16 --grad-accum 2 --out two > /dev/null
  same_curves one/metrics.csv two/metrics.csv 1e-5
  same_curves accum/metrics.csv two/metrics.csv 1e-5
  # The z_loss column by name (mechanism columns follow it).
  zcol=$(head -1 two/metrics.csv | tr ',' '\n' | grep -nx z_loss | cut -d: -f1)
  [ -n "$zcol" ] || fail "no z_loss column under mpirun"
  paste -d, <(awk -F, -v c="$zcol" 'NR > 2 { print $c }' one/metrics.csv) \
    <(awk -F, -v c="$zcol" 'NR > 2 { print $c }' two/metrics.csv) |
    awk -F, '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { print "z_loss " $1 " vs " $2; bad = 1 } }
      END { exit bad }' || fail "the z_loss column differs under 2 processes"
  [ "$(json_field two/summary.json world_size)" = 2 ] || fail "summary.json lacks world_size 2"
  ;;
muon)
  # Muon's Newton–Schulz iteration runs on each rank over the all-reduced gradient: -np 2 follows
  # one process on the same 32 rows per step (the hidden matrices through Muon, the rest AdamW).
  args=(--task recall --steps 40 --eval-every 5 --threads 1 --quiet --optimizer muon --layers 2
        --heads 2 --d-model 16)
  "$cli" train "${args[@]}" --batch 32 --out one > /dev/null
  mpi 2 "$cli" train "${args[@]}" --batch 32 --out two > /dev/null
  same_curves one/metrics.csv two/metrics.csv 1e-5
  ;;
eval)
  # The sharded eval (uneven shards: 509 examples) equals one process's on the same weights: the
  # step-0 row, before any training step, isolates it; a 3-process run checks it too.
  args=(--task recall --steps 1 --batch 6 --eval-size 509 --eval-every 1 --threads 1 --quiet)
  "$cli" train "${args[@]}" --out one > /dev/null
  mpi 2 "$cli" train "${args[@]}" --out two > /dev/null
  mpi 3 "$cli" train "${args[@]}" --out three > /dev/null
  for n in two three; do
    paste -d, <(sed -n 2p one/metrics.csv | cut -d, -f3-4) <(sed -n 2p $n/metrics.csv | cut -d, -f3-4) |
      awk -F, -v n=$n '{ d = $1 - $3; if (d < 0) d = -d;
        printf "%s processes: eval loss %s vs %s, accuracy %s vs %s\n", n, $1, $3, $2, $4;
        exit !(d <= 1e-6 * $1 && $2 == $4) }' || fail "eval under $n processes differs"
  done
  ;;
resume)
  # Saved under 2 processes, resumed under 1 (and the reverse): the same curve as one uninterrupted
  # process, so the data order and optimizer state carried over.
  ref=(--task recall --steps 40 --batch 32 --eval-every 5 --threads 1 --quiet)
  "$cli" train "${ref[@]}" --out ref > /dev/null
  set +e
  mpi 2 "$cli" train "${ref[@]}" --stop-after 20 --out a > /dev/null; rc=$?
  "$cli" train "${ref[@]}" --stop-after 20 --out b > /dev/null; rc_b=$?
  set -e
  if [ $rc != 130 ] || [ $rc_b != 130 ]; then fail "--stop-after exits 130 (got $rc and $rc_b)"; fi
  "$cli" train --resume a --steps 40 --threads 1 --quiet > /dev/null
  mpi 2 "$cli" train --resume b --steps 40 --threads 1 --quiet > /dev/null
  same_curves ref/metrics.csv a/metrics.csv 1e-5
  same_curves ref/metrics.csv b/metrics.csv 1e-5
  ;;
killed)
  # Rank 1 killed mid-run: the job ends within a bounded time with a non-zero status, mpirun names
  # the rank, and the last checkpoint (written atomically by rank 0) still loads.
  mpi 2 "$cli" train --task recall --steps 1000000 --batch 32 --save-every 10 --eval-every 1000 \
    --threads 1 --quiet --out run > out.txt 2> err.txt &
  job=$!
  for _ in $(seq 1 600); do [ -f run/model.safetensors ] && break; sleep 0.1; done
  [ -f run/model.safetensors ] || fail "no checkpoint after 60 s"
  victim=""
  for p in $(pgrep -f "attnlab train --task recall --steps 1000000" || true); do
    tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && victim=$p
  done
  [ -n "$victim" ] || fail "rank 1's process not found"
  kill -9 "$victim"
  job_ends_failed "$job" "rank 1 was killed"
  grep -q "rank 1" err.txt || fail "stderr does not name rank 1: $(cat err.txt)"
  "$cli" eval --checkpoint run --show 0 > eval.txt || fail "the last checkpoint does not load"
  grep -Eq "step [1-9][0-9]*0," eval.txt || fail "unexpected checkpoint: $(head -1 eval.txt)"
  ;;
rank-error)
  # Rank 0 fails mid-run (its output directory is replaced by a file, so its next metrics write
  # throws) while rank 1 waits in a collective: rank 0 prints its error naming itself and ends the
  # job with MPI_Abort, within a bounded time.
  mpi 2 "$cli" train --task recall --steps 1000000 --batch 32 --eval-every 20 --threads 1 --quiet \
    --out run > out.txt 2> err.txt &
  job=$!
  for _ in $(seq 1 600); do [ -f run/metrics.csv ] && [ "$(wc -l < run/metrics.csv)" -ge 3 ] && break; sleep 0.1; done
  [ -f run/metrics.csv ] || fail "no metrics after 60 s"
  # Renamed, not removed: `rm -rf` races with the files rank 0 keeps writing there and can fail
  # with "Directory not empty", leaving the run going. A rename is one atomic step.
  mv run run.gone && echo "not a directory" > run
  job_ends_failed "$job" "rank 0's directory went away"
  cat err.txt
  grep -q "^attnlab: error: rank 0 of 2: .*metrics" err.txt || fail "rank 0's error line is missing"
  # (Open MPI 4.1.4 usually adds "MPI_ABORT was invoked on rank 0"; in this case it can fail to
  # format that help text instead, so the line is not required.)
  ;;
bad-input)
  # Found by every rank, told once (by rank 0), exit status 2.
  for args in "--lr -1" "--batch 1" "--task text"; do
    set +e
    # shellcheck disable=SC2086
    mpi 2 "$cli" train $args --steps 2 --out bad > out.txt 2> err.txt; rc=$?
    set -e
    lines=$(grep -c '^attnlab: error' err.txt || true)
    echo "train $args: exit $rc, $lines error line(s): $(grep '^attnlab: error' err.txt)"
    [ $rc = 2 ] || fail "train $args under mpirun: exit $rc, expected 2"
    [ "$lines" = 1 ] || fail "train $args under mpirun: $lines error lines, expected 1"
    [ ! -e bad ] || fail "a refused run wrote bad/"
  done
  grep -q "batch" <(mpi 2 "$cli" train --batch 1 --steps 2 --out bad 2>&1 || true) ||
    fail "--batch 1 under 2 processes does not name batch"
  ;;
*)
  echo "unknown case $case" >&2
  exit 2
  ;;
esac
echo "mpi $case: passed"
