#!/bin/bash
# session 42: the page-table row prefetched into L2 at the split kernel's start (fast paged forms), A/B per call
patch -p1 -s < bench/results/sweeps/v58/prefetch-page-table.patch || exit 1
export PYTHONPATH=src ROUNDS=5
r() { env "$@" python3 bench/results/sweeps/v58/b1_cfg.py 2>&1 | grep -E "per call|planner|rel err" | cut -c1-160; }
r PAGE=16 S=4096 SETS=9 CFGLIST="64,4,3,16,-,0;64,4,3,16,-,1"
r S=4096 SETS=9 CFGLIST="64,4,3,16,-,0"
r PAGE=16 S=16384 SETS=3 CFGLIST="64,4,3,32,-,0;64,4,3,32,-,1"
r PAGE=16 S=65536 SETS=1 CFGLIST="64,4,3,32,-,0;64,4,3,32,-,1"
r B=64 PAGE=16 S=8192 SETS=1 CFGLIST="32,4,3,1,-,0;32,4,3,1,-,1"
