# Session 11, call C (one H200, ~7 device minutes). Q's copies first is now the plain schedule's
# default (call A: T=8,H=8 36.2 -> 35.0 us; the seesaw keeps Q after, T=64,H=64 744 -> 781 with it).
# New experiment: split partials in bf16 (TRITREE_PARTIALS_16BIT=1; T=64,H=8's 16 splits write and the
# merge reads 16.8 MB of fp32 partials, and the timeline has the store at ~3 us). Tests (the switch and
# the Q-first bit test, then every verify_mla GPU test at the new default), then side by side: the
# default, Q last (plain), Q first (seesaw, again: was the T=64,H=64 loss noise?), bf16 partials; the
# timeline with bf16 partials; the decode step at the default and with bf16 partials.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 200 python3 -m pytest -q -rf -p no:logging -m gpu tests/kernels/test_verify_mla.py 2>&1 \
  | grep -v Warn | tail -4 | tee $OUT/s11c_tests.txt
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for grid in targets engine; do
  timeout 150 python3 -m bench.verify_sweep --grid $grid --variant tritree --variant tritree-qlast \
    --variant tritree-qfirst-seesaw --variant tritree-p16 --ceilings /tmp/ceil.json \
    --out /tmp/s11c_$grid.jsonl 2>&1 | grep "L=\|#" | tee -a $OUT/s11c_sweep.txt
done
TRITREE_PARTIALS_16BIT=1 timeout 60 python3 -m bench.timeline --shapes "8,8;64,8;65,8;16,64" --ctx 46000 2>&1 \
  | grep -v Warn | sed "s/^/bf16 partials: /" | tee $OUT/s11c_timeline.txt
timeout 100 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s11c_decode.txt
TRITREE_PARTIALS_16BIT=1 timeout 100 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/dp.jsonl 2>&1 \
  | grep -v Warn | sed "s/^/bf16 partials: /" | tee -a $OUT/s11c_decode.txt
