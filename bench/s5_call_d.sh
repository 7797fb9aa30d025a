# Session 5, call D: L2 prefetch also in the plain schedule and the row-gather seesaw; split-merge
# shapes (combine_config bounds). Gluon GPU tests without the long reference sweeps.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 100 python3 -m pytest -q -x -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "not overlap and not matches_reference" 2>&1 | grep -v Warn | tail -3 | tee $OUT/d_tests.txt
timeout 60 python3 -m bench.split_profile --shapes "8,8;16,8;64,8;16,64" 2>&1 | grep "T=" | tee $OUT/d_profile.txt
timeout 60 python3 -m bench.split_profile --shapes "8,8;16,8;64,8;16,64" --page-size 1 2>&1 | grep "T=" | tee -a $OUT/d_profile.txt
timeout 40 python3 -m bench.split_profile --shapes "8,8;16,8" --no-prefetch 2>&1 | grep "T=" | tee -a $OUT/d_profile.txt
for c in 256,8192 4096,4096 512,16384; do
  timeout 40 python3 -m bench.split_profile --shapes "8,8;16,8;64,8;17,8" --combine $c 2>&1 | grep "T=" | tee -a $OUT/d_profile.txt
done
