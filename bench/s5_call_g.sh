# Session 5, call G (final code: Q row indices clamped instead of offsets, so that triton 3.9 also sees
# 16-byte cp.async; the decode bench times each non-target phase alone in a CUDA graph): Gluon GPU
# tests, a profile of the target shapes, the decode step.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 110 python3 -m pytest -q -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "not overlap and not gather_matches_reference" 2>&1 | grep -v Warn | tail -3 | tee $OUT/f_tests.txt
timeout 45 python3 -m bench.split_profile --shapes "8,8;16,8;64,8;16,64" 2>&1 | grep "T=" | tee $OUT/f_profile.txt
timeout 200 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out $OUT/decode.jsonl 2>&1 | grep -v Warn | tail -12 | tee $OUT/f_decode.txt
