"""``head_norm_rope`` (per-head RMSNorm and RoPE in one launch) against its float64 reference and against the composed
model functions it replaces: head counts and sizes (non-powers of two), positions past 2^16, with and without the
norm, one norm weight for all heads or one a head, amplitudes, strided inputs and outputs (in place, heads of a wider
tensor), poisoned outputs; validation; on a GPU the draft's shapes and a graph replay."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree.kernels.head_rope import head_norm_rope, head_norm_rope_reference
from tritree.model.layers import apply_rope, cos_sin, rms_norm, yarn_inv_freq

from ..conftest import DEVICE

TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1.6e-2), torch.float16: (2e-3, 2e-3)}


def _case(lead, H, D, dtype, seed, norm=True, max_pos=1 << 17, strided=False, per_head=False):
    g = torch.Generator().manual_seed(seed)
    xw = torch.randn(*lead, H, D + (6 if strided else 0), generator=g) * 3
    x = xw[..., 2:2 + D] if strided else xw
    w = 1 + 0.1 * torch.randn(*((H, D) if per_head else (D,)), generator=g) if norm else None
    pos = torch.randint(0, max_pos, lead, generator=g)
    inv = yarn_inv_freq(D, 50000.0, {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096})
    dev = DEVICE
    return (x.to(dtype).to(dev), None if w is None else w.to(dtype).to(dev), pos.to(dev), inv.to(dev))


def _check(x, w, pos, inv, eps=1e-6, amplitude=1.0):
    out = torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)
    res = head_norm_rope(x, w, pos, inv, eps=eps, amplitude=amplitude, out=out)
    assert res is out
    assert not out.isnan().any()  # every element written
    ref = head_norm_rope_reference(x.cpu(), None if w is None else w.cpu(), pos.cpu(), inv.cpu(), eps, amplitude)
    atol, rtol = TOL[x.dtype]
    torch.testing.assert_close(out.cpu().double(), ref, atol=atol * amplitude, rtol=rtol)


@settings(max_examples=12, deadline=None)
@given(B=st.integers(1, 3), S=st.integers(1, 5), H=st.integers(1, 9), D=st.sampled_from([2, 6, 16, 24, 64]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), norm=st.booleans(),
       strided=st.booleans(), per_head=st.booleans(), amplitude=st.sampled_from([1.0, 0.7]), seed=st.integers(0, 2**16))
def test_head_norm_rope_matches_reference(B, S, H, D, dtype, norm, strided, per_head, amplitude, seed):
    _check(*_case((B, S), H, D, dtype, seed, norm=norm, strided=strided, per_head=per_head), amplitude=amplitude)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_norm_rope_in_place_on_heads_of_a_wider_tensor(dtype):
    """``out = x``, a view of the first heads of a wider row (the draft's q | k heads of its fused q | k | v
    projection): those heads become the reference's, every other element keeps its value."""
    x, w, pos, inv = _case((2, 3), 7, 32, dtype, 5, per_head=True)
    wide = torch.randn(2, 3, 9, 32, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    heads = wide[:, :, :7]
    heads.copy_(x)
    before = wide.clone()
    ref = head_norm_rope_reference(x.cpu(), w.cpu(), pos.cpu(), inv.cpu(), 1e-6)
    assert head_norm_rope(heads, w, pos, inv, out=heads) is heads
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(heads.cpu().double(), ref, atol=atol, rtol=rtol)
    assert torch.equal(wide[:, :, 7:], before[:, :, 7:])
    # and into a view of other heads of the same row, x left as it was
    x2 = before[:, :, :7]
    out = wide[:, :, 2:9]
    head_norm_rope(x2.clone(), w, pos, inv, out=out)
    torch.testing.assert_close(out.cpu().double(), head_norm_rope_reference(x2.cpu(), w.cpu(), pos.cpu(), inv.cpu(),
                                                                            1e-6), atol=atol, rtol=rtol)


def test_head_norm_rope_far_positions():
    """Positions up to 2^20 (angles past the 105,615 where float32 sine reductions change method): float32 within
    the dtype's tolerance of the exact cosine and sine of the float32 angle."""
    x, w, pos, inv = _case((3, 40), 2, 128, torch.float32, 9, max_pos=1 << 20)
    pos[0, :4] = torch.tensor([105614, 105616, (1 << 20) - 1, 1 << 17], device=pos.device)
    _check(x, w, pos, inv)


@pytest.mark.parametrize("lead", [(1,), (2, 3, 1)])
def test_head_norm_rope_leading_dims_and_one_row(lead):
    _check(*_case(lead, 3, 16, torch.float32, 7))


def test_head_norm_rope_equals_the_composed_model_functions():
    """What the draft computed before: rms_norm, cos_sin and apply_rope (float32: to rounding)."""
    x, w, pos, inv = _case((2, 4), 5, 32, torch.float32, 3)
    cos, sin = cos_sin(inv, pos, torch.float32, 0.9)
    want = apply_rope(rms_norm(x, w, 1e-6), cos[:, :, None], sin[:, :, None])
    got = head_norm_rope(x, w, pos, inv, eps=1e-6, amplitude=0.9)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_head_norm_rope_zero_rows():
    x = torch.randn(0, 4, 16, device=DEVICE)
    out = head_norm_rope(x, None, torch.zeros(0, dtype=torch.long, device=DEVICE),
                         torch.ones(8, device=DEVICE))
    assert out.shape == (0, 4, 16)


@pytest.mark.parametrize("kw, match", [
    (dict(x=torch.randn(4, 16)), "leading dimension"),
    (dict(x=torch.randn(2, 4, 15)), "even"),
    (dict(x=torch.randn(2, 4, 32)[..., ::2]), "contiguous"),
    (dict(positions=torch.zeros(3, dtype=torch.long)), "positions"),
    (dict(positions=torch.zeros(2)), "positions"),
    (dict(inv_freq=torch.ones(4)), "inv_freq"),
    (dict(inv_freq=torch.ones(8, dtype=torch.float64)), "inv_freq"),
    (dict(norm_weight=torch.ones(8)), "norm_weight"),
    (dict(norm_weight=torch.ones(5, 16)), "norm_weight"),
    (dict(norm_weight=torch.ones(16, 4).t()), "norm_weight"),
    (dict(eps=-1.0), "eps"),
    (dict(out=torch.empty(2, 4, 16, dtype=torch.float16)), "out"),
    (dict(out=torch.empty(2, 16, 4).transpose(1, 2)), "out"),
    (dict(x=torch.randn(2, 3, 4, 16), positions=torch.zeros(2, 3, dtype=torch.long),
          out=torch.empty(3, 2, 4, 16).transpose(0, 1)), "out"),
])
def test_head_norm_rope_rejects_bad_input(kw, match):
    args = dict(x=torch.randn(2, 4, 16), norm_weight=torch.ones(16), positions=torch.zeros(2, dtype=torch.long),
                inv_freq=torch.ones(8), eps=1e-6, out=None)
    args.update(kw)
    with pytest.raises((ValueError, TypeError), match=match):
        head_norm_rope(args["x"], args["norm_weight"], args["positions"], args["inv_freq"], eps=args["eps"],
                       out=args["out"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("H", [64, 8])
def test_gpu_draft_shapes_and_graph_replay(H):
    """K2.6's draft (heads of 128, block 8): bf16, positions near 128k, equal under a CUDA-graph replay."""
    x, w, pos, inv = (t.cuda() for t in _case((1, 8), H, 128, torch.bfloat16, 11, max_pos=131072))
    _check(x, w, pos, inv)
    eager = head_norm_rope(x, w, pos, inv)
    out = torch.empty_like(x)
    head_norm_rope(x, w, pos, inv, out=out)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        head_norm_rope(x, w, pos, inv, out=out)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, eager, atol=0, rtol=0)
