# Session 10, call D (one H200, ~4 device minutes): the sm_120 path in emulation, third round.
# 1. Pages below 64 tokens: 16x64x8x2 (fits sm_120 without a spill for bf16 pools at P = 1 and 16, not
#    for fp8 ones) against the small-pages table's 32x32x8x2 (fits both).
# 2. fp8 pools at P = 64: the sm_120:fp8 table's 16x64x8x2 against 32x32x8x2 and session 1's 16x32x8x2.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
export DISABLE_MMA_V3=1 TRITREE_ARCH=sm_120
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
timeout 120 python3 -m bench.verify_sweep --grid targets --variant tritree-sm120 --configs "16,64,8,2;32,32,8,2" \
  --ceilings /tmp/ceil.json --filter "P == 1 and (H == 8 or T == 16)" --out /tmp/s10d_p1.jsonl 2>&1 \
  | grep "L=\|#" | tee $OUT/s10d_sm120_p1.txt
timeout 150 python3 -m bench.verify_sweep --grid targets --variant tritree-fp8 --configs "16,64,8,2;32,32,8,2;16,32,8,2" \
  --ceilings /tmp/ceil.json --filter "P == 64 and (H == 8 or T == 16)" --out /tmp/s10d_fp8.jsonl 2>&1 \
  | grep "L=\|#" | tee $OUT/s10d_sm120_fp8.txt
