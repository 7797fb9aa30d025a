# Session 18, call B (one H200): the decode step with the recorded ceilings and the merge's 16-split chunks, then
# what session 17 prepared for this session (~6 device minutes). Session 17 call H: a
# pair's tiles as one 128-row box per column block where adjacent (WIDE_COPIES) made T=65,H=8 2.6-3.2 us
# faster; it is on only in launches with a narrow last row block, because at -O3 the consumers' pair loop of
# the other launches went from 2 to 20 local accesses (ahead of time). Here the same copies in the launches
# without a narrow block (WIDE_FULL), at -O3 and at -O1 (their loop then 749 instructions, no local
# accesses), against what ships: the wide-copy tests with WIDE_FULL, then graph-timed, interleaved, two
# rounds over the compute-bound targets and T=17,H=8.
# (After this call WIDE_FULL became the default where the rows fill the last block, at -O1: its
# "tritree-ws-wide-full-O1" is now "tritree" there, "tritree-ws-wide-full" is "tritree-ws-wide-full-O3", and
# the old default is "tritree-ws-boxes64-full".)
source bench/device_prelude.sh
timeout 150 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py -k "wide_copies" 2>&1 \
  | grep -v Warn | tail -4 | tee $OUT/s18b_tests.txt
grep -q " passed" $OUT/s18b_tests.txt && ! grep -q "failed\|error" $OUT/s18b_tests.txt || exit 1
timeout 150 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 \
  | tee $OUT/s18b_decode.txt
for round in 1 2; do
  timeout 150 python3 -m bench.verify_sweep --grid targets --filter "P == 64 and T * H > 64" --variant tritree \
    --variant tritree-ws-wide-full --variant tritree-ws-wide-full-O1 --out /tmp/s18b.jsonl \
    2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s18b_targets.txt
  timeout 60 python3 -m bench.verify_sweep --grid engine --filter "T == 17" --variant tritree \
    --variant tritree-ws-wide-full --variant tritree-ws-wide-full-O1 --out /tmp/s18b.jsonl \
    2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s18b_targets.txt
done
