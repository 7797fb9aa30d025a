# Session 16, call H (one H200, ~2 device minutes): call G had the TAIL_PAIRS build (1df0a18) at 117.0 us
# under Nsight Compute against 109.4 shipped, with the same instruction count and clock, no_instruction stalls
# 0.23 against 0.17 per issue. Where its warps stall, by SASS line (warp-stall sampling, as session 13's call D),
# both builds; the source pages come back gzipped for a side-by-side reading.
source bench/device_prelude.sh
NCU=/usr/local/cuda/bin/ncu
page() {
  env $2 timeout 150 $NCU --clock-control none -k regex:_verify_gluon_ws_kernel --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --import-source no -o /tmp/$1 \
    python3 -m bench.one_case 1 65 8 46000 64 2>&1 | grep -v "^==PROF==\|Warn" | tail -2
  $NCU -i /tmp/$1.ncu-rep --page source --csv --print-source sass > /tmp/$1.csv 2> /tmp/$1.err
  echo "=== $1" >> $OUT/s16h_hotspots.txt
  python3 -m bench.ncu_hotspots /tmp/$1.csv 30 >> $OUT/s16h_hotspots.txt 2>&1
  gzip -c /tmp/$1.csv > $OUT/s16h_$1.csv.gz
}
page shipped X=0
cp bench/s16_probe/_verify_gluon.py bench/s16_probe/_verify_gluon_ws.py tritree/kernels/
page tailpairs TRITREE_TAIL_PAIRS=1
tail -5 $OUT/s16h_hotspots.txt; ls -la $OUT
