# Session 14, call G (one H200, right after F): every GPU test but the Gluon matrix at the final defaults
# (the narrow last row block on).
source bench/device_prelude.sh
( time timeout 420 python3 -m pytest -q -rfE -p no:logging -m gpu tests \
    --ignore=tests/kernels/test_verify_gluon.py ) 2>&1 | grep -v Warn | tail -12 | tee $OUT/s14g_gpu_suite.txt
