#!/usr/bin/env bash
# session 47 device call: stash this call's FA4 chunk (.fa4s/c*), then GPU test files on the image's triton 3.6.
# Usage (device): bash bench/results/sweeps/v63/gpu_tests.sh LOGNAME TIMEOUT PYTEST-ARGS...
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -x .fa4s/stash.sh ] && bash .fa4s/stash.sh 2>&1 | grep stashed
log=$1 limit=$2; shift 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 FLASHCORE_GIT_SHA=${FLASHCORE_GIT_SHA:-unknown}
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" | tee "$OUT/$log.log"
t0=$(date +%s)
timeout "$limit" python3 -m pytest "$@" -q -p no:cacheprovider -rfEx 2>&1 | tee -a "$OUT/$log.log" | grep -E "passed|failed|FAILED|ERROR|XFAIL|error" | tail -40
echo "$log: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/$log.log"
