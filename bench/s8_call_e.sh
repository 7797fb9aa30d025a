# Session 8, call E (nvidia-h200-x2): the NCCL TP test after the moe kernels' fp32 dots became IEEE
# (call D: no hang any more, but prefill logits 6e-4 apart from one process), the moe GPU tests, and
# verify_mla's fp8 GPU test through the new sm_90:fp8 table.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
( time timeout -s INT 200 python3 -m pytest -q -rf -p no:logging -m gpu tests/test_parallel.py tests/kernels/test_moe.py ) > $OUT/d_tp_tests.txt 2>&1
grep -v "Warn\|warn" $OUT/d_tp_tests.txt | grep -v "^ *$" | tail -25
timeout 100 python3 -m pytest -q -rf -p no:logging -m gpu tests/kernels/test_verify_mla.py -k fp8 2>&1 | tail -2
