# Session 16, call G (one H200, ~3 device minutes): warp stall reasons of the ws kernel at T=65,H=8 in two
# builds whose pair loops are the same code but ran ~3% apart back to back (calls B, C, F): the shipped
# kernel, and commit 1df0a18's with TAIL_PAIRS=1 (bench/s16_probe/, as in call F). no_instruction = waits for
# instruction fetch; as session 13's call C (`ncu --clock-control none`, one launch, caches flushed).
source bench/device_prelude.sh
NCU=/usr/local/cuda/bin/ncu
prof() {
  echo "=== $1" | tee -a $OUT/s16g_ncu.txt
  env $2 timeout 150 $NCU --clock-control none -k regex:_verify_gluon_ws_kernel --launch-skip 2 --launch-count 1 \
    --metrics "gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 -m bench.one_case 1 65 8 46000 64 2>&1 | grep -v "^==PROF==\|Warn" | grep -v " 0$" \
    | tee -a $OUT/s16g_ncu.txt | tail -40
}
prof shipped X=0
cp bench/s16_probe/_verify_gluon.py bench/s16_probe/_verify_gluon_ws.py tritree/kernels/
prof "1df0a18 TAIL_PAIRS=1" TRITREE_TAIL_PAIRS=1
prof "1df0a18 TAIL_PAIRS=0" TRITREE_TAIL_PAIRS=0
