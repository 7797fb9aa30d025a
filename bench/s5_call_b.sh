# Session 5, call B: the one-pass split merge (combine_config) and the one-program-per-SM tables:
# GPU tests of the public op and draft attention (both merge with it), where the time goes now
# (P = 64 and P = 1), and 16-bit o partials through the Gluon kernels with the new merge.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 150 python3 -m pytest -q -p no:logging -m gpu tests/kernels/test_verify_mla.py tests/kernels/test_draft_attention.py 2>&1 | grep -v Warn | tail -4 | tee $OUT/b_tests.txt
timeout 100 python3 -m bench.split_profile --shapes "8,8;16,8;64,8;16,64;65,8;17,8" 2>&1 | grep "T=" | tee $OUT/b_profile.txt
timeout 60 python3 -m bench.split_profile --shapes "8,8;16,8;64,8;16,64" --page-size 1 2>&1 | grep "T=" | tee -a $OUT/b_profile.txt
timeout 150 python3 bench/gluon_check.py --shapes 8x8,16x8,64x8,16x64 --partials bfloat16 2>&1 | grep -v Warn | tee $OUT/b_partials.txt
