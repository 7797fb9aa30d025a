# Session 3, call E: every GPU test, the DDTree sweep, the verify sweep at the targets.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
TESTS="tests -m gpu -q" bash bench/gpu_run.sh tests
bash bench/gpu_run.sh tree
SWEEP_TIMEOUT=150 GRID=targets bash bench/gpu_run.sh sweep
