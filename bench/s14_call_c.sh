# Session 14, call C (one H200): is the order of variants within a case behind call B's T=65,H=8 result
# (Q_ZERO_PAD off 109.2-110.6 us against on 110.8-111.5, the default always timed first, while at T=17,H=8
# zero padding won by 1.0-1.7 us)? The engine grid's T=17 and T=65, five variants a case with the default
# timed second and fourth, three rounds.
source bench/device_prelude.sh
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2 3; do
  timeout 80 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree-qdup --variant tritree \
    --variant tritree-s13 --variant tritree --variant tritree-stage32 --ceilings /tmp/ceil.json \
    --out /tmp/s14c.jsonl 2>&1 | grep "L=\|#" | tee -a $OUT/s14c_engine.txt
done
