# Session 17, call D (one H200, ~3 device minutes): what the shipped ws kernel at T=65,H=8 (L=46000, P=64)
# loads: ncu's speed-of-light, memory and compute sections and the tensor / shared-memory pipes, one launch
# (`--clock-control none`, caches flushed). Each of the 9 row blocks' programs reads the whole KV range of
# its split: ~9 x 53 MB from the L2 a call; session 6's copies-alone probe (T=64,H=8) ran at ~6.3 TB/s of
# L2 reads. Is the L2 a co-bottleneck beside the tensor cores?
source bench/device_prelude.sh
NCU=/usr/local/cuda/bin/ncu
run() {
  timeout 200 $NCU --clock-control none -k regex:_verify_gluon_ws_kernel --launch-skip 2 --launch-count 1 "$@" \
    python3 -m bench.one_case 1 65 8 46000 64 2>&1 | grep -v "^==PROF==\|Warn\|^ok " | tee -a $OUT/s17d_ncu.txt | tail -80
}
run --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis
run --metrics "regex:^sm__pipe_tensor_op_gmma.*pct_of_peak_sustained_(active|elapsed)$,regex:^lts__t_bytes\.sum\.per_second$,regex:^lts__t_sectors_srcunit_tex_op_read\.sum$,regex:^l1tex__data_pipe_lsu_wavefronts_mem_shared\.sum\.pct_of_peak_sustained_elapsed$,regex:^dram__bytes_read\.sum$,regex:^lts__throughput\.avg\.pct_of_peak_sustained_elapsed$,regex:^sm__cycles_elapsed\.avg\.per_second$,regex:^smsp__inst_executed_pipe_uniform.*sum$"
