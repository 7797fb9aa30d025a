# Session 6, call C: a time decomposition of the pair loop (the ws kernel with parts left out: copies
# alone, scores + P V without softmax, scores alone) next to the shipped seesaw: is the loop bound by
# the copies (L2 -> shared memory), the tensor cores, or the softmax and its synchronisation?
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 300 python3 bench/gluon_check.py --ws --probes --variants gluon+seesaw,gluon+ws,gluon+ws-load,gluon+ws-mma,gluon+ws-qk --shapes 64x8,16x64,8x8,17x8,32x8 2>&1 | grep -v Warn | tee $OUT/c_probes.txt
