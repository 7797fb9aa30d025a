# Prepared in session 8 for the next one, call A (one H200; not yet run; ~5 device minutes; carry [".whl"]).
# Send call B (bench/s9_call_b.sh: FlashInfer) right after it, within the machine's 30 s warm window.
# The split merge by programmatic dependent launch (TRITREE_MERGE_PDL; the Gluon split kernels signal
# griddepcontrol.launch_dependents at their start, the merge waits in griddepcontrol.wait):
# 1. its GPU tests (every Gluon kernel, the row gathers and the Triton path; eager and CUDA graph), and
#    the cached tensor of T's for tree_lens=None (no fill kernel in the graphs the sweeps time:
#    the "tritree" rows below include that change: compare with session 8's; not yet measured),
# 2. the target and engine shapes with and without it, side by side in one process,
# 3. the decode step with and without it (TP8 view, budget 64).
# If it wins everywhere: MERGE_PDL on by default (tritree/kernels/_splitkv.py) and the RESULTS table.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-deps .whl/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -1
timeout 150 python3 -m pytest -q -rf -p no:logging -m gpu tests/kernels/test_verify_mla.py -k "programmatic or without_tree_lens" 2>&1 | grep -v Warn | tail -4 | tee $OUT/s9_tests.txt
for grid in targets engine; do
  timeout 120 python3 -m bench.verify_sweep --grid $grid --variant tritree --variant tritree-pdl \
    --out $OUT/s9_pdl_$grid.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s9_pdl_$grid.txt
done
timeout 120 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/s9_decode.jsonl 2>&1 | grep -v Warn | tee $OUT/s9_decode.txt
TRITREE_MERGE_PDL=1 timeout 120 python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/s9_decode_pdl.jsonl 2>&1 | grep -v Warn | tee $OUT/s9_decode_pdl.txt
