#!/bin/bash
# v58 A/B: the planner's new configuration against the old one, the suite's timer per call, B1 32/8 D128
export PYTHONPATH=src ROUNDS=5
r() { env "$@" python3 scratch/b1_cfg.py 2>&1 | grep -E "per call|planner|rel err" | cut -c1-150; }
r S=1024 SETS=33 CFGLIST="128,8,3,4"
r S=2048 SETS=17 CFGLIST="128,8,3,8"
r S=4096 SETS=9 CFGLIST="128,8,3,16"
r B=2 S=2048 SETS=9 CFGLIST="128,8,3,8"
r PAGE=16 S=4096 SETS=9 CFGLIST="64,4,3,32"
r PAGE=16 S=16384 SETS=3 CFGLIST="64,4,3,33"
r PAGE=16 S=65536 SETS=1 CFGLIST="64,4,3,33"
r PAGE=32 S=65536 SETS=1 CFGLIST="64,4,3,33"
r FP8=1 S=65536 SETS=1 CFGLIST="128,4,3,33"
r FP8=1 PAGE=16 S=65536 SETS=1 CFGLIST="128,4,3,33"
