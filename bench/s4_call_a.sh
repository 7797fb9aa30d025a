# Session 4, call A: verify_mla with split score tiles (AttnConfig.split_scores) against the shipped
# tables at the target shapes; GPU correctness of the new configs; the device's Gluon sources.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
TRITON_DIR=$(python3 -c 'import triton,os;print(os.path.dirname(triton.__file__))')
tar czf $OUT/gluon36.tgz -C "$TRITON_DIR" experimental/gluon language/core.py 2>/dev/null; ls -la $OUT/gluon36.tgz
timeout 150 python3 -m pytest -q -p no:logging tests/kernels/test_verify_mla.py -m gpu 2>&1 | tail -4 | tee $OUT/a_tests.txt
EXPLORE_TIMEOUT=240 FILTER="P==64 and (T,H) in [(8,8),(16,8),(64,8),(16,64)]" \
  CONFIGS="32,64,8,3,1,0,1;64,32,8,3,1,0,1;64,32,8,3,2,0,1;64,64,8,2,1,0,1,0,1;64,64,8,2,2,0,1,0,1;64,32,8,3,1,0,1,0,1;64,32,8,3,2,0,1,0,1;32,64,8,3,1,0,1,0,1" \
  bash bench/gpu_run.sh explore > /dev/null
EXPLORE_TIMEOUT=200 FILTER="P==1 and (T,H) in [(8,8),(16,8),(64,8),(16,64)]" \
  CONFIGS="16,64,4,2,2;64,64,8,1,1;64,64,8,1,2;64,64,8,1,1,0,0,0,1;64,64,8,1,2,0,0,0,1;64,32,8,2,2,0,0,0,1" \
  bash bench/gpu_run.sh explore > /dev/null
python3 -c "
import json
for l in open('$OUT/explore.jsonl'):
    r=json.loads(l); print(r['T'],r['H'],r['P'],round(r.get('us',-1),1),round(100*r.get('frac_floor',0),1),r.get('config'),r.get('skipped',''))" | tee $OUT/a_explore.txt
