# Session 13, call C (one H200): row gathers with bf16 split partials behind the staged store as the
# default (PARTIALS_16BIT_GATHER, COALESCED_STORE_GATHER; call B): every verify_mla GPU test, then the
# targets grid with P = 1 and P = 64 side by side in one process (issue #2's fragmented-pool point), and
# the warp stall reasons of the ws kernel over TMA at T=65,H=8 (call B: tensor pipe active 61% of the
# SMs' active cycles, L2 57%, DRAM 11%, 0.51 eligible warps per scheduler).
source bench/device_prelude.sh
timeout 240 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py 2>&1 | grep -v Warn \
  | tail -4 | tee $OUT/s13c_tests.txt
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
timeout 120 python3 -m bench.verify_sweep --grid targets --variant tritree --ceilings /tmp/ceil.json \
  --out /tmp/s13c.jsonl 2>&1 | grep "L=\|#" | tee $OUT/s13c_sweep.txt
timeout 120 /usr/local/cuda/bin/ncu --clock-control none -k regex:_verify_gluon_ws_kernel --launch-skip 2 \
  --launch-count 1 --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  python3 -m bench.one_case 1 65 8 46000 64 2>&1 | grep -v "^==PROF==\|Warn" | grep -v " 0$" | tee $OUT/s13c_ncu.txt | tail -70
