# Session 16, call D (one H200, ~5 device minutes). Calls B and C: the same pair-loop code ran at different
# Ran on commit 1df0a18 (the switches it names were reverted after it: 30ec498).
# speeds in builds that differ only elsewhere (T=65,H=8 graph-timed, unstamped vs TIMELINE-stamped: 107.1-109.3
# vs 111.2-113.0 us with the one-tile tail; 110.5 vs 110.6 with TAIL_PAIRS, whose pair loop is the same code
# instruction for instruction). Does the pair loop's speed depend on its address (instruction fetch)? Here the
# shipped kernel with K never-run NANOSLEEPs before the consumers' pair loop (PAD_NOPS; K=1 moves it 80 bytes,
# each more 16), graph-timed, variants interleaved, three rounds.
source bench/device_prelude.sh
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2 3; do
  timeout 300 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree --variant tritree-pad1 \
    --variant tritree-pad2 --variant tritree-pad3 --variant tritree-pad4 --variant tritree-pad8 --variant tritree-pad32 \
    --variant tritree-pad128 --ceilings /tmp/ceil.json --out /tmp/s16d.jsonl 2>&1 | grep "L=\|Error" \
    | tee -a $OUT/s16d_engine.txt
done
