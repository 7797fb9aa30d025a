# Session 12, call H (one H200, the last ~5 device minutes): every verify_mla GPU test with bf16 split
# partials on by default for the warp-specialised kernel over TMA (PARTIALS_16BIT_WS).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 230 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py 2>&1 \
  | grep -v Warn | tee $OUT/s12h_tests.txt | tail -15
