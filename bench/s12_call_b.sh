# Session 12, call B (one H200): bf16 split partials behind the warp-specialised kernel's staged,
# coalesced store (TRITREE_PARTIALS_16BIT; session 11 measured them slower from the MMA layout only).
# The GPU tests of the switch on every kernel, then side by side in one process: the table as shipped,
# with bf16 partials, and with bf16 partials plus the coalesced store everywhere; kernel vs merge
# apart; the timeline; the decode step at budget 64.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 150 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py -k 16bit 2>&1 \
  | grep -v Warn | tail -4 | tee $OUT/s12b_tests.txt
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
for grid in targets engine; do
  timeout 150 python3 -m bench.verify_sweep --grid $grid --filter "P == 64" --variant tritree --variant tritree-partials16 \
    --variant tritree-partials16-coalesced --ceilings /tmp/ceil.json --out /tmp/s12b.jsonl 2>&1 \
    | grep "L=\|#" | tee -a $OUT/s12b_sweep.txt
done
timeout 60 python3 -m bench.split_profile --shapes "8,8;17,8;64,8;65,8;16,64" 2>&1 | grep -v Warn | tee $OUT/s12b_profile.txt
TRITREE_PARTIALS_16BIT=1 timeout 60 python3 -m bench.split_profile --shapes "8,8;17,8;64,8;65,8;16,64" 2>&1 \
  | grep -v Warn | sed "s/^/bf16 partials: /" | tee -a $OUT/s12b_profile.txt
TRITREE_PARTIALS_16BIT=1 timeout 60 python3 -m bench.split_profile --shapes "8,8;65,8" --combine 1024,8192 2>&1 \
  | grep -v Warn | sed "s/^/bf16 partials, merge chunks of 8192: /" | tee -a $OUT/s12b_profile.txt
TRITREE_PARTIALS_16BIT=1 timeout 60 python3 -m bench.timeline --shapes "8,8;64,8;65,8;16,64" --ctx 46000 2>&1 \
  | grep -v Warn | sed "s/^/bf16 partials: /" | tee $OUT/s12b_timeline.txt
TRITREE_PARTIALS_16BIT=1 timeout 150 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 \
  | grep -v Warn | sed "s/^/bf16 partials: /" | tee $OUT/s12b_decode.txt
