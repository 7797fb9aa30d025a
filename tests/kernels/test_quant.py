"""INT4 (compressed-tensors) and FP8 block dequantisation against dequantising by hand."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree.kernels.quant import dequant_fp8, dequant_int4

from ..conftest import DEVICE


def pack_int4_by_hand(nibbles: torch.Tensor) -> torch.Tensor:
    """[out, in] values 0..15 -> [out, in/8] int32, column 8c + j in bits 4j..4j+3."""
    out, cols = nibbles.shape
    words = torch.zeros(out, cols // 8, dtype=torch.int64)
    for j in range(8):
        words |= nibbles[:, j::8].to(torch.int64) << (4 * j)
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


@settings(max_examples=25)
@given(st.integers(1, 9), st.integers(1, 6), st.integers(0, 2**31 - 1), st.sampled_from([torch.float32, torch.bfloat16]))
def test_int4_matches_manual_dequant(rows, groups, seed, scale_dtype):
    g = torch.Generator().manual_seed(seed)
    cols = 32 * groups
    nib = torch.randint(0, 16, (rows, cols), generator=g)
    scale = (torch.rand(rows, groups, generator=g) + 0.1).to(scale_dtype)
    manual = torch.empty(rows, cols)
    for o in range(rows):
        for i in range(cols):
            manual[o, i] = (int(nib[o, i]) - 8) * float(scale[o, i // 32])
    got = dequant_int4(pack_int4_by_hand(nib).to(DEVICE), scale.to(DEVICE), dtype=torch.float32,
                       shape=(rows, cols))
    assert torch.equal(got.cpu(), manual)


def e4m3_value(b: int) -> float:
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 0xF, b & 7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return sign * m / 8 * 2.0 ** -6
    return sign * (1 + m / 8) * 2.0 ** (e - 7)


@settings(max_examples=20)
@given(st.integers(1, 200), st.integers(1, 300), st.integers(0, 2**31 - 1))
def test_fp8_block_matches_manual_dequant(rows, cols, seed):
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 256, (rows, cols), generator=g, dtype=torch.uint8)
    scale_inv = torch.rand(-(-rows // 128), -(-cols // 128), generator=g) + 0.5
    got = dequant_fp8(bits.view(torch.float8_e4m3fn).to(DEVICE), scale_inv.to(DEVICE), dtype=torch.float32).cpu()
    for o, i in [(0, 0), (rows - 1, cols - 1), (rows // 2, cols // 3)]:
        want = e4m3_value(int(bits[o, i])) * float(scale_inv[o // 128, i // 128])
        assert (torch.isnan(got[o, i]) and want != want) or float(got[o, i]) == pytest.approx(want, rel=1e-6)
    # every value: the decoder agrees with torch's own float8 conversion
    ref = bits.view(torch.float8_e4m3fn).float() * scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    assert torch.allclose(got.nan_to_num(), ref.nan_to_num(), rtol=1e-6, atol=0)


def test_bad_quantised_inputs():
    packed = torch.zeros(4, 8, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="weight_scale must have shape"):
        dequant_int4(packed, torch.ones(4, 3, device=DEVICE))
    with pytest.raises(ValueError, match="weight_shape"):
        dequant_int4(packed, torch.ones(4, 2, device=DEVICE), shape=(4, 60))
    with pytest.raises(TypeError, match="weight_packed must have dtype"):
        dequant_int4(packed.float(), torch.ones(4, 2, device=DEVICE))
    with pytest.raises(ValueError, match="weight_scale_inv must have shape"):
        dequant_fp8(torch.zeros(130, 10, dtype=torch.uint8, device=DEVICE), torch.ones(1, 1, device=DEVICE))
