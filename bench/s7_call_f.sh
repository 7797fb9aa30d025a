# Session 7, call F: the split merge's bounds (combine_config: fewest programs, most partial values per
# program and chunk) at the shapes where the merge is a large share (many splits, few rows).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
for c in 512,16384 1024,8192 2048,4096 512,4096 1024,2048 4096,1024; do
  timeout 60 python3 -m bench.split_profile --shapes "8,8;16,8;17,8;64,8" --combine $c --iters 40 2>&1 | grep "T=" | tee -a $OUT/f_combine.txt
done
