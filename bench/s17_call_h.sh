# Session 17, call H (one H200, ~4 device minutes, the session's last): WIDE_COPIES, a pair's two tiles as one
# 128-row box per column block where they are consecutive pool rows, in launches with a narrow last row block
# (T=65,H=8): 9 TMA copies and 9 producer barriers a pair instead of 18, the producer's path from a slot's
# release to its first copy ~40 instructions instead of ~108 (ahead of time; the consumers' loops the same
# SASS as session 16's, launches without a narrow block byte for byte the same). Tests (contiguous, mixed and
# fragmented page tables, bit-equal to two boxes), then graph-timed against two boxes, three rounds.
source bench/device_prelude.sh
timeout 120 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "wide_copies or narrow_last_row_block" 2>&1 | grep -v Warn | tail -4 | tee $OUT/s17h_tests.txt
grep -q " passed" $OUT/s17h_tests.txt && ! grep -q "failed\|error" $OUT/s17h_tests.txt || exit 1
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for round in 1 2 3; do
  timeout 60 python3 -m bench.verify_sweep --grid engine --filter "T == 65" --variant tritree --variant tritree-ws-boxes64 \
    --ceilings /tmp/ceil.json --out /tmp/s17h.jsonl 2>&1 | grep "L=\|Error" | tee -a $OUT/s17h_engine.txt
done
# Then, as a separate inline command on the warm machine (~40 s):
#   timeout 110 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 \
#     | tee $OUT/s17h_decode.txt
