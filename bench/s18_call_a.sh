# Session 18, call A (one H200): (1) the two ceilings under sustained load in three processes, for the
# recorded ceilings (roofline.RECORDED_CEILINGS); (2) the split merge of bf16 partials with up to 16 splits a
# chunk (one round of loads at 9-16 splits) and with 256-column programs, the merge alone (profiler) and
# graph-timed; (3) the merge by programmatic dependent launch signalled after each program's partial store
# (tritree-pdl-end). Tests first.
# (After this call the 16-split chunks became the default: its "tritree-merge16" is now "tritree", and the
# old default is "tritree-merge8"; "tritree-merge8-256" now sets 8 explicitly.)
source bench/device_prelude.sh
timeout 150 python3 -m pytest -q -x -rfE -p no:logging tests/kernels/test_verify_mla.py tests/kernels/test_splitkv.py \
  -k "programmatic_dependent_launch or 16bit" 2>&1 | grep -v Warn | tail -4 | tee $OUT/s18a_tests.txt
grep -q " passed" $OUT/s18a_tests.txt && ! grep -q "failed\|error" $OUT/s18a_tests.txt || exit 1
for i in 1 2 3; do timeout 60 python3 -m tritree.roofline 2>&1 | tail -1 | tee -a $OUT/s18a_ceilings.txt; done
for v in "" tritree-merge16 tritree-merge16-256 tritree-merge8-256; do
  timeout 90 python3 -m bench.split_profile --shapes "65,8;17,8;16,64" --iters 40 ${v:+--variant $v} 2>&1 \
    | grep "T=\|Error" | tee -a $OUT/s18a_merge.txt
done
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2; do
  timeout 100 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree --variant tritree-merge16 \
    --variant tritree-merge16-256 --variant tritree-pdl-end --ceilings /tmp/ceil.json --out /tmp/s18a.jsonl \
    2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s18a_engine.txt
done
