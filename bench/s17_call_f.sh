# Session 17, call F (one H200, ~3 device minutes): the decode step at budget 64 on what ships at the end of
# the session (the ws kernel as session 16 left it: calls A-E's changes measured slower and not kept).
source bench/device_prelude.sh
timeout 150 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -25 \
  | tee $OUT/s17f_decode.txt
