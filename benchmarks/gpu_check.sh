#!/usr/bin/env bash
# The GPU checks in one call (`make gpu-check`), for a GPU machine lent for minutes: install amem into
# the interpreter that has torch, then
#   1. amem doctor --calibrate        the CUDA context and libraries' memory (the GPU idle)
#   2. benchmarks/bench_gpu.py        amem vs native, empty/del loop and a training step (the GPU idle)
#   3. side by side, each bounded in time:
#      tests/gpu                      the GPU suite (pytest-xdist where installed; compare's module alone)
#      benchmarks/bench_predict_gpu.py  every program predicted (no GPU) and run for real
# Everything is logged under $WORK (default build/gpu-check); the few files a short lease can bring
# back are copied into $OUT when it is set: summary.txt (the verdicts and timings), one log per part,
# and artifacts.tgz / snapshots.tgz (every log, JSON and real snapshot). On a machine without a GPU
# each part says so and the script exits 0 after the install (so CI-less machines can smoke it).
#
#   BUDGET=420 benchmarks/gpu_check.sh      # seconds the whole check may take (default 470)
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-470}
WORK=${WORK:-$ROOT/build/gpu-check}
rm -rf "$WORK" && mkdir -p "$WORK/artifacts" "$WORK/logs"
SUMMARY=$WORK/summary.txt
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export AMEM_CALIBRATION=$WORK/calibration.json AMEM_GPU_ARTIFACTS=$WORK/artifacts AMEM_RESULTS_DIR=$WORK/results
mkdir -p "$AMEM_RESULTS_DIR"

say() { echo "[+${SECONDS}s] $*" | tee -a "$SUMMARY"; }
left() { echo $(( BUDGET - SECONDS )); }
bounded() {  # bounded SECONDS LOG CMD...: run CMD with a time limit, its output to LOG; its status
  local limit=$1 log=$2; shift 2
  if (( limit < 5 )); then echo "not run: no time left" >"$log"; return 124; fi
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$log" 2>&1
}
bring_back() {
  [ -n "${OUT:-}" ] || return 0
  cp "$SUMMARY" "$OUT/summary.txt"
  for f in install calibrate bench_gpu pytest_suite pytest_compare predict_vs_real; do
    [ -f "$WORK/logs/$f.log" ] && tail -c 3000000 "$WORK/logs/$f.log" >"$OUT/$f.log"
  done
  (cd "$WORK" && tar czf "$OUT/artifacts.tgz" --exclude='*.pickle' summary.txt logs artifacts results \
     calibration.json predict-vs-real 2>/dev/null)
  (cd "$WORK" && find predict-vs-real -name '*.pickle' -size -12M 2>/dev/null | sort | \
     tar czf "$OUT/snapshots.tgz" -T - 2>/dev/null)
  # a lease brings back files of at most 16 MiB: drop snapshots until the archive fits
  while [ -f "$OUT/snapshots.tgz" ] && (( $(stat -c %s "$OUT/snapshots.tgz") > 15000000 )); do
    biggest=$(cd "$WORK" && find predict-vs-real -name '*.pickle' -printf '%s %p\n' | sort -n | tail -1 | cut -d' ' -f2)
    [ -n "$biggest" ] || break
    rm -f "$WORK/$biggest"
    (cd "$WORK" && find predict-vs-real -name '*.pickle' | sort | tar czf "$OUT/snapshots.tgz" -T -)
  done
}
trap bring_back EXIT

# ---------------------------------------------------------------------------- the machine
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', \
torch.version.cuda, 'available', torch.cuda.is_available())" 2>&1
  nproc; uname -r
} | tee -a "$SUMMARY"

# ---------------------------------------------------------------------------- install
if ! bounded 240 "$WORK/logs/install.log" "$PY" -m pip install --no-build-isolation --no-deps -e .; then
  say "install FAILED (logs/install.log):"; tail -30 "$WORK/logs/install.log" | tee -a "$SUMMARY"; exit 1
fi
say "installed: $("$PY" -c 'import amem_alloc, amem_alloc._C as c; print(amem_alloc.__version__, c.__file__)' 2>&1)"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  say "no CUDA device: nothing more to check here"; exit 0
fi

# ---------------------------------------------------------------------------- 1. calibrate (GPU idle)
bounded 100 "$WORK/logs/calibrate.log" "$PY" -m amem_alloc doctor --calibrate
say "calibrate: status $? (logs/calibrate.log)"; cat "$WORK/logs/calibrate.log" >>"$SUMMARY"

# ---------------------------------------------------------------------------- 2. speed (GPU idle)
bounded 110 "$WORK/logs/bench_gpu.log" "$PY" benchmarks/bench_gpu.py --reps 3 --table
say "bench_gpu: status $?"; grep -v '^{' "$WORK/logs/bench_gpu.log" >>"$SUMMARY"

# ---------------------------------------------------------------------------- 3. suite and programs, side by side
PHASE=$(( $(left) - 25 ))
XDIST=""
"$PY" -c "import xdist" 2>/dev/null && XDIST="-n 5"
TIMEOUT_ARG=""
"$PY" -c "import pytest_timeout" 2>/dev/null && TIMEOUT_ARG="--timeout=$(( PHASE - 10 ))"
say "suite and programs side by side for at most ${PHASE}s (xdist: ${XDIST:-no})"
bounded "$PHASE" "$WORK/logs/pytest_suite.log" "$PY" -m pytest -q -rA $XDIST $TIMEOUT_ARG -p no:cacheprovider \
  --durations=25 --junitxml="$WORK/results/junit-suite.xml" tests/gpu --ignore=tests/gpu/test_compare_gpu.py &
SUITE=$!
bounded "$PHASE" "$WORK/logs/pytest_compare.log" "$PY" -m pytest -q -rA $TIMEOUT_ARG -p no:cacheprovider \
  --durations=10 --junitxml="$WORK/results/junit-compare.xml" tests/gpu/test_compare_gpu.py &
COMPARE=$!
bounded "$PHASE" "$WORK/logs/predict_vs_real.log" "$PY" benchmarks/bench_predict_gpu.py "$WORK/predict-vs-real" \
  --deadline $(( PHASE - 90 )) --predict-timeout $(( PHASE - 30 )) --real-timeout 150 --real-jobs 3 &
PROGRAMS=$!
wait $SUITE; say "tests/gpu (all but compare): status $?"; tail -n 40 "$WORK/logs/pytest_suite.log" >>"$SUMMARY"
wait $COMPARE; say "tests/gpu/test_compare_gpu.py: status $?"; tail -n 15 "$WORK/logs/pytest_compare.log" >>"$SUMMARY"
wait $PROGRAMS; say "predicted vs real: status $?"
cat "$WORK/predict-vs-real/predict_vs_real.md" >>"$SUMMARY" 2>/dev/null || tail -n 20 "$WORK/logs/predict_vs_real.log" >>"$SUMMARY"
say "done"
