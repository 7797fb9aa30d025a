# Session 14, call A (one H200): two switches made default this session, measured against their off
# settings: Q's padding rows zero-filled (_verify_gluon.Q_ZERO_PAD; the timeline has Q landing at ~3 us at
# T=65,H=8, whose ninth row block is 8 real rows and 56 copies of one row, against ~1.5 at T=64,H=8) and
# the ws kernel's 16-bit rows scaled and cast before its staged store (_verify_gluon_ws.STAGE_16BIT: 64 KB
# through shared memory instead of 128). The timeline with both on / both off, the engine grid with each
# off in the same process, then every GPU test but the Gluon matrix (new: both switches' bit-equality).
source bench/device_prelude.sh
for setting in "1 1" "0 0"; do
  set -- $setting
  echo "Q_ZERO_PAD=$1 STAGE_16BIT=$2" | tee -a $OUT/s14a_timeline.txt
  TRITREE_Q_ZERO_PAD=$1 TRITREE_STAGE_16BIT=$2 timeout 90 python3 -m bench.timeline \
    --shapes "65,8;17,8;64,8;16,64" --ctx 46000 2>&1 | grep "^T=" | tee -a $OUT/s14a_timeline.txt
done
python3 -c "from tritree.roofline import cached_ceilings; cached_ceilings('/tmp/ceil.json')"
timeout 150 python3 -m bench.verify_sweep --grid engine --variant tritree --variant tritree-qdup \
  --variant tritree-stage32 --ceilings /tmp/ceil.json --out /tmp/s14a.jsonl 2>&1 | grep "L=\|#" \
  | tee $OUT/s14a_sweep.txt
( time timeout 330 python3 -m pytest -q -rfE -p no:logging -m gpu tests \
    --ignore=tests/kernels/test_verify_gluon.py ) 2>&1 | grep -v Warn | tail -12 | tee $OUT/s14a_gpu_suite.txt
