"""The one-launch MoE router against its float64 reference: logits to the inputs' rounding, selections exactly
(from the kernel's own logits, and on integer data with deliberate ties from the inputs), weights, padding;
validation, the plan and its config tables; on a GPU Kimi K2.6's shapes, CUDA-graph replays and repeated calls."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree.kernels._launch import _OLD_ZEROED, arrival_counters
from tritree.kernels.moe import router as R
from tritree.kernels.moe.router import (
    ROUTER_CONFIGS,
    RoutePlan,
    RouterConfig,
    moe_route,
    moe_route_reference,
    plan_moe_route,
)

from ...conftest import DEVICE

GROUPINGS = [(1, 1), (2, 1), (4, 2), (8, 4)]


def _selection_matches(idx, ref_idx, logits, bias):
    """``idx == ref_idx`` exactly, except where the float64 choices (``sigmoid(logits) + bias``) of the two
    picks are equal to fp32 rounding (the kernel chooses in fp32): then the picks must be equally good."""
    if torch.equal(idx, ref_idx):
        return
    choice = torch.sigmoid(logits.double()) + (0 if bias is None else bias.double())
    rows = torch.nonzero((idx != ref_idx).any(1)).flatten()
    for r in rows.tolist():
        a, b = idx[r].long(), ref_idx[r].long()
        assert (a >= 0).all() and (b >= 0).all(), (r, a, b)
        ca, cb = choice[r, a], choice[r, b]
        assert torch.allclose(ca, cb, rtol=0, atol=1e-6), (r, a.tolist(), b.tolist(), ca.tolist(), cb.tolist())


def _run(x, w, bias, tree_lens=None, T=None, plan=None, **opts):
    """moe_route with poisoned logits_out and workspaces; checks shapes, dtypes, that every logit was written
    and the counters are back at 0. Returns ``(idx, w, logits)`` on the CPU."""
    N, E = x.shape[0], w.shape[0]
    logits = torch.full((N, E), float("nan"), device=x.device)
    if N and plan is None and (x.device.type == "cuda" or R.interpreting()):
        # Poison the plan's workspaces: every element read must have been written in the same launch (an unwritten
        # candidate key would beat every written one).
        moe_route(x, w, bias, tree_lens=tree_lens, rows_per_request=T, logits_out=logits, **opts)
        for p in R._ROUTE_PLANS._plans.values():
            for t in (p._scratch.get(x.device) if hasattr(p, "_scratch") else ()):
                if t is not None:
                    t.fill_(float("nan") if t.is_floating_point() else torch.iinfo(t.dtype).max)
        logits.fill_(float("nan"))
    idx, wt = moe_route(x, w, bias, tree_lens=tree_lens, rows_per_request=T, logits_out=logits, plan=plan, **opts)
    assert idx.shape == (N, opts["top_k"]) and idx.dtype == torch.int32 and idx.device == x.device
    assert wt.shape == (N, opts["top_k"]) and wt.dtype == torch.float32
    assert not torch.isnan(logits).any()
    assert torch.isfinite(wt).all()
    if x.device.type == "cuda":
        torch.cuda.synchronize()
    if N and (x.device.type == "cuda" or R.interpreting()):
        assert int(arrival_counters(x.device, 1).abs().sum()) == 0  # every launch leaves its counters at 0
    return idx.cpu(), wt.cpu(), logits.cpu()


def _check(x, w, bias, tree_lens=None, T=None, plan=None, **opts):
    idx, wt, logits = _run(x, w, bias, tree_lens, T, plan, **opts)
    xc, wc = x.cpu(), w.cpu()
    bc = None if bias is None else bias.cpu()
    lens = None if tree_lens is None else tree_lens.cpu()
    ref_logits = xc.double() @ wc.double().t()
    H = x.shape[1]
    bound = (H + 2) * 2.0**-24 * (xc.double().abs() @ wc.double().abs().t()) + 1e-30  # fp32 sums, any order
    assert ((logits.double() - ref_logits).abs() <= bound).all(), float((logits.double() - ref_logits).abs().max())
    # The selection from the kernel's own logits (rounding in the GEMM cannot flip a near tie there).
    eye = torch.eye(w.shape[0], dtype=torch.float64)
    ri, rw = moe_route_reference(logits.double(), eye, bc, tree_lens=lens, rows_per_request=T, **opts)
    _selection_matches(idx, ri, logits, bc)
    same = (idx == ri).all(1)
    torch.testing.assert_close(wt[same], rw[same], rtol=1e-5, atol=1e-6)
    # Padding rows: -1 and 0; real rows: distinct experts in the local id range.
    if tree_lens is not None:
        pad = (torch.arange(x.shape[0]) % T) >= lens.repeat_interleave(T)
        assert (idx[pad] == -1).all() and (wt[pad] == 0).all()
    else:
        pad = torch.zeros(x.shape[0], dtype=torch.bool)
    real = idx[~pad].long() + opts.get("expert_offset", 0)
    assert ((real >= 0) & (real < w.shape[0])).all()
    assert all(len(set(r)) == len(r) for r in real.tolist())
    return idx, wt, logits


DTYPE_PAIRS = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
               (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)]


@settings(max_examples=50)
@given(N=st.integers(1, 130), E=st.sampled_from([32, 64, 96, 128, 256]), H=st.sampled_from([32, 64, 96]),
       top_k=st.integers(1, 8), grouping=st.sampled_from(GROUPINGS), has_bias=st.booleans(), norm=st.booleans(),
       scaling=st.sampled_from([1.0, 2.827, 0.5]), offset=st.sampled_from([0, 32, -5]),
       lens=st.sampled_from([None, "random"]), dtypes=st.sampled_from(DTYPE_PAIRS), seed=st.integers(0, 2**31 - 1))
def test_matches_reference(N, E, H, top_k, grouping, has_bias, norm, scaling, offset, lens, dtypes, seed):
    n_group, topk_group = grouping
    if E % n_group:
        n_group, topk_group = 1, 1
    top_k = min(top_k, topk_group * (E // n_group))
    g = torch.Generator().manual_seed(seed)
    xd, wd = dtypes
    x = torch.randn(N, H, generator=g).to(xd).to(DEVICE)
    w = (torch.randn(E, H, generator=g) / H**0.5).to(wd).to(DEVICE)
    bias = (0.1 * torch.randn(E, generator=g)).to(DEVICE) if has_bias else None
    tree_lens = T = None
    if lens is not None:  # N = B * T; lengths from 0 (all padding) to T (none)
        T = next(t for t in (5, 3, 2, 1) if N % t == 0)
        B = N // T
        tree_lens = torch.randint(0, T + 1, (B,), generator=g, dtype=torch.int32)
        tree_lens[0] = 0
        tree_lens[-1] = T
        tree_lens = tree_lens.to(DEVICE)
    _check(x, w, bias, tree_lens, T, top_k=top_k, n_group=n_group, topk_group=topk_group, norm_topk_prob=norm,
           scaling=scaling, expert_offset=offset)


# Integer data: logits are small non-negative integers (exact fp32 sums), biases a few multiples of 1/64 (one a
# group when there are groups): distinct choices and distinct group scores are far apart compared with fp32
# rounding, equal ones are sums of the same operands (so they tie in fp32 as in float64).
_BIAS_MARKS = (0, 1, 4, 9, 15, 22, 32, 34)  # a Golomb ruler


def _assert_ties_exact_or_far(x, w, b, n_group):
    """Every two float64 choices (and group scores) of a row are equal or more than 1e-6 apart."""
    choice = torch.sigmoid(x.double() @ w.double().t()) + (0 if b is None else b.double())
    gs = w.shape[0] // n_group
    top2 = torch.sort(choice.view(len(x), n_group, gs), -1, descending=True).values[..., :2].sum(-1)
    for v in (choice, top2):
        d = torch.diff(torch.sort(v, 1).values, dim=1)
        assert ((d == 0) | (d > 1e-6)).all()


def _integer_case(N, E, H, n_group, seed, bias=True):
    """x and weight in {0, 1}, at most 4 ones a weight row (logits in [0, 4]); expert rows (with their biases)
    and a whole group duplicated, so ties of experts and of groups are common."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 2, (N, H), generator=g).float()
    w = torch.zeros(E, H)
    for e in range(E):
        w[e, torch.randperm(H, generator=g)[:4]] = torch.randint(0, 2, (4,), generator=g).float()
    marks = torch.tensor(_BIAS_MARKS, dtype=torch.float32) / 64 - 0.25
    gs = E // n_group
    if n_group == 1:
        b = marks[torch.randint(0, len(marks), (E,), generator=g)]
    else:  # one bias a group: group scores of different groups never sum the same values in another order
        b = marks[torch.randperm(len(marks), generator=g)[:n_group]].repeat_interleave(gs)
    dup = torch.randperm(gs, generator=g)[:gs // 4 + 1]  # in the first group: also in its copy
    w[dup[1:]] = w[dup[0]].clone()
    b[dup[1:]] = b[dup[0]].clone()
    if n_group > 1:  # group 1 a copy of group 0
        w[gs:2 * gs] = w[:gs].clone()
        b[gs:2 * gs] = b[:gs].clone()
    b = b if bias else None
    _assert_ties_exact_or_far(x, w, b, n_group)
    return x, w, b


@pytest.mark.parametrize("n_group,topk_group", GROUPINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_integer_data_equals_reference_exactly(n_group, topk_group, dtype):
    """With exact logits the kernel's picks are the reference's, ties broken by the lower expert or group id,
    in descending order; weights to fp32 rounding."""
    N, E, H = 37, 64, 32
    for seed, bias in ((0, True), (1, False)):
        x, w, b = _integer_case(N, E, H, n_group, seed, bias)
        top_k = min(8, topk_group * E // n_group)
        opts = dict(top_k=top_k, n_group=n_group, topk_group=topk_group, scaling=2.5, expert_offset=3)
        xd, wd = x.to(dtype).to(DEVICE), w.to(dtype).to(DEVICE)
        idx, wt, logits = _run(xd, wd, None if b is None else b.to(DEVICE), **opts)
        assert torch.equal(logits, x @ w.t())
        ri, rw = moe_route_reference(x, w, b, **opts)
        assert torch.equal(idx, ri)
        torch.testing.assert_close(wt, rw, rtol=1e-5, atol=1e-6)
        # The ties were real: some row picks two experts of equal choice.
        choice = torch.sigmoid(x.double() @ w.double().t()) + (0 if b is None else b.double())
        picked = choice.gather(1, (idx + 3).long())
        assert (picked[:, 1:] == picked[:, :-1]).any()


def test_every_grid_path():
    """One expert tile / several, no split / split K (every split whole K tiles, a short last one), K and expert
    tails, several row blocks with a part-filled last one, one-row selection passes."""
    g = torch.Generator().manual_seed(3)
    N, H, E = 45, 160, 96
    x = torch.randn(N, H, generator=g).to(DEVICE)
    w = (torch.randn(E, H, generator=g) / H**0.5).to(DEVICE)
    b = (0.1 * torch.randn(E, generator=g)).to(DEVICE)
    configs = ((RouterConfig(16, 128, 32, 4, 1), 1), (RouterConfig(16, 32, 32, 4, 1), 1),
               (RouterConfig(32, 32, 64, 4, 1), 2), (RouterConfig(16, 64, 32, 4, 1, sel_lanes=128), 4))
    # Groups (every lane read by the selection), one group (the tiles' candidates), one group with more picks
    # than a tile has experts (a tile's every expert a candidate).
    routings = (dict(top_k=6, n_group=4, topk_group=2), dict(top_k=6), dict(top_k=40))
    for (cfg, split), opts in itertools.product(configs, routings):
        k_tiles = -(-H // cfg.block_k)
        per = -(-k_tiles // split)
        tiles = -(-E // cfg.block_e)
        lanes = R._sel_lanes(E, opts["top_k"], opts.get("n_group", 1), cfg.block_e, tiles)
        sel = 1 << (max(1, min(cfg.block_t, cfg.sel_lanes // lanes)).bit_length() - 1)
        plan = RoutePlan(cfg, -(-N // cfg.block_t), tiles, -(-k_tiles // per), per * cfg.block_k, sel)
        _check(x, w, b, plan=plan, **opts)


def test_strided_inputs_and_logits_out():
    """x and logits_out with padded rows; the weight's rows strided too."""
    g = torch.Generator().manual_seed(4)
    N, H, E = 9, 64, 32
    xb = torch.randn(N, H + 32, generator=g).to(DEVICE)
    wb = (torch.randn(E, H + 16, generator=g) / 8).to(DEVICE)
    x, w = xb[:, 16:16 + H], wb[:, :H]
    lb = torch.full((N, E + 8), float("nan"), device=DEVICE)
    idx, wt = moe_route(x, w, top_k=4, logits_out=lb[:, :E])
    ri, rw = moe_route_reference(x.cpu(), w.cpu(), top_k=4)
    torch.testing.assert_close(lb[:, :E].cpu().double(), x.cpu().double() @ w.cpu().double().t(), rtol=1e-5,
                               atol=1e-5)
    assert torch.isnan(lb[:, E:]).all()
    _selection_matches(idx.cpu(), ri, lb[:, :E].cpu(), None)


def test_empty_batch_and_no_gradient_kernel():
    w = torch.randn(32, 64, device=DEVICE)
    idx, wt = moe_route(torch.randn(0, 64, device=DEVICE), w, top_k=2)
    assert idx.shape == (0, 2) and wt.shape == (0, 2)
    # Gradients: the reference (float32) runs, and the weights are differentiable in x and the weight.
    x = torch.randn(3, 64, device=DEVICE, requires_grad=True)
    wg = w.clone().requires_grad_(True)
    idx, wt = moe_route(x, wg, top_k=2, scaling=2.0)
    wt.sum().backward()
    assert x.grad is not None and wg.grad is not None


def test_bad_inputs_name_the_argument():
    x = torch.randn(4, 64)
    w = torch.randn(32, 64)
    b = torch.zeros(32)
    lens = torch.tensor([2, 1], dtype=torch.int32)
    ok = dict(top_k=2)
    cases = [
        (([[0.0]], w), ok, TypeError, "x must be a torch.Tensor"),
        ((x.double(), w), ok, TypeError, "x must have dtype"),
        ((x[0], w), ok, ValueError, "x must have 2 dimensions"),
        ((x.t().contiguous().t(), w), ok, ValueError, "x must be contiguous in its last dimension"),
        ((x, w.to(torch.int32)), ok, TypeError, "weight must have dtype"),
        ((x, w[:, :32]), ok, ValueError, "weight must have shape"),
        ((x, w, b.half()), ok, TypeError, "bias must have dtype"),
        ((x, w, b[:16]), ok, ValueError, "bias must have shape"),
        ((x, w), dict(top_k=0), ValueError, "top_k must be in"),
        ((x, w), dict(top_k=33), ValueError, "top_k = 33 exceeds the E = 32 experts of weight"),
        ((x, w), dict(top_k=2.0), TypeError, "top_k must be an int"),
        ((x, w), dict(top_k=2, n_group=3), ValueError, "n_group = 3 must divide"),
        ((x, w), dict(top_k=2, n_group=32), ValueError, "at least 2 experts"),
        ((x, w), dict(top_k=2, n_group=4, topk_group=5), ValueError, "topk_group must be in"),
        ((x, w), dict(top_k=2, n_group=4, topk_group=0), ValueError, "topk_group must be in"),
        ((x, w), dict(top_k=9, n_group=4, topk_group=1), ValueError, "top_k = 9 exceeds"),
        ((x, w), dict(top_k=2, norm_topk_prob=1), TypeError, "norm_topk_prob must be a bool"),
        ((x, w), dict(top_k=2, scaling=float("inf")), ValueError, "scaling must be a finite"),
        ((x, w), dict(top_k=2, scaling="2"), TypeError, "scaling must be a number"),
        ((x, w), dict(top_k=2, expert_offset=1.5), TypeError, "expert_offset must be an int"),
        ((x, w), dict(top_k=2, tree_lens=lens), ValueError, "tree_lens and rows_per_request"),
        ((x, w), dict(top_k=2, rows_per_request=2), ValueError, "tree_lens and rows_per_request"),
        ((x, w), dict(top_k=2, tree_lens=lens, rows_per_request=3), ValueError, "N = B \\* rows_per_request"),
        ((x, w), dict(top_k=2, tree_lens=lens.long(), rows_per_request=2), TypeError, "tree_lens must have dtype"),
        ((x, w), dict(top_k=2, tree_lens=lens, rows_per_request=0), ValueError, "rows_per_request must be in"),
        ((x, w), dict(top_k=2, tree_lens=torch.tensor([3, 1], dtype=torch.int32), rows_per_request=2), ValueError,
         "tree_lens\\[0\\] = 3 must be in \\[0, 2\\]"),
        ((x, w), dict(top_k=2, logits_out=torch.empty(4, 31)), ValueError, "logits_out must have shape"),
        ((x, w), dict(top_k=2, logits_out=torch.empty(4, 32).half()), TypeError, "logits_out must have dtype"),
        ((x, w), dict(top_k=2, plan="p"), TypeError, "plan must be a RoutePlan"),
        ((x, w), dict(top_k=2, plan=RoutePlan(RouterConfig(16, 16, 16, 4, 1), 1, 1, 1, 16, 1)), ValueError,
         "plan does not cover"),
        ((x, w, b.to("meta")), ok, ValueError, "bias must be on"),
    ]
    for args, kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            moe_route(*args, **kw)


def test_plan_and_splits():
    """From static shapes, cached; at decode the K split brings the programs to about ``programs_per_sm`` an SM
    (one on sm_90 for one or two row blocks) in whole K tiles (no empty split); many rows take no split."""
    p = plan_moe_route(1, 7168, 384, torch.bfloat16, torch.bfloat16, 8, 1, 1, "sm_90", 132)
    assert p is plan_moe_route(1, 7168, 384, torch.bfloat16, torch.bfloat16, 8, 1, 1, "sm_90", 132)
    assert p.config is ROUTER_CONFIGS["sm_90"][16]
    assert p.grid == (1, 12, 10) and p.k_split == 6 * 128 and p.sel_rows == 16  # 96 candidates a row
    for N, arch, sms in itertools.product((1, 9, 17, 33, 65, 129, 130, 1024, 8192), ("sm_90", "sm_120"), (132, 188)):
        q = plan_moe_route(N, 7168, 384, torch.bfloat16, torch.bfloat16, 8, 8, 4, arch, sms)
        c = q.config
        k_tiles = 7168 // c.block_k
        assert q.row_blocks == -(-N // c.block_t) and q.expert_tiles == -(-384 // c.block_e)
        assert q.k_split % c.block_k == 0 and (q.split_k - 1) * q.k_split < 7168 <= q.split_k * q.k_split
        programs = q.row_blocks * q.expert_tiles
        if programs >= c.programs_per_sm * sms:
            assert q.split_k == 1
        else:
            assert q.split_k <= min(R.MAX_SPLIT_K, k_tiles)
            assert q.split_k * programs <= 2 * c.programs_per_sm * sms
        lanes = R._lanes(384, 8)
        assert c.block_t % q.sel_rows == 0 and q.sel_rows * lanes <= max(c.sel_lanes, lanes)
        assert RoutePlan.from_ints(q.as_ints()) == q
    assert plan_moe_route(8192, 7168, 384, torch.bfloat16, torch.bfloat16, 8, 1, 1, "sm_90", 132).split_k == 1
    # An architecture the table lacks: the error every op's lookup gives.
    with pytest.raises(ValueError, match="no config table for architecture 'sm_75'"):
        R.config_for("sm_75", 1)
    assert R.config_for("sm_120", 17) is ROUTER_CONFIGS["sm_120"][256]
    assert R.config_for("sm_120", 100_000) is ROUTER_CONFIGS["sm_120"][1 << 30]


@pytest.mark.parametrize("arch", ["sm_90", "sm_120", "sm_80", "cpu"])
def test_config_tables(arch):
    """Every table has buckets up to any row count; tiles of at least 16 (tl.dot), powers of two; the
    pipelined tiles of fp32 inputs fit the architecture's shared memory (the AOT audit checks the compiles)."""
    from tritree.kernels.configs import SHARED_MEMORY_LIMIT

    table = ROUTER_CONFIGS[arch]
    assert max(table) >= 1 << 30
    for cfg in table.values():
        for v in (cfg.block_t, cfg.block_e, cfg.block_k, cfg.num_warps, cfg.sel_lanes):
            assert v >= 1 and v & (v - 1) == 0
        assert min(cfg.block_t, cfg.block_e, cfg.block_k) >= 16 and cfg.num_stages >= 1
        if arch in SHARED_MEMORY_LIMIT:
            assert (cfg.num_stages - 1) * (cfg.block_t + cfg.block_e) * cfg.block_k * 4 <= SHARED_MEMORY_LIMIT[arch]


def test_counters_are_shared_and_grown():
    dev = DEVICE
    a = arrival_counters(dev, 10)
    assert a.numel() >= 4096 and arrival_counters(dev, a.numel()) is a and int(a.abs().sum()) == 0
    big = arrival_counters(dev, a.numel() + 1)  # grown to the next power of two; the old one kept (graphs may use it)
    assert big.numel() == 2 * a.numel() and arrival_counters(dev, 10) is big and any(t is a for t in _OLD_ZEROED)
    assert int(big.abs().sum()) == 0


def test_fake_impl_and_compile():
    """The op's fake impl propagates shapes (torch.compile's view of it); a compiled call equals the eager one."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    plan = plan_moe_route(3, 64, 32, torch.float32, torch.float32, 2, 1, 1, "sm_90", 132)
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(torch.randn(3, 64))
        fw = mode.from_tensor(torch.randn(32, 64))
        idx, w = torch.ops.tritree.moe_route(fx, fw, None, None, None, plan.as_ints(), 2, 1, 1, True, 1.0, 0, 0)
    assert idx.shape == (3, 2) and idx.dtype == torch.int32 and w.dtype == torch.float32
    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, 64, generator=g).to(DEVICE)
    wt = torch.randn(32, 64, generator=g).to(DEVICE)
    b = torch.randn(32, generator=g).to(DEVICE)
    f = torch.compile(lambda x: moe_route(x, wt, b, top_k=3, n_group=4, topk_group=2, scaling=2.0),
                      backend="aot_eager", fullgraph=True)
    ci, cw = f(x)
    ei, ew = moe_route(x, wt, b, top_k=3, n_group=4, topk_group=2, scaling=2.0)
    assert torch.equal(ci, ei) and torch.equal(cw, ew)


# --------------------------------------------------------------------------------------------------
# GPU: Kimi K2.6's and DeepSeek-V3's routing at H = 7168, E = 384
# --------------------------------------------------------------------------------------------------

def _k2_inputs(N, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(N, 7168, generator=g, device="cuda").to(dtype)
    w = (torch.randn(384, 7168, generator=g, device="cuda") / 7168**0.5).to(dtype)
    b = 0.05 * torch.randn(384, generator=g, device="cuda")
    return x, w, b


@pytest.mark.gpu
@pytest.mark.parametrize("N", [1, 17, 65, 130])
@pytest.mark.parametrize("n_group,topk_group", [(1, 1), (8, 4)])
def test_gpu_kimi_shapes(N, n_group, topk_group):
    x, w, b = _k2_inputs(N)
    T = 1 if N == 1 else (17 if N % 17 == 0 else (13 if N % 13 == 0 else 5))
    lens = torch.randint(0, T + 1, (N // T,), device="cuda", dtype=torch.int32)
    opts = dict(top_k=8, n_group=n_group, topk_group=topk_group, scaling=2.827, expert_offset=48)
    _check(x, w, b, lens, T, **opts)
    _check(x.float(), w, b, **opts)  # fp32 activations over the bf16 weight


@pytest.mark.gpu
@pytest.mark.parametrize("n_group,topk_group", [(1, 1), (8, 4)])
def test_gpu_graph_replay_and_repeats_are_identical(n_group, topk_group):
    """Repeated calls give the same bits (the counters are reset, the sums ordered); a captured graph replays
    to the eager result, with new inputs copied in."""
    opts = dict(top_k=8, n_group=n_group, topk_group=topk_group, scaling=2.827)
    for N in (1, 17, 130):
        x, w, b = _k2_inputs(N, seed=1)
        first = moe_route(x, w, b, **opts)
        for _ in range(5):
            again = moe_route(x, w, b, **opts)
            assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
        logits = torch.empty(N, 384, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            moe_route(x, w, b, logits_out=logits, **opts)  # warm on the side stream (compiles, plans)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gi, gw = moe_route(x, w, b, logits_out=logits, **opts)
        x2 = _k2_inputs(N, seed=2)[0]
        x.copy_(x2)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        ei, ew = moe_route(x2, w, b, **opts)
        assert torch.equal(gi, ei) and torch.equal(gw, ew)
        ri, _ = moe_route_reference(logits.double(), torch.eye(384, dtype=torch.float64, device="cuda"), b, **opts)
        _selection_matches(gi.cpu(), ri.cpu(), logits.cpu(), b.cpu())
