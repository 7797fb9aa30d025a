# Session 20, call C (one H200): MASKED_PAIRS with the producer's L2 prefetch of the masked pairs' tiles (a pair
# ahead of their copies, as in the loop). Call B: T=65,H=8 faster (97.4-99.1 us against 100.2-101.4) but
# T=17,H=8 slower (51.4-51.7 against 47.8-48.7: every split there has 17 tiles, its lone 17th now a pair with
# a copy of itself). The tail / narrow tests, graph-timed on the targets over TMA (T=16/64 x H=8/64) and the
# engine's T=17/65, against the tile tail; the graph timeline at T=17,H=8; the decode step.
source bench/device_prelude.sh
( time timeout 200 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "tail_shapes or narrow_last" ) 2>&1 | grep -v Warn | tail -8 | tee $OUT/s20c_tests.txt
grep -q " passed" $OUT/s20c_tests.txt && ! grep -q "failed\|error\|Timeout" $OUT/s20c_tests.txt || exit 1
for r in 1 2 3; do
for g in targets engine; do
timeout 80 python3 -m bench.verify_sweep --grid $g --filter "T > 8 and P == 64" --variant tritree \
  --variant tritree-ws-masked-pairs-off --out /tmp/s20c.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s20c_sweep.txt
done; done
for mp in 1 0; do echo "MASKED_PAIRS=$mp" | tee -a $OUT/s20c_timeline.txt
  TRITREE_WS_MASKED_PAIRS=$mp timeout 90 python3 -m bench.timeline --graph --shapes "17,8" --ctx 46000 2>&1 \
    | tail -2 | tee -a $OUT/s20c_timeline.txt; done
timeout 130 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 \
  | tee $OUT/s20c_decode.txt
