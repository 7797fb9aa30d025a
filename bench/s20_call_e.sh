# Session 20, call E (one H200, the session's last ~4 device minutes): the ws switches' bit-equality cases
# (NAMED_RELEASE, EARLY_TAIL_MASK) on the final kernel, where MASKED_PAIRS is on (with NAMED_RELEASE off too:
# the mbarrier releases with every pair released and the producer's last waits).
source bench/device_prelude.sh
( time timeout 170 python3 -m pytest -q -rfE -p no:logging -m gpu tests/kernels/test_verify_mla.py \
  -k "switch_gives" ) 2>&1 | grep -v Warn | tail -8 | tee $OUT/s20e_tests.txt
