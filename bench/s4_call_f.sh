# Session 4, call F: the engine's verify shapes (T = budget + 1, H = 8) across the Gluon configs, and the
# decode step again with the table bounds moved to fit them.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 150 python3 -m bench.verify_sweep --grid engine --ceilings $OUT/ceilings.json --out $OUT/explore.jsonl \
  --filter "T in (17, 65)" --configs "64,64,8,2,1,0,1,0,1,gluon;64,64,8,2,1,0,1,0,1,gluon-seesaw;64,64,8,2,2,0,1,0,1,gluon-seesaw;64,64,8,2,4,0,1,0,1,gluon-seesaw;64,64,8,2,2,0,1,0,1,gluon" 2>&1 | grep "L=" | tee $OUT/f_explore.txt
timeout 150 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out $OUT/decode.jsonl 2>&1 | grep -v Warn | tail -8 | tee $OUT/f_decode.txt
