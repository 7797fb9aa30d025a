"""Grouped routed-expert SwiGLU kernels against the per-expert loop."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree.kernels.moe import moe_reference, routed_experts

from ...conftest import DEVICE


@settings(max_examples=20)
@given(N=st.integers(1, 40), E=st.integers(1, 9), k=st.integers(1, 3), Hd=st.sampled_from([16, 48, 70]),
       I=st.sampled_from([16, 32, 40]), skew=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_routed_experts_match_reference(N, E, k, Hd, I, skew, seed):
    k = min(k, E)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, Hd, generator=g)
    scores = torch.randn(N, E, generator=g)
    if skew:  # most tokens on one expert: long runs, many blocks for one expert, empty experts
        scores[:, 0] += 5
    idx = torch.topk(scores, k, dim=-1).indices
    w = torch.rand(N, k, generator=g)
    wg, wu = torch.randn(E, I, Hd, generator=g) / Hd**0.5, torch.randn(E, I, Hd, generator=g) / Hd**0.5
    wd = torch.randn(E, Hd, I, generator=g) / I**0.5
    args = [t.to(DEVICE) for t in (x, idx, w, wg, wu, wd)]
    got = routed_experts(*args)
    ref = moe_reference(*[a.double() if a.is_floating_point() else a for a in args])
    err = (got.double() - ref).norm() / ref.norm().clamp_min(1e-12)
    assert err < 1e-4, float(err)
