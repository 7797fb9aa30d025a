# Prepared in session 9 for the next one, call A (one H200, ~6 device minutes; carry [".whl"]); not yet run.
# Send call B (bench/s10_call_b.sh: the GPU suite) right after it, within the machine's 30 s warm window.
# 1. The masked tail's L2 prefetch (TRITREE_TAIL_PREFETCH, off until measured): its GPU test (bit-equal to
#    the plain launch, eager and graph), then the target and engine shapes with and without it side by
#    side, and the decode step with and without it. If it wins: on by default (_verify_gluon.TAIL_PREFETCH).
# 2. Where T=64,H=8's time goes between fixed per-program costs and per-key work: the same shape over
#    L = 4k..128k (the "issue" grid, H = 8, P = 64; session 9's estimate: ~10% fixed cost at 46k, 22 tile
#    pairs a program, so the fraction of the matmul floor should rise towards T=64,H=64's 70% as L grows;
#    a linear fit of time against L gives both parts).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 150 python3 -m pytest -q -rf -p no:logging -m gpu tests/kernels/test_verify_mla.py -k tail_prefetch 2>&1 \
  | grep -v Warn | tail -4 | tee $OUT/s10a_tests.txt
for grid in targets engine; do
  timeout 120 python3 -m bench.verify_sweep --grid $grid --variant tritree --variant tritree-tailpf \
    --out /tmp/s10a_tail_$grid.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s10a_tail_$grid.txt
done
timeout 150 python3 -m bench.verify_sweep --grid issue --filter "H == 8 and P == 64" \
  --out /tmp/s10a_over_L.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s10a_over_L.txt
timeout 100 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | grep -v Warn \
  | tee $OUT/s10a_decode.txt
TRITREE_TAIL_PREFETCH=1 timeout 100 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/dt.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s10a_decode_tailpf.txt
