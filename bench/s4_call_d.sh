# Session 4, call D: Gluon kernel round 2 (single-copy tiles, seesaw schedule) on the GPU; verify_mla
# with Gluon configs through the public op (compile, graphs); 16-bit vs fp32 split partials.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 150 python3 -m tritree.kernels._verify_gluon 2>&1 | grep -v Warn | tail -14 | tee $OUT/d_compile.txt
timeout 200 python3 -m pytest -q -p no:logging -m gpu tests/kernels/test_verify_gluon.py tests/kernels/test_verify_mla.py 2>&1 | grep -v Warn | tail -25 | tee $OUT/d_tests.txt
timeout 150 python3 bench/gluon_check.py 2>&1 | grep -v Warn | tail -30 | tee $OUT/d_check.txt
timeout 100 python3 bench/gluon_check.py --splits 33 --shapes 64x8,16x64 2>&1 | grep -v Warn | tail -12 | tee -a $OUT/d_check.txt
F="P==64 and (T,H) in [(8,8),(16,8),(64,8),(16,64)]"
EXPLORE_TIMEOUT=150 FILTER="$F" CONFIGS="64,64,8,2,1,0,1,0,1;64,64,8,2,2,0,1,0,1;64,64,8,2,4,0,1,0,1" \
  TRITREE_FP32_PARTIALS=1 bash bench/gpu_run.sh explore 2>&1 | grep "L=" | sed 's/^/fp32-partials /' | tee $OUT/d_explore.txt
EXPLORE_TIMEOUT=240 FILTER="$F" CONFIGS="64,64,8,2,1,0,1,0,1;64,64,8,2,2,0,1,0,1;64,64,8,2,4,0,1,0,1;64,64,8,2,1,0,1,0,1,gluon;64,64,8,2,2,0,1,0,1,gluon;64,64,8,2,1,0,1,0,1,gluon-seesaw;64,64,8,2,2,0,1,0,1,gluon-seesaw" \
  bash bench/gpu_run.sh explore 2>&1 | grep "L=" | tee -a $OUT/d_explore.txt
