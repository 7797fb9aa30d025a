# Session 14, call F (one H200): call E's narrow last row block launched 9 x 15 (T=65,H=8) or 3 x 48
# (T=17,H=8) programs of which 3 / 12 narrow ones had no keys, more than 132 SMs: full programs started in a
# second wave (timeline max skew 35-90 us; T=17 61 us against 48.5). Now the grid holds the full blocks'
# programs and then the narrow block's own (8 x 15 + 12, 2 x 48 + 36), the narrow programs writing the
# empty partial slots. Its GPU tests, the timeline, the engine grid three rounds against a 64-row last
# block, the decode step.
source bench/device_prelude.sh
timeout 150 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py -k narrow 2>&1 \
  | grep -v Warn | tail -8 | tee $OUT/s14f_tests.txt
for on in 1 0; do
  echo "NARROW_LAST_BLOCK=$on" | tee -a $OUT/s14f_timeline.txt
  TRITREE_NARROW_LAST_BLOCK=$on timeout 60 python3 -m bench.timeline --shapes "65,8;17,8" --ctx 46000 2>&1 \
    | grep "^T=\|Error" | tee -a $OUT/s14f_timeline.txt
done
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2 3; do
  timeout 60 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree --variant tritree-wide-last \
    --variant tritree --variant tritree-wide-last --ceilings /tmp/ceil.json --out /tmp/s14f.jsonl 2>&1 \
    | grep "L=\|#\|Error" | tee -a $OUT/s14f_engine.txt
done
timeout 200 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s14f_decode.txt
