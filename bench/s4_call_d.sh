# Session 4, call D: Gluon kernel round 2 (one TMA per tile, the seesaw schedule) on the GPU; verify_mla
# with Gluon configs through the public op (torch.compile, graphs); 16-bit vs fp32 split partials.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 170 python3 -m pytest -q -x -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "not overlap" 2>&1 | grep -v Warn | tail -15 | tee $OUT/d_tests.txt
timeout 90 python3 -m pytest -q -x -p no:logging -m gpu tests/kernels/test_verify_mla.py -k "tma_tiles" 2>&1 | grep -v Warn | tail -15 | tee -a $OUT/d_tests.txt
timeout 110 python3 bench/gluon_check.py 2>&1 | grep -v Warn | tail -30 | tee $OUT/d_check.txt
F="P==64 and (T,H) in [(8,8),(16,8),(64,8),(16,64)]"
EXPLORE_TIMEOUT=170 FILTER="$F" CONFIGS="64,64,8,2,1,0,1,0,1;64,64,8,2,2,0,1,0,1;64,64,8,2,4,0,1,0,1;64,64,8,2,1,0,1,0,1,gluon;64,64,8,2,2,0,1,0,1,gluon;64,64,8,2,4,0,1,0,1,gluon;64,64,8,2,1,0,1,0,1,gluon-seesaw;64,64,8,2,2,0,1,0,1,gluon-seesaw;64,64,8,2,4,0,1,0,1,gluon-seesaw" \
  bash bench/gpu_run.sh explore 2>&1 | grep "L=" | tee $OUT/d_explore.txt
EXPLORE_TIMEOUT=40 FILTER="P==64 and (T,H) in [(8,8),(16,64)]" CONFIGS="64,64,8,2,1,0,1,0,1;64,64,8,2,4,0,1,0,1" \
  TRITREE_FP32_PARTIALS=1 bash bench/gpu_run.sh explore 2>&1 | grep "L=" | sed 's/^/fp32-partials /' | tee -a $OUT/d_explore.txt
