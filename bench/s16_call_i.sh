# Session 16, call I (one H200, ~3 device minutes): ahead of time the "same" pair loop comes out of ptxas with
# a different schedule in different builds (RESULTS, calls G/H). ptxas -O1 (PTXAS_OPTIONS, read by triton at
# import; -O2 and --allow-expensive-optimizations give the default's SASS exactly) schedules the shipped
# kernel's full-block loop in 742 instructions without local accesses (856 with 4 at -O3). Graph-timed, one
# process per setting, alternating, three rounds each.
source bench/device_prelude.sh
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2 3; do
  for opt in "" "-O1"; do
    echo "round $round PTXAS_OPTIONS='$opt'" | tee -a $OUT/s16i_engine.txt
    PTXAS_OPTIONS="$opt" timeout 100 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
      --ceilings /tmp/ceil.json --out /tmp/s16i.jsonl 2>&1 | grep "L=\|Error" | tee -a $OUT/s16i_engine.txt
  done
done
