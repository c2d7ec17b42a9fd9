#!/usr/bin/env bash
# session 46: GPU tests under triton 3.9.0 (staged as .t39 parts by bench/results/triton-versions/stage_triton39.sh;
# a part that came in an earlier call of the same warm machine waits in /root/t39stash) or under the image's 3.6.
# Usage (device): bash bench/results/sweeps/v62/gpu_t39.sh stash | 3.9 LOGNAME TIMEOUT PYTEST-ARGS... | 3.6 LOGNAME TIMEOUT PYTEST-ARGS...
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p /root/t39stash "$OUT"
cp .t39/*/part.* /root/t39stash/ 2>/dev/null || true
[ "${1:-}" = stash ] && { ls -la /root/t39stash; exit 0; }
ver=$1 log=$2 limit=$3; shift 3
if [ "$ver" = 3.9 ]; then
  if [ ! -d /tmp/t39/triton ]; then
    cat /root/t39stash/part.* > /root/t39.tar.xz || exit 3
    python3 -c "import tarfile; tarfile.open('/root/t39.tar.xz').extractall('/tmp/t39')" || { echo "the triton 3.9 parts do not join"; exit 3; }
  fi
  P="/tmp/t39:$PWD/src"
else
  P="$PWD/src"
fi
PYTHONPATH=$P python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" | tee "$OUT/$log.log"
export FLASHCORE_GIT_SHA=${FLASHCORE_GIT_SHA:-unknown} PYTHONUNBUFFERED=1
t0=$(date +%s)
PYTHONPATH=$P timeout "$limit" python3 -m pytest "$@" -q -p no:cacheprovider -rfEx 2>&1 | tee -a "$OUT/$log.log" | grep -E "passed|failed|FAILED|ERROR|XFAIL|error" | tail -40
echo "$log: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/$log.log"
