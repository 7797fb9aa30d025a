# Prepared in session 6 for the next one (not yet run; ~5 device minutes, carry nothing).
# 1. The warp-specialised seesaw's row gathers (P < 64: its producer gathers rows by cp.async, by column
#    halves; compile-checked only): its GPU tests alone under a timeout (a scheduling bug hangs rather
#    than fails), then its time at P = 1 next to the seesaw's gathers (the fragmented-pool target:
#    T=64,H=8 and T=16,H=64 are 19-20% behind P = 64). If correct and faster, route "gluon-ws" for
#    P < 64 in verify_mla._launch_verify and use it in configs' sm_90:small_pages above 512 rows.
# 2. T=8,H=8 is the copy stream alone (RESULTS, sixth session): the plain schedule with the program's
#    whole chunk prefetched into L2 at its start (gluon+pf, PREFETCH_CHUNK=16), and 16-bit partials.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
TRITREE_EXPERIMENTAL=1 timeout 150 python3 -m pytest -q -x -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "gather and wscs" 2>&1 | grep -v Warn | tail -5 | tee $OUT/s7_gather_tests.txt
timeout 150 python3 bench/gluon_check.py --ws --page-size 1 --variants gluon+seesaw,gluon+wscs --shapes 64x8,16x64,65x8,17x8 2>&1 | grep -v Warn | tee $OUT/s7_gather_check.txt
timeout 120 python3 -m pytest -q -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "plain-pf" 2>&1 | grep -v Warn | tail -3 | tee $OUT/s7_pf_tests.txt
timeout 120 python3 bench/gluon_check.py --variants gluon,gluon+pf --shapes 8x8,16x8,17x8 2>&1 | grep -v Warn | tee $OUT/s7_pf_check.txt
timeout 100 python3 bench/gluon_check.py --variants gluon,gluon+pf --partials bfloat16 --shapes 8x8,16x8 2>&1 | grep -v Warn | tee -a $OUT/s7_pf_check.txt
