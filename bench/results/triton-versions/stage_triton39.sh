#!/usr/bin/env bash
# Build the parts of triton 3.9.0 that bench/results/triton-versions/gpu_triton_versions.sh joins on the GPU machine (Python 3.12 there):
# the wheel's triton package without what sm_90 does not use (the AMD backend, CUPTI/profiler libraries, the
# legacy ptxas: 3.9 compiles sm_90 with ptxas-blackwell, CUDA 13.4), libtriton.so stripped of its static symbols
# (477 MB -> 192 MB; the dynamic ones stay), tar.xz'ed and split into parts that fit one device call each.
# Run from the repository root; writes .t39/a/part.aa and .t39/b/part.ab (ignored by git).
set -euo pipefail
work=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d "$work" triton==3.9.0
(cd "$work" && unzip -q triton-3.9.0-*.whl)
t="$work/triton"
rm -rf "$t/backends/amd" "$t"/backends/nvidia/lib/cupti* "$t/backends/nvidia/bin/ptxas" "$t/_C/libproton.so" \
  "$t/instrumentation" "$t/plugins" "$t/profiler"
strip --strip-unneeded "$t/_C/libtriton.so"
sed -i '/^amd = /d' "$work"/triton-3.9.0.dist-info/entry_points.txt
(cd "$work" && tar cf - triton triton-3.9.0.dist-info | xz -9 -T2 > t39.tar.xz)
rm -rf .t39 && mkdir -p .t39/a .t39/b
split -b 40M "$work/t39.tar.xz" "$work/part."
[ "$(ls "$work"/part.* | wc -l)" = 2 ] || { echo "the archive no longer fits two parts of 40 MB: add a part" >&2; exit 1; }
mv "$work/part.aa" .t39/a/ && mv "$work/part.ab" .t39/b/
ls -la .t39/a .t39/b
rm -rf "$work"
