# Ran at commit 995064a (the fused merge was removed after this call: not faster).
# Session 9, call C (one H200): the split merge inside the split kernel (TRITREE_FUSED_MERGE).
# 1. its GPU tests (every Gluon kernel family, P = 64 and 1, empty splits; eager, and 20 graph replays
#    into poisoned outputs); the sweeps and decode only if they pass (a broken barrier would hang),
# 2. the target and engine shapes with and without it, side by side in one process,
# 3. the decode step with and without it (TP8 view, budget 64).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 240 python3 -m pytest -q -rf -x -p no:logging -m gpu tests/kernels/test_verify_mla.py tests/kernels/test_splitkv.py \
  -k "inside or fused" 2>&1 | grep -v Warn | tail -25 > $OUT/s9c_tests.txt
rc=${PIPESTATUS[0]}; cat $OUT/s9c_tests.txt
grep -q " passed" $OUT/s9c_tests.txt && ! grep -q "failed\|error" $OUT/s9c_tests.txt || { echo "tests did not pass: stop"; exit 1; }
timeout 150 python3 -m bench.verify_sweep --grid targets --variant tritree --variant tritree-fused \
  --out $OUT/s9c_targets.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s9c_targets.txt
timeout 100 python3 -m bench.verify_sweep --grid engine --variant tritree --variant tritree-fused \
  --out $OUT/s9c_engine.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s9c_engine.txt
timeout 120 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | grep -v Warn | tee $OUT/s9c_decode.txt
TRITREE_FUSED_MERGE=1 timeout 120 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/df.jsonl 2>&1 | grep -v Warn | tee $OUT/s9c_decode_fused.txt
