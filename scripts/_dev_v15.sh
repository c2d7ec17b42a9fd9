set -e
export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
python3 scripts/gluon_ab.py --attr tune=0,16,32,48 --rounds 4 --families auto --out $OUT \
  --shapes 4x16x1024x64,1x16x1024x64,2x16x1024x64,8x16x1024x64,16x16x2048x64,4x16x1024x64c,4x16x1024x128,4x32x4096x128c 2>&1 | grep -v "^{" | grep -v "^ok " | tail -30
TUNE=48 python3 scripts/_timeline.py 2>&1 | tail -14
