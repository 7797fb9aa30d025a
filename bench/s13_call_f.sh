# Session 13, call F (one H200, the last ~7 device minutes): the plain Gluon schedule over TMA (T=8,H=8)
# with bf16 split partials re-laid out before their store as the default (_verify_gluon.PARTIALS_16BIT_PLAIN;
# call E measured that pair 33.9-34.2 against 35.0-35.5 us with a merge variant since dropped): the
# verify_mla GPU tests that reach it, then the target and engine grids (P = 64) against fp32 partials.
source bench/device_prelude.sh
timeout 150 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "bf16_large or 16bit or coalesced or graph or tma_tiles" 2>&1 | grep -v Warn | tail -4 | tee $OUT/s13f_tests.txt
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for grid in targets engine; do
  timeout 100 python3 -m bench.verify_sweep --grid $grid --filter "P == 64 and T <= 17 and H == 8" --variant tritree \
    --variant tritree-plain32 --ceilings /tmp/ceil.json --out /tmp/s13f.jsonl 2>&1 | grep "L=\|#" \
    | tee -a $OUT/s13f_sweep.txt
done
timeout 100 python3 -m bench.verify_sweep --grid targets --filter "P == 64 and T == 8 and H == 8" --variant tritree \
  --variant tritree-plain32 --variant tritree --variant tritree-plain32 --ceilings /tmp/ceil.json \
  --out /tmp/s13f.jsonl 2>&1 | grep "L=" | sed "s/^/again: /" | tee -a $OUT/s13f_sweep.txt
