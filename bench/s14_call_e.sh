# Session 14, call E (one H200): the narrow last row block (_verify_gluon_ws.NARROW_LAST_BLOCK, on; never
# run before this call): its GPU tests, the timeline with it on and off (the last row block's programs
# apart: its time per key against a full block's is what the split choice assumes, NARROW_COST = 0.75),
# the engine grid three rounds against a 64-row last block (tritree-wide-last), the decode step.
source bench/device_prelude.sh
timeout 150 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py -k narrow 2>&1 \
  | grep -v Warn | tail -8 | tee $OUT/s14e_tests.txt
for on in 1 0; do
  echo "NARROW_LAST_BLOCK=$on" | tee -a $OUT/s14e_timeline.txt
  TRITREE_NARROW_LAST_BLOCK=$on timeout 60 python3 -m bench.timeline --shapes "65,8;17,8" --ctx 46000 2>&1 \
    | grep "^T=\|Error" | tee -a $OUT/s14e_timeline.txt
done
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2 3; do
  timeout 60 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree --variant tritree-wide-last \
    --variant tritree --variant tritree-wide-last --ceilings /tmp/ceil.json --out /tmp/s14e.jsonl 2>&1 \
    | grep "L=\|#\|Error" | tee -a $OUT/s14e_engine.txt
done
timeout 200 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s14e_decode.txt
