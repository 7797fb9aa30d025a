# Session 15, call D (one H200): the pipelined tail reverted (kernel back to 3bbf2a1); its tail-shape test kept,
# now for the shipped kernel, run on it with the ws tests it sits beside.
source bench/device_prelude.sh
timeout 200 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "ws_tail_shapes or narrow or cuda_graph_and_compile" 2>&1 | grep -v Warn | tail -6 | tee $OUT/s15d_tests.txt
