# Session 17, call E (one H200, ~6 device minutes): call D's ncu counted 51,696 local-memory (spill) requests
# in one T=65,H=8 launch, the L2 at 55% and the tensor pipe at 52% of peak (latency-bound); the producer
# partition (24 registers) reloads spilled values in its pair loop (4 local accesses an iteration), on the
# path from a slot's release to its refill. With 32 registers (consumers 240 -> 232) no partition spills
# (ahead of time, narrow and full launches) and the loops' SASS is otherwise the same. The GPU tests of
# the ws kernel with it, then graph-timed against the shipped 24, interleaved, three rounds on the engine
# shapes and one over the compute-bound targets.
source bench/device_prelude.sh
TRITREE_WS_PRODUCER_REGS=32 timeout 200 python3 -m pytest -q -x -rfE -p no:logging -m gpu \
  tests/kernels/test_verify_mla.py -k "narrow or ws_tail_shapes or tma_tiles" 2>&1 | grep -v Warn | tail -4 \
  | tee $OUT/s17e_tests.txt
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2 3; do
  timeout 90 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree --variant tritree-ws-preg32 \
    --ceilings /tmp/ceil.json --out /tmp/s17e.jsonl 2>&1 | grep "L=\|Error" | tee -a $OUT/s17e_engine.txt
done
timeout 150 python3 -m bench.verify_sweep --grid targets --filter "P == 64 and T * H > 64" --variant tritree \
  --variant tritree-ws-preg32 --ceilings /tmp/ceil.json --out /tmp/s17e.jsonl 2>&1 | grep "L=\|Error" \
  | tee -a $OUT/s17e_targets.txt
