# Session 10, call B (one H200, ~8 device minutes): the sm_120 path in emulation.
# 1. The emulation's own compute ceiling: a Triton bf16 matmul lowered to mma.sync (DISABLE_MMA_V3=1).
# 2. Candidate sm_120 verify configs (all compile for sm_120 within 101,376 B without spills, triton 3.9
#    audit) against the table's 16x32x8x2, at the H = 8 target shapes, T=16,H=64 and the engine shapes.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
export DISABLE_MMA_V3=1 TRITREE_ARCH=sm_120
timeout 90 python3 -m bench.mma_sync_ceiling --out /tmp/mma.json 2>&1 | grep -v Warn | tee $OUT/s10b_mma_sync.txt
CFGS="16,32,8,2;16,32,8,3;16,32,8,2,1,1,1,1;32,32,8,2;32,32,8,3;32,32,8,2,1,1,1,1;32,16,8,3,1,1,1,1;16,64,8,2,1,1,1,1"
timeout 300 python3 -m bench.verify_sweep --grid targets --variant tritree-sm120 --configs "$CFGS" \
  --filter "P == 64 and (H == 8 or T == 16)" --out /tmp/s10b_sm120_targets.jsonl 2>&1 | grep "L=\|#" \
  | tee $OUT/s10b_sm120_targets.txt
timeout 150 python3 -m bench.verify_sweep --grid engine --variant tritree-sm120 --configs "$CFGS" \
  --filter "T != 8" --out /tmp/s10b_sm120_engine.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s10b_sm120_engine.txt
