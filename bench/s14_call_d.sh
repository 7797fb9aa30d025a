# Session 14, call D (one H200): call C kept Q_ZERO_PAD's split verdict (T=17,H=8 ~1 us faster with zero
# padding, T=65,H=8 ~1 us slower: copies of the first row 108.9-109.7 us against 109.4-110.9). A third
# padding, each padding row copying a different real row of the request (Q_SPREAD_PAD; no hot spot, real
# data), against both: the engine grid's T=17 and T=65, three rounds.
source bench/device_prelude.sh
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2 3; do
  timeout 80 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree-qspread --variant tritree \
    --variant tritree-qdup --variant tritree-qspread --variant tritree --ceilings /tmp/ceil.json \
    --out /tmp/s14d.jsonl 2>&1 | grep "L=\|#" | tee -a $OUT/s14d_engine.txt
done
