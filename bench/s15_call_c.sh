# Session 15, call C (one H200): call B's pipelined tail lost (T=65,H=8 134 vs 110 us): spills in the narrow
# launch's pair loop and a 8.6 us tail pair. Now the masked pairs sit in the 64-row blocks' branch (no pair-loop
# spills ahead of time), their buffers by a runtime index, their mask words loaded before the scores, and a
# last pair with no key in its second tile copies one tile. The timeline with and without it, the engine grid
# two rounds against the one-tile tail, the targets grid P = 64, the decode step, then the GPU suite.
source bench/device_prelude.sh
for on in 1 0; do
  echo "PIPELINED_TAIL=$on" | tee -a $OUT/s15c_timeline.txt
  TRITREE_PIPELINED_TAIL=$on timeout 60 python3 -m bench.timeline --shapes "65,8;17,8;64,8" --ctx 46000 2>&1 \
    | grep "^T=\|Error" | tee -a $OUT/s15c_timeline.txt
done
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2; do
  timeout 60 python3 -m bench.verify_sweep --grid engine --variant tritree --variant tritree-serial-tail \
    --variant tritree --variant tritree-serial-tail --ceilings /tmp/ceil.json --out /tmp/s15c.jsonl 2>&1 \
    | grep "L=\|#\|Error" | tee -a $OUT/s15c_engine.txt
done
timeout 100 python3 -m bench.verify_sweep --grid targets --filter "P == 64" --variant tritree \
  --variant tritree-serial-tail --ceilings /tmp/ceil.json --out /tmp/s15c.jsonl 2>&1 | grep "L=\|#\|Error" \
  | tee $OUT/s15c_sweep.txt
timeout 100 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s15c_decode.txt
( time timeout 320 python3 -m pytest -q -rfE -p no:logging -m gpu tests --ignore=tests/kernels/test_verify_gluon.py ) \
  2>&1 | grep -v Warn | tail -14 | tee $OUT/s15c_gpu_suite.txt
