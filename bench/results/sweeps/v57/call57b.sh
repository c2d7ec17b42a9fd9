export PYTHONPATH=src
for c in 0 1; do
python3 -m flashcore audit timing --kernel decode --page-size 16 -B 8 -H 32 --kv-heads 8 -S 4096 -D 128 --pairs 100000 \
  --causal $c --control none --contrast none --no-save-samples --out $OUT/gate4-page16-causal$c > $OUT/gate4-page16-causal$c.log 2>&1
grep "│ secure" $OUT/gate4-page16-causal$c.log
done
