# Session 12, call D (one H200). The decode bench timed the verify attention alone on randomly permuted
# pages, while the step's own pool is one contiguous run per request; it now times both. The sweep at
# P = 64 on contiguous and on permuted pages, side by side (same ceilings), says what the layout costs.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for grid in engine targets; do
  for frag in "" "--fragmented"; do
    timeout 100 python3 -m bench.verify_sweep --grid $grid --filter "P == 64" $frag --ceilings /tmp/ceil.json \
      --out /tmp/s12d.jsonl 2>&1 | grep "L=\|#" | tee -a $OUT/s12d_sweep.txt
  done
done
timeout 300 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s12d_decode.txt
