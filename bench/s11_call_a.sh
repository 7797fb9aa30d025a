# Prepared in session 10 for the next one, call A (one H200, ~5 device minutes); not yet run.
# Q's copies ahead of the first tiles' (TRITREE_Q_FIRST, off until measured): session 10's in-kernel
# timeline (bench/timeline.py, call H) has Q landing 4-6 us into every program, queued behind the first
# tile pair's TMA copies; the first scores wait for it. Its GPU test (bit-equal, eager and graph, TMA
# and row gathers), the target and engine shapes with and without it, the timeline with and without it,
# the decode step. If it wins everywhere: on by default (_verify_gluon.Q_FIRST); else remove it. The
# timeline also covers the warp-specialised kernel's shapes (T=16,H=8; T=65,H=8; T=16,H=64), stamped by
# its consumer partition (not yet run).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 150 python3 -m pytest -q -rf -p no:logging -m gpu tests/kernels/test_verify_mla.py -k q_first 2>&1 \
  | grep -v Warn | tail -4 | tee $OUT/s11a_tests.txt
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for grid in targets engine; do
  timeout 120 python3 -m bench.verify_sweep --grid $grid --variant tritree --variant tritree-qfirst --ceilings /tmp/ceil.json \
    --filter "P == 64" --out /tmp/s11a_$grid.jsonl 2>&1 | grep "L=\|#" | tee -a $OUT/s11a_qfirst.txt
done
timeout 60 python3 -m bench.timeline --shapes "8,8;16,8;64,8;65,8;16,64" --ctx 46000 2>&1 | grep -v Warn | tee $OUT/s11a_timeline.txt
TRITREE_Q_FIRST=1 timeout 60 python3 -m bench.timeline --shapes "8,8;64,8" --ctx 46000 2>&1 | grep -v Warn \
  | sed "s/^/Q first: /" | tee -a $OUT/s11a_timeline.txt
TRITREE_Q_FIRST=1 timeout 100 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/dq.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s11a_decode_qfirst.txt
