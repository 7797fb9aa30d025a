# Session 16, call J (one H200, ~2 device minutes): call I's ptxas -O1 for every kernel of the process made
# T=65,H=8 1.7 us faster and T=17,H=8 1.7 us slower. Here -O1 for the ws kernel alone, for its launches with
# a narrow last row block (T=65,H=8; PTXAS_NARROW) or without one (T=17,H=8; PTXAS_FULL), graph-timed,
# variants interleaved, three rounds.
source bench/device_prelude.sh
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2 3; do
  timeout 150 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
    --variant tritree-ws-O1-narrow --variant tritree-ws-O1-full --ceilings /tmp/ceil.json --out /tmp/s16j.jsonl 2>&1 \
    | grep "L=\|Error" | tee -a $OUT/s16j_engine.txt
done
