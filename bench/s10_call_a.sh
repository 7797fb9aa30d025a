# Prepared in session 9 for the next one (one H200, ~10 device minutes; carry [".whl"]), not yet run.
# 1. Where T=64,H=8's time goes between fixed per-program costs and per-key work: the same shape over
#    L = 4k..128k (the "issue" grid, H = 8, P = 64; session 9's hypothesis: ~10% fixed cost at 46k, 22
#    tile pairs a program, so the fraction of the matmul floor should rise towards T=64,H=64's 70% as L
#    grows; a linear fit of time against L gives both parts).
# 2. The whole GPU suite but the Gluon kernel matrix (~4.5 minutes; session 9's whole-suite run found a
#    regression the targeted runs missed). The matrix (tests/kernels/test_verify_gluon.py, ~6 minutes)
#    needs a call of its own: run it when a Gluon kernel changes.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 150 python3 -m bench.verify_sweep --grid issue --filter "H == 8 and P == 64" \
  --out $OUT/s10a_over_L.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s10a_over_L.txt
( time timeout 400 python3 -m pytest -q -rfE -p no:logging -m gpu tests \
  --ignore=tests/kernels/test_verify_gluon.py ) 2>&1 | grep -v Warn | tail -20 \
  | tee $OUT/s10a_gpu_suite.txt
