#!/usr/bin/env bash
# session 27, device call 1: strict decode GPU tests, speed, timing gate
set -u
export PYTHONPATH=src FLASHCORE_GIT_SHA=${FLASHCORE_GIT_SHA:-unknown}
mkdir -p $OUT
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
( timeout 200 python3 -m pytest -q -x tests/test_kvcache_gpu.py -k "strict" -p no:cacheprovider 2>&1 | tail -15 ) > $OUT/tests.txt
cat $OUT/tests.txt
timeout 150 python3 .scratch/s27_strict_speed.py 2>&1 | tail -12
timeout 220 python3 -m flashcore audit timing --kernel decode --strict --batch 8 --heads 32 --kv-heads 8 --seqlen 4096 \
  --head-dim 128 --dtype bf16 --causal 1 --pairs 100000 --contrast none --control none --budget-s 180 \
  --no-save-samples --out $OUT/timing-strict 2>&1 | tail -14
