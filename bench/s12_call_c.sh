# Session 12, call C (one H200). Call B: bf16 partials shortened the ws kernel's store (T=65,H=8 4.4 ->
# 3.4 us) but the merge of bf16 partials took 2-3x as long (4.5 -> 12.4 us). Here: the merge of bf16
# partials under other merge shapes (min programs, values per chunk, 8-warp bound), against fp32; and
# the PDL merge (session 9: neutral) against the plain launch at the shipped table, side by side.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
for comb in 1024,4096 1024,2048 2048,2048 512,1024 1024,4096,4096 4096,4096; do
  timeout 60 python3 -m bench.split_profile --shapes "8,8;65,8;16,64" --combine $comb 2>&1 | grep "total" \
    | sed "s/^/fp32: /" | tee -a $OUT/s12c_merge.txt
  TRITREE_PARTIALS_16BIT=1 timeout 60 python3 -m bench.split_profile --shapes "8,8;65,8;16,64" --combine $comb 2>&1 \
    | grep "total" | sed "s/^/bf16: /" | tee -a $OUT/s12c_merge.txt
done
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for grid in targets engine; do
  timeout 150 python3 -m bench.verify_sweep --grid $grid --filter "P == 64" --variant tritree --variant tritree-pdl \
    --ceilings /tmp/ceil.json --out /tmp/s12c.jsonl 2>&1 | grep "L=\|#" | tee -a $OUT/s12c_sweep.txt
done
