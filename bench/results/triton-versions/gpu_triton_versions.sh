#!/usr/bin/env bash
# The GPU side of issue 24's compatibility matrix, in one device call: flashcore on triton 3.9 (staged as parts,
# joined here) and on the image's triton 3.6, on the same machine.
#   1. the GPU tests (tests/test_gpu.py, test_hopper_gluon.py, test_secure_gluon.py) under triton 3.9;
#   2. `flashcore bench --suite all` (flashcore, flashcore-secure, SDPA) under triton 3.9, then under 3.6:
#      each backend checked against float64 first, then timed; ratios against SDPA are same-run.
# Triton 3.9 arrives as .t39/part.* (a tar.xz of the wheel's triton package, stripped to what sm_90 needs: no AMD
# backend, no profiler libraries, libtriton.so without its static symbols; bench/results/triton-versions/stage_triton39.sh builds it);
# a part that came in an earlier call of the same warm machine waits in /root/t39stash.
# Usage (device): bash bench/results/triton-versions/gpu_triton_versions.sh [stash|launch]
#   stash: only keep the parts that came along;
#   launch: the Gluon tests under 3.9, the host cost of one call (flashcore.bench.experiments.host_latency) under
#           3.9 and 3.6, and two against three consumer warpgroups at D=64 under 3.9 (experiments.wg_count).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p /root/t39stash "$OUT"
cp .t39/*/part.* /root/t39stash/ 2>/dev/null || true
[ "${1:-}" = stash ] && { ls -la /root/t39stash; exit 0; }
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl; fi
cat /root/t39stash/part.* > /root/t39.tar.xz || exit 3
python3 -c "import tarfile; tarfile.open('/root/t39.tar.xz').extractall('/tmp/t39')" || { echo "the triton 3.9 parts do not join: a part is missing"; exit 3; }
T39="/tmp/t39:/tmp/site:$PWD/src"
T36="/tmp/site:$PWD/src"
PYTHONPATH=$T39 python3 -c "import triton; assert triton.__version__ == '3.9.0', triton.__version__; print('triton', triton.__version__)" || exit 3
export FLASHCORE_GIT_SHA=${FLASHCORE_GIT_SHA:-unknown} PYTHONUNBUFFERED=1
t0=$(date +%s)
if [ "${1:-}" = launch ]; then
  PYTHONPATH=$T39 timeout 200 python3 -m pytest tests/test_hopper_gluon.py -q -p no:cacheprovider -n 8 -rfEx 2>&1 \
    | tee "$OUT/gluon-tests-triton-3.9.0.log" | grep -E "passed|failed|FAILED|XFAIL"
  for v in 3.9 3.6; do
    [ $v = 3.9 ] && P=$T39 || P=$T36
    PYTHONPATH=$P timeout 120 python3 -m flashcore.bench.experiments.host_latency --out "$OUT/host-triton-$v" 2>&1 | tail -14
  done
  PYTHONPATH=$T39 timeout 200 python3 -m flashcore.bench.experiments.wg_count --out "$OUT/wg-count" 2>&1 | tail -6
  echo "total $(( $(date +%s) - t0 )) s"
  exit 0
fi
PYTHONPATH=$T39 timeout 330 python3 -m pytest tests/test_gpu.py tests/test_hopper_gluon.py tests/test_secure_gluon.py \
  -q -p no:cacheprovider -n 8 -rfEx 2>&1 | tee "$OUT/gpu-tests-triton-3.9.0.log" | tail -25
echo "GPU tests (triton 3.9.0): $(( $(date +%s) - t0 )) s"
for v in 3.9 3.6; do
  [ $v = 3.9 ] && P=$T39 || P=$T36
  PYTHONPATH=$P timeout 150 python3 -m flashcore bench --suite all --backends flashcore flashcore-secure sdpa-default \
    --rep-ms 60 --no-progress --out "$OUT/bench-triton-$v" 2>&1 | tail -16
done
echo "total $(( $(date +%s) - t0 )) s"
