# Prepared in session 11 for the next one, call A (one H200, ~8 device minutes); not yet run.
# Session 11 ended with its device time spent after changing the sm_90 table (the warp-specialised
# kernel with its L2 prefetch and coalesced store above 64 rows, call F): the GPU suite has not run on
# that table. First the suite (all but the Gluon matrix, which passed 327 with the coalesced store on
# every kernel in call E), then the target, engine and batch grids at the new table, the ws kernel at
# the 64-row shape the plain schedule serves (T=8,H=8) and at 128 / 256 rows (T=16,H=8 and T=8,H=16;
# T=32,H=8 and T=16,H=16: not measured with it), and the decode step at budgets 16 and 64.
source bench/device_prelude.sh
gpu_suite $OUT/s12a_gpu_suite.txt
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for grid in targets engine; do
  timeout 100 python3 -m bench.verify_sweep --grid $grid --ceilings /tmp/ceil.json --out /tmp/s12a.jsonl 2>&1 \
    | grep "L=\|#" | tee -a $OUT/s12a_sweep.txt
done
timeout 100 python3 -m bench.verify_sweep --grid full --filter "L == 46000 and P == 64 and B == 1 and T * H in (64, 128, 256)" \
  --configs "64,64,8,2,1,0,1,0,1,gluon;64,64,8,2,1,0,1,0,1,gluon-ws-noprefetch;64,64,8,2,1,0,1,0,1,gluon-ws" \
  --ceilings /tmp/ceil.json --out /tmp/s12a_b.jsonl 2>&1 | grep "L=\|#" | tee -a $OUT/s12a_buckets.txt
timeout 150 python3 -m tritree bench decode --ctx 46000 --budgets 16 64 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s12a_decode.txt
# Where the warp-specialised kernel's time goes now that it serves every shape above 64 rows.
timeout 60 python3 -m bench.timeline --shapes "8,8;16,8;64,8;65,8;16,64" --ctx 46000 2>&1 | grep -v Warn \
  | tee $OUT/s12a_timeline.txt
