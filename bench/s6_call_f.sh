# Session 6, call F (final tables: verify_mla above 128 rows on sm_90 = the warp-specialised seesaw with
# O += P V by column halves, "gluon-ws"): verify_mla GPU tests, the target shapes against the
# PyTorch version (P = 64 and P = 1), the decode step (issue #7), the engine's GPU tests.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 150 python3 -m pytest -q -p no:logging -m gpu tests/kernels/test_verify_mla.py 2>&1 | grep -v Warn | tail -4 | tee $OUT/f_tests.txt
GRID=targets SWEEP_TIMEOUT=170 FILTER="(T,H) in [(8,8),(16,8),(64,8),(16,64)]" bash bench/gpu_run.sh sweep 2>&1 | grep "L="
timeout 200 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out $OUT/decode.jsonl 2>&1 | grep -v Warn | tail -14 | tee $OUT/f_decode.txt
timeout 70 python3 -m pytest -q -p no:logging -m gpu tests/test_engine.py 2>&1 | grep -v Warn | tail -3 | tee $OUT/f_engine_tests.txt
