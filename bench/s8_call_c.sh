# Session 8, call C (nvidia-h200-x2, carry [".whl"]): why `generate --tp 2` and the NCCL TP test ran past
# their limits in call A (bench decode --tp 2 ran), with every rank's stacks printed every 40 s; then
# fp8 pools' Triton configs at the target shapes (one GPU).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
export TRITREE_STACKS_EVERY_S=40 NCCL_DEBUG=WARN
G="torchrun --standalone --nproc-per-node 2 -m tritree generate --tp 2 -n 12 --check --quiet"
( time timeout -s INT 90 $G --eager ) > $OUT/b_eager.txt 2>&1; tail -5 $OUT/b_eager.txt
( time timeout -s INT 100 $G ) > $OUT/b_graph.txt 2>&1; tail -5 $OUT/b_graph.txt
# (TRITREE_CAPTURE_ERROR_MODE: a switch of the engine at the time, removed after this call: it changed nothing)
( time TRITREE_CAPTURE_ERROR_MODE=thread_local timeout -s INT 100 $G ) > $OUT/b_graph_tl.txt 2>&1; tail -5 $OUT/b_graph_tl.txt
unset TRITREE_STACKS_EVERY_S NCCL_DEBUG
CF="64,64,8,2,1,0,1,1,1;64,64,8,3,1,0,1,1,1;64,64,8,4,1,0,1,1,1;64,64,4,3,1,0,1,1,0;64,64,8,2,1,0,1,1,0;64,32,8,4,1,0,1,1,1;32,64,4,3,2,0,1,1,0;16,64,4,3,2,0,1,1,0;64,64,8,2,2,0,1,1,1;64,128,8,2,1,0,0,0,1"
timeout 240 python3 -m bench.verify_sweep --grid targets --variant tritree-fp8 --configs "$CF" \
  --filter "P == 64 and (T,H) in [(8,8),(16,8),(64,8),(16,64)]" --out $OUT/b_fp8cfg.jsonl 2>&1 | grep "L=\|#" > $OUT/b_fp8cfg.txt
cat $OUT/b_fp8cfg.txt
