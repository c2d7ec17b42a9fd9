set -e
export PYTHONPATH=$PWD/src FLASHCORE_GIT_SHA=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
python3 scripts/gluon_ab.py --attr exp_poly=0,1,2,3 --rounds 3 --out $OUT \
  --shapes 4x16x1024x64,1x16x1024x64,2x16x1024x64,16x16x2048x64,4x32x4096x64,4x16x1024x64c,4x32x4096x128,1x32x16384x128 2>&1 | grep -v "^{" | tail -40
