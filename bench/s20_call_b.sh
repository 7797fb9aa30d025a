# Session 20, call B (one H200): MASKED_PAIRS, the full row blocks' masked tiles as pairs of the producer's
# stream (TMA over the paged view; the tile in which the keys end copied from before its start, zeros below
# slot 0), masked by row words of visibility bits, instead of the consumers' one-tile cp.async tail. Ahead of
# time: the pair loops as before (689 / 697 instructions, no local accesses), the masked pair loop 919-924
# instructions without local accesses (-O1 builds), the producer's masked loop 15-25 local accesses (once).
# The ws tail / narrow / wide-copies / softmax tests (the tail shapes with three new ones), graph-timed
# against the tile tail (tritree-ws-masked-pairs-off), the graph timeline, the decode step.
source bench/device_prelude.sh
( time timeout 300 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "tail_shapes or narrow_last or wide_copies or softmax_exchange" ) 2>&1 | grep -v Warn | tail -8 \
  | tee $OUT/s20b_tests.txt
grep -q " passed" $OUT/s20b_tests.txt && ! grep -q "failed\|error\|Timeout" $OUT/s20b_tests.txt || exit 1
for r in 1 2 3; do
timeout 80 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
  --variant tritree-ws-masked-pairs-off --out /tmp/s20b.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s20b_sweep.txt
done
for mp in 1 0; do echo "MASKED_PAIRS=$mp" | tee -a $OUT/s20b_timeline.txt
  TRITREE_WS_MASKED_PAIRS=$mp timeout 90 python3 -m bench.timeline --graph --shapes "65,8" --ctx 46000 2>&1 \
    | tail -2 | tee -a $OUT/s20b_timeline.txt; done
timeout 130 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 \
  | tee $OUT/s20b_decode.txt
