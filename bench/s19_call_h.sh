# Session 19, call H (one H200): EARLY_TAIL_MASK, the masked tail's tree-mask words loaded before each tile's
# copy is issued (their latency under the copy's, not after the tile's scores). Ahead of time: the loops'
# SASS as before but the tail loop (799 instructions, the mask loads at its top), no new local accesses.
# The ws tail / narrow / named tests, graph-timed against the late mask (tritree-ws-early-mask-off), the
# decode step, the graph timeline.
source bench/device_prelude.sh
( time timeout 170 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "tail_shapes or narrow_last or named_release or softmax_exchange" ) 2>&1 | grep -v Warn | tail -6 \
  | tee $OUT/s19h_tests.txt
grep -q " passed" $OUT/s19h_tests.txt && ! grep -q "failed\|error\|Timeout" $OUT/s19h_tests.txt || exit 1
for r in 1 2 3; do
timeout 80 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
  --variant tritree-ws-early-mask-off --out /tmp/s19h.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s19h_sweep.txt
done
timeout 130 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 \
  | tee $OUT/s19h_decode.txt
for em in 1 0; do echo "EARLY_TAIL_MASK=$em" | tee -a $OUT/s19h_timeline.txt
  TRITREE_WS_EARLY_TAIL_MASK=$em timeout 90 python3 -m bench.timeline --graph --shapes "65,8" --ctx 46000 2>&1 \
    | tail -2 | tee -a $OUT/s19h_timeline.txt; done
