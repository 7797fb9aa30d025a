# Session 6, call E: the shipped seesaw with O += P V by column halves (seesaw-cs, no producer partition)
# -- its GPU tests, then its time next to the seesaw and the ws kernel with the same change (wscs).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 200 python3 -m pytest -q --maxfail=3 -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "seesaw-cs" 2>&1 | grep -v Warn | tail -25 | tee $OUT/e_tests.txt
timeout 240 python3 bench/gluon_check.py --ws --variants gluon+seesaw,gluon+seesaw-cs,gluon+wscs --shapes 64x8,16x64,65x8,17x8,32x8,128x8 2>&1 | grep -v Warn | tee $OUT/e_check.txt
