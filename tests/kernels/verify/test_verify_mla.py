"""verify_mla against its float64 reference: property tests (interpreter on the CPU), edge cases,
input validation, and GPU tests in bf16 at large shapes."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree import verify_mla, verify_mla_reference
from tritree.kernels import _launch
from tritree.kernels.configs import AttnConfig
from tritree.testing import TREE_KINDS, random_verify_inputs

from ...conftest import DEVICE, HAS_GPU

SM_SCALE = 192**-0.5 * (1 + 0.1 * math.log(64)) ** 2
# Small tiles keep the interpreter fast and exercise many tiles, splits and tails.
SMALL = AttnConfig(16, 16, 4, 1)
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
LSE_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def make_case(B, T, H, P, kv_lens, tree_lens, kinds, dtype, *, seed, fragmented=True, device=DEVICE):
    return random_verify_inputs(B, T, H, P, kv_lens, tree_lens, kinds, dtype, seed=seed, fragmented=fragmented,
                                device=device)


def check_against_reference(case, dtype, **kw):
    q = case["q"]
    B, T, H, _ = q.shape
    out = torch.full((B, T, H, 512), float("nan"), dtype=dtype, device=q.device)  # poison
    lse = torch.full((B, T, H), float("nan"), dtype=torch.float32, device=q.device)
    verify_mla(case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"], sm_scale=SM_SCALE,
               tree_lens=case["tree_lens"], out=out, lse=lse, kv_scale=case.get("kv_scale"), **kw)
    assert_matches_reference(case, out, lse, dtype)
    return out


def assert_matches_reference(case, out, lse, dtype):
    """``out``/``lse`` (poisoned with NaN before the launch) against the float64 reference: every
    element written, relative and element errors within the dtype's tolerance, lse -inf exactly on
    padding rows, padding rows exactly zero."""
    T = case["q"].shape[1]
    ref_out, ref_lse = verify_mla_reference(
        case["q"].double(), case["kv"].double(), case["page_table"], case["kv_lens"], case["tree_mask"],
        sm_scale=SM_SCALE, tree_lens=case["tree_lens"], return_lse=True, kv_scale=case.get("kv_scale"))
    assert not torch.isnan(out).any(), "some output elements were not written"
    assert not torch.isnan(lse).any(), "some lse elements were not written"
    err = (out.double() - ref_out).norm() / ref_out.norm().clamp_min(1e-30)
    assert err <= TOL[dtype], f"relative error {err:.3g} > {TOL[dtype]}"
    elem = (out.double() - ref_out).abs().max() / ref_out.abs().max().clamp_min(1e-30)
    assert elem <= 4 * TOL[dtype], f"max element error {elem:.3g} (relative to max |ref|)"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), "lse is -inf exactly on padding rows"
    assert (lse[~finite] == float("-inf")).all()
    if finite.any():
        lse_err = (lse.double()[finite] - ref_lse[finite]).abs().max()
        assert lse_err <= LSE_TOL[dtype], f"lse error {lse_err:.3g}"
    tree_lens = case["tree_lens"]
    if tree_lens is not None:  # padding rows are exactly zero
        rows = torch.arange(T, device=out.device)[None, :] >= tree_lens[:, None]
        assert (out[rows] == 0).all()


@st.composite
def verify_cases(draw):
    B = draw(st.integers(1, 4))
    T = draw(st.integers(1, 64))
    H = draw(st.integers(1, max(1, min(16, 96 // T))))
    P = draw(st.sampled_from([1, 2, 16, 64]))
    kv_lens = draw(st.lists(st.one_of(st.integers(0, 200), st.sampled_from([0, 1, P, 2 * P - 1, 64])),
                            min_size=B, max_size=B))
    padded = draw(st.booleans())
    tree_lens = draw(st.lists(st.integers(0, T), min_size=B, max_size=B)) if padded else None
    kinds = tuple(draw(st.lists(st.sampled_from(TREE_KINDS), min_size=1, max_size=B)))
    dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    num_splits = draw(st.sampled_from([None, 1, 2, 3, 7]))
    tma = draw(st.booleans())
    split_scores = draw(st.booleans())
    fragmented = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    return dict(B=B, T=T, H=H, P=P, kv_lens=kv_lens, tree_lens=tree_lens, kinds=kinds, dtype=dtype,
                num_splits=num_splits, fragmented=fragmented, seed=seed, tma=tma, split_scores=split_scores)


@settings(max_examples=30)
@given(verify_cases())
def test_verify_mla_matches_reference(c):
    case = make_case(c["B"], c["T"], c["H"], c["P"], c["kv_lens"], c["tree_lens"], c["kinds"], c["dtype"],
                     seed=c["seed"], fragmented=c["fragmented"])
    cfg = AttnConfig(16, 16, 4, 1, tma=c["tma"], split_scores=c["split_scores"])
    check_against_reference(case, c["dtype"], config=cfg, num_splits=c["num_splits"])


def to_fp8_pool(case, headroom=1.0):
    """The case's pool quantised to float8_e4m3fn with one per-tensor scale (its largest magnitude maps
    to ``448 / headroom``); the reference then reads the same fp8 values times the scale."""
    kv = case["kv"].float()
    scale = float(kv.abs().max().clamp_min(1e-6)) * headroom / 448.0
    case["kv"] = (kv / scale).to(torch.float8_e4m3fn)
    case["kv_scale"] = scale
    return case


@settings(max_examples=12)
@given(verify_cases(), st.floats(1.0, 8.0))
def test_fp8_pool_matches_reference(c, headroom):
    """fp8 (e4m3) pools with a per-tensor scale, fp32 / fp16 queries: the kernel against the float64
    reference over the same fp8 values (tolerances of q's dtype)."""
    case = to_fp8_pool(make_case(c["B"], c["T"], c["H"], c["P"], c["kv_lens"], c["tree_lens"], c["kinds"],
                                 c["dtype"], seed=c["seed"], fragmented=c["fragmented"]), headroom)
    cfg = AttnConfig(16, 16, 4, 1, tma=c["tma"], split_scores=c["split_scores"])
    check_against_reference(case, c["dtype"], config=cfg, num_splits=c["num_splits"])


def test_fp8_pool_written_by_kv_write_():
    """The tree rows quantised with the pool's scale and written by ``kv_write_``, then verified."""
    from tritree import kv_write_

    case = to_fp8_pool(make_case(2, 9, 3, 16, [70, 33], [9, 6], ("random", "wide"), torch.float32, seed=21), 4.0)
    g = torch.Generator().manual_seed(3)
    latent = torch.randn(2, 9, 576, generator=g).to(case["q"].device)
    rows = (latent / case["kv_scale"]).to(torch.float8_e4m3fn)
    kv_write_(case["kv"], case["page_table"], case["kv_lens"], rows, case["tree_lens"])
    for b, (L, n) in enumerate(zip(case["kv_lens"].tolist(), case["tree_lens"].tolist())):
        pos = torch.arange(L, L + n, device=case["kv"].device)
        written = case["kv"][case["page_table"][b, pos // 16].long(), pos % 16]
        assert torch.equal(written.view(torch.uint8), rows[b, :n].view(torch.uint8))
    check_against_reference(case, torch.float32, config=SMALL, num_splits=2)


@pytest.mark.parametrize("P", [1, 16])
def test_fp8_pool_bf16_queries_and_a_gluon_config(P):
    """bf16 queries over an fp8 pool; a Gluon config runs the Triton kernel with its tiles."""
    case = to_fp8_pool(make_case(2, 19, 4, P, [150, 61], [19, 11], ("random", "chain"), torch.bfloat16, seed=P))
    check_against_reference(case, torch.bfloat16, config=SMALL, num_splits=3)
    check_against_reference(case, torch.bfloat16,
                            config=AttnConfig(16, 16, 4, 1, split_scores=True, kernel="gluon-ws"), num_splits=2)


def poison_unused_slots(case):
    """NaN in every pool slot that no request uses (including padding tree rows): a kernel that reads
    whole pages (TMA) must keep them out of the result."""
    kv, pt = case["kv"], case["page_table"]
    P = kv.shape[1]
    used = torch.zeros(kv.shape[:2], dtype=torch.bool, device=kv.device)
    T = case["q"].shape[1]
    for b, L in enumerate(case["kv_lens"].tolist()):
        n = T if case["tree_lens"] is None else int(case["tree_lens"][b])
        pos = torch.arange(L + n, device=kv.device)
        used[pt[b, pos // P].long(), pos % P] = True
    case["kv"] = torch.where(used[..., None], kv, float("nan")).to(kv.dtype)
    return case


@pytest.mark.parametrize("tma,split", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("P", [16, 64])
def test_garbage_outside_the_request_is_never_read(P, tma, split):
    case = poison_unused_slots(make_case(2, 7, 3, P, [37, 70 + P * 17], [5, 7], ("random", "wide"), torch.float32,
                                         seed=P + tma))
    cfg = AttnConfig(16, 16, 4, 1, tma=tma, split_scores=split)
    check_against_reference(case, torch.float32, config=cfg, num_splits=3)


def test_gluon_config_falls_back_to_triton_where_gluon_cannot_serve():
    # fp32 on the interpreter: the Gluon kernel (bf16, Hopper) cannot serve it; the same tiles run in Triton.
    case = make_case(2, 7, 3, 16, [37, 90], [5, 7], ("random", "wide"), torch.float32, seed=5)
    check_against_reference(case, torch.float32, config=AttnConfig(16, 16, 4, 1, split_scores=True, kernel="gluon"),
                            num_splits=3)
    with pytest.raises(ValueError, match="config.kernel"):
        check_against_reference(case, torch.float32, config=AttnConfig(16, 16, 4, 1, kernel="cuda"))


@pytest.mark.parametrize("kind", ["chain", "star"])
@pytest.mark.parametrize("kv_len,T,H", [(0, 1, 1), (1, 1, 3), (0, 33, 2), (63, 7, 5), (64, 16, 4)])
def test_edge_cases(kind, kv_len, T, H):
    case = make_case(1, T, H, 16, [kv_len], None, (kind,), torch.float32, seed=kv_len * 100 + T)
    check_against_reference(case, torch.float32, config=SMALL, num_splits=2)
    check_against_reference(case, torch.float32, config=AttnConfig(16, 16, 4, 1, tma=True), num_splits=3)


def test_default_config_and_splits():
    case = make_case(2, 9, 4, 64, [130, 5], [9, 3], ("random", "wide"), torch.float16, seed=7)
    check_against_reference(case, torch.float16)


def test_narrow_last_row_block_split_counts():
    """Which launches get a narrow last row block and how the programs are shared (132 SMs): T=65,H=8
    (8 full blocks and 8 rows) 8 x 15 full programs and 12 narrow ones, not 9 x 14; the narrow block never
    has more splits than the full ones, nor fewer than one."""
    from tritree.kernels.verify import gluon_launch as GL

    # (at least NARROW_MIN_BLOCKS = 5 row blocks: not T=9 or T=17 with H=8)
    assert [GL.narrow_rows(r) for r in (64, 72, 136, 264, 520, 1040, 396, 152, 512)] == [0, 0, 0, 8, 8, 16, 16, 0, 0]
    kw = dict(max_keys=46_080, block_n=64, sms=132)
    assert GL.choose_narrow_num_splits(batch=1, row_blocks=9, **kw) == 15
    assert GL.narrow_splits_for(15, 1, 9, 132) == 12
    assert GL.narrow_splits_for(14, 1, 9, 132) == 14  # explicit splits: at most as many as the full blocks
    assert GL.choose_narrow_num_splits(batch=1, row_blocks=3, **kw) == 48
    assert GL.narrow_splits_for(48, 1, 3, 132) == 36
    assert GL.narrow_splits_for(40, 4, 9, 132) == 1  # no SM left: one split
    assert GL.choose_narrow_num_splits(batch=1, row_blocks=9, max_keys=512, block_n=64, sms=132) == 2
    # verify_mla's choice, as torch.compile traces it (fullgraph: no graph break)
    from tritree.kernels.verify.policy import _narrow_num_splits

    cfg = AttnConfig(64, 64, 8, 2, tma=True, split_scores=True, kernel="gluon-ws")
    args = dict(batch=1, row_blocks=9, **kw)
    torch._dynamo.reset()
    traced = torch.compile(lambda x: x + _narrow_num_splits(cfg, 520, args), fullgraph=True)(torch.zeros(1))
    assert traced.item() == 15 and _narrow_num_splits(cfg, 512, args) is None
    assert _narrow_num_splits(AttnConfig(64, 64, 8, 2, kernel="gluon"), 520, args) is None


def test_one_node_trees_all_padding_and_mixed():
    case = make_case(3, 4, 2, 2, [10, 0, 33], [1, 0, 4], ("random",), torch.float32, seed=3)
    out = check_against_reference(case, torch.float32, config=SMALL, num_splits=3)
    assert (out[1] == 0).all()


def test_functional_and_out_forms_agree():
    case = make_case(2, 5, 3, 16, [40, 17], [5, 2], ("random",), torch.float32, seed=11)
    args = (case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"])
    out1, lse1 = verify_mla(*args, sm_scale=SM_SCALE, tree_lens=case["tree_lens"], return_lse=True,
                            config=SMALL, num_splits=2)
    out2 = verify_mla(*args, sm_scale=SM_SCALE, tree_lens=case["tree_lens"], config=SMALL, num_splits=2)
    assert torch.equal(out1, out2)
    assert lse1.shape == (2, 5, 3) and lse1.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_split_partials(dtype):
    """Split partials in the output's 16-bit dtype (``split_destinations(..., narrow=True)``, what the Gluon
    kernels write; one more rounding of each normalised partial row): merged, within the dtype's tolerance
    of the fp32 partials' merge, padding rows and empty splits included; fp32 outputs and ``narrow=False``
    keep fp32 partials. And verify_mla with 16-bit outputs and splits against the reference."""
    import tritree.kernels._splitkv as splitkv

    case = make_case(2, 9, 3, 16, [130, 47], [9, 4], ("random", "chain"), dtype, seed=17)
    check_against_reference(case, dtype, config=SMALL, num_splits=3)
    out = torch.empty(2, 9, 3, 512, dtype=dtype)
    assert splitkv.split_destinations(out, torch.empty(2, 9, 3), 3, 27, narrow=True)[0].dtype == dtype
    assert splitkv.split_destinations(out.float(), torch.empty(2, 9, 3), 3, 27, narrow=True)[0].dtype == torch.float32
    assert splitkv.split_destinations(out, torch.empty(2, 9, 3), 3, 27)[0].dtype == torch.float32
    assert splitkv.split_destinations(out, torch.empty(2, 9, 3), 1, 27, narrow=True)[0] is out

    g = torch.Generator().manual_seed(5)
    part_o = torch.randn(2, 3, 27, 512, generator=g).to(DEVICE)
    part_l = (torch.randn(2, 3, 27, generator=g) * 4).to(DEVICE)
    part_l[0, 1] = float("-inf")  # an empty split
    part_o[0, 1] = 0
    ref_o, ref_l = torch.empty(2, 9, 3, 512, device=DEVICE), torch.empty(2, 9, 3, device=DEVICE)
    splitkv.combine_splits(part_o, part_l, ref_o, ref_l)
    got_o, got_l = torch.empty(2, 9, 3, 512, dtype=dtype, device=DEVICE), torch.empty(2, 9, 3, device=DEVICE)
    splitkv.combine_splits(part_o.to(dtype), part_l, got_o, got_l)
    assert torch.equal(got_l, ref_l)
    err = (got_o.double() - ref_o.double()).norm() / ref_o.double().norm()
    assert err <= TOL[dtype], f"relative error {err:.3g}"


def test_bf16_loads_in_interpreter():
    # bf16 tl.dot is wrong in the interpreter; the launcher upcasts tiles there. On a GPU this is
    # the native bf16 path.
    case = make_case(1, 6, 2, 16, [50], None, ("random",), torch.bfloat16, seed=5)
    check_against_reference(case, torch.bfloat16, config=SMALL, num_splits=2)


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

def _valid():
    return make_case(2, 4, 2, 16, [20, 3], None, ("random",), torch.float32, seed=1)


def _call(c, **over):
    c = {**c, **over}
    return verify_mla(c["q"], c["kv"], c["page_table"], c["kv_lens"], c["tree_mask"], sm_scale=c.get("sm_scale", 0.1),
                      tree_lens=c["tree_lens"], config=SMALL)


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda c: dict(q=c["q"][..., :512]), ValueError, "q must have shape"),
    (lambda c: dict(q=c["q"].double()), TypeError, "q must have dtype"),
    (lambda c: dict(q=c["q"].half()), TypeError, "kv must have the dtype of q"),
    (lambda c: dict(q=c["q"][:, :, :, :].transpose(2, 3).contiguous().transpose(2, 3)), ValueError, "contiguous"),
    (lambda c: dict(kv=c["kv"][:, :3]), ValueError, "power of two"),
    (lambda c: dict(kv=c["kv"][..., :512]), ValueError, "kv must have shape"),
    (lambda c: dict(page_table=c["page_table"].long()), TypeError, "page_table must have dtype"),
    (lambda c: dict(page_table=c["page_table"][:1]), ValueError, "page_table must have shape"),
    (lambda c: dict(kv_lens=c["kv_lens"][:1]), ValueError, "kv_lens must have shape"),
    (lambda c: dict(kv_lens=c["kv_lens"].float()), TypeError, "kv_lens must have dtype"),
    (lambda c: dict(kv_lens=torch.tensor([20, -1], dtype=torch.int32, device=c["q"].device)), ValueError, "kv_lens must be >= 0"),
    (lambda c: dict(kv_lens=torch.tensor([20, 40], dtype=torch.int32, device=c["q"].device)), ValueError, "exceeds the page table"),
    (lambda c: dict(page_table=torch.where(c["page_table"] == c["page_table"][0, 0], 10**6, c["page_table"])),
     ValueError, "out of range"),
    (lambda c: dict(tree_mask=c["tree_mask"][:, :3]), ValueError, "tree_mask must have shape"),
    (lambda c: dict(tree_lens=torch.tensor([5, 1], dtype=torch.int32, device=c["q"].device)), ValueError, "tree_lens must be in"),
    (lambda c: dict(tree_lens=torch.tensor([4], dtype=torch.int32, device=c["q"].device)), ValueError, "tree_lens must have shape"),
    (lambda c: dict(sm_scale=float("nan")), ValueError, "sm_scale"),
    (lambda c: dict(q=c["q"].numpy() if c["q"].device.type == "cpu" else None), TypeError, "q must be a torch.Tensor"),
])
def test_validation(mutate, exc, match, monkeypatch):
    monkeypatch.setattr("tritree.kernels._validate.DEBUG_CHECKS", True)  # value checks on GPU inputs too
    c = _valid()
    with pytest.raises(exc, match=match):
        _call(c, **mutate(c))


@pytest.mark.parametrize("fp8,kv_scale,match", [(False, 0.5, "kv_scale is the dequantisation scale"),
                                                 (True, 0.0, "kv_scale must be a positive"),
                                                 (True, float("nan"), "kv_scale must be a positive"),
                                                 (True, "0.5", "kv_scale must be a positive")])
def test_validation_kv_scale(fp8, kv_scale, match):
    c = to_fp8_pool(_valid()) if fp8 else _valid()
    with pytest.raises(ValueError, match=match):
        verify_mla(c["q"], c["kv"], c["page_table"], c["kv_lens"], c["tree_mask"], sm_scale=0.1, kv_scale=kv_scale)


def test_fp8_pool_without_a_scale_reads_it_unscaled():
    c = to_fp8_pool(_valid())
    got = verify_mla(c["q"], c["kv"], c["page_table"], c["kv_lens"], c["tree_mask"], sm_scale=0.1, config=SMALL)
    ref = verify_mla_reference(c["q"].double(), c["kv"].double(), c["page_table"], c["kv_lens"], c["tree_mask"],
                               sm_scale=0.1)
    assert ((got.double() - ref).norm() / ref.norm()) < TOL[torch.float32]


def test_validation_out_buffers():
    c = _valid()
    args = (c["q"], c["kv"], c["page_table"], c["kv_lens"], c["tree_mask"])
    with pytest.raises(ValueError, match="out must have shape"):
        verify_mla(*args, sm_scale=0.1, out=torch.empty(2, 4, 2, 576, device=c["q"].device),
                   lse=torch.empty(2, 4, 2, device=c["q"].device))
    with pytest.raises(ValueError, match="out must have shape"):
        verify_mla(*args, sm_scale=0.1, out=torch.empty(2, 4, 2, 576, device=c["q"].device))
    with pytest.raises(ValueError, match="lse must have shape"):
        verify_mla(*args, sm_scale=0.1, lse=torch.empty(2, 4, 3, device=c["q"].device))


def test_out_without_lse_and_lse_without_out():
    """Either output buffer may be given alone: written in place, the other allocated (or scratch)."""
    c = _valid()
    args = (c["q"], c["kv"], c["page_table"], c["kv_lens"], c["tree_mask"])
    ref, ref_lse = verify_mla(*args, sm_scale=0.1, config=SMALL, num_splits=2, return_lse=True)
    out = torch.full_like(ref, float("nan"))
    got = verify_mla(*args, sm_scale=0.1, config=SMALL, num_splits=2, out=out)
    assert got is out and torch.equal(out, ref)
    out.fill_(float("nan"))
    got, got_lse = verify_mla(*args, sm_scale=0.1, config=SMALL, num_splits=2, out=out, return_lse=True)
    assert got is out and torch.equal(out, ref) and torch.equal(got_lse, ref_lse)
    lse = torch.full_like(ref_lse, float("nan"))
    got, got_lse = verify_mla(*args, sm_scale=0.1, config=SMALL, num_splits=2, lse=lse, return_lse=True)
    assert got_lse is lse and torch.equal(lse, ref_lse) and torch.equal(got, ref)


def test_kernel_clamps_bad_page_ids_without_faulting(monkeypatch):
    """With value checks off (GPU without TRITREE_DEBUG), a bad page id must not fault."""
    import tritree.kernels._validate as V
    c = _valid()
    bad = torch.where(c["page_table"] == c["page_table"][0, 0], 10**6, c["page_table"])
    monkeypatch.setattr(V, "values_checkable", lambda *t: False)  # the traced path's predicate
    monkeypatch.setattr(V, "checks_values", lambda device: False)  # the plans'
    out = _call(c, page_table=bad)
    assert torch.isfinite(out).all()


# ---------------------------------------------------------------------------------------------
# GPU: bf16 at large shapes
# ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("T,H,P", [(8, 3, 1), (9, 3, 16), (65, 8, 64), (16, 64, 1)])
def test_gpu_fp32_default_plan(T, H, P):
    """fp32 queries and pools through the default plan (the architecture's fp32 tiles) at small and large row
    counts and page sizes, against the float64 reference into poisoned outputs."""
    case = make_case(2, T, H, P, [700, 3_000], [T, T // 2 + 1], ("random", "chain"), torch.float32, seed=T * H + P)
    check_against_reference(case, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("B,T,H,P,L", [(1, 8, 8, 64, 46_000), (1, 17, 8, 64, 20_000), (1, 64, 8, 64, 8_000),
                                       (2, 16, 64, 1, 4_000), (4, 33, 16, 64, 3_000), (1, 128, 8, 16, 2_000)])
def test_gpu_bf16_large(B, T, H, P, L):
    kv_lens = [L - 37 * b for b in range(B)]
    tree_lens = [T - (b % 3) for b in range(B)]
    case = make_case(B, T, H, P, kv_lens, tree_lens, ("random", "wide", "chain"), torch.bfloat16, seed=L + T)
    check_against_reference(case, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [AttnConfig(64, 64, 8, 1, tma=True), AttnConfig(64, 32, 8, 3, tma=True),
                                 AttnConfig(16, 64, 4, 3, tma=True), AttnConfig(64, 64, 8, 2, tma=True, split_scores=True),
                                 AttnConfig(64, 32, 8, 3, tma=True, split_scores=True),
                                 AttnConfig(64, 64, 8, 1, split_scores=True),
                                 AttnConfig(64, 64, 8, 2, tma=True, split_scores=True, kernel="gluon"),
                                 AttnConfig(64, 64, 8, 2, tma=True, split_scores=True, kernel="gluon-ws")])
def test_gpu_tma_tiles(cfg):
    case = poison_unused_slots(make_case(2, 19, 8, 64, [46_000, 1_000], [19, 11], ("random", "chain"),
                                         torch.bfloat16, seed=cfg.block_n))
    check_against_reference(case, torch.bfloat16, config=cfg)
    args = (case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"])
    torch._dynamo.reset()  # each config recompiles the same lambda: stay under the recompile limit
    ref = verify_mla(*args, sm_scale=SM_SCALE, tree_lens=case["tree_lens"], config=cfg)
    fn = torch.compile(lambda *a: verify_mla(*a, sm_scale=SM_SCALE, tree_lens=case["tree_lens"], config=cfg),
                       fullgraph=True)
    compiled = fn(*args)
    assert ((compiled.float() - ref.float()).norm() / ref.float().norm()) < TOL[torch.bfloat16]
    out = torch.empty_like(ref)
    lse = torch.empty(ref.shape[:3], dtype=torch.float32, device=ref.device)
    verify_mla(*args, sm_scale=SM_SCALE, tree_lens=case["tree_lens"], config=cfg, out=out, lse=lse)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        verify_mla(*args, sm_scale=SM_SCALE, tree_lens=case["tree_lens"], config=cfg, out=out, lse=lse)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


def check_reference_then_graph_replay(case, **kw):
    """bf16 ``verify_mla`` (``kw``: more arguments) against the float64 reference, then captured in a CUDA
    graph and replayed twice into NaN-poisoned outputs: the same bits as the eager run."""
    ref = check_against_reference(case, torch.bfloat16, **kw)
    args = (case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"])
    out = torch.empty_like(ref)
    lse = torch.empty(ref.shape[:3], dtype=torch.float32, device=ref.device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        verify_mla(*args, sm_scale=SM_SCALE, tree_lens=case["tree_lens"], out=out, lse=lse, **kw)
    for _ in range(2):
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ref)
    return ref


def gluon_launch_of(case, cfg, num_splits=None):
    """What verify_mla's plan launches for ``case`` with ``cfg`` (a ``verify.gluon_launch.GluonLaunch``)."""
    from tritree.kernels.verify import VerifyPlan

    plan = VerifyPlan(case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"],
                      case["tree_lens"], sm_scale=SM_SCALE, config=cfg, num_splits=num_splits)
    assert plan.launch.route == cfg.kernel
    return plan._gluon


@pytest.mark.gpu
@pytest.mark.parametrize("P,T", [(64, 16), (64, 65), (1, 16), (128, 64)])
def test_gpu_split_kernel_by_programmatic_dependent_launch(P, T):
    """The ws split kernel launched by programmatic dependent launch (each program waits for the prior
    grids before its first global read; the merge and the KV write signal their dependents at their
    start): against the reference and replayed from a CUDA graph; and in a graph where a kernel writes the
    query, the lengths and the pool's tree keys right before each call (inputs poisoned before every
    replay), every call reads what that kernel wrote."""
    from tritree.kernels._splitkv import pdl_capable

    cfg = AttnConfig(64, 64, 8, 2, tma=P >= 64, split_scores=True, kernel="gluon-ws")
    case = poison_unused_slots(make_case(2, T, 8, P, [30_000, 1_000 + 5], [T, 11], ("random", "chain"),
                                         torch.bfloat16, seed=P + T))
    launch = gluon_launch_of(case, cfg)
    assert launch.launch_pdl == pdl_capable(case["q"].device) == dict(launch.constexprs)["WAIT_PRIOR"]
    check_reference_then_graph_replay(case, config=cfg)

    # Two calls in one graph, each right after kernels that write its inputs (a plain launch would order
    # them; here only griddepcontrol.wait does).
    # a second call over the same page layout (one pool buffer serves both): other queries and keys
    gen = torch.Generator(device=case["q"].device).manual_seed(P + T)
    cases = [case, dict(case, q=torch.randn(case["q"].shape, generator=gen, device=case["q"].device).to(torch.bfloat16),
                        kv=(case["kv"] * -0.5).to(torch.bfloat16))]
    refs = [verify_mla(c["q"], c["kv"], c["page_table"], c["kv_lens"], c["tree_mask"], sm_scale=SM_SCALE,
                       tree_lens=c["tree_lens"], config=cfg) for c in cases]
    q_buf, kv_buf, lens_buf = torch.empty_like(case["q"]), torch.empty_like(case["kv"]), torch.empty_like(case["kv_lens"])
    outs = [torch.empty_like(r) for r in refs]
    lses = [torch.empty(r.shape[:3], dtype=torch.float32, device=r.device) for r in refs]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c, out, lse in zip(cases, outs, lses):
            torch.add(c["q"], 0, out=q_buf)  # kernels (not copies): the split kernel's programmatic predecessors
            torch.add(c["kv"], 0, out=kv_buf)
            torch.add(c["kv_lens"], 0, out=lens_buf)
            verify_mla(q_buf, kv_buf, c["page_table"], lens_buf, c["tree_mask"], sm_scale=SM_SCALE,
                       tree_lens=c["tree_lens"], config=cfg, out=out, lse=lse)
    for _ in range(3):
        for t in (q_buf, kv_buf, *outs):
            t.fill_(float("nan"))
        lens_buf.fill_(0)
        g.replay()
        torch.cuda.synchronize()
        for out, ref in zip(outs, refs):
            assert torch.equal(out, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("T,H,P,splits", [(65, 8, 64, None), (17, 8, 64, None), (64, 64, 64, None), (19, 8, 1, 8),
                                          (40, 4, 128, 3), (65, 8, 64, 1)])
def test_gpu_ws_tma_store(T, H, P, splits):
    """The ws kernel's 16-bit split partials stored by TMA boxes from the pair buffers (a narrow last block,
    a part-filled one whose rows past the last the copy clips, 64 heads, row gathers, P = 128; one split:
    the output itself, by the staged store): against the reference, then replayed from a CUDA graph into
    poisoned outputs."""
    cfg = AttnConfig(64, 64, 8, 2, tma=P >= 64, split_scores=True, kernel="gluon-ws")
    case = poison_unused_slots(make_case(2, T, H, P, [30_000 + 45, 1_000 + 5], [T, T // 2 + 1], ("random", "chain"),
                                         torch.bfloat16, seed=T + H + P))
    kw = {"config": cfg} if splits is None else {"config": cfg, "num_splits": splits}
    launch = gluon_launch_of(case, cfg, splits)
    assert dict(launch.constexprs)["TMA_STORE"] == (launch.num_splits > 1) == launch.partials_desc
    check_reference_then_graph_replay(case, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,P", [("gluon", 64), ("gluon", 128), ("gluon-ws", 64), ("gluon-ws", 1),
                                      ("gluon-ws", 16), ("triton", 64)])
def test_gpu_16bit_split_partials(kernel, P):
    """The Gluon kernels' bf16 split partials (the plain kernel's re-laid out before their store, the ws
    kernel's by TMA boxes or staged; Triton: fp32) against the float64 reference, then replayed from a
    CUDA graph into poisoned outputs, the same bits as the eager run."""
    from tritree.kernels.verify import VerifyPlan

    cfg = AttnConfig(64, 64, 8, 2, tma=P >= 64, split_scores=True, kernel=kernel)
    case = poison_unused_slots(make_case(2, 19, 8, P, [20_000 + 45, 1_000 + 64 - 19], [19, 11], ("random", "chain"),
                                         torch.bfloat16, seed=P + 7 * len(kernel)))
    plan = VerifyPlan(case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"],
                      case["tree_lens"], sm_scale=SM_SCALE, config=cfg, num_splits=8)
    assert plan.launch.partials_dtype == (torch.float32 if kernel == "triton" else torch.bfloat16)
    check_reference_then_graph_replay(case, config=cfg, num_splits=8)


@pytest.mark.gpu
@pytest.mark.parametrize("T,H,P,splits", [(65, 8, 64, None), (33, 8, 64, None), (65, 16, 64, None), (33, 8, 1, None),
                                          (65, 8, 128, None), (65, 8, 64, 8), (33, 8, 64, 1), (33, 12, 16, None),
                                          (129, 8, 64, None)])
def test_gpu_narrow_last_row_block(T, H, P, splits):
    """A last row block of at most 16 real rows run narrow (the rows as the MMAs' N, its own split count,
    its extra partial slots empty): against the float64 reference (outputs poisoned, two requests, the
    second's tree shorter, unused pool slots NaN), then replayed from a CUDA graph into poisoned outputs
    with the same bits."""
    from tritree.kernels.verify import gluon_launch as GL

    assert GL.narrow_rows(T * H) in (8, 16)
    case = poison_unused_slots(make_case(2, T, H, P, [30_000 + 45, 700 + 64 - T], [T, T // 2 + 1],
                                         ("random", "chain"), torch.bfloat16, seed=T + H + P))
    kw = {} if splits is None else {"num_splits": splits}
    check_reference_then_graph_replay(case, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("T,H,P,kv_lens,splits", [
    (65, 8, 64, [46_000, 700], None),  # the engine's budget-64 shape: two tail tiles in the last split
    (17, 8, 64, [46_000, 1_000 + 45], None),  # an odd prefix tile in every split, then the tree keys
    (129, 2, 64, [3_000 + 64, 64], 5),  # four tail tiles (an odd prefix tile, a partial one, the tree's); a prefix
    # that ends on a page, its tree keys alone in a chunk
    (33, 4, 128, [50, 0], 3),  # no unmasked pair at all (the tail is the whole chunk), splits with no keys
    (65, 8, 64, [20_000 + 45, 1_000 + 64 - 65], 1),  # one split
    (9, 8, 128, [9_000 + 127, 200], 16),  # tiles at a page's second half; many small chunks
    (65, 8, 64, [700, 100], 9),  # short chunks: the tree keys' chunk before the last, the last empty
    (40, 4, 128, [5_180, 128 + 63], 4),  # P = 128, the tree keys ending in a page's second half
    # MASKED_PAIRS (launches with a narrow block or full row blocks): the tile in which the keys end copied from
    # before its start (the slot below 0 at P = 64: zeros; at slot 64 of a page of 128 earlier keys of its
    # page), a pair's second tile past the end
    (65, 8, 64, [46_000 + 63, 1], None),  # 1 and 63 keys of the last tile before the tree's 65 / 33
    (16, 8, 128, [10_000 + 48, 256], 3),  # P = 128: the last tile at slot 64 of a page, moved back 48 slots
    (8, 16, 64, [64 + 3, 64 - 8 + 1], 1),  # a prefix tile, then 3 prefix keys and the tree's 8 (53 rows of zeros
    # in front of them); the second request in one tile (the tile tail)
])
def test_gpu_ws_tail_shapes(T, H, P, kv_lens, splits):
    """The ws kernel's masked tiles in every shape a chunk gives them (one to four tiles, a prefix ending
    mid-tile or on a page, chunks that are all tail or empty, one split; as masked pairs ahead of the full
    ones where the launch has a narrow block or full row blocks, else one tile at a time) against the
    float64 reference with the unused pool slots NaN, then replayed from a CUDA graph into poisoned
    outputs with the same bits."""
    cfg = AttnConfig(64, 64, 8, 2, tma=True, split_scores=True, kernel="gluon-ws")
    case = poison_unused_slots(make_case(2, T, H, P, kv_lens, [T, T // 2 + 1], ("random", "chain"), torch.bfloat16,
                                         seed=T + H + P + len(kv_lens)))
    kw = {"config": cfg} if splits is None else {"config": cfg, "num_splits": splits}
    check_reference_then_graph_replay(case, **kw)


@pytest.mark.gpu
def page_layout_case(T, H, P, layout):
    """Two bf16 requests over a ``"contiguous"``, ``"mixed"`` (adjacent runs broken by swapped pages: some
    tile pairs straddle a break, some do not) or ``"fragmented"`` page table, unused pool slots NaN."""
    case = make_case(2, T, H, P, [30_000 + 45, 3_000 + 7], [T, T // 2 + 1], ("random", "chain"), torch.bfloat16,
                     seed=T + H + P, fragmented=layout == "fragmented")
    if layout == "mixed":
        pt = case["page_table"]
        for b, (i, j) in enumerate([(5, 300), (40, 2)]):
            pt[b, i], pt[b, j] = pt[b, j].clone(), pt[b, i].clone()
    return poison_unused_slots(case)


@pytest.mark.gpu
@pytest.mark.parametrize("T,H,P,layout", [(65, 8, 64, "contiguous"), (65, 8, 64, "mixed"), (129, 8, 64, "mixed"),
                                          (65, 16, 64, "contiguous"), (33, 8, 128, "fragmented"),
                                          (16, 8, 64, "mixed"), (16, 64, 64, "contiguous")])
def test_gpu_ws_wide_copies(T, H, P, layout):
    """Wide copies (launches with a narrow last row block, or rows that fill the last block): a pair's two
    tiles copied as one 128-row box per column block where they are consecutive pool rows (adjacent pages,
    or one page of 128), two boxes elsewhere. Page tables contiguous, mixed (adjacent runs broken by swapped
    pages) and fragmented, unused pool slots NaN: against the reference, then from a CUDA graph."""
    cfg = AttnConfig(64, 64, 8, 2, tma=True, split_scores=True, kernel="gluon-ws")
    case = page_layout_case(T, H, P, layout)
    launch = gluon_launch_of(case, cfg)
    assert dict(launch.constexprs)["WIDE_COPIES"] and launch.wide_desc
    check_reference_then_graph_replay(case, config=cfg)


# Shapes of the ws kernel's synchronisation and tail paths: narrow, full and part-filled row blocks, row
# gathers, P = 128, requests with at most one pair a split (the pair buffers handed back by hardware-barrier
# arrivals of every consumer thread), a request that is all tail, an empty one (the masked tail's tree-mask
# words loaded before each tile's copy); the softmax's row maxima exchanged once between the warpgroups.
_WS_SHAPES = [(65, 8, 64, [30_000 + 45, 3_000 + 7]), (16, 64, 64, [30_000 + 45, 130]),
              (17, 8, 64, [20_000 + 3, 3_000 + 7]), (19, 8, 1, [20_000 + 45, 70]),
              (64, 8, 128, [30_000 + 45, 3_000 + 7]), (17, 8, 64, [20_000 + 3, 130]),
              (16, 64, 128, [30_000 + 45, 0])]


@pytest.mark.gpu
@pytest.mark.parametrize("T,H,P,kv_lens", _WS_SHAPES)
def test_gpu_ws_shapes(T, H, P, kv_lens):
    """The ws kernel (``_WS_SHAPES``) against the reference with a chain tree and a short second request,
    then from a CUDA graph into poisoned outputs."""
    cfg = AttnConfig(64, 64, 8, 2, tma=P >= 64, split_scores=True, kernel="gluon-ws")
    case = poison_unused_slots(make_case(2, T, H, P, kv_lens, [T, T // 2 + 1], ("random", "chain"), torch.bfloat16,
                                         seed=T + H + P + kv_lens[1]))
    check_reference_then_graph_replay(case, config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 16])
def test_gpu_small_pages_table_in_a_graph(P):
    """The small-pages table (the warp-specialised kernel's row gathers on Hopper) against the
    reference, then captured in a CUDA graph and replayed into poisoned outputs."""
    case = poison_unused_slots(make_case(2, 19, 8, P, [20_000, 1_000 + 3], [19, 11], ("random", "chain"),
                                         torch.bfloat16, seed=P))
    check_reference_then_graph_replay(case)


@pytest.mark.gpu
@pytest.mark.parametrize("T,H,P,L", [(8, 8, 64, 46_000), (64, 8, 64, 8_000), (16, 64, 1, 4_000), (17, 8, 16, 6_000)])
def test_gpu_fp8_pool(T, H, P, L):
    """bf16 queries over an fp8 (e4m3) pool with a per-tensor scale, the table's config (the Triton
    kernel with its tiles), against the reference; then compiled and in a CUDA graph."""
    case = to_fp8_pool(make_case(1, T, H, P, [L], [T - 1], ("random",), torch.bfloat16, seed=L + P), 2.0)
    ref = check_against_reference(case, torch.bfloat16)
    args = (case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"])
    kw = dict(sm_scale=SM_SCALE, tree_lens=case["tree_lens"], kv_scale=case["kv_scale"])
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: verify_mla(*a, **kw), fullgraph=True)(*args)
    assert ((compiled.float() - ref.float()).norm() / ref.float().norm()) < TOL[torch.bfloat16]
    out = torch.empty_like(ref)
    lse = torch.empty(ref.shape[:3], dtype=torch.float32, device=ref.device)
    g = torch.cuda.CUDAGraph()
    verify_mla(*args, **kw, out=out, lse=lse)
    with torch.cuda.graph(g):
        verify_mla(*args, **kw, out=out, lse=lse)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("table,P", [("sm_120", 64), ("sm_120:small_pages", 1), ("sm_120:small_pages", 16),
                                     ("sm_120:fp8", 64), ("sm_120:fp8", 1), ("sm_120:fp32", 64), ("sm_120:fp32", 1),
                                     ("sm_120:fp32:fp8", 64), ("sm_120:fp32:fp8", 1)])
def test_gpu_sm120_configs_run_on_this_gpu(table, P):
    """The sm_120 tables' configs at the page sizes and pool dtypes ``configs.lookup`` gives them (the Triton
    kernel for pages of 64 keys and fp32 queries, the Gluon mma.sync kernel for the others on an sm_90 / sm_120
    GPU)."""
    from tritree.kernels.verify import VERIFY_MLA_CONFIGS
    dtype = torch.float32 if ":fp32" in table else torch.bfloat16
    for cfg in set(VERIFY_MLA_CONFIGS[table].values()):
        case = make_case(1, 16, 8, P, [5_000 + 37], [13], ("random",), dtype, seed=cfg.block_m + P)
        if table.endswith(":fp8"):
            case = to_fp8_pool(case, 2.0)
        check_against_reference(case, dtype, config=cfg)


@pytest.mark.gpu
def test_gpu_cuda_graph_and_compile():
    case = make_case(1, 16, 8, 64, [3_000], None, ("random",), torch.bfloat16, seed=2)
    args = (case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"])
    ref = verify_mla(*args, sm_scale=SM_SCALE)
    fn = torch.compile(lambda *a: verify_mla(*a, sm_scale=SM_SCALE), fullgraph=True)
    compiled = fn(*args)  # the op runs the eager plan
    assert ((compiled.float() - ref.float()).norm() / ref.float().norm()) < TOL[torch.bfloat16]
    out = torch.empty_like(ref)
    lse = torch.empty(ref.shape[:3], dtype=torch.float32, device=ref.device)
    verify_mla(*args, sm_scale=SM_SCALE, out=out, lse=lse)  # warm
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        verify_mla(*args, sm_scale=SM_SCALE, out=out, lse=lse)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


@pytest.mark.gpu
def test_gpu_graph_without_tree_lens_adds_no_fill_and_replays_right():
    """``tree_lens=None``: a cached tensor of T's, so a graph captured after an eager call holds no fill
    kernel; a graph whose capture meets a new (B, T) first fills inside the graph (the cache is not
    fed from a capture, whose fill runs only at replay) and an eager call after it is still right."""
    for T, eager_first in ((13, True), (14, False)):
        case = make_case(2, T, 8, 64, [3_000, 700], None, ("random",), torch.bfloat16, seed=T)
        args = (case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"])
        full = torch.full((2,), T, dtype=torch.int32, device=case["q"].device)
        ref, ref_lse = verify_mla(*args, sm_scale=SM_SCALE, tree_lens=full, return_lse=True)
        out, lse = torch.empty_like(ref), torch.empty_like(ref_lse)
        _launch._FULL_LENGTHS.pop((ref.device, 2, T), None)
        if eager_first:
            verify_mla(*args, sm_scale=SM_SCALE, out=out, lse=lse)
            assert (ref.device, 2, T) in _launch._FULL_LENGTHS
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            verify_mla(*args, sm_scale=SM_SCALE, out=out, lse=lse)
        assert ((ref.device, 2, T) in _launch._FULL_LENGTHS) == eager_first
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ref)
        assert torch.equal(verify_mla(*args, sm_scale=SM_SCALE), ref)


def test_full_lengths_are_cached_and_right():
    a = _launch.full_lengths(3, 7, torch.device("cpu"))
    assert a.dtype == torch.int32 and a.tolist() == [7, 7, 7]
    assert _launch.full_lengths(3, 7, torch.device("cpu")) is a
    assert _launch.full_lengths(3, 8, torch.device("cpu")).tolist() == [8, 8, 8]


def test_cpu_path_without_interpreter_matches_reference(monkeypatch):
    """On the CPU outside the interpreter the launcher runs the reference (float32)."""
    from tritree.kernels.verify import launcher

    if HAS_GPU:
        pytest.skip("CPU path")
    case = make_case(1, 3, 2, 16, [10], None, ("chain",), torch.float32, seed=4, device="cpu")
    monkeypatch.setattr(_launch, "interpreting", lambda: False)
    launcher._PLANS.clear()
    try:
        plan = launcher.VerifyPlan(case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"],
                                   case["tree_lens"], sm_scale=SM_SCALE)
        assert plan.launch.route == "reference"
        check_against_reference(case, torch.float32)
    finally:
        launcher._PLANS.clear()
