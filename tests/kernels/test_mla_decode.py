"""The absorbed MLA steps of decode (``mla_query_``, ``mla_output``) against their float64 references: products,
RoPE, the latent RMSNorm, the paged write (every position that must change does, nothing else does), padding rows,
page boundaries, strided views; validation; on a GPU Kimi K2.6's per-rank shapes and a graph replay."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree.kernels import mla_decode as MD
from tritree.kernels.mla_decode import mla_output, mla_output_reference, mla_query_, mla_query_reference
from tritree.model.layers import cos_sin
from tritree.testing import paged_layout

from ..conftest import DEVICE

TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


def _query_case(B, T, H, nope, C, R, P, dtype, kv_dtype, seed, lens="random", strided=False):
    """Inputs of mla_query_ (``q`` and ``latent`` as views of wider rows when ``strided``, ``w_uk`` a view of a
    kv_b-shaped weight); the pool poisoned with NaN (float pools) or 0x7f bytes."""
    g = torch.Generator().manual_seed(seed)
    M = B * T
    D = nope + R
    qw = torch.randn(M, H, D + (8 if strided else 0), generator=g)
    q = qw[:, :, 4:4 + D] if strided else qw
    lw = torch.randn(M, C + R + (16 if strided else 0), generator=g)
    latent = lw[:, 8:8 + C + R] if strided else lw
    kv_b = torch.randn(H, nope + 24, C, generator=g) / nope**0.5  # nope key rows, then (value) rows
    w_uk = kv_b[:, :nope]
    norm_w = 1 + 0.1 * torch.randn(C, generator=g)
    kv_lens = torch.randint(0, 3 * P + 2, (B,), generator=g, dtype=torch.int32)
    if lens == "random":
        tree_lens = torch.randint(0, T + 1, (B,), generator=g, dtype=torch.int32)
        tree_lens[0] = T
    else:
        tree_lens = None
    table, num_pages = paged_layout([int(n) + T for n in kv_lens], B, P, extra_pages=2, generator=g)
    pos = kv_lens[:, None].long() + torch.arange(T)
    inv = 1.0 / (10000 ** (torch.arange(0, R, 2).float() / R))
    cos, sin = cos_sin(inv, pos.reshape(M), torch.float32)
    kv = torch.full((num_pages, P, C + R), float("nan")) if kv_dtype.is_floating_point else None
    dev = DEVICE
    t = [q.to(dtype), latent.to(dtype), w_uk.to(dtype), norm_w.to(dtype), cos.to(dtype), sin.to(dtype)]
    kv = kv.to(kv_dtype)
    return ([x.to(dev) for x in t] + [kv.to(dev), table.to(dev), kv_lens.to(dev),
                                      None if tree_lens is None else tree_lens.to(dev)])


def _check_query(args, T, eps=1e-6):
    q, latent, w_uk, g, cos, sin, kv, table, kv_lens, tree_lens = args
    kv_ref = kv.clone().cpu()
    out = torch.full((q.shape[0], q.shape[1], w_uk.shape[2] + cos.shape[1]), float("nan"), dtype=q.dtype,
                     device=q.device)
    res = mla_query_(q, latent, w_uk, g, cos, sin, kv, table, kv_lens, tree_lens, rows_per_request=T, eps=eps, out=out)
    assert res is out
    cpu = [None if a is None else a.cpu() for a in (q, latent, w_uk, g, cos, sin)]
    ref = mla_query_reference(*cpu, kv_ref, table.cpu(), kv_lens.cpu(), None if tree_lens is None else tree_lens.cpu(),
                              rows_per_request=T, eps=eps)
    rtol, atol = TOL[q.dtype]
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.cpu().double(), ref.double(), rtol=rtol, atol=atol)
    # The pool: written where the reference writes (close), untouched elsewhere (NaN in both).
    ktol = TOL.get(kv.dtype, TOL[torch.bfloat16])
    torch.testing.assert_close(kv.cpu().double(), kv_ref.double(), rtol=ktol[0], atol=ktol[1], equal_nan=True)
    return out


@settings(max_examples=25)
@given(B=st.integers(1, 3), T=st.integers(1, 9), H=st.integers(1, 3), nope=st.sampled_from([16, 32]),
       C=st.sampled_from([32, 48, 64]), R=st.sampled_from([8, 16]), P=st.sampled_from([1, 4, 16]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), kv_same=st.booleans(),
       lens=st.sampled_from(["random", None]), strided=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_query_matches_reference(B, T, H, nope, C, R, P, dtype, kv_same, lens, strided, seed):
    kv_dtype = dtype if kv_same else torch.float32
    _check_query(_query_case(B, T, H, nope, C, R, P, dtype, kv_dtype, seed, lens, strided), T)


def test_query_edges():
    """One row; a chain of rows crossing page boundaries at page size 1; a request with no real rows; more rows
    than one product row block (the CPU table's 32)."""
    _check_query(_query_case(1, 1, 1, 16, 32, 8, 1, torch.float32, torch.float32, 1), 1)
    args = _query_case(2, 7, 2, 16, 32, 8, 1, torch.float32, torch.float32, 2)
    args[-1] = torch.tensor([7, 0], dtype=torch.int32, device=DEVICE)
    _check_query(args, 7)
    _check_query(_query_case(3, 13, 2, 32, 64, 16, 4, torch.bfloat16, torch.bfloat16, 3), 13)


@settings(max_examples=20)
@given(M=st.integers(0, 40), H=st.integers(1, 3), C=st.sampled_from([32, 48, 64]), Vd=st.sampled_from([16, 24, 32]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), strided=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_output_matches_reference(M, H, C, Vd, dtype, strided, seed):
    g = torch.Generator().manual_seed(seed)
    ow = torch.randn(M, H, C + (8 if strided else 0), generator=g)
    o = (ow[:, :, 8:] if strided else ow).to(dtype).to(DEVICE)
    kv_b = (torch.randn(H, 16 + Vd, C, generator=g) / C**0.5).to(dtype).to(DEVICE)
    w_uv = kv_b[:, 16:]
    ob = torch.full((M, H * Vd + 4), float("nan"), dtype=dtype, device=DEVICE)
    out = mla_output(o, w_uv, out=ob[:, :H * Vd])
    ref = mla_output_reference(o.cpu(), w_uv.cpu())
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.cpu().double(), ref.double(), rtol=rtol, atol=atol)
    assert torch.isnan(ob[:, H * Vd:]).all()
    torch.testing.assert_close(mla_output(o, w_uv).cpu(), out.cpu())


def test_bad_inputs_name_the_argument():
    args = _query_case(2, 3, 2, 16, 32, 8, 4, torch.float32, torch.float32, 0)
    q, latent, w_uk, g, cos, sin, kv, table, kv_lens, tree_lens = args
    ok = dict(rows_per_request=3, eps=1e-6)

    def call(i, v, **kw):
        a = list(args)
        if i is not None:
            a[i] = v
        return mla_query_(*a, **{**ok, **kw})

    cases = [
        ((0, q.double()), {}, TypeError, "q must have dtype"),
        ((0, q[0]), {}, ValueError, "q must have 3 dimensions"),
        ((2, w_uk[:1]), {}, ValueError, "w_uk must have shape"),
        ((1, latent[:, :-1]), {}, ValueError, "latent must have shape"),
        ((3, g[:-1]), {}, ValueError, "norm_weight must have shape"),
        ((4, cos[:, :-2]), {}, ValueError, "cos must have shape"),
        ((6, kv[..., :-1]), {}, ValueError, "kv must have tokens"),
        ((None, None), dict(rows_per_request=4), ValueError, "multiple of rows_per_request"),
        ((8, kv_lens.long()), {}, TypeError, "kv_lens must have dtype"),
        ((9, tree_lens[:1]), {}, ValueError, "tree_lens must have shape"),
        ((None, None), dict(eps=-1.0), ValueError, "eps must be"),
    ]
    for (i, v), kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            call(i, v, **kw)
    o = torch.randn(3, 2, 32, device=DEVICE)
    with pytest.raises(ValueError, match="w_uv must have shape"):
        mla_output(o, torch.randn(3, 16, 32, device=DEVICE))
    with pytest.raises(TypeError, match="o must have dtype"):
        mla_output(o.double(), torch.randn(2, 16, 32, device=DEVICE))


def test_plans():
    p = MD.plan_mla(17, 512, "sm_90", True)
    assert p.grid(8) == (8 * 16 * 1 + 5, 1, 1) and MD.MlaPlan.from_ints(p.as_ints()) == p
    q = MD.plan_mla(65, 128, "sm_90", False)
    assert q.latent_programs == 0 and q.row_blocks == 2 and q.grid(8) == (8 * 4 * 2, 1, 1)
    with pytest.raises(ValueError, match="no config table for architecture 'sm_75'"):
        MD.config_for("sm_75", 1)


@pytest.mark.gpu
@pytest.mark.parametrize("T,B", [(17, 1), (65, 1), (9, 4)])
def test_gpu_kimi_shapes_and_graph_replay(T, B):
    """Kimi K2.6's TP8 rank: 8 heads, nope 128, C 512, R 64, pages of 64; the graph replay equals the eager call."""
    args = _query_case(B, T, 8, 128, 512, 64, 64, torch.bfloat16, torch.bfloat16, 5)
    out = _check_query(args, T)
    q, latent, w_uk, g, cos, sin, kv, table, kv_lens, tree_lens = args
    o = torch.randn(B * T, 8, 512, device="cuda", dtype=torch.bfloat16)
    w_uv = torch.randn(8, 128, 512, device="cuda", dtype=torch.bfloat16) / 23
    ov = mla_output(o, w_uv)
    torch.testing.assert_close(ov.double(), mla_output_reference(o, w_uv).double(), rtol=2e-2, atol=2e-2)
    kv2 = kv.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g = mla_query_(q, latent, w_uk, g, cos, sin, kv2, table, kv_lens, tree_lens, rows_per_request=T, eps=1e-6)
        ov_g = mla_output(o, w_uv)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_g, out) and torch.equal(ov_g, ov)
    assert torch.equal(kv2.nan_to_num(7.0), kv.nan_to_num(7.0))


def test_fake_impl_and_compile():
    """mla_output's fake impl propagates shapes; compiled calls (the ops traced) equal the eager ones, the pool's
    writes included."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    plan = MD.plan_mla(5, 16, "sm_90", False)
    with FakeTensorMode() as mode:
        out = torch.ops.tritree.mla_output(mode.from_tensor(torch.randn(5, 2, 32)), mode.from_tensor(torch.randn(2, 16, 32)),
                                           plan.as_ints())
    assert out.shape == (5, 32)
    args = _query_case(2, 3, 2, 16, 32, 8, 4, torch.float32, torch.float32, 7)
    q, latent, w_uk, g, cos, sin, kv, table, kv_lens, tree_lens = args
    kv_c = kv.clone()
    f = torch.compile(lambda q, kv: mla_query_(q, latent, w_uk, g, cos, sin, kv, table, kv_lens, tree_lens,
                                               rows_per_request=3, eps=1e-6), backend="aot_eager", fullgraph=True)
    got = f(q, kv_c)
    want = mla_query_(q, latent, w_uk, g, cos, sin, kv, table, kv_lens, tree_lens, rows_per_request=3, eps=1e-6)
    assert torch.equal(got, want) and torch.equal(kv_c.nan_to_num(7.0), kv.nan_to_num(7.0))
    o = torch.randn(6, 2, 32, device=DEVICE)
    w_uv = torch.randn(2, 16, 32, device=DEVICE)
    assert torch.equal(torch.compile(mla_output, backend="aot_eager", fullgraph=True)(o, w_uv), mla_output(o, w_uv))
