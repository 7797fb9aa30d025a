# Session 7, call C (final table: the small-pages table now runs the warp-specialised kernel's row
# gathers above 16 rows): GPU tests of the gather kernel, verify_mla and the engine, then the issue's
# target shapes at P = 64 and P = 1 against the PyTorch version, as session 6's call G.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 150 python3 -m pytest -q -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "gather and wscs" 2>&1 | grep -v Warn | tail -3 | tee $OUT/c_gather_tests.txt
timeout 150 python3 -m pytest -q -rf -p no:logging -m gpu tests/kernels/test_verify_mla.py tests/test_engine.py 2>&1 | grep -v Warn | tail -6 | tee $OUT/c_mla_engine_tests.txt
GRID=targets SWEEP_TIMEOUT=200 FILTER="(T,H) in [(8,8),(16,8),(64,8),(16,64)]" bash bench/gpu_run.sh sweep 2>&1 | grep "L="
