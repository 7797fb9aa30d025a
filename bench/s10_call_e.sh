# Session 10, call E (one H200, ~6 device minutes): the GPU suite on this session's code (all but the
# Gluon kernel matrix, tests/kernels/test_verify_gluon.py: no Gluon kernel changed since session 9's
# 327 passed but for the tail prefetch's removal, a checkout of the kernels as they were then).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
( time timeout 480 python3 -m pytest -q -rfE -p no:logging -m gpu tests \
  --ignore=tests/kernels/test_verify_gluon.py ) 2>&1 | grep -v Warn | tail -20 | tee $OUT/s10e_gpu_suite.txt
