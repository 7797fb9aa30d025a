# Prepared in session 16 for the next one (one H200, ~3 device minutes; not run yet). Session 16 kept ptxas
# -O1 for the ws kernel's launches with a narrow last row block (T=65,H=8 -1.5 to -2.5 us) and measured it
# slower for the launch without one at T=17,H=8 (+1.0-1.8 us); call L's process-wide -O1 was slower on the
# targets grid but changed every kernel (merge included). Here -O1 for the ws kernel's launches without a
# narrow block alone (PTXAS_FULL, sweep variant tritree-ws-O1-full) on the compute-bound target shapes,
# interleaved, three rounds.
source bench/device_prelude.sh
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2 3; do
  timeout 180 python3 -m bench.verify_sweep --grid targets --filter "P == 64 and T * H > 64" --variant tritree \
    --variant tritree-ws-O1-full --variant tritree --ceilings /tmp/ceil.json --out /tmp/s17a.jsonl 2>&1 \
    | grep "L=\|Error" | tee -a $OUT/s17a_targets.txt
done
