# Session 16, call B (one H200, ~3 device minutes). Call A refuted both suspects for the timeline/graph-timed
# disagreement (the rotating-set timeline still has the pipelined tail 3.6 us shorter; SM clock 1980 MHz in every
# active nvidia-smi sample, power <= 188 W). Here the stamped kernel runs as the graph-timed sweep runs it: 12
# calls (kernel + merge) back to back in one CUDA graph over rotating sets (bench.timeline --graph), so each
# call's span, the gap to the next call and the graph-timed period come from one replay, for the one-tile tail
# (PIPELINED_TAIL=0) and the pipelined one (1) of branch s16-tail-probe's kernel (bench/s16_probe/, untracked).
source bench/device_prelude.sh
cp bench/s16_probe/_verify_gluon_ws.py tritree/kernels/_verify_gluon_ws.py
for round in 1 2; do
  for on in 0 1; do
    echo "round $round PIPELINED_TAIL=$on" | tee -a $OUT/s16b_graph_timeline.txt
    TRITREE_PIPELINED_TAIL=$on timeout 90 python3 -m bench.timeline --graph --shapes "65,8;17,8" --ctx 46000 2>&1 \
      | grep "^T=\|Error\|error" | tee -a $OUT/s16b_graph_timeline.txt
  done
done
