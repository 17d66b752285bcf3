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
#   BUDGET=470 benchmarks/gpu_check.sh      # seconds the whole check may take (default 470)
#   PARTS="calibrate suite" benchmarks/gpu_check.sh   # some parts only (default: calibrate bench suite
#                                                       compare programs; the install always runs)
#   SUITE="tests/gpu/test_parity_gpu.py" ...           # what `suite` runs (default: tests/gpu but compare's)
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-470}
WORK=${WORK:-$ROOT/build/gpu-check}
PARTS=${PARTS:-calibrate bench suite compare programs}
SUITE=${SUITE:-tests/gpu --ignore=tests/gpu/test_compare_gpu.py}
part() { [[ " $PARTS " == *" $1 "* ]]; }
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
bring_back() {  # at most 8 files of 16 MiB come back from a lease: the summary, the suite's log, two archives
  [ -n "${OUT:-}" ] || return 0
  cp "$SUMMARY" "$OUT/summary.txt"
  [ -f "$WORK/logs/pytest_suite.log" ] && tail -c 3000000 "$WORK/logs/pytest_suite.log" >"$OUT/pytest_suite.log"
  (cd "$WORK" && tar czf "$OUT/artifacts.tgz" --exclude='*.pickle' summary.txt logs artifacts results \
     calibration.json predict-vs-real 2>/dev/null)
  snapshots() { (cd "$WORK" && find predict-vs-real artifacts -name '*.pickle' -size -12M 2>/dev/null | sort); }
  (cd "$WORK" && snapshots | tar czf "$OUT/snapshots.tgz" -T - 2>/dev/null)
  while [ -f "$OUT/snapshots.tgz" ] && (( $(stat -c %s "$OUT/snapshots.tgz") > 15000000 )); do
    biggest=$(cd "$WORK" && snapshots | xargs -r stat -c '%s %n' | sort -n | tail -1 | cut -d' ' -f2)
    [ -n "$biggest" ] || break
    rm -f "$WORK/$biggest"
    (cd "$WORK" && snapshots | tar czf "$OUT/snapshots.tgz" -T -)
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
if part calibrate; then
  bounded 100 "$WORK/logs/calibrate.log" "$PY" -m amem_alloc doctor --calibrate
  say "calibrate: status $? (logs/calibrate.log)"; cat "$WORK/logs/calibrate.log" >>"$SUMMARY"
fi

# ---------------------------------------------------------------------------- 2. speed (GPU idle)
if part bench; then
  bounded 110 "$WORK/logs/bench_gpu.log" "$PY" benchmarks/bench_gpu.py --reps 3 --table
  say "bench_gpu: status $?"; grep -v '^{' "$WORK/logs/bench_gpu.log" >>"$SUMMARY"
fi

# ---------------------------------------------------------------------------- 3. suite and programs, side by side
PHASE=$(( $(left) - 25 ))
XDIST=""
"$PY" -c "import xdist" 2>/dev/null && XDIST="-n ${WORKERS:-5}"
TIMEOUT_ARG=""
"$PY" -c "import pytest_timeout" 2>/dev/null && TIMEOUT_ARG="--timeout=$(( PHASE - 10 ))"
say "side by side for at most ${PHASE}s: $PARTS (xdist: ${XDIST:-no})"
PIDS=()
if part suite; then
  # shellcheck disable=SC2086  (SUITE is a list of pytest arguments)
  bounded "$PHASE" "$WORK/logs/pytest_suite.log" "$PY" -m pytest -q -rA $XDIST $TIMEOUT_ARG -p no:cacheprovider \
    --durations=25 --junitxml="$WORK/results/junit-suite.xml" $SUITE &
  PIDS+=("$!:tests/gpu:pytest_suite")
fi
if part compare; then
  bounded "$PHASE" "$WORK/logs/pytest_compare.log" "$PY" -m pytest -q -rA $TIMEOUT_ARG -p no:cacheprovider \
    --durations=10 --junitxml="$WORK/results/junit-compare.xml" tests/gpu/test_compare_gpu.py &
  PIDS+=("$!:tests/gpu/test_compare_gpu.py:pytest_compare")
fi
if part programs; then
  bounded "$PHASE" "$WORK/logs/predict_vs_real.log" "$PY" benchmarks/bench_predict_gpu.py "$WORK/predict-vs-real" \
    --deadline $(( PHASE - 90 )) --budget $(( PHASE - 15 )) --predict-timeout 240 --real-timeout 150 --real-jobs 3 &
  PIDS+=("$!:predicted vs real:predict_vs_real")
fi
if part native-trace; then   # torch's own trace of a bundled workload at size 4, both native policies
  bounded "$PHASE" "$WORK/logs/native_trace.log" "$PY" -c "import sys; from pathlib import Path; \
from amem_alloc.compare import compare, format_text; r = compare(workload=sys.argv[1], size=4, mode='real', \
policies=['torch', 'torch-expandable'], out_dir=Path(sys.argv[2]), progress=False); print(format_text(r))" \
    "${NATIVE_TRACE_WORKLOAD:-gpt}" "$WORK/artifacts/native-trace" &
  PIDS+=("$!:native trace:native_trace")
fi
for entry in "${PIDS[@]}"; do
  IFS=: read -r pid what log <<<"$entry"
  wait "$pid"; say "$what: status $?"; tail -n 40 "$WORK/logs/$log.log" >>"$SUMMARY"
done
cat "$WORK/predict-vs-real/predict_vs_real.md" >>"$SUMMARY" 2>/dev/null
say "done"
