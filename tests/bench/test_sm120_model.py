"""The RTX PRO 6000 paper model (``bench/sm120_model.py``) on rows written as ``bench.verify_sweep`` prints them."""

import math

import pytest

from bench.sm120_model import model_rows
from tritree.roofline import RTX_PRO_6000, Ceilings, verify_mla_counts

EMULATED = Ceilings(copy_gbps=4144.0, matmul_tflops=434.5)


def _row(T, H, P, variant, us, L=46000):
    return f"L= {L:5d} T={T:3d} H={H:2d} B= 1 P={P:2d} {variant:18s} {us:6.1f} us  floor ..."


@pytest.mark.parametrize("T,H,variant,kv_bytes", [(65, 8, "tritree-sm120", 2), (8, 8, "tritree-sm120", 2),
                                                  (64, 8, "tritree-fp8", 1), (65, 8, "tritree-sm120-triton", 2)])
def test_model_divides_the_paper_floor_by_the_emulated_fraction(T, H, variant, kv_bytes):
    (r,) = model_rows([_row(T, H, 64, variant, 490.9)], EMULATED)
    assert r["variant"] == variant
    nbytes, flops = verify_mla_counts(1, T, H, 46000, kv_bytes=kv_bytes)
    emu_floor, _ = EMULATED.floor_us(nbytes, flops)
    rtx_floor, bound = RTX_PRO_6000.floor_us(nbytes, flops)
    assert math.isclose(r["fraction"], emu_floor / 490.9)
    assert math.isclose(r["rtx_model_us"], rtx_floor * 490.9 / emu_floor)
    assert (r["rtx_floor_us"], r["bound"]) == (rtx_floor, bound)


def test_paper_floors_of_the_engine_shape():
    # T = 65, H = 8, L = 46,000: 52.1 GFLOP at 504 TFLOP/s = 103.4 us (compute-bound), as RESULTS states.
    nbytes, flops = verify_mla_counts(1, 65, 8, 46000)
    floor, bound = RTX_PRO_6000.floor_us(nbytes, flops)
    assert bound == "compute" and abs(floor - 103.4) < 0.1


def test_other_lines_are_ignored():
    assert model_rows(["# NVIDIA H200 ...", _row(8, 8, 64, "tritree", 36.1), "garbage"], EMULATED) == []


def test_moe_model_scales_the_rtx_copy_floor_by_the_emulated_fraction():
    from bench.sm120_model import moe_model_rows

    row = dict(arch="sm_120", shape="ep8", routing="uniform", N=17, us=200.0, bytes=3.7e8,
               ceilings=dict(copy_gbps=4240.0, matmul_tflops=800.3))
    (r,) = moe_model_rows([row, dict(row, arch="sm_90")])
    emu_floor = 3.7e8 / 4240e9 * 1e6
    assert math.isclose(r["fraction"], emu_floor / 200.0)
    assert math.isclose(r["rtx_model_us"], 3.7e8 / (RTX_PRO_6000.copy_gbps * 1e9) * 1e6 * 200.0 / emu_floor)
