# Session 16, call F (one H200, ~5 device minutes): is the pair loop's build-to-build speed difference the
# SM clock? (Session 13's Nsight Compute saw 1.66-1.72 GHz during this kernel, where nvidia-smi's 50 ms
# samples say 1980 MHz.) bench.timeline --graph --clock: each program stamps %clock beside %globaltimer
# (TIMELINE=2), so cycles / ns is the clock it ran at; back to back (as graph-timed) and with ~100 us of idle
# (a sleep kernel) between calls (as single launches are). Builds: the shipped kernel; commit 1df0a18's
# (bench/s16_probe/, TAIL_PAIRS 0 / 1) and branch s16-tail-probe's (bench/s16_probe_p/, PIPELINED_TAIL 0 / 1),
# each with bench/patches/timeline_clock.py applied (untracked folders, made before the call).
source bench/device_prelude.sh
run() {  # label, then env assignments
  local label=$1; shift
  for idle in 0 100; do
    echo "$label idle=$idle" | tee -a $OUT/s16f_clock.txt
    env "$@" timeout 90 python3 -m bench.timeline --graph --clock --idle-us $idle --shapes "65,8;17,8" --ctx 46000 \
      2>&1 | grep "^T=\|Error" | tee -a $OUT/s16f_clock.txt
  done
}
run shipped X=0
cp bench/s16_probe/_verify_gluon.py bench/s16_probe/_verify_gluon_ws.py tritree/kernels/
run "1df0a18 TAIL_PAIRS=0" TRITREE_TAIL_PAIRS=0
run "1df0a18 TAIL_PAIRS=1" TRITREE_TAIL_PAIRS=1
cp bench/s16_probe_p/_verify_gluon.py bench/s16_probe_p/_verify_gluon_ws.py tritree/kernels/
run "s16-tail-probe PIPELINED_TAIL=0" TRITREE_PIPELINED_TAIL=0
run "s16-tail-probe PIPELINED_TAIL=1" TRITREE_PIPELINED_TAIL=1
