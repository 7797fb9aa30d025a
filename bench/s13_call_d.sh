# Session 13, call D (one H200): where the warp-specialised kernel's warps stall, by SASS line (Nsight
# Compute's source page, warp-stall sampling) at T=65,H=8, L=46000, P=64 -- call C had the kernel-wide
# reasons (long scoreboard 2.55, wait 1.57, barrier 1.50 cycles per issued instruction) but not which
# partition or instruction they belong to.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
NCU=/usr/local/cuda/bin/ncu
$NCU --help 2>&1 | grep -A2 -E "print-source|--page " | head -20 | tee $OUT/s13d_hotspots.txt
timeout 150 $NCU --clock-control none -k regex:_verify_gluon_ws_kernel --launch-skip 2 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --import-source no -o /tmp/ws65 \
  python3 -m bench.one_case 1 65 8 46000 64 2>&1 | grep -v "^==PROF==\|Warn" | tail -3
$NCU -i /tmp/ws65.ncu-rep --page source --csv --print-source sass > /tmp/page.csv 2> /tmp/page.err
head -c 600 /tmp/page.err; wc -l /tmp/page.csv
python3 -m bench.ncu_hotspots /tmp/page.csv 60 2>&1 | tee -a $OUT/s13d_hotspots.txt
head -3 /tmp/page.csv | cut -c1-600 >> $OUT/s13d_hotspots.txt
