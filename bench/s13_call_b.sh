# Session 13, call B (one H200): the fragmented pool (P = 1, row gathers) with the ws kernel's bf16 split
# partials and / or its staged store (call A: at P = 64 the bf16 partials made T=16,H=8 42.8 us while P = 1,
# fp32, stayed at 51.1, +19%); the verify_mla GPU tests of the gather path with both on; and Nsight
# Compute on the ws kernel over TMA at T=64,H=8 and T=65,H=8 (what limits the pair loop: tensor pipe,
# L2 and DRAM throughput, warp stalls and where they sit).
source bench/device_prelude.sh
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
timeout 200 python3 -m bench.verify_sweep --grid targets --filter "P == 1" --variant tritree \
  --variant tritree-gather16 --variant tritree-gather16-plain --variant tritree-gather-coalesced \
  --ceilings /tmp/ceil.json --out /tmp/s13b.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s13b_sweep.txt
TRITREE_PARTIALS_16BIT_GATHER=1 TRITREE_COALESCED_STORE_GATHER=1 timeout 150 python3 -m pytest -q -rfE \
  -p no:logging -m gpu tests/kernels/test_verify_mla.py -k "small_pages or bf16_large" 2>&1 | grep -v Warn \
  | tail -4 | tee $OUT/s13b_tests.txt
NCU=/usr/local/cuda/bin/ncu
for T in 64 65; do
  echo "=== T=$T H=8 P=64" | tee -a $OUT/s13b_ncu.txt
  timeout 150 $NCU --clock-control none -k regex:_verify_gluon_ws_kernel --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section SourceCounters \
    --metrics "regex:sm__pipe_tensor.*cycles_active.avg.pct_of_peak_sustained_active,regex:sm__inst_executed_pipe_tensor.*sum" \
    python3 -m bench.one_case 1 $T 8 46000 64 2>&1 | grep -v "^==PROF==\|Warn" >> $OUT/s13b_ncu.txt
done
grep -n "Throughput\|Duration\|tensor\|Stall\|stall\|Issued\|Eligible\|Active Warps\|L2 Hit\|Mem Busy\|Max Bandwidth" \
  $OUT/s13b_ncu.txt | head -120
