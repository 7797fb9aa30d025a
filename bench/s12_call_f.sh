# Session 12, call F (one H200): why the merge of bf16 partials is 2-3x slower than that of fp32 ones
# (calls B, C). Nsight Compute on one merge launch at T=65,H=8 (the verify kernel's partials written just
# before, as in a real call), fp32 then bf16 partials: throughput, memory tables, warp stalls.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" | tee $OUT/s12f_ncu.txt
for p in 0 1; do
  echo "=== TRITREE_PARTIALS_16BIT=$p" | tee -a $OUT/s12f_ncu.txt
  TRITREE_PARTIALS_16BIT=$p timeout 200 $NCU --clock-control none -k regex:_combine --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section WarpStateStats --section LaunchStats --section Occupancy \
    python3 -m bench.one_case 1 65 8 46000 64 2>&1 | grep -v "^==PROF==\|Warn" | tee -a $OUT/s12f_ncu.txt | tail -150
done
