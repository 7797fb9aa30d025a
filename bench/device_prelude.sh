# Sourced by the device-call scripts (bench/s*_call_*.sh, from session 12 on): the environment every call
# runs under, the DFlash wheel the decode bench needs, and the GPU suite without the Gluon matrix.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1

# gpu_suite OUTFILE: every GPU test but the Gluon matrix (tests/kernels/test_verify_gluon.py), timed.
gpu_suite() {
  ( time timeout 300 python3 -m pytest -q -rfE -p no:logging -m gpu tests \
    --ignore=tests/kernels/test_verify_gluon.py ) 2>&1 | grep -v Warn | tail -12 | tee "$1"
}
