# Session 17, call G (one H200, ~1 device minute): how much the measured bf16 matmul ceiling (the floor's
# denominator, tritree.roofline.measure_ceilings: 8192^3 torch.matmul, median of 20) moves between processes:
# six processes back to back. (Run as an inline command; this file records it.)
source bench/device_prelude.sh >/dev/null 2>&1
for i in 1 2 3 4 5 6; do python3 -c "
from tritree.roofline import measure_ceilings
import torch
c = measure_ceilings()
print(f'copy {c.copy_gbps:.0f} GB/s  matmul {c.matmul_tflops:.1f} TFLOP/s')
"; done 2>&1 | tee $OUT/s17g_ceilings.txt
