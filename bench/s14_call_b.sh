# Session 14, call B (one H200): the engine grid three more times (call A's single pass: T=65,H=8 111.0 us
# on / 109.8 Q_ZERO_PAD off / 111.8 STAGE_16BIT off, within its noise, while the timeline's span fell 106.9 ->
# 105.0), the targets grid (P = 1 and 64) with the two session-14 switches on and each off, in one
# process (tritree-s13: both off), then the decode step at budgets 64 and 16 at the shipped defaults.
source bench/device_prelude.sh
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2 3; do
  timeout 70 python3 -m bench.verify_sweep --grid engine --variant tritree --variant tritree-qdup \
    --variant tritree-stage32 --variant tritree-s13 --ceilings /tmp/ceil.json --out /tmp/s14b.jsonl 2>&1 | grep "L=\|#" \
    | tee -a $OUT/s14b_engine.txt
done
timeout 240 python3 -m bench.verify_sweep --grid targets --variant tritree --variant tritree-qdup \
  --variant tritree-stage32 --ceilings /tmp/ceil.json --out /tmp/s14b.jsonl 2>&1 | grep "L=\|#" \
  | tee $OUT/s14b_sweep.txt
timeout 200 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | tee $OUT/s14b_decode.txt
