# Session 15, call B (one H200): the masked tail in pairs copied by the producer (_verify_gluon_ws.PIPELINED_TAIL):
# its GPU tests and those of the ws kernel it shares code with, the timeline with and without it, the engine grid
# two rounds against the one-tile tail (tritree-serial-tail), the targets grid P = 64, the decode step.
source bench/device_prelude.sh
timeout 240 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "pipelined_tail or narrow or tma_tiles or cuda_graph_and_compile" 2>&1 | grep -v Warn | tail -12 \
  | tee $OUT/s15b_tests.txt
for on in 1 0; do
  echo "PIPELINED_TAIL=$on" | tee -a $OUT/s15b_timeline.txt
  TRITREE_PIPELINED_TAIL=$on timeout 60 python3 -m bench.timeline --shapes "65,8;17,8;64,8" --ctx 46000 2>&1 \
    | grep "^T=\|Error" | tee -a $OUT/s15b_timeline.txt
done
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2; do
  timeout 60 python3 -m bench.verify_sweep --grid engine --variant tritree --variant tritree-serial-tail \
    --variant tritree --variant tritree-serial-tail --ceilings /tmp/ceil.json --out /tmp/s15b.jsonl 2>&1 \
    | grep "L=\|#\|Error" | tee -a $OUT/s15b_engine.txt
done
timeout 120 python3 -m bench.verify_sweep --grid targets --filter "P == 64" --variant tritree \
  --variant tritree-serial-tail --ceilings /tmp/ceil.json --out /tmp/s15b.jsonl 2>&1 | grep "L=\|#\|Error" \
  | tee $OUT/s15b_sweep.txt
timeout 150 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s15b_decode.txt
