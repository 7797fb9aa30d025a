# Session 14, call B (one H200): the targets grid (P = 1 and 64) with the two session-14 switches
# (Q_ZERO_PAD, STAGE_16BIT) on and each off, in one process, then the decode step at budgets 64 and 16 at
# the shipped defaults.
source bench/device_prelude.sh
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
timeout 300 python3 -m bench.verify_sweep --grid targets --variant tritree --variant tritree-qdup \
  --variant tritree-stage32 --ceilings /tmp/ceil.json --out /tmp/s14b.jsonl 2>&1 | grep "L=\|#" \
  | tee $OUT/s14b_sweep.txt
timeout 230 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s14b_decode.txt
