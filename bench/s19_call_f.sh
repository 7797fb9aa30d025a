# Ran branch s19-fused-merge (commit 1d5721e), not main.
# Session 19, call F (one H200, branch s19-fused-merge): call E's fused merge without the per-thread fences (the CTA barrier, then one release), with never-reset int64 arrival counters (no departure round trip) and only up to 16 splits (one chunk). FUSED_MERGE, the split merge inside the ws split kernel (each row block's
# programs, once all have stored their partials, merge the block's columns among themselves; arrival /
# departure counters, reset by the last to leave) instead of a second launch. Its GPU test (timeout: a wrong
# arrival count would hang), then the ws tests, graph-timed against the separate merge
# (tritree-ws-merge-apart), the targets' shapes, the decode step.
source bench/device_prelude.sh
( time timeout 150 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "fused_merge" ) 2>&1 | grep -v Warn | tail -8 | tee $OUT/s19f_tests.txt
grep -q " passed" $OUT/s19f_tests.txt && ! grep -q "failed\|error\|Timeout" $OUT/s19f_tests.txt || exit 1
for r in 1 2; do
timeout 80 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
  --variant tritree-ws-merge-apart --out /tmp/s19f.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s19f_sweep.txt
done
timeout 130 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 \
  | tee $OUT/s19f_decode.txt
