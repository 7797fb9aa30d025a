# Prepared in session 12 for the next one, call A (one H200, ~8 device minutes); not yet run.
# Session 12 shipped bf16 split partials for the warp-specialised kernel over TMA (PARTIALS_16BIT_WS) and
# the merge of 16-bit partials by column warps; its last call ran every verify_mla GPU test at that
# default (57 passed), not the rest of the GPU suite. First the suite (all but the Gluon matrix, whose
# tests call the kernels with their own fp32 partials), then the target / engine grids with and without
# the new default side by side, the decode step at budgets 16 and 64 (the bench times the verify
# attention back to back since session 12), and the timeline.
source bench/device_prelude.sh
gpu_suite $OUT/s13a_gpu_suite.txt
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for grid in targets engine; do
  timeout 120 python3 -m bench.verify_sweep --grid $grid --variant tritree --ceilings /tmp/ceil.json \
    --out /tmp/s13a.jsonl 2>&1 | grep "L=\|#" | tee -a $OUT/s13a_sweep.txt
  TRITREE_PARTIALS_16BIT_WS=0 timeout 120 python3 -m bench.verify_sweep --grid $grid --filter "P == 64" \
    --ceilings /tmp/ceil.json --out /tmp/s13a.jsonl 2>&1 | grep "L=" | sed "s/^/fp32 partials: /" \
    | tee -a $OUT/s13a_sweep.txt
done
timeout 200 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s13a_decode.txt
timeout 60 python3 -m bench.timeline --shapes "8,8;16,8;64,8;65,8;16,64" --ctx 46000 2>&1 | grep -v Warn \
  | tee $OUT/s13a_timeline.txt
