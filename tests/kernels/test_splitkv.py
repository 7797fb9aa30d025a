"""The split-KV helpers shared by verify_mla and draft_attention (``tritree.kernels._splitkv``): the
merge of split partials against a float64 merge (one chunk and several, splits with no keys, rows
with no keys at all), its launch shapes, and the split-count policy."""

import math
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tritree.kernels import _splitkv
from tritree.kernels._splitkv import choose_num_splits, combine_config, combine_splits

from ..conftest import DEVICE


def reference_merge(part_o, part_lse):
    """float64: out = sum_s 2^(lse_s) o_s / sum_s 2^(lse_s) (log2 partial lse), natural-log lse."""
    lse2 = part_lse.double()  # [B, S, M]
    m = lse2.max(dim=1, keepdim=True).values
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp2(lse2 - m)  # [B, S, M]
    denom = w.sum(dim=1)  # [B, M]
    out = (w[..., None] * part_o.double()).sum(dim=1) / torch.where(denom > 0, denom, 1.0)[..., None]
    lse = torch.where(denom > 0, (m[:, 0] + torch.log2(torch.where(denom > 0, denom, 1.0))) * math.log(2.0),
                      torch.full_like(denom, float("-inf")))
    return out, lse


@given(B=st.integers(1, 2), T=st.integers(1, 5), H=st.integers(1, 3), S=st.integers(1, 40),
       D=st.sampled_from([32, 64, 128]), chunk_values=st.sampled_from([64, 256, 16384]),
       empty=st.floats(0.0, 0.6), seed=st.integers(0, 2**16))
def test_combine_matches_float64_merge(B, T, H, S, D, chunk_values, empty, seed):
    g = torch.Generator().manual_seed(seed)
    M = T * H
    part_o = torch.randn(B, S, M, D, generator=g)
    part_lse = torch.randn(B, S, M, generator=g) * 8.0
    part_lse[torch.rand(B, S, M, generator=g) < empty] = float("-inf")  # splits that saw no key
    part_lse[:, :, 0] = float("-inf")  # row 0: no key in any split -> zeros, lse -inf
    part_o[torch.isinf(part_lse)] = 0.0  # what the kernels store for an empty split
    out = torch.full((B, T, H, D), float("nan"), device=DEVICE)
    lse = torch.full((B, T, H), float("nan"), device=DEVICE)
    # Small chunk bounds force several chunks per row (the running maximum across chunks).
    saved = _splitkv._COMBINE_CHUNK_VALUES
    _splitkv._COMBINE_CHUNK_VALUES = chunk_values
    try:
        combine_splits(part_o.to(DEVICE), part_lse.to(DEVICE), out, lse)
    finally:
        _splitkv._COMBINE_CHUNK_VALUES = saved
    ref_out, ref_lse = reference_merge(part_o, part_lse)
    torch.testing.assert_close(out.cpu().double().reshape(B, M, D), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.cpu().double().reshape(B, M), ref_lse, rtol=1e-5, atol=1e-5)
    assert (out.cpu().reshape(B, M, D)[:, 0] == 0).all()


@pytest.mark.parametrize("rows,splits,D", [(64, 132, 512), (128, 66, 512), (512, 16, 512), (1024, 8, 512),
                                           (8, 3, 128), (4160, 2, 128), (1, 1, 512), (3, 300, 64)])
def test_combine_config_bounds(rows, splits, D):
    block_d, chunk, num_warps = combine_config(rows, splits, D)
    assert D % block_d == 0 and block_d >= 32
    assert chunk & (chunk - 1) == 0 and 1 <= chunk <= triton_next_pow2(splits)
    assert chunk * block_d <= max(_splitkv._COMBINE_CHUNK_VALUES, block_d)
    assert chunk * block_d // (32 * num_warps) <= 64  # values per thread
    # Narrowed only while there are too few programs.
    if block_d < D:
        assert rows * (D // (2 * block_d)) < _splitkv._COMBINE_MIN_PROGRAMS


def triton_next_pow2(n):
    return 1 << (n - 1).bit_length()


def test_choose_num_splits_whole_waves():
    # 9 row blocks on 132 SMs: rounding up makes a partial second wave (15 x 9 = 135 programs).
    assert choose_num_splits(batch=1, row_blocks=9, max_keys=46_080, block_n=64, sms=132) == 15
    assert choose_num_splits(batch=1, row_blocks=9, max_keys=46_080, block_n=64, sms=132, whole_waves=True) == 14
    # Never more splits than chunks of min_tiles_per_split tiles, never fewer than one.
    assert choose_num_splits(batch=1, row_blocks=1, max_keys=256, block_n=64, sms=132) == 1
    assert choose_num_splits(batch=64, row_blocks=16, max_keys=46_080, block_n=64, sms=132, whole_waves=True) == 1


def test_merge_pdl_only_on_hopper_gpus_with_several_splits(monkeypatch):
    """The programmatic-dependent-launch switch never reaches the interpreter, the CPU, one split or a
    pre-Hopper GPU (griddepcontrol is sm_90+); off by default."""
    assert _splitkv.MERGE_PDL is False or os.environ.get("TRITREE_MERGE_PDL") == "1"
    monkeypatch.setattr(_splitkv, "MERGE_PDL", True)
    assert not _splitkv.merge_pdl(8, torch.device("cpu"))
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        assert not _splitkv.merge_pdl(1, dev)
        assert _splitkv.merge_pdl(8, dev) == (torch.cuda.get_device_capability(dev)[0] >= 9
                                              and os.environ.get("TRITON_INTERPRET", "0") != "1")
    monkeypatch.setattr(_splitkv, "MERGE_PDL", False)
    assert not _splitkv.merge_pdl(8, torch.device("cuda"))
