# Ran branch s19-tail-pairs (commit e6ce09f), not main.
# Session 19, call G (one H200): TAIL_PAIRS, the masked tail two tiles at a time (both copied at once into the
# two halves of the pair buffers, the second's copy in flight under the first's math; session 16's
# commit 1df0a18 ported onto this session's kernel). Ahead of time: the narrow launch's full-block pair loop
# 700 instructions (694 before), no new local accesses. Its GPU test and the ws tail / narrow tests, then
# graph-timed against a tile at a time (tritree-ws-tail-pairs-off), the decode step, the graph timeline.
source bench/device_prelude.sh
( time timeout 200 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "tail_pairs or tail_shapes or narrow_last" ) 2>&1 | grep -v Warn | tail -6 | tee $OUT/s19g_tests.txt
grep -q " passed" $OUT/s19g_tests.txt && ! grep -q "failed\|error\|Timeout" $OUT/s19g_tests.txt || exit 1
for r in 1 2 3; do
timeout 80 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
  --variant tritree-ws-tail-pairs-off --out /tmp/s19g.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s19g_sweep.txt
done
timeout 130 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 \
  | tee $OUT/s19g_decode.txt
for tp in 1 0; do echo "TAIL_PAIRS=$tp" | tee -a $OUT/s19g_timeline.txt
  TRITREE_WS_TAIL_PAIRS=$tp timeout 90 python3 -m bench.timeline --graph --shapes "65,8" --ctx 46000 2>&1 | tail -2 \
    | tee -a $OUT/s19g_timeline.txt; done
