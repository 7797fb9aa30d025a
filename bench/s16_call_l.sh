# Session 16, call L (one H200, ~3 device minutes): is ptxas -O1 a lever beyond the narrow launch? The
# targets grid at P = 64 with PTXAS_OPTIONS=-O1 for every kernel of the process against the default, one
# process each (one round: a first look, not a decision).
source bench/device_prelude.sh
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for opt in "" "-O1"; do
  echo "PTXAS_OPTIONS='$opt'" | tee -a $OUT/s16l_targets.txt
  PTXAS_OPTIONS="$opt" timeout 100 python3 -m bench.verify_sweep --grid targets --filter "P == 64" --variant tritree \
    --ceilings /tmp/ceil.json --out /tmp/s16l.jsonl 2>&1 | grep "L=\|Error" | tee -a $OUT/s16l_targets.txt
done
