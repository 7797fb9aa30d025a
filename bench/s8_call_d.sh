# Session 8, call D (nvidia-h200-x2, carry [".whl"]): the TP2 runs again after the fix found in call C
# (CUDA graphs that captured NCCL collectives are freed before destroy_process_group), the engine's
# close(), and fp8 pools through their new sm_90:fp8 table.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
export TRITREE_STACKS_EVERY_S=60
( time timeout -s INT 240 python3 -m pytest -q -s -rf -p no:logging -m gpu tests/test_parallel.py ) > $OUT/c_tp_tests.txt 2>&1
grep -v "Warn\|warn" $OUT/c_tp_tests.txt | tail -8
( time timeout -s INT 90 torchrun --standalone --nproc-per-node 2 -m tritree generate --tp 2 --check ) > $OUT/c_generate.txt 2>&1
grep -v "^W11\|\*\*\*\*" $OUT/c_generate.txt | tail -12
unset TRITREE_STACKS_EVERY_S
timeout 60 python3 -m pytest -q -rf -p no:logging -m gpu tests/test_engine.py -k close 2>&1 | tail -2
timeout 100 python3 -m bench.verify_sweep --grid targets --variant tritree-fp8 \
  --filter "(T,H) in [(8,8),(16,8),(64,8),(16,64)]" --out $OUT/c_fp8.jsonl 2>&1 | grep "L=\|#" | tee $OUT/c_fp8.txt
