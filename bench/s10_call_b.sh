# Prepared in session 9 for the next one, call B (one H200, ~5 device minutes; carry [".whl"]); not yet run.
# The whole GPU suite but the Gluon kernel matrix (session 9's whole-suite run found a regression that
# targeted runs missed). The matrix (tests/kernels/test_verify_gluon.py, ~6 minutes) needs a call of its
# own: run it when a Gluon kernel changes (session 9: 327 passed).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
( time timeout 500 python3 -m pytest -q -rfE -p no:logging -m gpu tests \
  --ignore=tests/kernels/test_verify_gluon.py ) 2>&1 | grep -v Warn | tail -20 | tee $OUT/s10b_gpu_suite.txt
