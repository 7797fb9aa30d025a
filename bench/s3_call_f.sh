# Session 3, call F: the fixed compiled engine step, fragmented-pool configs, draft attention with hoisted
# page ids, the compiled draft step and the compiled model layer.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 150 python3 -m pytest -q -p no:logging tests/test_engine.py tests/kernels/test_tree.py -m gpu 2>&1 | tail -4 | tee $OUT/f_tests.txt
EXPLORE_TIMEOUT=90 FILTER="P==1 and (T,H) in [(8,8),(16,8),(64,8),(16,64)]" CONFIGS="16,64,4,2,2;64,64,8,1,1;64,64,8,1,2;64,32,8,2,2;32,64,8,2,2" bash bench/gpu_run.sh explore > /dev/null
python3 -c "
import json
for l in open('$OUT/explore.jsonl'):
    r=json.loads(l); c=r.get('config'); print(r['T'],r['H'],r['P'],round(r['us'],1),c)" | tee $OUT/f_explore.txt
timeout 120 python3 -m bench.draft_sweep --no-step --no-sdpa --filter "L==46000 and window is None" --configs "64,64,4,2,1,0,0,1;64,64,4,3,1,0,0,1;32,64,4,3,1,0,0,1" --ceilings $OUT/ceilings.json --out $OUT/f_draft.jsonl 2>&1 | grep -v Warn | tee $OUT/f_draft.txt
timeout 100 python3 -m bench.draft_sweep --no-attention --compile --ceilings $OUT/ceilings.json --out $OUT/f_draft.jsonl 2>&1 | grep "draft step" | tee -a $OUT/f_draft.txt
timeout 120 python3 -m bench.model_sweep --compile --views TP8 --out $OUT/f_model.jsonl 2>&1 | grep -v Warn | tail -5 | tee $OUT/f_model.txt
