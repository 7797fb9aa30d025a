#!/usr/bin/env bash
# One device call: GPU tests, config exploration and the sweeps; everything lands in $OUT.
# usage: bash bench/gpu_run.sh [tests] [explore] [sweep] [sm120] [kv] [draft] [main] [decode] [tree] [model] [accept] [pybench] [ncu]
#   env: TESTS (pytest args), CONFIGS / CONFIGS120 (BM,BN,warps,stages[,ppsm[,scalar[,tma[,hoist[,split]]]]][,kernel];...),
#        FILTER (python expression over B,T,H,L,P), GRID (sweep grids), DRAFT_CONFIGS, NCU_CASE ("B T H L P [cfg]|...")
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/nvidia-smi.txt"
python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)" | tee -a "$OUT/nvidia-smi.txt"
for step in "$@"; do
  case $step in
    tests) timeout 300 python3 -m pytest -q -rf --tb=short -p no:logging ${TESTS:-tests} 2>&1 | tail -60 | tee "$OUT/gpu_tests.txt" ;;
    explore) timeout ${EXPLORE_TIMEOUT:-420} python3 -m bench.verify_sweep --grid targets --ceilings "$OUT/ceilings.json" --out "$OUT/explore.jsonl" \
               --configs "${CONFIGS:-32,64,8,2;16,64,4,2;64,32,8,2;64,64,8,1;32,32,4,2}" ${FILTER:+--filter "$FILTER"} 2>&1 | tee "$OUT/explore.txt" ;;
    sweep) for grid in ${GRID:-issue batch}; do
             timeout ${SWEEP_TIMEOUT:-300} python3 -m bench.verify_sweep --grid "$grid" --variant tritree --variant torch \
               --ceilings "$OUT/ceilings.json" --out "$OUT/sweep.jsonl" ${FILTER:+--filter "$FILTER"} 2>&1 | tee -a "$OUT/sweep.txt"
           done ;;
    sm120) DISABLE_MMA_V3=1 TRITREE_ARCH=sm_120 timeout 300 python3 -m bench.verify_sweep --grid "${GRID120:-targets}" \
               --variant tritree-sm120 --ceilings "$OUT/ceilings.json" --out "$OUT/sm120.jsonl" ${CONFIGS120:+--configs "$CONFIGS120"} ${FILTER:+--filter "$FILTER"} 2>&1 | tee "$OUT/sm120.txt" ;;
    kv) timeout 120 python3 -m bench.kv_sweep --out "$OUT/kv.jsonl" 2>&1 | tee "$OUT/kv.txt" ;;
    draft) timeout 420 python3 -m bench.draft_sweep --ceilings "$OUT/ceilings.json" --out "$OUT/draft.jsonl" ${DRAFT_CONFIGS:+--configs "$DRAFT_CONFIGS"} 2>&1 | tee "$OUT/draft.txt" ;;
    main) TRITREE_PROFILE=1 timeout 300 python3 -m tritree --check 2>&1 | tail -20 | tee "$OUT/main.txt" ;;
    decode) timeout ${DECODE_TIMEOUT:-420} python3 -m tritree bench decode --ctx ${CTX:-46000} --out "$OUT/decode.jsonl" 2>&1 | tee "$OUT/decode.txt" ;;
    tree) timeout 300 python3 -m bench.tree_sweep --out "$OUT/tree.jsonl" 2>&1 | tee "$OUT/tree.txt" ;;
    model) timeout ${MODEL_TIMEOUT:-300} python3 -m bench.model_sweep --out "$OUT/model.jsonl" 2>&1 | tee "$OUT/model.txt" ;;
    accept) timeout ${ACCEPT_TIMEOUT:-300} python3 -m tritree bench accept --new ${ACCEPT_NEW:-96} --out "$OUT/accept.jsonl" \
               --plot "$OUT/acceptance_h200.png" 2>&1 | tee "$OUT/accept.txt" ;;
    pybench) timeout 300 python3 -m pytest -q bench/test_bench_verify_mla.py --benchmark-json="$OUT/pybench.json" \
               --benchmark-columns=median,rounds 2>&1 | tail -30 | tee "$OUT/pybench.txt" ;;
  esac
done
# ncu: NCU_CASE="B T H L P [cfg]" bash bench/gpu_run.sh ncu
if [[ " $* " == *" ncu "* ]]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls /usr/local/cuda/bin/ncu)
  i=0
  IFS='|' read -ra cases <<< "${NCU_CASE:-1 16 8 46000 64}"
  for c in "${cases[@]}"; do
    i=$((i+1))
    timeout 200 "$NCU" --clock-control none --kernel-name regex:_verify_mla_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats \
      python3 -m bench.one_case $c > "$OUT/ncu_$i.txt" 2>&1
    grep -E "verify_mla|Duration|Throughput|Registers|Achieved Occupancy|Stall|Local Memory|One or More|Warp Cycles|Issued Warp|Block Limit" "$OUT/ncu_$i.txt" | head -40
  done
fi
