# Session 17, call B (one H200, ~7 device minutes): the full row blocks' masked tail as masked pairs through
# Ran commit b4b2261 (with 6a14ba9's test fix); its switches (BALANCE, TAIL_Q4, NARROW_TAIL_Q4, MASKED_PAIRS and their sweep variants) were
# removed after session 17 (commit 7d1706c restored session 16's kernel): check that commit out to rerun.
# the producer's TMA copies (_verify_gluon_ws.MASKED_PAIRS; the tile holding the chunk's end is the 64 keys
# ending there, from the [pages, P, 576] descriptor, out-of-bounds rows zero), the chunks balanced without
# a discount for it (TAIL_Q4 = 0). Call A: balancing alone moved the critical path from the last split
# (23 pairs + the one-tile tail, 7.7 us) to the splits given a 25th pair. The GPU tests of the ws kernel's
# tails (shipped / one tile balanced / session 16), its narrow launches and the Gluon matrix's wscs
# variant; stop there if any fails. Then the graph timeline and graph-timed variants, three rounds.
source bench/device_prelude.sh
timeout 240 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "narrow or ws_tail_shapes or small_pages" 2>&1 | grep -v Warn | tail -6 | tee $OUT/s17b_tests.txt
grep -q " passed" $OUT/s17b_tests.txt && ! grep -q "failed\|error" $OUT/s17b_tests.txt || exit 1
timeout 150 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "wscs" 2>&1 \
  | grep -v Warn | tail -6 | tee -a $OUT/s17b_tests.txt
grep -q "failed\|error" $OUT/s17b_tests.txt && exit 1
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for mode in masked onetile; do
  echo "$mode" | tee -a $OUT/s17b_timeline.txt
  if [ $mode = onetile ]; then export TRITREE_WS_MASKED_PAIRS=0 TRITREE_WS_TAIL_Q4=4; fi
  timeout 90 python3 -m bench.timeline --graph --shapes "65,8;17,8" --ctx 46000 2>&1 | tail -4 \
    | tee -a $OUT/s17b_timeline.txt
done
unset TRITREE_WS_MASKED_PAIRS TRITREE_WS_TAIL_Q4
for round in 1 2 3; do
  timeout 100 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
    --variant tritree-ws-onetile --variant tritree-ws-s16 --variant tritree \
    --ceilings /tmp/ceil.json --out /tmp/s17b.jsonl 2>&1 | grep "L=\|Error" | tee -a $OUT/s17b_engine.txt
done
