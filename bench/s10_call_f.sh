# Session 10, call F (one H200, ~3 device minutes): the sm_120 tables in emulation as shipped (verify at
# P = 64 and P = 1, fp8 pools, the engine shapes; draft attention).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
export DISABLE_MMA_V3=1 TRITREE_ARCH=sm_120
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
timeout 150 python3 -m bench.verify_sweep --grid targets --variant tritree-sm120 --variant tritree-fp8 --ceilings /tmp/ceil.json \
  --filter "(H == 8 or T == 16) and (P == 64 or T != 64)" --out /tmp/s10f_t.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s10f_sm120_table.txt
timeout 40 python3 -m bench.verify_sweep --grid engine --variant tritree-sm120 --ceilings /tmp/ceil.json \
  --filter "T != 8" --out /tmp/s10f_e.jsonl 2>&1 | grep "L=\|#" | tee -a $OUT/s10f_sm120_table.txt
timeout 40 python3 -m bench.draft_sweep --no-step --no-sdpa --ceilings /tmp/ceil.json \
  --filter "B == 1 and L == 46000" --out /tmp/s10f_d.jsonl 2>&1 | grep -v Warn | tee $OUT/s10f_sm120_draft.txt
