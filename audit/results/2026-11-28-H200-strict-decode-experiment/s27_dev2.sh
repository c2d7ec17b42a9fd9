#!/usr/bin/env bash
set -u
export PYTHONPATH=src
mkdir -p $OUT
timeout 150 python3 .scratch/s27_read_control.py 20000 2>&1 | tail -14
timeout 200 python3 -m flashcore audit timing --kernel decode --batch 8 --heads 32 --kv-heads 8 --seqlen 4096 \
  --head-dim 128 --dtype bf16 --causal 1 --pairs 100000 --contrast none --control none --budget-s 120 \
  --tests short_vs_long,pad_zeros_vs_random --no-save-samples --out $OUT/timing-secure 2>&1 | tail -8
