set -e
export PYTHONPATH=$PWD/src
python3 scripts/gluon_ab.py --attr tune=0,112,240 --rounds 6 --families auto --skip-checks --out $OUT \
  --shapes 1x16x1024x64,2x16x1024x64,4x16x1024x64c,2x16x1024x64c,4x16x1024x64,1x16x1024x128,2x16x2048x128c 2>&1 | grep -v "^{" | grep -v "^ok " | tail -22
