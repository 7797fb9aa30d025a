# Session 21, call C (one H200): the 16-bit split partials stored by TMA (TMA_STORE): its bit-equality tests,
# graph-timed alone and with MASKED_FIRST (+ SPLIT_PDL / MERGE_SIGNALS) against the shipped launch (engine
# shapes, three rounds; the targets at P = 64 with the split kernel by PDL, two rounds), the T=65 timeline and
# the decode step with all four on.
source bench/device_prelude.sh
SECONDS=0
( time timeout 150 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py -k "tma_store" ) \
  2>&1 | grep -v Warn | tail -12 | tee $OUT/s21c_tests.txt
for r in 1 2 3; do
timeout 100 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree --variant tritree-ws-tma-store \
  --variant tritree-s21-no-pdl --variant tritree-s21-all --out /tmp/s21c.jsonl 2>&1 | grep "L=\|Error\|^#" \
  | tee -a $OUT/s21c_sweep.txt
done
for r in 1 2; do
timeout 100 python3 -m bench.verify_sweep --grid targets --filter "T > 8 and P == 64" --variant tritree \
  --variant tritree-split-pdl --variant tritree-s21-all --out /tmp/s21c.jsonl 2>&1 | grep "L=\|Error\|^#" \
  | tee -a $OUT/s21c_targets.txt
done
echo "all four on" | tee $OUT/s21c_timeline.txt
TRITREE_WS_MASKED_FIRST=1 TRITREE_WS_TMA_STORE=1 TRITREE_WS_SPLIT_PDL=1 TRITREE_MERGE_SIGNALS=1 timeout 80 \
  python3 -m bench.timeline --graph --shapes "65,8" --ctx 46000 2>&1 | tail -2 | tee -a $OUT/s21c_timeline.txt
left=$(( 585 - SECONDS )); echo "decode gets $left s" | tee $OUT/s21c_decode.txt
TRITREE_WS_MASKED_FIRST=1 TRITREE_WS_TMA_STORE=1 TRITREE_WS_SPLIT_PDL=1 TRITREE_MERGE_SIGNALS=1 timeout $left \
  python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 | tee -a $OUT/s21c_decode.txt
