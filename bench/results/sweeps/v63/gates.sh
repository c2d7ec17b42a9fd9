#!/usr/bin/env bash
# session 47: gates 2-3 on the secure FP8 decode forms after v62's widening (one byte permute per four values).
# Usage (device): bash bench/results/sweeps/v63/gates.sh NAME 'ARGS' [NAME 'ARGS' ...]; NAME repro-* runs gate 3.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -x .fa4s/stash.sh ] && bash .fa4s/stash.sh 2>&1 | grep stashed
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 FLASHCORE_GIT_SHA=${FLASHCORE_GIT_SHA:-unknown}
while [ $# -ge 2 ]; do
  name=$1 args=$2; shift 2
  gate=counters; case $name in repro-*) gate=repro;; esac
  t0=$(date +%s)
  python3 -m flashcore audit $gate --out /tmp/g/$name $args > "$OUT/$name.log" 2>&1
  rc=$?
  cp /tmp/g/$name/$gate.json "$OUT/$name.json" 2>/dev/null
  echo "$name: rc $rc, $(( $(date +%s) - t0 )) s"; grep -iE "pass|fail|differ|status" "$OUT/$name.log" | head -6
done
