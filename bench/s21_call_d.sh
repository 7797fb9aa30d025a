# Session 21, call D (one H200): the new defaults (MASKED_FIRST, TMA_STORE, SPLIT_PDL where the rows fill the last
# block or it is narrow, MERGE_SIGNALS, WRITE_SIGNALS) against session 20's launch (tritree-s20), graph-timed over
# the engine shapes (three rounds) and the targets at P = 64 and P = 1 (one round); a layer's KV write + verify;
# the T=65 timeline; the decode step.
source bench/device_prelude.sh
SECONDS=0
for r in 1 2 3; do
timeout 100 python3 -m bench.verify_sweep --grid engine --variant tritree --variant tritree-s20 --out /tmp/s21d.jsonl \
  2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s21d_sweep.txt
done
timeout 150 python3 -m bench.verify_sweep --grid targets --variant tritree --variant tritree-s20 --out /tmp/s21d.jsonl \
  2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s21d_targets.txt
timeout 80 python3 -m bench.pdl_layer --ctx 46000 --T 65 --H 8 --rounds 2 2>&1 | tail -8 | tee $OUT/s21d_layer.txt
timeout 80 python3 -m bench.timeline --graph --shapes "65,8" --ctx 46000 2>&1 | tail -2 | tee $OUT/s21d_timeline.txt
left=$(( 585 - SECONDS )); echo "decode gets $left s" | tee $OUT/s21d_decode.txt
timeout $left python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 \
  | tee -a $OUT/s21d_decode.txt
