# Session 6, call G (final table: <= 512 rows the seesaw, above it the warp-specialised seesaw by column
# halves): the target shapes against the PyTorch version (P = 64 and P = 1), the engine's shapes.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
GRID=targets SWEEP_TIMEOUT=170 FILTER="(T,H) in [(8,8),(16,8),(64,8),(16,64)]" bash bench/gpu_run.sh sweep 2>&1 | grep "L="
timeout 45 python3 -m bench.verify_sweep --grid engine --ceilings $OUT/ceilings.json --out $OUT/engine.jsonl 2>&1 | grep "L=" | tee $OUT/g_engine.txt
