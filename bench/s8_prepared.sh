# Prepared in session 7 for the next one (one H200; not yet run; ~8 device minutes; carry [".whl"]).
# 1. GPU tests after session 7's last changes (the split merge's launch bounds; fp8 pools, new): the
#    verify_mla GPU file (incl. test_gpu_fp8_pool) and the engine.
# 2. The fp8 (e4m3, per-tensor scale) pool option, measured as issue #2 asks: the target shapes,
#    bf16 and fp8 pools side by side (fp8 runs the Triton kernel with the table's tiles; floor bytes
#    at 1 byte per KV element).
# 3. The decode step (issue #7) with the seventh session's table; its verify-attention row now passes
#    tree_lens as the model does.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 200 python3 -m pytest -q -rf -p no:logging -m gpu tests/kernels/test_verify_mla.py tests/test_engine.py 2>&1 | grep -v Warn | tail -6 | tee $OUT/s8_tests.txt
timeout 200 python3 -m bench.verify_sweep --grid targets --variant tritree --variant tritree-fp8 \
  --filter "(T,H) in [(8,8),(16,8),(64,8),(16,64)]" --out $OUT/s8_fp8.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s8_fp8.txt
timeout 240 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out $OUT/s8_decode.jsonl 2>&1 | grep -v Warn | tee $OUT/s8_decode.txt
