# Prepared in session 13 for the next one, call A (one H200, ~7 device minutes); not yet run.
# Session 13 made bf16 split partials the default for row gathers (PARTIALS_16BIT_GATHER with the staged
# store) and for the plain schedule over TMA (PARTIALS_16BIT_PLAIN); its calls C and F ran the verify_mla
# GPU tests at those defaults (57 and 37 passed), not the rest of the GPU suite. First the suite (all but
# the Gluon matrix), then the targets grid at P = 1 and 64 in one process, the engine grid, the decode step
# at budgets 64 and 16.
source bench/device_prelude.sh
gpu_suite $OUT/s14a_gpu_suite.txt
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for grid in targets engine; do
  timeout 120 python3 -m bench.verify_sweep --grid $grid --variant tritree --ceilings /tmp/ceil.json \
    --out /tmp/s14a.jsonl 2>&1 | grep "L=\|#" | tee -a $OUT/s14a_sweep.txt
done
timeout 200 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s14a_decode.txt
