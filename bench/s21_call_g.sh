# Session 21, call G (one H200): the Gluon matrix's warp-specialised cases (tests/kernels/test_verify_gluon.py -k ws,
# 136 tests) with session 21's defaults, as many as run in the time left.
source bench/device_prelude.sh
( time timeout 230 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k ws ) 2>&1 \
  | grep -v Warn | tail -15 | tee $OUT/s21g_tests.txt
