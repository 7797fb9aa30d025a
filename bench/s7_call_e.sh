# Session 7, call E (final table: 65..256 rows the warp-specialised kernel without its L2 prefetch;
# small pages its row gathers): GPU tests, the target shapes at P = 64 and P = 1 against the
# PyTorch version, the engine's shapes, and T <= 17 next to the other Gluon schedules.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 100 python3 -m pytest -q -rf -p no:logging -m gpu tests/kernels/test_verify_mla.py 2>&1 | grep -v Warn | tail -3 | tee $OUT/e_mla_tests.txt
timeout 80 python3 -m pytest -q -rf -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "nopf" 2>&1 | grep -v Warn | tail -3 | tee $OUT/e_nopf_tests.txt
GRID=targets SWEEP_TIMEOUT=150 FILTER="(T,H) in [(8,8),(16,8),(64,8),(16,64)]" bash bench/gpu_run.sh sweep 2>&1 | grep "L="
timeout 45 python3 -m bench.verify_sweep --grid engine --ceilings $OUT/ceilings.json --out $OUT/engine.jsonl 2>&1 | grep "L=" | tee $OUT/e_engine.txt
timeout 90 python3 bench/gluon_check.py --ws --variants gluon,gluon+seesaw,gluon+wscs-nopf --shapes 8x8,16x8,17x8 2>&1 | grep -v Warn | tee $OUT/e_small.txt
