set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
EXPLORE_TIMEOUT=200 FILTER="P==64 and (T,H) in [(8,8),(16,8),(64,8),(16,64)]" CONFIGS="16,64,4,2,2,0,0,0;64,64,8,1,2,0,0,0;64,32,8,2,1,0,1,1;64,32,8,3,1,0,1,1;64,32,8,4,1,0,1,1;16,64,4,3,2,1,0,1;16,64,4,2,2,1,0,1;16,64,4,3,2,0,1,1;32,64,8,3,1,0,1,1;64,32,8,3,2,0,1,1;64,64,8,1,2,1,0,1;64,32,8,3,2,1,0,1" bash bench/gpu_run.sh explore
timeout 100 python3 -m bench.draft_sweep --no-attention --profile --ceilings $OUT/ceilings.json --out $OUT/draft_step.jsonl 2>&1 | tee $OUT/draft_profile.txt | tail -40
timeout 110 python3 -m bench.model_sweep --compile --views TP8 --out $OUT/model_compiled.jsonl 2>&1 | tee $OUT/model_compiled.txt
timeout 140 python3 -m tritree train --out /tmp/tiny --target-steps 5000 --draft-steps 3000 --batch 16 --seq 128 --lr 0.003 --device cuda 2>&1 | tee $OUT/train.txt | tail -8
timeout 60 python3 -m tritree bench accept --new 48 --out $OUT/accept48.jsonl --plot $OUT/acceptance48.png 2>&1 | tee $OUT/accept48.txt
