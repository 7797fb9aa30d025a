# Session 9, call E (one H200): the GPU tests that call D's whole-suite run failed (torch.compile of the
# Triton paths: the split merge's PDL constexpr was not passed through wrap_triton), after the fix.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
( time timeout 400 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  tests/kernels/test_draft_attention.py tests/kernels/test_splitkv.py tests/model/test_kimi_k2.py \
  -k "tma_tiles or fp8_pool or compile or every_parameter or programmatic" ) 2>&1 | grep -v Warn | tail -15 \
  | tee $OUT/s9e_tests.txt
