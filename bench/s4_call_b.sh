# Session 4, call B: split-score configs: programs per SM, and pipelined pointer tiles for P = 1 pools
# (fit now that the tail loop is unpipelined); an ncu profile of the best T=64, H=8 config.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
EXPLORE_TIMEOUT=200 FILTER="P==64 and (T,H) in [(8,8),(16,8),(64,8),(16,64)]" \
  CONFIGS="64,64,8,2,1,0,1,0,1;64,64,8,2,3,0,1,0,1;64,64,8,2,4,0,1,0,1;64,32,8,3,3,0,1,0,1" \
  bash bench/gpu_run.sh explore > /dev/null
EXPLORE_TIMEOUT=240 FILTER="P==1 and (T,H) in [(8,8),(16,8),(64,8),(16,64)]" \
  CONFIGS="64,64,8,2,1,0,0,0,1;64,64,8,2,2,0,0,0,1;64,64,8,2,3,0,0,0,1;64,32,8,3,2,0,0,0,1;64,64,8,1,3,0,0,0,1" \
  bash bench/gpu_run.sh explore > /dev/null
python3 -c "
import json
for l in open('$OUT/explore.jsonl'):
    r=json.loads(l); c=r.get('config','');print(r['T'],r['H'],r['P'],round(r.get('us',-1),1),round(100*r.get('frac_floor',0),1),c.replace('AttnConfig',''),r.get('skipped',''))" | tee $OUT/b_explore.txt
NCU_CASE="1 64 8 46000 64 64,64,8,2,2,0,1,0,1" bash bench/gpu_run.sh ncu 2>&1 | tail -40 > $OUT/b_ncu.txt
