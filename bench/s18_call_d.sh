# Session 18, call D (one H200): how much the -O1 narrow build's nondeterminism moves T=65,H=8. ptxas at -O1
# schedules the narrow block's pair loop differently on every compile of the same PTX (ahead of time); -O3 is
# the same build every time. Four processes, each with an empty triton cache (a fresh compile, so a fresh -O1
# draw, and the same -O3 build each time: its spread is the run-to-run noise), graph-timed, both variants.
source bench/device_prelude.sh
for i in 1 2 3 4; do
  TRITON_CACHE_DIR=/tmp/tc_d$i timeout 100 python3 -m bench.verify_sweep --grid engine --filter "T == 65" \
    --variant tritree --variant tritree-ws-O3-narrow --out /tmp/s18d.jsonl 2>&1 | grep "L=\|Error" \
    | sed "s/^/compile $i: /" | tee -a $OUT/s18d_draws.txt
done
