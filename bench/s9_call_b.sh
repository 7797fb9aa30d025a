# Prepared in session 8 for the next one, call B (one H200; not yet run; ~6 device minutes with
# FlashInfer's first JIT compile; carry [".whl"]). Issue #2's named peer: FlashInfer's MLA kernel
# (0.5.3, carried as wheels, bench/PEERS.md) next to verify_mla and the PyTorch version on chain-shaped
# trees (causal), same pool, page table and queries, graph-timed in one process.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  .whl/flashinfer_python-0.5.3-py3-none-any.whl .whl/apache_tvm_ffi-*-cp312-*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" 2>&1 | tail -3 | tee $OUT/s9b_import.txt
# The first call compiles FlashInfer's sm_90 MLA kernel (nvcc): one small case, alone, with a generous limit.
( time timeout 360 python3 -m bench.verify_sweep --grid targets --trees chain --variant flashinfer \
  --filter "(T,H,P) == (8,8,64)" --out $OUT/s9b_warm.jsonl ) > $OUT/s9b_warm.txt 2>&1; tail -25 $OUT/s9b_warm.txt
timeout 200 python3 -m bench.verify_sweep --grid targets --trees chain --variant tritree --variant flashinfer \
  --variant torch --out $OUT/s9b_peers.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s9b_peers.txt
