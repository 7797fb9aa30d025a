# Session 14, call H (one H200; replaces call G, not run): the narrow last row block only from 5 row blocks
# (call F: T=17,H=8 lost, 50.0-54.8 us against 48.1-49.7), and its launches' chunks in whole tile pairs sized
# for the keys plus two tiles (call F's critical program at T=65,H=8 was the last split: 23 pairs plus two
# masked tiles, 8 us after the others). Its GPU tests, the timeline on / off, the engine grid two rounds,
# the decode step at budget 64, then the GPU suite (all but the Gluon matrix) in what device time is left.
source bench/device_prelude.sh
timeout 150 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py -k narrow 2>&1 \
  | grep -v Warn | tail -8 | tee $OUT/s14h_tests.txt
for on in 1 0; do
  echo "NARROW_LAST_BLOCK=$on" | tee -a $OUT/s14h_timeline.txt
  TRITREE_NARROW_LAST_BLOCK=$on timeout 60 python3 -m bench.timeline --shapes "65,8" --ctx 46000 2>&1 \
    | grep "^T=\|Error" | tee -a $OUT/s14h_timeline.txt
done
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2; do
  timeout 60 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree --variant tritree-wide-last \
    --variant tritree --variant tritree-wide-last --ceilings /tmp/ceil.json --out /tmp/s14h.jsonl 2>&1 \
    | grep "L=\|#\|Error" | tee -a $OUT/s14h_engine.txt
done
timeout 120 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s14h_decode.txt
( time timeout 400 python3 -m pytest -q --tb=line -p no:logging -m gpu tests \
    --ignore=tests/kernels/test_verify_gluon.py ) 2>&1 | grep -v Warn | tee $OUT/s14h_gpu_suite.txt | tail -12
