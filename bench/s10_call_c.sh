# Session 10, call C (one H200, ~7 device minutes): the sm_120 path in emulation, second round.
# 1. Verify, P = 64: call B's winner (16x64x8x2, TMA tiles, hoisted pages) against the configs next to it.
# 2. Verify, P = 1 (fragmented, token-granular: no TMA tiles): configs that fit sm_120 without TMA.
# 3. Draft attention (K2.6-DFlash: 64 q heads, 8 KV heads, D 128): the table's 32x32x8x2 against larger tiles.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
export DISABLE_MMA_V3=1 TRITREE_ARCH=sm_120
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
CFGS="16,64,8,2,1,1,1,1;16,64,4,2;16,32,8,3,1,1,1,1;16,32,8,2,1,1,1,1,1;32,32,8,2,1,1,1,1"
timeout 200 python3 -m bench.verify_sweep --grid targets --variant tritree-sm120 --configs "$CFGS" --ceilings /tmp/ceil.json \
  --filter "P == 64 and (H == 8 or T == 16)" --out /tmp/s10c_p64.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s10c_sm120_p64.txt
timeout 100 python3 -m bench.verify_sweep --grid engine --variant tritree-sm120 --configs "$CFGS" --ceilings /tmp/ceil.json \
  --filter "T != 8" --out /tmp/s10c_eng.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s10c_sm120_engine.txt
CFGS1="16,32,8,2;32,32,8,2;16,64,4,2;16,32,8,3"
timeout 150 python3 -m bench.verify_sweep --grid targets --variant tritree-sm120 --configs "$CFGS1" --ceilings /tmp/ceil.json \
  --filter "P == 1 and (H == 8 or T == 16)" --out /tmp/s10c_p1.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s10c_sm120_p1.txt
DCFGS="32,64,8,2,1,0,0,1;64,32,8,2,1,0,0,1;64,64,8,1;32,64,8,3,1,0,0,1;32,32,8,2,1,0,0,1"
timeout 120 python3 -m bench.draft_sweep --no-step --no-sdpa --configs "$DCFGS" --ceilings /tmp/ceil.json \
  --filter "B == 1 and L == 46000" --out /tmp/s10c_draft.jsonl 2>&1 | grep -v Warn | tee $OUT/s10c_sm120_draft.txt
