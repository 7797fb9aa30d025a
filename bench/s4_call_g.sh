# Session 4, call G: splits rounded down to whole waves (verify_mla); the shipped table at the engine's
# verify shapes (T = budget + 1, H = 8) and the decode step. (The target shapes keep their
# split counts under the new rule: call E's numbers stand for them.)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 90 python3 -m bench.verify_sweep --grid engine --ceilings $OUT/ceilings.json --out $OUT/sweep.jsonl 2>&1 | grep "L=" | tee $OUT/g_sweep.txt
timeout 120 python3 -m tritree bench decode --ctx 46000 --budgets 64 16 --out $OUT/decode.jsonl 2>&1 | grep -v Warn | tail -8 | tee $OUT/g_decode.txt
