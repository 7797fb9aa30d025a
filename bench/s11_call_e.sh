# Session 11, call E (one H200, ~7 device minutes, right after call D): the whole Gluon matrix with the
# coalesced store on (TRITREE_COALESCED_STORE=1), the code it would run as the default.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1 TRITREE_COALESCED_STORE=1
( time timeout 560 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_gluon.py ) 2>&1 \
  | grep -v Warn | tail -12 | tee $OUT/s11e_gluon_matrix.txt
