# Session 17, call A (one H200, ~8 device minutes): the ws kernel's split chunks balanced for the masked tail
# Ran commit 6e67cd3; its switches (BALANCE, TAIL_Q4, NARROW_TAIL_Q4, MASKED_PAIRS and their sweep variants) were
# removed after session 17 (commit 7d1706c restored session 16's kernel): check that commit out to rerun.
# (_verify_gluon_ws.BALANCE: whole tile pairs, the last split ceil(tail tiles x TAIL_Q4 / 4) pairs short,
# NARROW_TAIL_Q4 in the narrow row block). Session 16's graph timeline at T=65,H=8 had the full blocks' last
# split end ~7 us after the median program (23 pairs + two tail tiles one at a time, 89.7 + 10.9 us). The
# GPU tests that run the ws kernel's tail and narrow launches (balanced and not), the graph timeline with
# per-split end times (balanced / page chunks), then graph-timed, variants interleaved, three rounds.
# (Replaces the call prepared in session 16 under this name, PTXAS_FULL=-O1 alone, not run.)
source bench/device_prelude.sh
timeout 200 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "narrow or ws_tail_shapes" 2>&1 | grep -v Warn | tail -4 | tee $OUT/s17a_tests.txt
timeout 150 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "wscs" 2>&1 \
  | grep -v Warn | tail -4 | tee -a $OUT/s17a_tests.txt
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for bal in 1 0; do
  echo "TRITREE_WS_BALANCE=$bal" | tee -a $OUT/s17a_timeline.txt
  TRITREE_WS_BALANCE=$bal timeout 90 python3 -m bench.timeline --graph --shapes "65,8;17,8" --ctx 46000 2>&1 \
    | tail -4 | tee -a $OUT/s17a_timeline.txt
done
for round in 1 2 3; do
  timeout 100 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
    --variant tritree-ws-pagechunks --variant tritree-ws-tail-light --variant tritree-ws-tail-heavy \
    --ceilings /tmp/ceil.json --out /tmp/s17a.jsonl 2>&1 | grep "L=\|Error" | tee -a $OUT/s17a_engine.txt
done
