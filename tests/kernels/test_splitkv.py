"""The split-KV helpers shared by verify_mla and draft_attention (``tritree.kernels._splitkv``): the
merge of split partials against a float64 merge (one chunk and several, splits with no keys, rows
with no keys at all), its launch shapes, and the split-count policy."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tritree.kernels import _splitkv
from tritree.kernels._splitkv import balanced_num_splits, choose_num_splits, combine_config, combine_splits

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


@pytest.mark.parametrize("M,S,D", [(136, 11, 512), (520, 14, 512), (130, 3, 256), (20, 5, 512), (300, 40, 512)])
def test_combine_of_16bit_partials(M, S, D):
    """bf16 partials (the Gluon kernels' staged stores) merged by column warps where there are rows enough
    (256 or 512-column blocks, the splits summed in registers, one or several chunks of up to 16) or as fp32
    partials are, against the float64 merge of the same bf16 values."""
    block_d, chunk, warps = combine_config(M, S, D, elem_bytes=2)
    if M * D // 256 >= _splitkv._COMBINE_16BIT_MIN_PROGRAMS:
        assert block_d in (256, 512) and warps == block_d // 256 and chunk <= _splitkv._COMBINE_16BIT_MAX_CHUNK
    g = torch.Generator().manual_seed(M + S)
    part_o = torch.randn(1, S, M, D, generator=g).to(torch.bfloat16)
    part_lse = torch.randn(1, S, M, generator=g) * 8.0
    part_lse[:, 1, 3] = float("-inf")
    part_o[torch.isinf(part_lse)] = 0.0
    out = torch.full((1, M, 1, D), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    lse = torch.full((1, M, 1), float("nan"), device=DEVICE)
    combine_splits(part_o.to(DEVICE), part_lse.to(DEVICE), out, lse)
    ref_out, ref_lse = reference_merge(part_o, part_lse)
    torch.testing.assert_close(out.cpu().double().reshape(1, M, D), ref_out, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(lse.cpu().double().reshape(1, M), ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,splits,D", [(64, 132, 512), (128, 66, 512), (512, 16, 512), (1024, 8, 512),
                                           (8, 3, 128), (4160, 2, 128), (1, 1, 512), (3, 300, 64)])
@pytest.mark.parametrize("elem_bytes", [4, 2])
def test_combine_config_bounds(rows, splits, D, elem_bytes):
    block_d, chunk, num_warps = combine_config(rows, splits, D, elem_bytes)
    assert D % block_d == 0 and block_d >= 32
    assert chunk & (chunk - 1) == 0 and 1 <= chunk <= triton_next_pow2(splits)
    if elem_bytes == 2 and block_d >= 256 and num_warps == block_d // 256:  # 16-bit partials by column warps
        assert chunk <= _splitkv._COMBINE_16BIT_MAX_CHUNK
    else:
        assert chunk * block_d <= max(_splitkv._COMBINE_CHUNK_VALUES, block_d)
    assert chunk * block_d // (32 * num_warps) <= (128 if elem_bytes == 2 else 64)  # values (16-bit: 64 regs) a thread
    # Narrowed only while there are too few programs.
    if block_d < D and elem_bytes == 4:
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


def _modelled(per, S, tiles, sms, fixed=4):
    return -(-per * S // sms) * (-(-tiles // S) + fixed)


def test_balanced_num_splits_examples():
    """Four requests of 65 x 8 rows in 32-row blocks (68 blocks) on 132 SMs: whole waves give one split and
    leave half the SMs idle; the balanced count takes 7 (3.6 waves of short chunks: 0.58 of the time modelled).
    One request: the whole-wave count (7)."""
    keys = 46_080
    assert choose_num_splits(batch=4, row_blocks=17, max_keys=keys, block_n=32, sms=132, whole_waves=True) == 1
    assert balanced_num_splits(batch=4, row_blocks=17, max_keys=keys, block_n=32, sms=132) == 7
    assert balanced_num_splits(batch=1, row_blocks=17, max_keys=keys, block_n=32, sms=132) == 7
    assert balanced_num_splits(batch=1, row_blocks=1, max_keys=64, block_n=32, sms=132) == 1


@given(st.integers(1, 16), st.integers(1, 64), st.integers(1, 300_000), st.sampled_from([16, 32, 64]),
       st.sampled_from([4, 132, 170, 188]))
def test_balanced_num_splits_is_within_slack_of_the_best(batch, row_blocks, max_keys, block_n, sms):
    """The count is the smallest within 5% of the least modelled time over every allowed count, never more
    splits than chunks of 4 tiles (at least one), and never modelled slower than whole waves."""
    S = balanced_num_splits(batch=batch, row_blocks=row_blocks, max_keys=max_keys, block_n=block_n, sms=sms)
    top = max(1, min(256, max_keys // (block_n * 4)))
    assert 1 <= S <= top
    per, tiles = batch * row_blocks, -(-max_keys // block_n)
    costs = [_modelled(per, s, tiles, sms) for s in range(1, top + 1)]
    assert _modelled(per, S, tiles, sms) <= min(costs) * 1.05
    assert all(c > min(costs) * 1.05 for c in costs[:S - 1])
    whole = choose_num_splits(batch=batch, row_blocks=row_blocks, max_keys=max_keys, block_n=block_n, sms=sms,
                              whole_waves=True)
    assert _modelled(per, S, tiles, sms) <= _modelled(per, whole, tiles, sms) * 1.05


class _ArgumentRecorder:
    """Stands in for ``torch.library.wrap_triton``: records, per kernel launched through it, the
    parameters that were not passed (wrap_triton, unlike a plain launch, fills in no defaults)."""

    def __init__(self):
        self.missing = {}

    def __call__(self, kernel):
        def launch(grid):
            def call(*args, **kwargs):
                names = kernel.arg_names
                passed = set(names[:len(args)]) | set(kwargs)
                self.missing[kernel.fn.__name__] = [n for n in names if n not in passed]
            return call

        class Launcher:
            __getitem__ = staticmethod(launch)
        return Launcher()


def test_kernels_under_torch_compile_get_every_parameter():
    """The Triton paths that torch.compile traces (draft_attention's kernel and the split merge, through
    wrap_triton; verify_mla's op runs its eager plan) pass every parameter, defaulted constexprs included: a default
    added to a kernel but not to its launch breaks torch.compile only, which only the GPU suite would
    otherwise find."""
    import importlib

    from tritree.kernels.configs import AttnConfig

    # The module, not the function of the same name that tritree.kernels re-exports.
    da = importlib.import_module("tritree.kernels.draft_attention")
    rec = _ArgumentRecorder()
    q = torch.randn(1, 4, 4, 64)
    k_cache = torch.randn(4, 16, 2, 64)
    page_table = torch.arange(4, dtype=torch.int32).view(1, 4)
    blk = torch.randn(1, 4, 2, 64)
    da._launch(q, k_cache, k_cache, page_table, torch.tensor([30], dtype=torch.int32), blk, blk,
               torch.empty_like(q), torch.empty(1, 4, 4), 0.1, None, AttnConfig.concrete(16, 16, 4, 1), 2, launch=rec)
    assert set(rec.missing) == {"_draft_attention_kernel", "_combine_kernel"}
    assert all(not m for m in rec.missing.values()), rec.missing
