# Session 10, call I (one H200, ~6 device minutes): the seesaw's split chunks in whole tile pairs
# (_verify_gluon.PAIR_CHUNKS, on): its tests (the seesaw part of the Gluon matrix, verify_mla's GPU
# tests), then T=64,H=8 and the other target / engine shapes with and without it side by side, and
# the in-kernel timeline of T=64,H=8 with it.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
timeout 200 python3 -m pytest -q -rf -p no:logging -m gpu tests/kernels/test_verify_gluon.py -k seesaw 2>&1 \
  | grep -v Warn | tail -4 | tee $OUT/s10i_tests.txt
timeout 120 python3 -m pytest -q -rf -p no:logging -m gpu tests/kernels/test_verify_mla.py 2>&1 \
  | grep -v Warn | tail -4 | tee -a $OUT/s10i_tests.txt
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
timeout 90 python3 -m bench.verify_sweep --grid targets --variant tritree --variant tritree-pagechunks --ceilings /tmp/ceil.json \
  --filter "P == 64 and (H == 8 or T == 16)" --out /tmp/s10i_t.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s10i_pairchunks.txt
timeout 60 python3 -m bench.verify_sweep --grid issue --variant tritree --variant tritree-pagechunks --ceilings /tmp/ceil.json \
  --filter "P == 64 and H == 8 and T == 64 and L != 46000" --out /tmp/s10i_l.jsonl 2>&1 | grep "L=" | tee -a $OUT/s10i_pairchunks.txt
timeout 40 python3 -m bench.timeline --shapes "64,8" --ctx 16384,46000,131072 2>&1 | grep -v Warn | tee $OUT/s10i_timeline.txt
