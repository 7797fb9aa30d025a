# Session 11, call F (the last ~4 device minutes): with its store re-laid out, the warp-specialised
# kernel's stack frame over TMA with the L2 prefetch fell from 440 to 24 bytes and its pair loop ran
# ~11% faster per key (call D timeline: T=65,H=8 97.1 us for 3,286 keys a program, the seesaw at
# T=64,H=8 95.0 us for 2,875). The row buckets that avoided that kernel for its stack frame (65..256
# rows: ws without prefetch; 257..512: the seesaw) against it, side by side.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 110 python3 -m bench.verify_sweep --grid targets --filter "P == 64 and T * H in (128, 512)" \
  --configs "64,64,8,2,1,0,1,0,1,gluon-seesaw;64,64,8,2,1,0,1,0,1,gluon-ws-noprefetch;64,64,8,2,1,0,1,0,1,gluon-ws" \
  --out /tmp/f.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s11f_buckets.txt
