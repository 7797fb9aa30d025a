# Prepared for the next session (not yet run): the experimental warp-specialised seesaw
# (tritree/kernels/_verify_gluon_ws.py, compile-checked only) on the H200 -- its GPU tests alone under
# a timeout (a scheduling bug would hang rather than fail), then its time next to the shipped kernels.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
TRITREE_EXPERIMENTAL=1 timeout 150 python3 -m pytest -q -x -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k ws 2>&1 | grep -v Warn | tail -5 | tee $OUT/ws_tests.txt
timeout 150 python3 bench/gluon_check.py --ws --shapes 64x8,16x64,65x8,17x8 2>&1 | grep -v Warn | tee $OUT/ws_check.txt
