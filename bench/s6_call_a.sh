# Session 6, call A: the experimental warp-specialised seesaw (never run before) -- its GPU tests under a
# timeout (a scheduling bug would hang, not fail), its time next to the shipped kernels; then the engine's
# GPU tests after session 5's phase refactor (decode_step_ = draft/tree/verify/accept/commit phases).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv | tee $OUT/a_smi.txt
bash bench/s6_ws_check.sh
timeout 150 python3 -m pytest -q -p no:logging -m gpu tests/test_engine.py 2>&1 | grep -v Warn | tail -4 | tee $OUT/a_engine_tests.txt
