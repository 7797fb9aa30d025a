# Session 21, call F (one H200): the last 25 GPU tests in collection order (call E's suite ran 146 of 169, all
# passed, before its time limit), node ids in bench/s21_call_f_tests.txt.
source bench/device_prelude.sh
( time timeout 330 python3 -m pytest -q -rfE -p no:logging $(cat bench/s21_call_f_tests.txt) ) 2>&1 | grep -v Warn \
  | tail -15 | tee $OUT/s21f_tests.txt
