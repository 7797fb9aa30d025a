# Session 5, call E: the final tables (one program per SM, Gluon seesaw for P < 64 too, the one-pass
# merge, Q by cp.async, the seesaw's L2 prefetch): GPU tests, the target shapes against the
# PyTorch version, the engine's shapes, the decode step (issue #7), the engine's GPU tests.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 100 python3 -m pytest -q -p no:logging -m gpu tests/kernels/test_verify_mla.py tests/kernels/test_draft_attention.py 2>&1 | grep -v Warn | tail -3 | tee $OUT/e_tests.txt
GRID=targets SWEEP_TIMEOUT=170 FILTER="(T,H) in [(8,8),(16,8),(64,8),(16,64)]" bash bench/gpu_run.sh sweep 2>&1 | grep "L=" | tee $OUT/e_sweep.txt
timeout 45 python3 -m bench.verify_sweep --grid engine --ceilings $OUT/ceilings.json --out $OUT/engine.jsonl 2>&1 | grep "L=" | tee $OUT/e_engine.txt
timeout 170 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out $OUT/decode.jsonl 2>&1 | grep -v Warn | tail -12 | tee $OUT/e_decode.txt
timeout 90 python3 -m pytest -q -p no:logging -m gpu tests/test_engine.py 2>&1 | grep -v Warn | tail -3 | tee -a $OUT/e_tests.txt
