"""The skinny linear against its float64 reference: shapes, dtypes, the row RMS norm, bias and residual, strided
rows and destinations, in-place residual; poisoned outputs and workspaces; validation, the plan and its config
tables; the op under torch.compile; on a GPU Kimi K2.6's projection shapes and CUDA-graph replays."""

import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree.kernels.linear import LINEAR_CONFIGS, LinearConfig, linear, linear_reference, plan_linear, row_bound

from ..conftest import DEVICE

L = importlib.import_module("tritree.kernels.linear")  # the module (the package's ``linear`` is the op)

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def _inputs(M, N, K, dtype, seed, norm=False, bias=False, residual=False, row_pad=0):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(M, K + row_pad, generator=g)
    x = xs.to(dtype).to(DEVICE)[:, :K]  # rows of K + row_pad: a row stride past K
    w = (torch.randn(N, K, generator=g) / max(1, K) ** 0.5).to(dtype).to(DEVICE)
    eps = 1e-6 if norm else None
    b = torch.randn(N, generator=g).to(dtype).to(DEVICE) if bias else None
    r = torch.randn(M, N, generator=g).to(dtype).to(DEVICE) if residual else None
    return x, w, eps, b, r


def _poison_workspaces():
    for p in L._LINEAR_PLANS._plans.values():
        if getattr(p, "kernel", False):
            for t in p._scratch.get(torch.device(DEVICE)):
                t.fill_(float("nan"))


def _check(x, w, eps, b, r, out=None, plan=None, nw=None, act=None):
    """linear with a poisoned destination and workspaces against the float64 reference (scaled by the sizes of
    the terms), every element written."""
    M, N = x.shape[0], w.shape[0] // (2 if act else 1)
    ref = linear_reference(x, w, b, rms_eps=eps, norm_weight=nw, act=act, residual=r).double()
    if out is None:
        out = torch.full((M, N + 3), float("nan"), dtype=x.dtype, device=x.device)[:, :N]  # a strided destination
    else:
        out.fill_(float("nan"))
    linear(x, w, b, rms_eps=eps, norm_weight=nw, act=act, residual=r, out=out, plan=plan)  # plans and warms
    _poison_workspaces()
    if r is None or out.data_ptr() != r.data_ptr():
        out.fill_(float("nan"))
    y = linear(x, w, b, rms_eps=eps, norm_weight=nw, act=act, residual=r, out=out, plan=plan)
    assert y.data_ptr() == out.data_ptr() and y.dtype == x.dtype
    assert not torch.isnan(y).any()
    scale = 1.0 + (ref.abs().max().item() if M else 0.0)
    err = (y.double() - ref).abs().max().item() if M else 0.0
    assert err <= TOL[x.dtype] * scale, (err, scale)
    return y


@settings(max_examples=25)
@given(M=st.integers(0, 70), N=st.integers(1, 100), K=st.integers(1, 200),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), norm=st.booleans(), bias=st.booleans(),
       residual=st.booleans(), row_pad=st.sampled_from([0, 5]), norm_weight=st.sampled_from([None, "x", "fp32"]),
       act=st.sampled_from([None, "silu_mul"]), seed=st.integers(0, 2**16))
def test_matches_reference(M, N, K, dtype, norm, bias, residual, row_pad, norm_weight, act, seed):
    x, w, eps, b, r = _inputs(M, N, K, dtype, seed, norm, bias, residual, row_pad)
    if act:  # gate | up: 2N weight rows (and biases) for N output columns; the same x (drawn first)
        x, w, eps, b, _ = _inputs(M, 2 * N, K, dtype, seed, norm, bias, False, row_pad)
    nw = None
    if norm and norm_weight is not None:  # the RMSNorm's weight given to the op (not folded into w)
        nw = (1 + 0.5 * torch.randn(K, generator=torch.Generator().manual_seed(seed + 1)))
        nw = nw.to(dtype if norm_weight == "x" else torch.float32).to(DEVICE)
    _check(x, w, eps, b, r, nw=nw, act=act)


def test_every_grid_path():
    """One K split and several, one row block and several, ragged K (a partial last tile), the residual added in
    place (out is residual), the fresh-output form."""
    for M, N, K, cfg in ((3, 40, 100, LinearConfig(16, 16, 16, 4, 1)), (40, 40, 64, LinearConfig(16, 32, 64, 4, 1)),
                         (5, 17, 33, LinearConfig(16, 16, 32, 4, 1, programs_per_sm=1))):
        plan = plan_linear(M, N, K, torch.float32, "cpu", 4, cfg)
        x, w, eps, b, r = _inputs(M, N, K, torch.float32, 1, True, True, True)
        _check(x, w, eps, b, r, plan=plan)
        _check(x, w, eps, b, r, plan=plan, nw=torch.linspace(0.5, 1.5, K, device=DEVICE))
        # gate | up rows and silu(gate) * up: 2N weight rows, N output columns (the residual's)
        _, wg, _, bg, _ = _inputs(M, 2 * N, K, torch.float32, 2, True, True)
        _check(x, wg, eps, bg, r, plan=plan_linear(M, 2 * N, K, torch.float32, "cpu", 4, cfg), act="silu_mul")
        _check(x, w, None, None, r, out=r.clone(), plan=plan)
        ref = linear_reference(x, w, b, rms_eps=eps, residual=r).double()
        inplace = r.clone()
        linear(x, w, b, rms_eps=eps, residual=inplace, out=inplace, plan=plan)
        assert (inplace.double() - ref).abs().max() < 1e-4 * (1 + ref.abs().max())
        y = linear(x, w, plan=plan)
        assert y.shape == (M, N) and (y.double() - linear_reference(x, w).double()).abs().max() < 1e-4


def test_plan_and_splits():
    for M, N, K in ((1, 1536, 7168), (17, 576, 7168), (32, 2048, 512), (5, 7168, 1024), (20, 64, 64)):
        p = plan_linear(M, N, K, torch.bfloat16, "sm_90", 132)
        c = p.config
        assert p.kernel and p.row_blocks * c.block_m >= M and p.col_tiles * c.block_n >= N
        k_tiles = -(-K // c.block_k)
        assert p.k_split % c.block_k == 0 and p.split_k * p.k_split >= K and (p.split_k - 1) * p.k_split < K
        assert p.split_k <= max(1, k_tiles) and p.grid == (p.row_blocks, p.col_tiles, p.split_k)
        assert LinearConfig(*p.as_ints()[1:7]) == c and L.LinearPlan.from_ints(p.as_ints()) == p
    assert row_bound("sm_90") == 32
    with pytest.raises(ValueError, match="no config table for architecture 'sm_75'"):
        row_bound("sm_75")
    assert not plan_linear(33, 64, 64, torch.bfloat16, "sm_90", 132).kernel  # cuBLAS past the bound
    # With the row norm the composed ops add a launch: the ":norm" table serves more rows, in blocks of 32.
    assert row_bound("sm_90", norm=True) == 96 and row_bound("sm_80", norm=True) == 32
    normed = plan_linear(65, 2112, 7168, torch.bfloat16, "sm_90", 132, norm=True)
    assert normed.kernel and normed.config.block_m == 32 and normed.row_blocks == 3
    assert plan_linear(17, 64, 64, torch.bfloat16, "sm_90", 132, norm=True).config.block_m == 16
    assert not plan_linear(97, 64, 64, torch.bfloat16, "sm_90", 132, norm=True).kernel
    with pytest.raises(ValueError, match="no config table for architecture 'sm_75'"):
        plan_linear(4, 64, 64, torch.bfloat16, "sm_75", 132, norm=True)
    big = plan_linear(300, 64, 64, torch.bfloat16, "sm_90", 132, LinearConfig(64, 64, 64, 4, 3))
    assert big.kernel and big.row_blocks == 5  # a given config runs the kernel at any row count
    assert not plan_linear(4, 64, 64, torch.float32, "sm_90", 132).kernel  # fp32 rows: the composed ops
    assert plan_linear(4, 64, 64, torch.float32, "cpu", 4).kernel  # ... except under the interpreter (tests)


@pytest.mark.parametrize("arch", ["sm_90", "sm_120", "sm_80"])
def test_config_tables(arch):
    """Every table's tiles are at least 16 (``tl.dot``) and cover its largest bucket's rows in whole row blocks; the
    AOT audit checks that each compiles within the architecture's shared memory and without spills."""
    table = LINEAR_CONFIGS[arch]
    assert max(table) == row_bound(arch) >= 16 and row_bound(arch, norm=True) >= row_bound(arch)
    norm_table = LINEAR_CONFIGS.get(f"{arch}:norm", {})
    assert all(bound % cfg.block_m == 0 for bound, cfg in norm_table.items())
    for cfg in [*table.values(), *norm_table.values()]:
        assert min(cfg.block_m, cfg.block_n, cfg.block_k) >= 16 and cfg.num_stages >= 1
        assert 1 <= L.sum_unroll(cfg) <= 8


def test_empty_rows_and_gradients():
    x, w, eps, b, r = _inputs(0, 8, 16, torch.float32, 0, True, True, True)
    assert linear(x, w, b, rms_eps=eps, residual=r).shape == (0, 8)
    x, w, eps, b, r = _inputs(3, 8, 16, torch.float32, 0, True, True, False)
    w.requires_grad_(True)
    y = linear(x, w, b, rms_eps=eps)  # autograd: the composed ops
    y.sum().backward()
    assert w.grad is not None and w.grad.shape == w.shape


def test_bad_inputs_name_the_argument():
    x, w, eps, b, r = _inputs(4, 8, 16, torch.float32, 0, True, True, True)
    cases = [
        (dict(x=x[0]), "x"),
        (dict(weight=w.half()), "weight"),
        (dict(weight=w[:, :8]), "weight"),
        (dict(x=x.t().contiguous().t()), "x"),
        (dict(bias=b[:4]), "bias"),
        (dict(rms_eps=-1.0), "rms_eps"),
        (dict(rms_eps="small"), "rms_eps"),
        (dict(residual=r[:, :4]), "residual"),
        (dict(out=torch.empty(4, 8, dtype=torch.float16, device=DEVICE)), "out"),
        (dict(out=torch.empty(8, 4, device=DEVICE).t()), "out"),
        (dict(plan="fast"), "plan"),
        (dict(plan=L.LinearPlan(True, LinearConfig(16, 16, 16, 4, 1), 1, 1, 1, 8)), "plan"),
        (dict(norm_weight=torch.ones(16, device=DEVICE)), "norm_weight needs rms_eps"),
        (dict(rms_eps=1e-6, norm_weight=torch.ones(8, device=DEVICE)), "norm_weight"),
        (dict(rms_eps=1e-6, norm_weight=torch.ones(16, device=DEVICE, dtype=torch.float16)), "norm_weight"),
        (dict(act="gelu"), "act must be one of"),
        (dict(act="silu_mul", weight=w[:7]), "even count"),
        (dict(act="silu_mul", residual=r), "residual must have shape"),
    ]
    for kw, name in cases:
        args = dict(x=x, weight=w, bias=None, rms_eps=None, norm_weight=None, act=None, residual=None, out=None,
                    plan=None)
        args.update(kw)
        with pytest.raises((ValueError, TypeError), match=name):
            linear(args.pop("x"), args.pop("weight"), args.pop("bias"), **args)
    with pytest.raises(ValueError, match="alias"):
        linear(x, w, out=x[:, :8])


def test_fake_impl_and_compile():
    """The ops' fake impls propagate shapes; a compiled call equals the eager one (with and without ``out``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    plan = plan_linear(3, 8, 16, torch.float32, "sm_90", 132)
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(torch.randn(3, 16))
        fw = mode.from_tensor(torch.randn(8, 16))
        y = torch.ops.tritree.linear(fx, fw, None, None, None, plan.as_ints(), 1e-6, False)
        h = torch.ops.tritree.linear(fx, fw, None, None, None, plan.as_ints(), 1e-6, True)
    assert y.shape == (3, 8) and h.shape == (3, 4)
    x, w, eps, b, r = _inputs(5, 24, 40, torch.float32, 3, True, True, True)
    f = torch.compile(lambda x: linear(x, w, b, rms_eps=eps, residual=r), backend="aot_eager", fullgraph=True)
    assert torch.allclose(f(x), linear(x, w, b, rms_eps=eps, residual=r), rtol=0, atol=1e-5)
    out = torch.empty(5, 24, device=DEVICE)
    g = torch.compile(lambda x: linear(x, w, out=out), backend="aot_eager", fullgraph=True)
    g(x)
    assert torch.allclose(out, linear(x, w), rtol=0, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# GPU: Kimi K2.6's projection shapes (one TP8 rank) and graph replays
# --------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("N,K", [(1536, 7168), (576, 7168), (2048, 512), (7168, 1024)])
@pytest.mark.parametrize("M", [1, 17, 32, 65, 96, 97, 300])
def test_gpu_projection_shapes(M, N, K):
    x, w, eps, b, r = _inputs(M, N, K, torch.bfloat16, M + N, True, False, True)
    _check(x, w, eps, None, r)
    _check(x, w, None, None, None)


@pytest.mark.gpu
def test_gpu_graph_replay_equals_eager():
    for M in (1, 17, 65):
        x, w, eps, b, r = _inputs(M, 1536, 7168, torch.bfloat16, 7, True, True, True)
        first = linear(x, w, b, rms_eps=eps, residual=r)
        assert torch.equal(linear(x, w, b, rms_eps=eps, residual=r), first)  # counters reset, sums ordered
        out = torch.empty_like(first)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            linear(x, w, b, rms_eps=eps, residual=r, out=out)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            linear(x, w, b, rms_eps=eps, residual=r, out=out)
        x.copy_(_inputs(M, 1536, 7168, torch.bfloat16, 8)[0])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, linear(x, w, b, rms_eps=eps, residual=r))


@pytest.mark.gpu
@pytest.mark.parametrize("N", [1280, 2112])
@pytest.mark.parametrize("M", [1, 8, 40])
@pytest.mark.parametrize("splits", [3, 7, 8])
def test_gpu_k_splits_with_the_row_norm_repeat_bitwise(N, M, splits):
    """The split reduction with the row norm at the draft's and the target's 7168-column shapes, odd and even split
    counts, one row, eight and two blocks of the ":norm" table's 32 rows: against the reference, and 20 repeats
    (fresh poison between them) bit-identical (the partials are summed in split order, so any difference is a
    race)."""
    K = 7168
    x, w, eps, b, r = _inputs(M, N, K, torch.bfloat16, N + M + splits, True, False, False)
    cfg = L.config_for("sm_90", M, norm=True)
    per = -(-(K // cfg.block_k) // splits)
    plan = L.LinearPlan(True, cfg, -(-M // cfg.block_m), -(-N // cfg.block_n), -(-(K // cfg.block_k) // per), per * cfg.block_k)
    first = _check(x, w, eps, None, None, plan=plan).clone()
    for _ in range(20):
        _poison_workspaces()
        assert torch.equal(linear(x, w, rms_eps=eps, plan=plan), first)
