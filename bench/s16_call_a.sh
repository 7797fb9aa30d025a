# Prepared in session 15 for the next one (one H200, ~4 device minutes). Session 15: the masked tail as producer-
# copied pairs (PIPELINED_TAIL, commit e6ba0f7) shortened T=65,H=8's span in single launches (timeline 106.1 vs
# 110.9 us) but was slower graph-timed in 6 pairs of 6 (111.2 vs 109.8); the third change that wins only in the
# timeline. Two suspects, tested here: (1) the timeline launched one input set again and again, so part of its
# 53 MB of KV was still in the 50 MB L2 (bench.timeline now rotates sets as the graph-timed sweep does; --warm is
# the old way); (2) clocks: back to back the GPU may run power-limited (nvidia-smi samples, reading only).
#
# First the three GPU tests whose shared helper (check_reference_then_graph_replay) was refactored after
# session 15's last call, on the shipped kernel. Then branch s16-tail-probe's kernel and sweep, put in
# bench/s16_probe/ (untracked) for the call:
#   git show s16-tail-probe:tritree/kernels/_verify_gluon_ws.py > bench/s16_probe/_verify_gluon_ws.py
#   git show s16-tail-probe:bench/verify_sweep.py > bench/s16_probe/verify_sweep.py
source bench/device_prelude.sh
timeout 150 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "ws_tail_shapes or narrow or small_pages" 2>&1 | grep -v Warn | tail -5 | tee $OUT/s16a_tests.txt
cp bench/s16_probe/_verify_gluon_ws.py tritree/kernels/_verify_gluon_ws.py
cp bench/s16_probe/verify_sweep.py bench/verify_sweep.py
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 50 \
  > $OUT/s16a_smi.csv 2>&1 &
SMI=$!
mark() { echo "$(date +%H:%M:%S.%N) $*" >> $OUT/s16a_marks.txt; }
for warm in "" "--warm"; do
  for on in 0 1; do
    mark "timeline PIPELINED_TAIL=$on ${warm:-rotating}"
    echo "PIPELINED_TAIL=$on ${warm:-rotating sets}" | tee -a $OUT/s16a_timeline.txt
    TRITREE_PIPELINED_TAIL=$on timeout 60 python3 -m bench.timeline --shapes "65,8;17,8" --ctx 46000 $warm 2>&1 \
      | grep "^T=\|Error" | tee -a $OUT/s16a_timeline.txt
  done
done
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2; do
  mark "graph-timed round $round"
  timeout 60 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
    --variant tritree-serial-tail --variant tritree --variant tritree-serial-tail --ceilings /tmp/ceil.json \
    --out /tmp/s16a.jsonl 2>&1 | grep "L=\|Error" | tee -a $OUT/s16a_engine.txt
done
mark done
kill $SMI
