# Prepared in session 15 for a later one (branch s16-tail-probe; ~3 device minutes): why the masked tail as pairs
# (PIPELINED_TAIL, commit e6ba0f7) lost. Session 15 call C: with it the unmasked pair loop ran 4-6% slower though
# its SASS is the same, and a masked pair cost 6.6-6.9 us against 4.2-4.4 for a tile of the one-tile tail. Here
# the pairs' code is compiled in but never run (TRITREE_TAIL_PAIRS_IDLE=1, the one-tile tail does the work):
# if its pair loop is as slow as call C's pipelined one, the code's size / placement (instruction fetch) is the
# cause, not the masked pairs' work. Timeline three ways, each twice, interleaved. T=65,H=8 only: its launch (a
# narrow last row block) compiles to the same loops with and without the probe (849-instruction pair loop, 1
# local access, 7,424 instructions in all); at T=17 / T=64 the probe's kernel differs (13 local accesses in
# the pair loop), so it would not isolate anything there.
source bench/device_prelude.sh
for round in 1; do
  for v in "0 0" "1 1" "1 0"; do
    set -- $v
    echo "PIPELINED_TAIL=$1 TAIL_PAIRS_IDLE=$2" | tee -a $OUT/tail_probe_timeline.txt
    TRITREE_PIPELINED_TAIL=$1 TRITREE_TAIL_PAIRS_IDLE=$2 timeout 60 python3 -m bench.timeline \
      --shapes "65,8" --ctx 46000 2>&1 | grep "^T=\|Error" | tee -a $OUT/tail_probe_timeline.txt
  done
done
