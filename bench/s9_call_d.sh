# Session 9, call D (one H200; carry [".whl"]): the whole GPU test suite at HEAD (every test marked gpu;
# the Gluon kernel matrix last, under what time is left), after FlashInfer on the engine's chain shapes
# (T = 17 and 65, H = 8: budgets 16 and 64 of issue #7) next to verify_mla.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  .whl/flashinfer_python-0.5.3-py3-none-any.whl .whl/apache_tvm_ffi-*-cp312-*.whl 2>&1 | tail -2
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m bench.verify_sweep --grid engine --trees chain --variant tritree \
  --variant flashinfer --out $OUT/s9d_engine_peers.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s9d_engine_peers.txt
( time timeout 330 python3 -m pytest -q -rfE -p no:logging -m gpu tests --deselect tests/kernels/test_verify_gluon.py \
  --ignore=tests/kernels/test_verify_gluon.py ) 2>&1 | grep -v Warn | tail -30 > $OUT/s9d_gpu_suite.txt; cat $OUT/s9d_gpu_suite.txt
( time timeout 200 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_gluon.py ) 2>&1 \
  | grep -v Warn | tail -15 > $OUT/s9d_gpu_gluon.txt; cat $OUT/s9d_gpu_gluon.txt
