#!/usr/bin/env bash
# session 46 device call (run with early-mask-copy.patch applied and the integration before it saved as
# bench/results/sweeps/v62/old_transformers.py): the new GPU tests against the integration before the patch (they
# failed) and after, the
# transformers GPU tests, then the generate A/B at B1 and B32.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
f=src/flashcore/integrations/transformers.py
cp $f /tmp/new_transformers.py
cp bench/results/sweeps/v62/old_transformers.py $f
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_transformers_gpu.py -k "checked_decode" 2>&1 | tail -8 | tee "$OUT/before.log"
cp /tmp/new_transformers.py $f
timeout 250 python3 -m pytest -q -p no:cacheprovider tests/test_transformers_gpu.py -n 4 2>&1 | tail -4 | tee "$OUT/after.log"
B=1 ROUNDS=9 timeout 200 python3 bench/results/sweeps/v62/hf_ab.py 2>&1 | grep -v Warning | tail -6
B=32 ROUNDS=5 timeout 200 python3 bench/results/sweeps/v62/hf_ab.py 2>&1 | grep -v Warning | tail -6
