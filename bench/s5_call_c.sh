# Session 5, call C: Q by cp.async (all ten column blocks in flight) and the seesaw's L2 prefetch one
# pair ahead: the Gluon GPU tests, then where the time goes with and without the prefetch.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 240 python3 -m pytest -q -x -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "not overlap" 2>&1 | grep -v Warn | tail -4 | tee $OUT/c_tests.txt
timeout 100 python3 -m bench.split_profile --shapes "8,8;16,8;64,8;16,64;65,8;17,8" 2>&1 | grep "T=" | tee $OUT/c_profile.txt
timeout 80 python3 -m bench.split_profile --shapes "64,8;16,64;65,8;17,8" --no-prefetch 2>&1 | grep "T=" | tee -a $OUT/c_profile.txt
timeout 60 python3 -m bench.split_profile --shapes "8,8;16,8;64,8;16,64" --page-size 1 2>&1 | grep "T=" | tee -a $OUT/c_profile.txt
