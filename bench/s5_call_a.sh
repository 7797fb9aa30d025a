# Session 5, call A: the Gluon gather path's remaining GPU tests; where a call's time goes (kernel vs
# split combine, torch.profiler); TMA seesaw at one program per SM (whole waves) at the target and
# engine shapes.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 90 python3 -m pytest -q -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "gather and not matches_reference" 2>&1 | grep -v Warn | tail -5 | tee $OUT/a_tests.txt
timeout 170 python3 -m pytest -q -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k "gather_matches_reference" 2>&1 | grep -v Warn | tail -5 | tee -a $OUT/a_tests.txt
SEE1="64,64,8,2,1,0,1,0,1,gluon-seesaw"
timeout 120 python3 -m bench.split_profile --shapes "8,8;16,8;64,8;16,64;65,8" --configs "table;$SEE1" 2>&1 | grep "T=" | tee $OUT/a_profile.txt
for grid in targets engine; do
  timeout 100 python3 -m bench.verify_sweep --grid $grid --ceilings $OUT/ceilings.json --out $OUT/explore.jsonl \
    --configs "$SEE1;64,64,8,2,1,0,1,0,1,gluon" --filter "P==64 and T>8 and (T,H)!=(64,64)" 2>&1 | grep "L=" | tee -a $OUT/a_explore.txt
done
