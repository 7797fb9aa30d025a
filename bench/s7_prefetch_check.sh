# Prepared in session 6 for the next one (not yet run): T=8,H=8 is the copy stream alone (RESULTS,
# sixth session). Does prefetching each program's whole chunk into L2 at its start help the plain
# schedule (gluon+pf, PREFETCH_CHUNK=16), and do 16-bit partials help there with the one-pass merge?
# GPU tests of the new variant first (a prefetch is a hint: only faults could show).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 120 python3 -m pytest -q -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "plain-pf" 2>&1 | grep -v Warn | tail -3 | tee $OUT/pf_tests.txt
timeout 120 python3 bench/gluon_check.py --variants gluon,gluon+pf --shapes 8x8,16x8,17x8 2>&1 | grep -v Warn | tee $OUT/pf_check.txt
timeout 100 python3 bench/gluon_check.py --variants gluon,gluon+pf --partials bfloat16 --shapes 8x8,16x8 2>&1 | grep -v Warn | tee -a $OUT/pf_check.txt
