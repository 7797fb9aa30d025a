# Session 16, call K (one H200, ~4 device minutes): ptxas -O1 for the ws kernel's narrow launches as the
# default (PTXAS_NARROW, call J): the GPU tests that run narrow launches, then the decode step at budget 64.
source bench/device_prelude.sh
timeout 150 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "narrow or ws_tail_shapes" 2>&1 | grep -v Warn | tail -4 | tee $OUT/s16k_tests.txt
timeout 140 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -25 \
  | tee $OUT/s16k_decode.txt
