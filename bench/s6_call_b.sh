# Session 6, call B: the split seesaw (_verify_gluon_ss_kernel: each warpgroup a partition, FlashMLA's
# schedule; never run before) -- its GPU tests under a timeout, then its time next to the shipped seesaw.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
TRITREE_EXPERIMENTAL=1 timeout 200 python3 -m pytest -q --maxfail=3 -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "ss" 2>&1 | grep -v Warn | tail -25 | tee $OUT/b_ss_tests.txt
timeout 200 python3 bench/gluon_check.py --ws --variants gluon+seesaw,gluon+ss --shapes 64x8,16x64,65x8,17x8,8x8 2>&1 | grep -v Warn | tee $OUT/b_ss_check.txt
