# Session 18, call C (one H200): WIDE_FULL on (one box a column block where a pair's tiles are adjacent, -O1,
# in launches without a narrow block whose rows fill the last block) and the merge's 16-split chunks as
# shipped: the verify_mla GPU tests, then graph-timed against two boxes there (tritree-ws-boxes64-full), one
# round over the compute-bound targets and the engine's T=17 / T=65.
source bench/device_prelude.sh
( time timeout 360 python3 -m pytest -q -x -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py ) 2>&1 \
  | grep -v Warn | tail -6 | tee $OUT/s18c_tests.txt
grep -q " passed" $OUT/s18c_tests.txt && ! grep -q "failed\|error" $OUT/s18c_tests.txt || exit 1
timeout 120 python3 -m bench.verify_sweep --grid targets --filter "P == 64 and T * H > 64" --variant tritree \
  --variant tritree-ws-boxes64-full --out /tmp/s18c.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s18c_sweep.txt
timeout 60 python3 -m bench.verify_sweep --grid engine --filter "T > 8" --variant tritree \
  --variant tritree-ws-boxes64-full --out /tmp/s18c.jsonl 2>&1 | grep "L=\|Error\|^#" | tee -a $OUT/s18c_sweep.txt
