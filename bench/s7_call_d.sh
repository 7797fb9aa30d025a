# Session 7, call D: the warp-specialised kernel over TMA without its producer's L2 prefetch (which,
# on triton 3.6, gives the kernel a 440-byte stack frame whose loads sit in the consumers' pair loop;
# without it: no stack), next to the shipped seesaw and ws kernels.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 280 python3 bench/gluon_check.py --ws --variants gluon,gluon+seesaw,gluon+wscs,gluon+wscs-nopf --shapes 64x8,16x64,65x8,32x8,17x8,128x8,16x8 2>&1 | grep -v Warn | tee $OUT/d_nopf.txt
