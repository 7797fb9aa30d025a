# Session 21, call A (one H200): the ws split kernel launched by programmatic dependent launch (SPLIT_PDL:
# each program waits in griddepcontrol.wait before its first global read; the merge signals its dependents at
# its start, MERGE_SIGNALS), graph-timed against the plain launch (variants interleaved, one process), the
# graph timeline's gap between calls both ways, the decode step with it on; then the GPU tests not yet run on a
# GPU (the ws tail shapes in their final form, the new PDL test).
source bench/device_prelude.sh
SECONDS=0
for r in 1 2 3; do
timeout 100 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
  --variant tritree-split-pdl --variant tritree-split-pdl-only --out /tmp/s21a.jsonl 2>&1 \
  | grep "L=\|Error\|^#" | tee -a $OUT/s21a_sweep.txt
done
for pdl in 1 0; do echo "SPLIT_PDL=$pdl MERGE_SIGNALS=$pdl" | tee -a $OUT/s21a_timeline.txt
  TRITREE_WS_SPLIT_PDL=$pdl TRITREE_MERGE_SIGNALS=$pdl timeout 80 python3 -m bench.timeline --graph --shapes "65,8" \
    --ctx 46000 2>&1 | tail -2 | tee -a $OUT/s21a_timeline.txt; done
echo "elapsed $SECONDS s" | tee -a $OUT/s21a_timeline.txt
TRITREE_WS_SPLIT_PDL=1 TRITREE_MERGE_SIGNALS=1 timeout 150 python3 -m tritree bench decode --ctx 46000 --budgets 64 \
  --out /tmp/d.jsonl 2>&1 | tail -4 | tee $OUT/s21a_decode.txt
left=$(( 585 - SECONDS )); echo "tests get $left s" | tee $OUT/s21a_tests.txt
( time timeout $left python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "split_kernel_by or tail_shapes" ) 2>&1 | grep -v Warn | tail -8 | tee -a $OUT/s21a_tests.txt
