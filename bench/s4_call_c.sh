# Session 4, call C: first GPU run of the Gluon (Hopper) verify kernel: compile, tests, timing against
# the Triton kernel; P = 1 with four programs per SM.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 120 python3 -m tritree.kernels._verify_gluon 2>&1 | tail -12 | tee $OUT/c_compile.txt
timeout 200 python3 -m pytest -q -x -p no:logging -m gpu tests/kernels/test_verify_gluon.py 2>&1 | grep -v Warn | tail -30 | tee $OUT/c_tests.txt
timeout 150 python3 bench/gluon_check.py 2>&1 | grep -v Warn | tail -30 | tee $OUT/c_check.txt
timeout 100 python3 bench/gluon_check.py --splits 33 --shapes 64x8,16x64 2>&1 | grep -v Warn | tail -10 | tee -a $OUT/c_check.txt
EXPLORE_TIMEOUT=100 FILTER="P==1 and (T,H) in [(64,8),(16,64)]" CONFIGS="64,64,8,2,4,0,0,0,1" bash bench/gpu_run.sh explore 2>&1 | grep "L=" | tee $OUT/c_explore.txt
