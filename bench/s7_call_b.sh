# Session 7, call B: the ws kernel's row gathers in both producer orders (GPU tests, then P = 1 and
# P = 16 times next to the seesaw's gathers and the P = 64 kernel), then the T=8,H=8 anatomy.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 170 python3 -m pytest -q -x -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "gather and wscs" 2>&1 | grep -v Warn | tail -4 | tee $OUT/b_gather_tests.txt
timeout 200 python3 bench/gluon_check.py --ws --page-size 1 --variants gluon+seesaw,gluon+wscs,gluon+wscs-il --shapes 64x8,16x64,65x8,8x8,16x8,17x8 2>&1 | grep -v Warn | tee $OUT/b_gather_p1.txt
timeout 120 python3 bench/stream_ceiling.py 2>&1 | grep -v Warn | tee $OUT/b_stream.txt
timeout 100 python3 bench/gluon_check.py --ws --page-size 16 --variants gluon+seesaw,gluon+wscs,gluon+wscs-il --shapes 65x8,17x8 2>&1 | grep -v Warn | tee $OUT/b_gather_p16.txt
