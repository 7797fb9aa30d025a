# Session 16, call C (one H200, ~5 device minutes): the ws kernel's masked tail two tiles at a time
# Ran on commit 1df0a18 (the switches it names were reverted after it: 30ec498).
# (TAIL_PAIRS: the second tile's cp.async in flight under the first's math) and the producer's L2 prefetch of
# the tail's tiles after its last pair (TAIL_PREFETCH). Call B (graph-timed regime) had T=65,H=8's last
# program, the full blocks' last split, end ~7 us after the median one: its pairs plus ~11 us of two tail
# tiles one at a time. Tests with both on, then graph-timed (variants interleaved, two rounds) and the
# graph timeline with both on.
source bench/device_prelude.sh
TRITREE_TAIL_PAIRS=1 TRITREE_TAIL_PREFETCH=1 timeout 200 python3 -m pytest -q -rfE -p no:logging -m gpu \
  tests/kernels/test_verify_mla.py -k "ws_tail_shapes or narrow or small_pages or tma_tiles or cuda_graph_and_compile" \
  2>&1 | grep -v Warn | tail -8 | tee $OUT/s16c_tests.txt
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2; do
  timeout 100 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree-tail-serial \
    --variant tritree-tailpf --variant tritree-tailpairs --variant tritree-tailpairs-pf --ceilings /tmp/ceil.json \
    --out /tmp/s16c.jsonl 2>&1 | grep "L=\|Error" | tee -a $OUT/s16c_engine.txt
done
for flags in "0 0" "1 1"; do
  set -- $flags
  echo "TAIL_PAIRS=$1 TAIL_PREFETCH=$2" | tee -a $OUT/s16c_graph_timeline.txt
  TRITREE_TAIL_PAIRS=$1 TRITREE_TAIL_PREFETCH=$2 timeout 60 python3 -m bench.timeline --graph --shapes "65,8" \
    --ctx 46000 2>&1 | grep "^T=\|Error" | tee -a $OUT/s16c_graph_timeline.txt
done
