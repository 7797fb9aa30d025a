# Session 4, call J: the Gluon kernels' row-gather path for pools with P < 64 (P = 1: token-granular,
# randomly permuted pages): GPU tests (as many as 100 s allow), then the target shapes at P = 1
# (the Triton kernel's P = 1 numbers: call E).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 100 python3 -m pytest -q -x -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "gather and not overlap and not bf16" 2>&1 | grep -v Warn | tail -6 | tee $OUT/j_tests.txt
EXPLORE_TIMEOUT=110 FILTER="P==1 and (T,H) in [(8,8),(16,8),(64,8),(16,64)]" \
  CONFIGS="64,64,8,2,1,0,0,0,1,gluon;64,64,8,2,1,0,0,0,1,gluon-seesaw;64,64,8,2,2,0,0,0,1,gluon-seesaw;64,64,8,2,4,0,0,0,1,gluon-seesaw" \
  bash bench/gpu_run.sh explore 2>&1 | grep "L=" | tee $OUT/j_explore.txt
