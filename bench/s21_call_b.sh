# Session 21, call B (one H200): the ws kernel's masked pairs ahead of its full pairs (MASKED_FIRST), alone and
# with the split kernel by programmatic dependent launch (SPLIT_PDL + MERGE_SIGNALS), graph-timed against the
# shipped launch (variants interleaved, one process); timelines (T=65,H=8 with both; T=17,H=8 with PDL on / off:
# call A had T=17 3 us slower with the merge's signal); the KV write + verify pair of a layer with the KV write
# signalling (bench/pdl_layer.py); the GPU tests (tail shapes both orders, the PDL test with its lse fixed); the
# decode step with both on.
source bench/device_prelude.sh
SECONDS=0
for r in 1 2 3; do
timeout 100 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
  --variant tritree-split-pdl --variant tritree-ws-masked-first --variant tritree-ws-masked-first-split-pdl \
  --out /tmp/s21b.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s21b_sweep.txt
done
for cfg in "65,8 1 1" "17,8 0 1" "17,8 0 0"; do set -- $cfg
  echo "shape $1 MASKED_FIRST=$2 SPLIT_PDL=MERGE_SIGNALS=$3" | tee -a $OUT/s21b_timeline.txt
  TRITREE_WS_MASKED_FIRST=$2 TRITREE_WS_SPLIT_PDL=$3 TRITREE_MERGE_SIGNALS=$3 timeout 80 python3 -m bench.timeline \
    --graph --shapes "$1" --ctx 46000 2>&1 | tail -2 | tee -a $OUT/s21b_timeline.txt; done
timeout 100 python3 -m bench.pdl_layer --ctx 46000 --T 65 --H 8 --rounds 3 2>&1 | tail -10 | tee $OUT/s21b_layer.txt
echo "elapsed $SECONDS s" | tee -a $OUT/s21b_layer.txt
( time timeout 200 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "split_kernel_by or tail_shapes" ) 2>&1 | grep -v Warn | tail -30 | tee $OUT/s21b_tests.txt
left=$(( 585 - SECONDS )); echo "decode gets $left s" | tee $OUT/s21b_decode.txt
TRITREE_WS_MASKED_FIRST=1 TRITREE_WS_SPLIT_PDL=1 TRITREE_MERGE_SIGNALS=1 timeout $left python3 -m tritree bench decode \
  --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 | tee -a $OUT/s21b_decode.txt
