#!/usr/bin/env bash
set -u
export PYTHONPATH=src
T0=$(date +%s)
python3 -m pytest -q -p no:cacheprovider tests/test_kvcache_gpu.py -k "secure and not chunked" 2>&1 | tail -4
echo "tests done $(( $(date +%s) - T0 )) s"
python3 -m flashcore.bench.experiments.kv_configs --only interleaved --rounds 40 --out $OUT/speed \
  --cases v57_secure_p16_b8_4k,v57_fast_p16_b8_4k,v57_secure_p16_b1_4k,v57_fast_p16_b1_4k,v57_secure_p16_b1_64k,v57_fast_p16_b1_64k,v57_secure_p32_b1_64k,v57_fast_p32_b1_64k \
  > $OUT/speed.log 2>&1
grep '"us"' $OUT/speed.log | python3 -c "
import sys, json
for l in sys.stdin:
    d=json.loads(l); print(f\"{d['case']:24s} auto={d['auto']!s:5s} {d['us']:9.2f} us err {d['err']:.1e} {d['cfg'][:60]}\")"
echo "speed done $(( $(date +%s) - T0 )) s"
python3 -m flashcore audit timing --kernel decode --page-size 16 -B 8 -H 32 --kv-heads 8 -S 4096 -D 128 --pairs 100000 \
  --control none --contrast none --no-save-samples --out $OUT/gate4-page16 > $OUT/gate4-page16.log 2>&1
tail -12 $OUT/gate4-page16.log
echo "total $(( $(date +%s) - T0 )) s"
