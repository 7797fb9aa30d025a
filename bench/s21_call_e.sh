# Session 21, call E (one H200): T=8,H=64 (slower with the new defaults in call D's one round) against each of
# session 21's switches off, three rounds; the GPU suite (the Gluon matrix apart) on the final code; the decode
# step again (a second machine with the new defaults).
source bench/device_prelude.sh
SECONDS=0
for r in 1 2 3; do
timeout 60 python3 -m bench.verify_sweep --grid targets --filter "T == 8 and H == 64 and P == 64" --variant tritree \
  --variant tritree-s20 --variant tritree-ws-tma-store-off --variant tritree-split-pdl-off --out /tmp/s21e.jsonl 2>&1 \
  | grep "L=\|Error\|^#" | tee -a $OUT/s21e_sweep.txt
done
( time timeout 380 python3 -m pytest -q -rfE -p no:logging -m gpu tests --ignore=tests/kernels/test_verify_gluon.py ) \
  2>&1 | grep -v Warn | tail -15 | tee $OUT/s21e_suite.txt
left=$(( 590 - SECONDS )); echo "decode gets $left s" | tee $OUT/s21e_decode.txt
timeout $left python3 -m tritree bench decode --ctx 46000 --budgets 64 --out /tmp/d.jsonl 2>&1 | tail -4 \
  | tee -a $OUT/s21e_decode.txt
