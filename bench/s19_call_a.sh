# Session 19, call A (one H200): NAMED_RELEASE, the by-column-halves loops' pair buffers released by hardware
# barriers (each consumer thread bar.arrive after its own warpgroup's wgmma wait, the producer bar.sync) instead
# of a partition barrier and an mbarrier arrival each; also drops the barrier triton's analysis put at the
# top of the loop. Ahead of time: the full blocks' pair loop 2 partition barriers a pair instead of 5, 724
# instructions instead of 727, no local accesses. Its GPU test, then graph-timed against the mbarrier
# release (tritree-ws-named-off), then the decode step.
source bench/device_prelude.sh
( time timeout 170 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "named_release" ) 2>&1 | grep -v Warn | tail -6 | tee $OUT/s19a_tests.txt
grep -q " passed" $OUT/s19a_tests.txt && ! grep -q "failed\|error\|Timeout" $OUT/s19a_tests.txt || exit 1
timeout 80 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
  --variant tritree-ws-named-off --out /tmp/s19a.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s19a_sweep.txt
timeout 130 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 \
  | tee $OUT/s19a_decode.txt
timeout 60 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
  --variant tritree-ws-named-off --out /tmp/s19a.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s19a_sweep.txt
