# Session 7, call G: the split merge's bounds again, with 4 warps up to 4096 values a program (call F:
# every 8-warp program of 4096 values was slow) -- MIN_PROGRAMS,CHUNK_VALUES,WARPS8_VALUES.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
for c in 512,16384,4096 512,16384,8192 1024,4096,8192 1024,2048,8192 2048,4096,8192 2048,2048,8192; do
  timeout 50 python3 -m bench.split_profile --shapes "8,8;16,8;17,8;64,8;65,8;16,64" --combine $c --iters 40 2>&1 | grep "T=" | tee -a $OUT/g_combine.txt
done
