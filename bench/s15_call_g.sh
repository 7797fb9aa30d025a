# Session 15, call G (one H200, the last ~3 device minutes): the kernel and sweep of branch s16-tail-probe (e6ba0f7's
# pipelined tail) in the working tree; T=65,H=8 graph-timed, pipelined vs the one-tile tail, three rounds.
source bench/device_prelude.sh
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2 3; do
  timeout 40 python3 -m bench.verify_sweep --grid engine --filter "T == 65" --variant tritree \
    --variant tritree-serial-tail --variant tritree --variant tritree-serial-tail --ceilings /tmp/ceil.json \
    --out /tmp/g.jsonl 2>&1 | grep "L=\|Error" | tee -a $OUT/s15g_engine.txt
done
