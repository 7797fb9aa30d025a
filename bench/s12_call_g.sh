# Session 12, call G (one H200). Call F (ncu): the merge of bf16 partials sat at 81.6% of L1 throughput
# (its 4 warps on 4 splits, the sum over splits through shared memory), 13.6 us vs 6.8 for fp32. Now
# merged by 256-column warps side by side (COMBINE_16BIT_BY_COLUMNS). Tests of the merge and of bf16
# partials on the GPU, kernel vs merge apart, the sweep with and without bf16 partials, the decode step.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 120 python3 -m pytest -q -rfE -p no:logging tests/kernels/test_splitkv.py tests/kernels/test_verify_mla.py \
  -k 16bit 2>&1 | grep -v Warn | tail -3 | tee $OUT/s12g_tests.txt
TRITREE_PARTIALS_16BIT=1 timeout 60 python3 -m bench.split_profile --shapes "8,8;17,8;64,8;65,8;16,64" 2>&1 \
  | grep total | sed "s/^/bf16 partials, merge by columns: /" | tee $OUT/s12g_profile.txt
timeout 60 python3 -m bench.split_profile --shapes "8,8;17,8;64,8;65,8;16,64" 2>&1 | grep total \
  | sed "s/^/fp32 partials: /" | tee -a $OUT/s12g_profile.txt
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for grid in engine targets; do
  timeout 100 python3 -m bench.verify_sweep --grid $grid --filter "P == 64" --variant tritree --variant tritree-partials16 \
    --ceilings /tmp/ceil.json --out /tmp/s12g.jsonl 2>&1 | grep "L=\|#" | tee -a $OUT/s12g_sweep.txt
done
TRITREE_PARTIALS_16BIT=1 timeout 150 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | sed "s/^/bf16 partials: /" | tee $OUT/s12g_decode.txt
