# Prepared in session 10 for the next one, call B (one H200, ~8 device minutes); not yet run.
# The whole Gluon matrix at HEAD (session 10 ran its seesaw part after PAIR_CHUNKS: 80 passed; the
# warp-specialised kernel's TIMELINE and the plain/seesaw Q_FIRST constexprs are off by default, so
# their default compiles are unchanged, but the matrix has not run on this code as a whole).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
( time timeout 560 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_gluon.py ) 2>&1 \
  | grep -v Warn | tail -12 | tee $OUT/s11b_gluon_matrix.txt
# The sm_120 tables' configs at every page size and pool dtype lookup gives them (test widened in
# session 10's review; not yet run on a GPU).
timeout 100 python3 -m pytest -q -rf -p no:logging -m gpu tests/kernels/test_verify_mla.py -k sm120 2>&1 \
  | grep -v Warn | tail -4 | tee $OUT/s11b_sm120_tests.txt
