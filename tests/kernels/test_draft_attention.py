"""draft_attention against its float64 reference: property tests (interpreter on the CPU), edge cases,
input validation, GPU tests in bf16 at the Kimi-K2.6-DFlash shapes."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree import draft_attention, draft_attention_reference
from tritree.kernels.configs import AttnConfig
from tritree.testing import paged_layout

from ..conftest import DEVICE, HAS_GPU

SMALL = AttnConfig(16, 16, 4, 1)
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
LSE_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def make_case(B, S, Hq, Hkv, D, P, ctx_lens, dtype, *, seed, fragmented=True, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    page_table, num_pages = paged_layout([max(1, L) for L in ctx_lens], B, P, extra_pages=2, fragmented=fragmented,
                                         generator=g)
    case = dict(
        q=torch.randn(B, S, Hq, D, generator=g), k_cache=torch.randn(num_pages, P, Hkv, D, generator=g),
        v_cache=torch.randn(num_pages, P, Hkv, D, generator=g), k_blk=torch.randn(B, S, Hkv, D, generator=g),
        v_blk=torch.randn(B, S, Hkv, D, generator=g))
    case = {k: v.to(dtype) for k, v in case.items()}
    case.update(page_table=page_table, ctx_lens=torch.tensor(ctx_lens, dtype=torch.int32))
    return {k: v.to(device) for k, v in case.items()}


def _args(c):
    return c["q"], c["k_cache"], c["v_cache"], c["page_table"], c["ctx_lens"], c["k_blk"], c["v_blk"]


def check_against_reference(case, dtype, *, window=None, **kw):
    D = case["q"].shape[-1]
    out, lse = draft_attention(*_args(case), sm_scale=D**-0.5, window=window, return_lse=True, **kw)
    ref, ref_lse = draft_attention_reference(*(t.double() if t.is_floating_point() else t for t in _args(case)),
                                             sm_scale=D**-0.5, window=window, return_lse=True)
    assert out.dtype == dtype and out.shape == case["q"].shape
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "every row sees at least its own key"
    err = (out.double() - ref).norm() / ref.norm().clamp_min(1e-30)
    assert err <= TOL[dtype], f"relative error {err:.3g} > {TOL[dtype]}"
    elem = (out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)
    assert elem <= 4 * TOL[dtype], f"max element error {elem:.3g}"
    assert (lse.double() - ref_lse).abs().max() <= LSE_TOL[dtype]
    return out


@st.composite
def draft_cases(draw):
    B = draw(st.integers(1, 3))
    S = draw(st.sampled_from([1, 2, 5, 8, 16]))
    Hkv = draw(st.sampled_from([1, 2, 3]))
    group = draw(st.sampled_from([1, 2, 8]))
    D = draw(st.sampled_from([16, 32]))
    P = draw(st.sampled_from([1, 4, 16, 64]))
    ctx_lens = draw(st.lists(st.one_of(st.integers(0, 200), st.sampled_from([0, 1, P, 2 * P - 1])),
                             min_size=B, max_size=B))
    window = draw(st.one_of(st.none(), st.integers(1, 70)))
    dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    num_splits = draw(st.sampled_from([None, 1, 2, 5]))
    return dict(B=B, S=S, Hq=Hkv * group, Hkv=Hkv, D=D, P=P, ctx_lens=ctx_lens, window=window, dtype=dtype,
                num_splits=num_splits, fragmented=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)),
                hoist=draw(st.booleans()))


@settings(max_examples=30)
@given(draft_cases())
def test_draft_attention_matches_reference(c):
    case = make_case(c["B"], c["S"], c["Hq"], c["Hkv"], c["D"], c["P"], c["ctx_lens"], c["dtype"], seed=c["seed"],
                     fragmented=c["fragmented"])
    cfg = AttnConfig(16, 16, 4, 1, hoist_pages=c["hoist"])  # hoist_pages applies where P >= 16
    check_against_reference(case, c["dtype"], window=c["window"], config=cfg, num_splits=c["num_splits"])


@pytest.mark.parametrize("ctx,S,window", [(0, 1, None), (1, 1, None), (0, 8, 3), (33, 8, 1), (64, 16, 64),
                                          (100, 8, 17), (17, 16, None)])
@pytest.mark.parametrize("group", [1, 2, 8])
def test_edge_cases(ctx, S, window, group):
    case = make_case(1, S, 2 * group, 2, 16, 16, [ctx], torch.float32, seed=ctx * 31 + S)
    check_against_reference(case, torch.float32, window=window, config=SMALL, num_splits=3)
    check_against_reference(case, torch.float32, window=window, config=AttnConfig(16, 16, 4, 1, hoist_pages=True),
                            num_splits=3)


def test_default_config_bf16():
    case = make_case(2, 8, 16, 2, 32, 64, [130, 5], torch.bfloat16, seed=7)
    check_against_reference(case, torch.bfloat16)
    check_against_reference(case, torch.bfloat16, window=40)


def test_cpu_path_without_interpreter_matches_reference():
    import importlib
    da = importlib.import_module("tritree.kernels.draft_attention")
    if HAS_GPU:
        pytest.skip("CPU path")
    case = make_case(1, 4, 4, 2, 16, 16, [10], torch.float32, seed=4, device="cpu")
    orig = da.interpreting
    try:
        da.interpreting = lambda: False
        da._PLANS.clear()
        check_against_reference(case, torch.float32, window=5)
    finally:
        da.interpreting = orig
        da._PLANS.clear()


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

def _valid():
    return make_case(2, 4, 4, 2, 16, 16, [20, 3], torch.float32, seed=1)


@pytest.mark.parametrize("mutate,kw,exc,match", [
    (lambda c: dict(q=c["q"][..., :12]), {}, ValueError, "q must have shape"),
    (lambda c: dict(q=c["q"].double()), {}, TypeError, "q must have dtype"),
    (lambda c: dict(k_cache=c["k_cache"].half()), {}, TypeError, "k_cache must have the dtype"),
    (lambda c: dict(k_cache=c["k_cache"][:, :, :1].repeat(1, 1, 3, 1)), {}, ValueError, "Hkv dividing"),
    (lambda c: dict(v_cache=c["v_cache"][:, :8]), {}, ValueError, "v_cache must have the shape"),
    (lambda c: dict(k_cache=c["k_cache"][:, :3], v_cache=c["v_cache"][:, :3]), {}, ValueError, "power of two"),
    (lambda c: dict(k_blk=c["k_blk"][:, :3]), {}, ValueError, "k_blk must have shape"),
    (lambda c: dict(v_blk=c["v_blk"].half()), {}, TypeError, "v_blk must have dtype"),
    (lambda c: dict(page_table=c["page_table"].long()), {}, TypeError, "page_table must have dtype"),
    (lambda c: dict(ctx_lens=c["ctx_lens"][:1]), {}, ValueError, "ctx_lens must have shape"),
    (lambda c: dict(ctx_lens=torch.tensor([20, -1], dtype=torch.int32, device=c["q"].device)), {}, ValueError,
     "ctx_lens must be >= 0"),
    (lambda c: dict(ctx_lens=torch.tensor([20, 40], dtype=torch.int32, device=c["q"].device)), {}, ValueError,
     "exceeds the page table"),
    (lambda c: dict(page_table=torch.where(c["page_table"] == c["page_table"][0, 0], 10**6, c["page_table"])), {},
     ValueError, "out of range"),
    (lambda c: {}, dict(window=0), ValueError, "window"),
    (lambda c: {}, dict(sm_scale=-1.0), ValueError, "sm_scale"),
])
def test_validation(mutate, kw, exc, match, monkeypatch):
    monkeypatch.setattr("tritree.kernels._validate.DEBUG_CHECKS", True)
    c = _valid()
    c = {**c, **mutate(c)}
    kw = {"sm_scale": 0.25, **kw}
    with pytest.raises(exc, match=match):
        draft_attention(*_args(c), config=SMALL, **kw)


# ---------------------------------------------------------------------------------------------
# GPU: bf16 at Kimi-K2.6-DFlash shapes
# ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("B,S,L,window,P", [(1, 8, 46_000, None, 64), (1, 16, 8_000, 4096, 1), (4, 8, 3_000, None, 16),
                                            (2, 16, 5_000, 4096, 64)])
def test_gpu_bf16_kimi_shapes(B, S, L, window, P):
    case = make_case(B, S, 64, 8, 128, P, [L - 13 * b for b in range(B)], torch.bfloat16, seed=L + S)
    check_against_reference(case, torch.bfloat16, window=window)
    check_against_reference(case, torch.bfloat16, window=window, config=AttnConfig(64, 64, 4, 3, hoist_pages=True))


@pytest.mark.gpu
def test_gpu_sm120_configs_run_on_this_gpu():
    from tritree.kernels.draft_attention import DRAFT_ATTN_CONFIGS
    for cfg in set(DRAFT_ATTN_CONFIGS["sm_120"].values()):
        case = make_case(1, 8, 64, 8, 128, 64, [5_000], torch.bfloat16, seed=cfg.block_m)
        check_against_reference(case, torch.bfloat16, config=cfg)


@pytest.mark.gpu
def test_gpu_cuda_graph_and_compile():
    case = make_case(1, 8, 64, 8, 128, 64, [3_000], torch.bfloat16, seed=2)
    ref = draft_attention(*_args(case), sm_scale=128**-0.5)
    fn = torch.compile(lambda *a: draft_attention(*a, sm_scale=128**-0.5), fullgraph=True)
    compiled = fn(*_args(case))
    assert ((compiled.float() - ref.float()).norm() / ref.float().norm()) < TOL[torch.bfloat16]
    static = {}
    g = torch.cuda.CUDAGraph()
    draft_attention(*_args(case), sm_scale=128**-0.5)  # warm
    with torch.cuda.graph(g):
        static["out"] = draft_attention(*_args(case), sm_scale=128**-0.5)
    static["out"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(static["out"], ref)
