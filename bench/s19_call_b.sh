# Session 19, call B (one H200): call A's NAMED_RELEASE plus the pair loop's exponents as one FMA each (the
# row maxima of the raw scores, then scaled: 694 instructions in the full blocks' loop instead of 724).
# The ws GPU tests, then graph-timed against the mbarrier release (tritree-ws-named-off) and the narrow
# launch at -O3 (tritree-ws-O3-narrow), the targets' shapes, then the decode step.
source bench/device_prelude.sh
( time timeout 250 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "named_release or softmax_exchange or wide_copies or narrow or tail" ) 2>&1 \
  | grep -v Warn | tail -6 | tee $OUT/s19b_tests.txt
grep -q " passed" $OUT/s19b_tests.txt && ! grep -q "failed\|error\|Timeout" $OUT/s19b_tests.txt || exit 1
for r in 1 2; do
timeout 80 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
  --variant tritree-ws-named-off --variant tritree-ws-O3-narrow --out /tmp/s19b.jsonl 2>&1 \
  | grep "L=\|Error\|^#" | tee -a $OUT/s19b_sweep.txt
done
timeout 130 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 \
  | tee $OUT/s19b_decode.txt
timeout 100 python3 -m bench.verify_sweep --grid targets --filter "P == 64 and T * H > 64" --variant tritree \
  --variant tritree-ws-named-off --out /tmp/s19b.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s19b_sweep.txt
