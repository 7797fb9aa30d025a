# Session 18, call E (one H200): XWG_SOFTMAX, the ws pair loop's softmax with one exchange of row maxima between
# the warpgroups and the row sums kept per warpgroup (ahead of time: the full blocks' pair loop 5 partition
# barriers a pair instead of 9, 727 instructions instead of 742, no local accesses). The verify_mla GPU tests,
# then graph-timed against the cross-warp reductions (tritree-ws-xwg-off), then the decode step.
source bench/device_prelude.sh
( time timeout 330 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py ) 2>&1 \
  | grep -v Warn | tail -6 | tee $OUT/s18e_tests.txt
grep -q " passed" $OUT/s18e_tests.txt && ! grep -q "failed\|error" $OUT/s18e_tests.txt || exit 1
timeout 60 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
  --variant tritree-ws-xwg-off --out /tmp/s18e.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s18e_sweep.txt
timeout 100 python3 -m bench.verify_sweep --grid targets --filter "P == 64 and T * H > 64" --variant tritree \
  --variant tritree-ws-xwg-off --out /tmp/s18e.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s18e_sweep.txt
timeout 60 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
  --variant tritree-ws-xwg-off --out /tmp/s18e.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s18e_sweep.txt
timeout 130 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 \
  | tee $OUT/s18e_decode.txt
