# Session 10, call G (one H200, ~4 device minutes).
# 1. Where the ~20 us that every H = 8 shape pays regardless of L goes (call A's fit over L): the attention
#    kernel and the split merge apart (torch.profiler device time, eager) at L = 4k .. 128k.
# 2. The decode scenario (budget 64) with the sm_120 tables in emulation (DISABLE_MMA_V3=1).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
for L in 4096 16384 46000 131072; do
  timeout 60 python3 -m bench.split_profile --shapes "8,8;16,8;64,8;65,8" --ctx $L --iters 30 2>&1 | grep "T=" \
    | sed "s/^/L=$L /" | tee -a $OUT/s10g_split_profile.txt
done
DISABLE_MMA_V3=1 TRITREE_ARCH=sm_120 timeout 200 python3 -m tritree bench decode --ctx 46000 --budgets 64 \
  --out /tmp/d120.jsonl 2>&1 | grep -v Warn | tail -8 | tee $OUT/s10g_decode_sm120.txt
