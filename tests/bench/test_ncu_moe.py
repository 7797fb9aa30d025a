"""The Nsight Compute report parser of ``bench/ncu_moe.py`` (no GPU: a CSV in ncu's format)."""

import pytest

from bench.ncu_moe import METRICS, parse_ncu_csv, table

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def _row(launch, kernel, metric, unit, value):
    return (f'"{launch}","1","python","h","{kernel}","1","7","(128, 1, 1)","(57, 32, 1)","0","9.0","Command line '
            f'profiler metrics","{metric}","{unit}","{value}"\n')


def test_parse_labels_roles_in_launch_order_and_converts_units():
    text = "==PROF== Connected to process 1\n" + HEADER
    kernels = ["_align_kernel", "_gate_up_int4_kernel", "_down_int4_kernel", "_align_kernel", "_walk_kernel",
               "_walk_kernel", "void at::vectorized_elementwise_kernel<4, at::FillFunctor<float>>"]
    for i, k in enumerate(kernels):
        text += _row(i, k, METRICS["us"], "nsecond", f"{(i + 1) * 1000:,}")
        text += _row(i, k, METRICS["dram_pct"], "%", "46.26")
        text += _row(i, k, METRICS["stall_barrier"], "inst", "0.99")
        text += _row(i, k, "some__other_metric", "", "3")
    rows = parse_ncu_csv(text)
    assert [r["role"] for r in rows][:6] == ["align", "gate_up", "down", "align", "walk gate_up", "walk down"]
    assert [r["us"] for r in rows] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert all(r["dram_pct"] == 46.26 and r["stall_barrier"] == 0.99 for r in rows)
    md = table(rows, "ep8, 17").splitlines()
    assert len(md) == 4 and md[0].startswith("| ep8, 17 | gate_up | 2.0 | 46.3 |") and "barrier 0.99" in md[0]


def test_parse_refuses_text_without_a_report():
    with pytest.raises(ValueError, match="no ncu CSV header"):
        parse_ncu_csv("==ERROR== the profiler could not start\n")


def test_the_mma_kernels_take_the_same_roles():
    text = HEADER + "".join(_row(i, k, METRICS["us"], "nsecond", "2,000") for i, k in enumerate(
        ["_align_kernel", "_gate_up_mma_kernel", "_down_mma_kernel", "_walk_kernel", "_walk_kernel"]))
    assert [r["role"] for r in parse_ncu_csv(text)] == ["align", "gate_up", "down", "walk gate_up", "walk down"]
