# Session 20, call D (one H200): MASKED_PAIRS only where a split's masked keys span more than one tile (a lone
# tile as before: call C, T=17,H=8 slower with it as a pair). The tail / narrow tests, graph-timed on the
# targets over TMA and the engine's shapes against the tile tail (two rounds), the decode step, then as much
# of the rest of the verify_mla GPU file as the time left allows.
source bench/device_prelude.sh
( time timeout 150 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "tail_shapes or narrow_last" ) 2>&1 | grep -v Warn | tail -8 | tee $OUT/s20d_tests.txt
grep -q " passed" $OUT/s20d_tests.txt && ! grep -q "failed\|error\|Timeout" $OUT/s20d_tests.txt || exit 1
for r in 1 2; do
for g in targets engine; do
timeout 80 python3 -m bench.verify_sweep --grid $g --filter "T > 8 and P == 64" --variant tritree \
  --variant tritree-ws-masked-pairs-off --out /tmp/s20d.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s20d_sweep.txt
done; done
timeout 130 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 \
  | tee $OUT/s20d_decode.txt
( time timeout 190 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "not tail_shapes and not narrow_last" ) 2>&1 | grep -v Warn | tail -12 | tee $OUT/s20d_rest.txt
