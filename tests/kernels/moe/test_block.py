"""The MoE block (``tritree.kernels.moe.block``): the composition (the CPU path) against the float64 reference
over random shapes, routings, groups, padding rows and other ranks' experts; validation; on an sm_90 / sm_120
GPU the fused launches against the reference (rows whose routing is within rounding of a tie are left out),
forced K splits, poisoned outputs, the counters left at 0, and a CUDA-graph replay."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree.kernels import Int4Experts, moe_block, moe_block_reference
from tritree.kernels._launch import arrival_counters, zeroed_workspace

from ...conftest import HAS_GPU

# float32 residuals: the routed experts run on bf16 activations and return bf16 (W4A16).
TOL = {torch.float32: 1e-2, torch.float16: 5e-3, torch.bfloat16: 2.5e-2}


def _mma_gpu():
    return HAS_GPU and torch.cuda.get_device_capability()[0] in (9, 12)


def mma_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not _mma_gpu(), reason="needs an sm_90 / sm_120 GPU")(test))


def _block(N, H, I, Is, E_all, world, rank, n_group, dtype, seed, device="cpu", layout="checkpoint", bias=True):
    """Random block operands: the router over ``E_all`` experts, the rank's ``E_all / world`` INT4 experts."""
    g = torch.Generator().manual_seed(seed)
    E = E_all // world
    ex = Int4Experts.quantize(torch.randn(E, I, H, generator=g) / H**0.5, torch.randn(E, I, H, generator=g) / H**0.5,
                              torch.randn(E, H, I, generator=g) / I**0.5)
    ex = Int4Experts(*(t.to(device) for t in (ex.w13_packed, ex.w13_scale, ex.w2_packed, ex.w2_scale)))
    if layout != "checkpoint":
        ex = ex.to_layout(layout)
    t = dict(
        residual=(torch.randn(N, H, generator=g) * 2).to(dtype),
        norm_weight=(1 + 0.2 * torch.randn(H, generator=g)).to(dtype),
        router_weight=(torch.randn(E_all, H, generator=g) * 2 / H**0.5).to(dtype),
        router_bias=torch.randn(E_all, generator=g) * 0.3 if bias else None,
        shared_gate_up=(torch.randn(2 * Is, H, generator=g) / H**0.5).to(dtype),
        shared_down=(torch.randn(H, Is, generator=g) / Is**0.5).to(dtype),
    )
    t = {k: (v.to(device) if v is not None else None) for k, v in t.items()}
    return t, ex, dict(expert_offset=rank * E)


def _call(fn, t, ex, **kw):
    return fn(t["residual"], t["norm_weight"], t["router_weight"], t["router_bias"], ex, t["shared_gate_up"],
              t["shared_down"], **kw)


def _clear_rows(t, kw, margin=1e-4):
    """Rows whose selection no rounding of the norm or the logits can change: every kept group and picked expert
    ahead of the first left out by more than ``margin`` (float64 scores of the reference's normed rows)."""
    x = t["residual"].float()
    xn = torch.nn.functional.rms_norm(x, (x.shape[1],), t["norm_weight"].float(), kw["eps"]).to(x.dtype)
    xn = xn.to(t["residual"].dtype).double()
    s = torch.sigmoid(xn @ t["router_weight"].double().t())
    if t["router_bias"] is not None:
        s = s + t["router_bias"].double()
    N, E = s.shape
    ok = torch.ones(N, dtype=torch.bool, device=s.device)
    ng, tg, k = kw.get("n_group", 1), kw.get("topk_group", 1), kw["top_k"]
    if ng > 1:
        top2 = s.view(N, ng, -1).sort(-1, descending=True).values[..., :2].sum(-1)
        gs = top2.sort(-1, descending=True).values
        if tg < ng:
            ok &= (gs[:, tg - 1] - gs[:, tg]) > margin
        keep = torch.zeros(N, ng, dtype=torch.bool, device=s.device).scatter_(
            1, top2.sort(-1, descending=True).indices[:, :tg], True)
        s = s.masked_fill(~keep.repeat_interleave(E // ng, 1), float("-inf"))
    v = s.sort(-1, descending=True).values
    if k < E:
        ok &= (v[:, k - 1] - v[:, k]) > margin
    return ok


def _err(out, ref, rows):
    o, r = out[rows].double(), ref[rows].double()
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


# --------------------------------------------------------------------------------------------------
# CPU: the composition against the reference
# --------------------------------------------------------------------------------------------------

@settings(max_examples=15, deadline=None)
@given(N=st.integers(0, 130), top_k=st.integers(1, 8), E_all=st.sampled_from([16, 32]), I=st.sampled_from([32, 64]),
       groups=st.sampled_from([(1, 1), (2, 1), (4, 2)]), world_rank=st.sampled_from([(1, 0), (2, 1), (4, 2)]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), pad=st.booleans(),
       add_residual=st.booleans(), bias=st.sampled_from(["none", "small", "skewed"]), seed=st.integers(0, 10**6))
def test_composition_matches_reference(N, top_k, E_all, I, groups, world_rank, dtype, pad, add_residual, bias, seed):
    n_group, topk_group = groups
    world, rank = world_rank
    H, Is = 64, 32
    top_k = min(top_k, topk_group * E_all // n_group)
    t, ex, kw = _block(N, H, I, Is, E_all, world, rank, n_group, dtype, seed, bias=bias != "none")
    if bias == "skewed":  # every token on the same few experts: blocks of many rows
        t["router_bias"] = torch.zeros(E_all)
        t["router_bias"][:top_k] = 2.0
    kw.update(eps=1e-6, top_k=top_k, n_group=n_group, topk_group=topk_group, scaling=2.5, add_residual=add_residual)
    if pad and N:
        B = 2 if N % 2 == 0 else 1
        kw.update(tree_lens=torch.randint(0, N // B + 1, (B,), dtype=torch.int32), rows_per_request=N // B)
    out = torch.full((N, H), float("nan"), dtype=dtype)
    res = _call(moe_block, t, ex, out=out, **kw)
    assert res is out and not out.isnan().any()
    ref = _call(moe_block_reference, t, ex, **kw)
    if N:
        rows = _clear_rows(t, kw)
        assert _err(out, ref, rows) < TOL[dtype]


def test_padding_rows_get_the_shared_expert_only():
    t, ex, kw = _block(6, 64, 32, 32, 8, 1, 0, 1, torch.float32, 3)
    kw.update(eps=1e-6, top_k=2, tree_lens=torch.tensor([3, 0], dtype=torch.int32), rows_per_request=3)
    out = _call(moe_block, t, ex, **kw)
    shared_only = _call(moe_block_reference, t, Int4Experts(*(x[:0] for x in (ex.w13_packed, ex.w13_scale,
                                                                              ex.w2_packed, ex.w2_scale))),
                        **{**kw, "expert_offset": 100})
    assert torch.allclose(out[3:], shared_only[3:].float(), atol=1e-4)
    assert not torch.allclose(out[:3], shared_only[:3].float(), atol=1e-3)


def test_validation_names_the_argument():
    t, ex, kw = _block(4, 64, 32, 32, 8, 1, 0, 1, torch.float32, 0)
    kw.update(eps=1e-6, top_k=2)
    with pytest.raises(ValueError, match="norm_weight"):
        _call(moe_block, {**t, "norm_weight": t["norm_weight"][:10]}, ex, **kw)
    with pytest.raises(ValueError, match="shared_gate_up"):
        _call(moe_block, {**t, "shared_gate_up": t["shared_gate_up"][:10]}, ex, **kw)
    with pytest.raises(ValueError, match="shared_down"):
        _call(moe_block, {**t, "shared_down": t["shared_down"][:32]}, ex, **kw)
    with pytest.raises(TypeError, match="experts"):
        _call(moe_block, t, object(), **kw)
    with pytest.raises(ValueError, match="router_weight must have shape"):
        _call(moe_block, {**t, "router_weight": t["router_weight"][:, :10]}, ex, **kw)
    with pytest.raises(ValueError, match="top_k = 9 exceeds the E = 8 experts of router_weight"):
        _call(moe_block, t, ex, **{**kw, "top_k": 9})
    with pytest.raises(ValueError, match="eps"):
        _call(moe_block, t, ex, **{**kw, "eps": -1.0})
    with pytest.raises(TypeError, match="add_residual"):
        _call(moe_block, t, ex, **{**kw, "add_residual": 1})
    with pytest.raises(ValueError, match="out must not be residual"):
        _call(moe_block, t, ex, out=t["residual"], **kw)
    with pytest.raises(ValueError, match="out"):
        _call(moe_block, t, ex, out=torch.empty(3, 64), **kw)
    with pytest.raises(TypeError, match="MoeBlockPlan"):
        _call(moe_block, t, ex, plan=object(), **kw)


def test_plan_is_checked():
    M = pytest.importorskip("tritree.kernels.moe.int4_mma")

    for bad, match in ((M.Int4MmaPlan(8, 1, 1, 1), "num_blocks"), (M.Int4MmaPlan(8, 64, 0, 1), "gate_up_programs"),
                       (M.Int4MmaPlan(8, 64, 2, 2), "down_split"), (M.Int4MmaPlan(12, 64, 1, 1), "block_m")):
        with pytest.raises(ValueError, match=match):
            M.check_plan(bad, 1024, 256, 24, 16)
    M.check_plan(M.Int4MmaPlan(8, 64, 5, 1), 1024, 256, 24, 16)


# --------------------------------------------------------------------------------------------------
# GPU: the fused launches
# --------------------------------------------------------------------------------------------------

@mma_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N,top_k,E_all,world,H,I,Is,groups", [
    (1, 8, 64, 1, 512, 256, 128, (1, 1)), (9, 8, 384, 8, 1024, 512, 256, (1, 1)),
    (17, 6, 64, 2, 768, 256, 256, (8, 4)), (65, 8, 128, 4, 512, 256, 384, (4, 2)),
    (130, 2, 32, 1, 256, 512, 128, (1, 1)), (5, 4, 16, 1, 256, 256, 512, (2, 1))])
def test_fused_matches_reference(dtype, N, top_k, E_all, world, H, I, Is, groups):
    n_group, topk_group = groups
    t, ex, kw = _block(N, H, I, Is, E_all, world, world - 1, n_group, dtype, N * 31 + H, "cuda", "mma")
    kw.update(eps=1e-6, top_k=top_k, n_group=n_group, topk_group=topk_group, scaling=2.5)
    out = torch.full((N, H), float("nan"), dtype=dtype, device="cuda")
    _call(moe_block, t, ex, out=out, **kw)
    ref = _call(moe_block_reference, t, ex, **kw)
    rows = _clear_rows(t, kw)
    assert torch.isfinite(out).all()
    assert rows.float().mean() > 0.7
    assert _err(out, ref, rows) < TOL[dtype]
    assert int(arrival_counters(out.device, 1).abs().sum()) == 0
    moe_only = _call(moe_block, t, ex, add_residual=False, **kw)
    ref = _call(moe_block_reference, t, ex, add_residual=False, **kw)
    assert _err(moe_only, ref, rows) < TOL[dtype]


@mma_gpu
@pytest.mark.parametrize("bm,programs,dsplit,sshared", [(8, 2, 1, (1, 1)), (16, 13, 2, (8, 2)), (8, 300, 4, (16, 1)),
                                                        (16, 1, 1, (2, 2)), (8, 5, 2, (0, 0))])
def test_fused_forced_splits_and_padding(bm, programs, dsplit, sshared):
    from tritree.kernels.moe import int4_mma as M
    from tritree.kernels.moe.align import min_blocks
    from tritree.kernels.moe.block import MoeBlockPlan, plan_moe_block

    N, top_k, E_all, H, I, Is = 24, 8, 64, 2048, 1024, 256
    t, ex, kw = _block(N, H, I, Is, E_all, 1, 0, 1, torch.bfloat16, bm + programs, "cuda", "mma")
    kw.update(eps=1e-6, top_k=top_k, tree_lens=torch.tensor([5, 12, 0], dtype=torch.int32, device="cuda"),
              rows_per_request=8)
    auto = plan_moe_block(N, H, E_all, E_all, I, Is, torch.bfloat16, torch.bfloat16, top_k, 1, 1, "sm_90", 132)
    plan = MoeBlockPlan(auto.route, M.Int4MmaPlan(bm, min_blocks(N * top_k, E_all, bm), programs, dsplit), sshared)
    out = torch.full((N, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    _call(moe_block, t, ex, out=out, plan=plan, **kw)
    ref = _call(moe_block_reference, t, ex, **kw)
    rows = _clear_rows(t, kw)
    assert torch.isfinite(out).all() and _err(out, ref, rows) < TOL[torch.bfloat16]
    assert int(arrival_counters(out.device, 1).abs().sum()) == 0
    assert not zeroed_workspace(out.device, 1).any()


@mma_gpu
def test_fused_graph_replay_equals_eager():
    N, H, I, Is, E_all = 17, 1024, 256, 256, 48
    t, ex, kw = _block(N, H, I, Is, E_all, 1, 0, 1, torch.bfloat16, 7, "cuda", "mma")
    kw.update(eps=1e-6, top_k=8, scaling=2.5)
    out = torch.empty(N, H, dtype=torch.bfloat16, device="cuda")
    _call(moe_block, t, ex, out=out, **kw)  # warm (compiles, plans)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _call(moe_block, t, ex, out=out, **kw)
    for seed in range(3):
        t["residual"].copy_(torch.randn(N, H, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16))
        out.fill_(float("nan"))
        graph.replay()
        eager = _call(moe_block, t, ex, **kw)
        torch.cuda.synchronize()
        assert torch.equal(out, eager) or _err(out, eager, slice(None)) < 1e-2
