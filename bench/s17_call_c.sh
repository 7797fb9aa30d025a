# Session 17, call C (one H200, ~4 device minutes): call B's masked pairs were correct but every program's
# Ran commit 409ddfa; its switches (BALANCE, TAIL_Q4, NARROW_TAIL_Q4, MASKED_PAIRS and their sweep variants) were
# removed after session 17 (commit 7d1706c restored session 16's kernel): check that commit out to rerun.
# pair loop ran ~6 us slower (timeline median 98.8 vs 92.5 us): the loop's PTX is the same line for line,
# so ptxas; the producer partition (24 registers) had 7 local accesses in its loop (4 before). Now it keeps
# one scalar more than before through its loop, not two (3 local accesses). Tests of the tails and narrow
# launches, the graph timeline, graph-timed against session 16's build, three rounds.
source bench/device_prelude.sh
timeout 200 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "narrow or (ws_tail_shapes and shipped)" 2>&1 | grep -v Warn | tail -6 | tee $OUT/s17c_tests.txt
grep -q " passed" $OUT/s17c_tests.txt && ! grep -q "failed\|error" $OUT/s17c_tests.txt || exit 1
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
timeout 60 python3 -m bench.timeline --graph --shapes "65,8" --ctx 46000 2>&1 | tail -2 | tee -a $OUT/s17c_timeline.txt
for round in 1 2 3; do
  timeout 60 python3 -m bench.verify_sweep --grid engine --filter "T == 65" --variant tritree --variant tritree-ws-s16 \
    --ceilings /tmp/ceil.json --out /tmp/s17c.jsonl 2>&1 | grep "L=\|Error" | tee -a $OUT/s17c_engine.txt
done
