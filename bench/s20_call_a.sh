# Session 20, call A (one H200): TAIL_PREFETCH, the producer's L2 prefetch of the masked tail's tiles once it
# has issued its last pair (the tail's own cp.async copies, which nothing overlaps, then hit the L2). Ahead of
# time: the consumers' loops as before, the producer's loop one more 8-byte spill pair in the narrow build.
# The ws bit-equality switches (EARLY_TAIL_MASK's cases had not run on a GPU; a first try with the tail / narrow
# tests too ran past its 240 s),
# graph-timed against the tail without the prefetch (tritree-ws-tail-prefetch-off), the graph timeline,
# the decode step.
source bench/device_prelude.sh
( time timeout 330 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "same_bits" ) 2>&1 | grep -v Warn | tail -6 | tee $OUT/s20a_tests.txt
grep -q " passed" $OUT/s20a_tests.txt && ! grep -q "failed\|error\|Timeout" $OUT/s20a_tests.txt || exit 1
for r in 1 2 3; do
timeout 80 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
  --variant tritree-ws-tail-prefetch-off --out /tmp/s20a.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s20a_sweep.txt
done
for pf in 1 0; do echo "TAIL_PREFETCH=$pf" | tee -a $OUT/s20a_timeline.txt
  TRITREE_WS_TAIL_PREFETCH=$pf timeout 90 python3 -m bench.timeline --graph --shapes "65,8" --ctx 46000 2>&1 \
    | tail -2 | tee -a $OUT/s20a_timeline.txt; done
timeout 130 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 \
  | tee $OUT/s20a_decode.txt
