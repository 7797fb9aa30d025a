# Session 7, call H (final: call E's table with the merge bounds of call G, 1024 / 4096 / 8192): the
# issue's target shapes at P = 64 and P = 1 against the PyTorch version, and the engine's shapes.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
GRID=targets SWEEP_TIMEOUT=110 FILTER="(T,H) in [(8,8),(16,8),(64,8),(16,64)]" bash bench/gpu_run.sh sweep 2>&1 | grep "L="
timeout 40 python3 -m bench.verify_sweep --grid engine --ceilings $OUT/ceilings.json --out $OUT/engine.jsonl 2>&1 | grep "L=" | tee $OUT/h_engine.txt
