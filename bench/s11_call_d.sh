# Session 11, call D (one H200, ~4 device minutes). The store of each program's 64 output / partial
# rows (3-4 us in the timeline) re-laid out through shared memory first (TRITREE_COALESCED_STORE=1):
# call C showed the store bound by its 32-byte pieces, not its bytes (bf16 partials, half the bytes in
# 16-byte pieces, took twice as long). Its GPU test (bit-equal, every Gluon kernel, one and several
# splits, eager and graph), then side by side at the target and engine shapes, the timeline with and
# without it in one call, the decode step with it.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 150 python3 -m pytest -q -rf -p no:logging -m gpu tests/kernels/test_verify_mla.py -k coalesced 2>&1 \
  | grep -v Warn | tail -4 | tee $OUT/s11d_tests.txt
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for grid in targets engine; do
  timeout 150 python3 -m bench.verify_sweep --grid $grid --variant tritree --variant tritree-coalesced \
    --ceilings /tmp/ceil.json --out /tmp/s11d_$grid.jsonl 2>&1 | grep "L=\|#" | tee -a $OUT/s11d_sweep.txt
done
timeout 60 python3 -m bench.timeline --shapes "8,8;64,8;65,8;16,64" --ctx 46000 2>&1 | grep -v Warn \
  | tee $OUT/s11d_timeline.txt
TRITREE_COALESCED_STORE=1 timeout 60 python3 -m bench.timeline --shapes "8,8;64,8;65,8;16,64" --ctx 46000 2>&1 \
  | grep -v Warn | sed "s/^/coalesced: /" | tee -a $OUT/s11d_timeline.txt
TRITREE_COALESCED_STORE=1 timeout 100 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | sed "s/^/coalesced: /" | tee $OUT/s11d_decode.txt
