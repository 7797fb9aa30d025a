# Session 13, call E (one H200): the split merge with its sum over splits once after the loop
# (_splitkv.COMBINE_ONE_SUM; the maximum of every split's lse taken first) -- the merge alone under the
# profiler, old and new, at the shipped bounds and others; then the verify times side by side (and with
# bf16 partials behind the staged store for every Gluon kernel: T=8,H=8's plain kernel lost with bf16
# partials under the old merge); then the merge tests and verify_mla GPU tests with it on.
source bench/device_prelude.sh
for run in 0:1024,4096 1:1024,4096 1:512,4096 1:2048,4096; do
  TRITREE_COMBINE_ONE_SUM=${run%%:*} timeout 60 python3 -m bench.split_profile --shapes "8,8;16,8;65,8;16,64" \
    --combine ${run#*:} --iters 30 2>&1 | grep "T=" | sed "s/^/one_sum=${run%%:*} /" | tee -a $OUT/s13e_merge.txt
done
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for grid in targets engine; do
  timeout 150 python3 -m bench.verify_sweep --grid $grid --filter "P == 64" --variant tritree --variant tritree-onesum \
    --variant tritree-onesum-partials16-coalesced --ceilings /tmp/ceil.json --out /tmp/s13e.jsonl 2>&1 \
    | grep "L=\|#" | tee -a $OUT/s13e_sweep.txt
done
TRITREE_COMBINE_ONE_SUM=1 timeout 150 python3 -m pytest -q -rfE -p no:logging tests/kernels/test_splitkv.py \
  tests/kernels/test_verify_mla.py -k "splitkv or bf16_large or 16bit or small_pages or graph" 2>&1 | grep -v Warn \
  | tail -4 | tee $OUT/s13e_tests.txt
