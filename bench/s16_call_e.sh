# Session 16, call E (one H200, ~2 device minutes): call B put 6.8 us between one T=65,H=8 kernel's last
# stamp and the next one's first (the split merge and two launches; 8.3 us at T=17,H=8). The merge by
# programmatic dependent launch (TRITREE_MERGE_PDL, session 9: neutral with that session's kernel) against
# the shipped launch, graph-timed, interleaved, three rounds.
source bench/device_prelude.sh
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2 3; do
  timeout 120 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree --variant tritree-pdl \
    --ceilings /tmp/ceil.json --out /tmp/s16e.jsonl 2>&1 | grep "L=\|Error" | tee -a $OUT/s16e_engine.txt
done
