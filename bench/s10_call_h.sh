# Session 10, call H (one H200, ~2 device minutes): %globaltimer stamps inside the Gluon verify kernel
# (bench/timeline.py) at T=8,H=8 (plain schedule) and T=64,H=8 (seesaw) over L, to split the ~15 us of
# fixed kernel time that call G's fit over L found into launch skew, Q, prefix loop, tail and store.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 200 python3 -m bench.timeline --shapes "8,8;64,8" --ctx 4096,16384,46000,131072 2>&1 | grep -v Warn \
  | tee $OUT/s10h_timeline.txt
