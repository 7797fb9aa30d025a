"""The INT4 weight walk (``bench/int4_walk.py``): each block reads exactly its expert's tiles (interpreter)."""

import pytest
import torch

from bench.int4_walk import make_walk, walk
from tritree.kernels.moe.int4 import Int4Experts
from tritree.kernels.moe.int4_triton import Int4MoeConfig, Int4MoePlan


def _fold(packed, scale, bn, bk):
    """What each program of the walk stores: per ``bn``-row tile, the XOR over K steps of the word and scale
    tiles, summed (int32 wrap-around)."""
    E, rows, kw = packed.shape
    steps = kw * 8 // bk
    w = packed.reshape(E, rows // bn, bn, steps, bk // 8)
    s = scale.view(torch.int16).to(torch.int32).reshape(E, rows // bn, bn, steps, bk // 32)
    fw, fs = w[..., 0, :].clone(), s[..., 0, :].clone()
    for k in range(1, steps):
        fw ^= w[..., k, :]
        fs ^= s[..., k, :]
    total = fw.to(torch.int64).sum((-1, -2)) + fs.to(torch.int64).sum((-1, -2))
    return ((total + 2**31) % 2**32 - 2**31).to(torch.int32)  # [E, rows // bn]


@pytest.mark.parametrize("ids", [[[0, 2], [2, 5]], [[3, 1], [1, 0]], [[3, 3], [1, 1]]])
def test_walk_reads_the_touched_experts_tiles_only(ids):
    E, H, I, bn, bk = 4, 128, 64, 32, 64
    g = torch.Generator().manual_seed(0)
    ex = Int4Experts(torch.randint(-2**31, 2**31 - 1, (E, 2 * I, H // 8), generator=g, dtype=torch.int32),
                     torch.randn(E, 2 * I, H // 32, generator=g).to(torch.bfloat16),
                     torch.randint(-2**31, 2**31 - 1, (E, H, I // 8), generator=g, dtype=torch.int32),
                     torch.randn(E, H, I // 32, generator=g).to(torch.bfloat16))
    # one block per used expert, then blocks past the last used one (expert E): what align_routing gives
    used = sorted({e for row in ids for e in row if 0 <= e < E})
    block_expert = torch.tensor(used + [E] * 3, dtype=torch.int32)
    for packed, scale in ((ex.w13_packed, ex.w13_scale), (ex.w2_packed, ex.w2_scale)):
        rows = packed.shape[1]
        sink = torch.full((block_expert.numel() * rows // bn,), -7, dtype=torch.int32)
        walk(packed, scale, block_expert, (bn, bk, 4, 1), sink)
        got, want = sink.reshape(-1, rows // bn), _fold(packed, scale, bn, bk)
        for b, e in enumerate(block_expert.tolist()):
            assert torch.equal(got[b], want[e] if e < E else torch.full_like(got[b], -7))


def test_make_walk_runs_on_routing_and_refuses_partial_tiles():
    E, H, I = 2, 64, 32
    z = torch.zeros
    ex = Int4Experts(z(E, 2 * I, H // 8, dtype=torch.int32), z(E, 2 * I, H // 32, dtype=torch.bfloat16),
                     z(E, H, I // 8, dtype=torch.int32), z(E, H, I // 32, dtype=torch.bfloat16))
    make_walk(ex, Int4MoePlan(Int4MoeConfig(16, (32, 32, 4, 1), (32, 32, 4, 1), True), 4, 1, 1))(
        None, torch.tensor([[0, 5]], dtype=torch.int32), None, None)
    with pytest.raises(ValueError, match="whole tiles"):
        make_walk(ex, Int4MoePlan(Int4MoeConfig(16, (48, 32, 4, 1), (32, 32, 4, 1), True), 4, 1, 1))(
            None, torch.tensor([[0, 1]], dtype=torch.int32), None, None)
