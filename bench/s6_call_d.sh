# Session 6, call D: the ws kernel with O += P V by column halves (COLSPLIT: the next pair's scores
# start on column blocks 0..3 while 4..7 load) -- its GPU tests under a timeout, then its time.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
TRITREE_EXPERIMENTAL=1 timeout 200 python3 -m pytest -q --maxfail=3 -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "wscs" 2>&1 | grep -v Warn | tail -25 | tee $OUT/d_tests.txt
timeout 200 python3 bench/gluon_check.py --ws --variants gluon+seesaw,gluon+ws,gluon+wscs --shapes 64x8,16x64,65x8,17x8,32x8 2>&1 | grep -v Warn | tee $OUT/d_check.txt
