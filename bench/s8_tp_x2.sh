# Prepared in session 7 for issue #9's GPU part on `nvidia-h200-x2` (status listed that kind at the end of
# session 7; not yet run). NVLink multicast stays off (device KINDS.md). Carry [".whl"] (the engine's draft).
#   run(kind="nvidia-h200-x2", carry=[".whl"], command="bash bench/s8_tp_x2.sh")
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c "import torch; print('GPUs', torch.cuda.device_count())" | tee $OUT/tp_gpus.txt
nvidia-smi topo -m 2>&1 | tee -a $OUT/tp_gpus.txt
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
# TP2 == TP1 token for token (tiny models; NCCL; the whole step in one CUDA graph per rank)
timeout 240 python3 -m pytest -q -rf -p no:logging -m gpu tests/test_parallel.py 2>&1 | grep -v Warn | tail -5 | tee $OUT/tp_tests.txt
timeout 120 torchrun --standalone --nproc-per-node 2 -m tritree generate --tp 2 --check 2>&1 | tail -8 | tee $OUT/tp_generate.txt
# The decode step of a real-shape TP2 slice at 46k: per-step time and the collectives' share
timeout 200 torchrun --standalone --nproc-per-node 2 -m tritree bench decode --tp 2 --ctx 46000 --budgets 64 16 \
  --out $OUT/tp_decode.jsonl 2>&1 | grep -v Warn | tee $OUT/tp_decode.txt
