# Session 12, call E (one H200). Call D: the decode bench's verify attention on contiguous pages 122.4 us,
# on permuted pages 120.5, while the sweep's T=65,H=8 was 114.4 / 114.3: not the layout. The bench timed
# one call per graph replay; the sweep times calls over rotated input sets back to back in one graph.
# Now the bench times both ways (and the permuted layout), at budgets 64 and 16.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 400 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s12e_decode.txt
