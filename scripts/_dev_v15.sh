set -e
export PYTHONPATH=$PWD/src
python3 scripts/gluon_ab.py --attr tune=0,112,240 --rounds 4 --families auto --out $OUT \
  --shapes 4x16x1024x64,1x16x1024x64,2x16x1024x64,8x16x1024x64,16x16x2048x64,4x32x4096x64,4x16x1024x64c,4x16x1024x128,4x32x4096x128,4x32x4096x128c 2>&1 | grep -v "^{" | grep -v "^ok " | tail -34
TUNE=240 python3 scripts/_timeline.py > /dev/null 2>&1 || echo timeline failed
