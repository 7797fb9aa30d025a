"""The sm_120 Gluon verify kernel (``verify.gluon_mma``, ``kernel="gluon-mma"``: ``mma.sync``, queries in
registers, row gathers, bf16 and fp8 pools), launched through the production launcher (``VerifyPlan``).

On the CPU (Gluon has no interpreter): the static launch rules (grid, constexprs, options, no descriptors,
fp32 partials) and which kernel, tiles and split count ``verify_mla`` picks on an RTX PRO 6000 (sm_120, 188
SMs), on an H200 under ``TRITREE_ARCH=sm_120`` and where the kernel cannot serve (fp16 queries,
unaligned rows, other GPUs; fp8 pools do run it). Its compiles for sm_120 and sm_90 are in the ahead-of-time audit
(``test_aot_audit.py``). On an sm_90 or sm_120 GPU: the kernel against the float64 reference in bf16 (pages of
1, 16, 64 and 128, one split and several, fragmented pools, trees over 32 nodes, 46k-key prefixes, output,
lse and partials poisoned with NaN and every element checked written), a property test over random shapes,
and ``verify_mla``'s own launches eager, compiled and in a CUDA graph."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree.kernels._splitkv import balanced_num_splits
from tritree.kernels.configs import AttnConfig
from tritree.kernels.verify import abi, policy
from tritree.kernels.verify import gluon_launch as L
from tritree.testing import TREE_KINDS

from ...conftest import HAS_GPU
from .test_verify_gluon import CASES, _splits_for, check
from .test_verify_mla import (
    SM_SCALE,
    TOL,
    check_against_reference,
    check_reference_then_graph_replay,
    make_case,
    page_layout_case,
    poison_unused_slots,
    to_fp8_pool,
)

RTX_PRO_6000_SMS = 188
H200_SMS = 132
MMA = AttnConfig(32, 32, 8, 2, kernel="gluon-mma")


def _mma_ok():
    return HAS_GPU and L.GLUON_AVAILABLE and torch.cuda.get_device_capability()[0] in (9, 12)


def mma_gpu(test):
    """A GPU test that needs an sm_90 or sm_120 GPU and triton's Gluon."""
    return pytest.mark.gpu(pytest.mark.skipif(not _mma_ok(), reason="needs an sm_90 / sm_120 GPU and Gluon")(test))


# ---- static rules (CPU) --------------------------------------------------------------------------

def _need_gluon():
    if not L.GLUON_AVAILABLE:
        pytest.skip(f"this triton has no Gluon: {L._IMPORT_ERROR!r}")


def test_plan_mma_launch():
    """One program a (32-row block, split, request), 8 warps, the page size and split count as constexprs,
    fp32 partials, no TMA descriptor, no PDL."""
    _need_gluon()
    g = L.plan_verify_gluon(kernel="gluon-mma", batch=2, T=65, H=8, page_size=64, num_splits=15, num_sms=188,
                            pdl_capable=True)
    assert g.fn is L._verify_gluon_mma_kernel
    assert g.grid == (17, 15, 2) and g.num_splits == 15
    assert dict(g.constexprs) == dict(PAGE_SIZE=64, SINGLE_SPLIT=False, BLOCK_M=32, BLOCK_N=32, D_LAT=512, D_PE=64)
    assert g.options() == {"num_warps": 8} and not g.launch_pdl
    assert not g.partials_16bit and L.partials_narrow_for("gluon-mma", 64) is None
    assert L.descriptors_for(g, torch.zeros(4, 64, 576, dtype=torch.bfloat16)) == ()
    one = L.plan_verify_gluon(kernel="gluon-mma", batch=1, T=8, H=8, page_size=1, num_splits=1, num_sms=188,
                              pdl_capable=False)
    assert one.grid == (2, 1, 1) and dict(one.constexprs)["SINGLE_SPLIT"] and dict(one.constexprs)["PAGE_SIZE"] == 1


def test_runs_on():
    assert L.runs_on("gluon-mma", 12) and L.runs_on("gluon-mma", 9)
    assert not L.runs_on("gluon-mma", 8) and not L.runs_on("gluon-mma", 10)
    assert L.runs_on("gluon-ws", 9) and not L.runs_on("gluon-ws", 12) and not L.runs_on("gluon", 12)


def test_gather_layout_takes_any_page_size_with_aligned_rows():
    """The mma kernel's layout need (``policy._gather_layout``): 16-byte aligned pool and q rows, at every page
    size, bf16 and fp8 pools."""
    q = torch.zeros(1, 1, 1, 576, dtype=torch.bfloat16)
    for P in (1, 2, 4, 8, 16, 32, 64, 128):
        assert policy._gather_layout(q, torch.zeros(4, P, 576, dtype=torch.bfloat16))
        assert policy._gather_layout(q, torch.zeros(4, P, 576, dtype=torch.float8_e4m3fn))
    assert not policy._gather_layout(q, torch.zeros(4, 64, 580, dtype=torch.bfloat16)[..., :576])
    assert not policy._gather_layout(torch.zeros(1, 1, 1, 580, dtype=torch.bfloat16)[..., 2:578],
                                     torch.zeros(4, 64, 576, dtype=torch.bfloat16))


def launch_pages(T, P, L_keys=46_000):
    """The page-table capacity ``_launch_on`` plans with."""
    return (L_keys + T + P - 1) // P + 1


def _launch_on(monkeypatch, *, major, sms, arch=None, B=1, T, H, P, L_keys=46_000, q_dtype=torch.bfloat16,
               kv_dtype=torch.bfloat16, gather_layout=True, gluon_layout=False):
    """``verify_mla``'s launch decision (``plan_launch``) on a GPU of compute capability ``major`` with ``sms``
    SMs (``arch``: ``TRITREE_ARCH``, else the device's own table)."""
    _need_gluon()
    if arch:
        monkeypatch.setenv("TRITREE_ARCH", arch)
    else:
        monkeypatch.delenv("TRITREE_ARCH", raising=False)
    monkeypatch.setattr(policy, "num_sms", lambda device: sms)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
    max_pages = launch_pages(T, P, L_keys)
    return policy.plan_launch(device=torch.device("cuda", 0), q_dtype=q_dtype, kv_dtype=kv_dtype, batch=B, T=T, H=H,
                          head_dim=576, page_size=P, max_pages=max_pages, gluon_layout=gluon_layout, tma_layout=False,
                          gather_layout=gather_layout)


@pytest.mark.parametrize("B,T,H", [(1, 65, 8), (1, 17, 8), (1, 8, 8), (1, 16, 64), (4, 65, 8), (4, 8, 8)])
@pytest.mark.parametrize("P", [1, 16, 64, 128])
def test_verify_mla_picks_the_faster_kernel_per_page_size_on_sm120(B, T, H, P, monkeypatch):
    """bf16 on an RTX PRO 6000 (sm_120, 188 SMs), and on an H200 under ``TRITREE_ARCH=sm_120`` with its 132 SMs:
    pages below 64 keys run the Gluon mma.sync kernel (its 32x32 tiles, fp32 partials, the balanced split count:
    waves against chunk length); pages of 64+ keys the Triton kernel with 16x64 tiles (faster there in
    emulation), its programs within one wave."""
    for major, sms, arch in ((12, RTX_PRO_6000_SMS, None), (9, H200_SMS, "sm_120")):
        launch = _launch_on(monkeypatch, major=major, sms=sms, arch=arch, B=B, T=T, H=H, P=P)
        if P < 64:
            assert launch.route == "gluon-mma" and launch.config == MMA and launch.partials_dtype == torch.float32
            want = balanced_num_splits(batch=B, row_blocks=-(-T * H // 32), max_keys=launch_pages(T, P) * P,
                                       block_n=32, sms=sms)
            assert launch.num_splits == want
        else:
            assert launch.route == "triton" and launch.config == AttnConfig(16, 64, 4, 2)
            assert B * -(-T * H // 16) * launch.num_splits <= max(sms, B * -(-T * H // 16))


@pytest.mark.parametrize("P", [1, 64])
def test_sm120_fp8_pools_take_the_mma_kernel(P, monkeypatch):
    """An fp8 (e4m3) pool with bf16 queries on sm_120: the same kernel (the fp8 table's config), fp32 partials."""
    fp8 = _launch_on(monkeypatch, major=12, sms=188, T=65, H=8, P=P, kv_dtype=torch.float8_e4m3fn)
    assert fp8.route == "gluon-mma" and fp8.config == MMA and fp8.partials_dtype == torch.float32


def test_scale_args():
    """The mma kernel takes ``sm_scale log2(e) kv_scale`` and ``kv_scale``; the Hopper kernels the first alone."""
    import math

    q = torch.zeros(1, 2, 8, 576, dtype=torch.bfloat16)
    kv = torch.zeros(4, 16, 576, dtype=torch.bfloat16)
    pt = torch.zeros(1, 4, dtype=torch.int32)
    mask = torch.zeros(1, 2, 1, dtype=torch.int32)

    def scales(kernel, sm_scale, kv_scale):
        return abi.scalar_args(kernel, q, kv, pt, mask, (0,) * 4, (0,) * 4, sm_scale=sm_scale, kv_scale=kv_scale,
                               num_splits=1)[:len(abi.SCALES[kernel])]

    assert scales("gluon-mma", 0.5, 4.0) == pytest.approx((0.5 * 4.0 / math.log(2), 4.0))
    assert scales("gluon-mma", 0.5, None) == pytest.approx((0.5 / math.log(2), 1.0))
    assert scales("gluon-ws", 0.5, None) == pytest.approx((0.5 / math.log(2),))


@pytest.mark.parametrize("P", [1, 64])
def test_sm120_calls_the_mma_kernel_cannot_serve(P, monkeypatch):
    """fp16 queries (over an fp16 or an fp8 pool) and unaligned rows: the Triton kernel with the table's tiles
    (32x32 for fp8 pools and small pages, 16x64 for pages of 64 keys); an sm_80 GPU forced to the sm_120 table:
    the Triton kernel."""
    tiles = (32, 32) if P < 64 else (16, 64)
    fp8_fp16 = _launch_on(monkeypatch, major=12, sms=188, T=65, H=8, P=P, q_dtype=torch.float16,
                          kv_dtype=torch.float8_e4m3fn)
    assert fp8_fp16.route == "triton" and (fp8_fp16.config.block_m, fp8_fp16.config.block_n) == (32, 32)
    fp16 = _launch_on(monkeypatch, major=12, sms=188, T=65, H=8, P=P, q_dtype=torch.float16, kv_dtype=torch.float16)
    assert fp16.route == "triton" and (fp16.config.block_m, fp16.config.block_n) == tiles
    unaligned = _launch_on(monkeypatch, major=12, sms=188, T=65, H=8, P=P, gather_layout=False)
    assert unaligned.route == "triton" and (unaligned.config.block_m, unaligned.config.block_n) == tiles
    ampere = _launch_on(monkeypatch, major=8, sms=108, arch="sm_120", T=65, H=8, P=P)
    assert ampere.route == "triton"


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 8), T=st.integers(1, 300), H=st.sampled_from([1, 3, 8, 16, 64, 128]),
       P=st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]), L_keys=st.integers(0, 200_000),
       kv=st.sampled_from(["bf16", "fp8", "fp16"]), aligned=st.booleans(), sms=st.sampled_from([132, 170, 188]))
def test_sm120_launch_decisions(B, T, H, P, L_keys, kv, aligned, sms):
    """A bf16-query call with 16-byte aligned rows on sm_120 over an fp8 pool or pages below 64 keys runs the mma
    kernel with the balanced split count (no chunk below 4 tiles of the page table's capacity unless one split);
    everything else the Triton kernel (16x64 tiles for 16-bit pools of 64+ key pages, else 32x32), its programs
    within one wave of the SMs unless one split already exceeds it."""
    _need_gluon()
    mp = pytest.MonkeyPatch()
    try:
        dtype = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "fp16": torch.float16}[kv]
        q_dtype = torch.float16 if kv == "fp16" else torch.bfloat16
        launch = _launch_on(mp, major=12, sms=sms, B=B, T=T, H=H, P=P, L_keys=L_keys, q_dtype=q_dtype,
                            kv_dtype=dtype, gather_layout=aligned)
    finally:
        mp.undo()
    wide = kv != "fp8" and P >= 64  # the main table's Triton tiles
    assert launch.route == ("gluon-mma" if aligned and kv != "fp16" and not wide else "triton")
    assert (launch.config.block_m, launch.config.block_n) == ((16, 64) if wide else (32, 32))
    blocks = -(-T * H // launch.config.block_m)
    if launch.num_splits > 1:
        assert launch.num_splits * launch.config.block_n * 4 <= launch_pages(T, P, L_keys) * P
        if launch.route == "triton":
            assert B * blocks * launch.num_splits <= sms
    if launch.route == "gluon-mma":
        assert launch.num_splits == balanced_num_splits(batch=B, row_blocks=blocks,
                                                        max_keys=launch_pages(T, P, L_keys) * P, block_n=32, sms=sms)
        assert launch.partials_dtype == torch.float32
        g = L.plan_verify_gluon(kernel="gluon-mma", batch=B, T=T, H=H, page_size=P, num_splits=launch.num_splits,
                                num_sms=sms, pdl_capable=False, partials_dtype=launch.partials_dtype)
        assert g.grid == (blocks, launch.num_splits, B)


def test_h200_keeps_the_hopper_kernels(monkeypatch):
    """Without ``TRITREE_ARCH`` an H200 runs its own table (the warp-specialised kernel at T=65, H=8)."""
    launch = _launch_on(monkeypatch, major=9, sms=H200_SMS, T=65, H=8, P=64, gluon_layout=True)
    assert launch.route == "gluon-ws"


def test_gather_layout():
    q = torch.zeros(1, 2, 8, 576, dtype=torch.bfloat16)
    kv = torch.zeros(4, 16, 576, dtype=torch.bfloat16)
    assert policy._gather_layout(q, kv)
    assert not policy._gather_layout(q, torch.zeros(4, 16, 580, dtype=torch.bfloat16)[..., :576])  # rows of 1160 B
    assert not policy._gather_layout(torch.zeros(1, 2, 8, 580, dtype=torch.bfloat16)[..., 1:577], kv)


# ---- GPU: the kernel against the reference -------------------------------------------------------

@mma_gpu
@pytest.mark.parametrize("many", [False, True], ids=["splits1", "splitsN"])
@pytest.mark.parametrize("c", CASES, ids=lambda c: f"B{c[0]}T{c[1]}H{c[2]}P{c[3]}L{c[4][0]}")
def test_mma_matches_reference(c, many):
    B, T, H, P, kv_lens, tree_lens, kinds = c
    case = make_case(B, T, H, P, kv_lens, tree_lens, kinds, torch.bfloat16, seed=sum(kv_lens) + T * H + 1)
    check(case, "gluon-mma", _splits_for(case, many))


@mma_gpu
@pytest.mark.parametrize("P", [1, 2, 16, 32])
@pytest.mark.parametrize("many", [False, True], ids=["splits1", "splitsN"])
@pytest.mark.parametrize("c", CASES[:6], ids=lambda c: f"B{c[0]}T{c[1]}H{c[2]}L{c[4][0]}")
def test_mma_small_pages_match_reference(c, many, P):
    """The cases above over a fragmented pool of small pages (the case's own P ignored)."""
    B, T, H, _, kv_lens, tree_lens, kinds = c
    case = make_case(B, T, H, P, kv_lens, tree_lens, kinds, torch.bfloat16, seed=sum(kv_lens) + T * H + P,
                     fragmented=True)
    check(case, "gluon-mma", _splits_for(case, many))


@mma_gpu
@pytest.mark.parametrize("num_splits", [2, 3, 5, 7, 200])
@pytest.mark.parametrize("P", [1, 64])
def test_mma_split_parities_and_empty_chunks(num_splits, P):
    """Chunks of odd and even tile counts with a remainder in one launch; more splits than tiles (empty key
    ranges: m = -inf, l = 0)."""
    case = make_case(1, 8, 8, P, [21 * 32 + 17], None, ("random",), torch.bfloat16, seed=num_splits + P)
    check(case, "gluon-mma", num_splits)


@mma_gpu
@pytest.mark.parametrize("P", [1, 16, 64])
@pytest.mark.parametrize("T", [19, 33, 65])
def test_mma_never_reads_garbage_outside_the_request(T, P):
    """NaN in every pool slot no request uses: keys past a chunk's end are zero-filled, never read."""
    case = poison_unused_slots(make_case(2, T, 8, P, [3_000 + 37, 1_000 + 5], [T, 11], ("random", "chain"),
                                         torch.bfloat16, seed=5 + P + T))
    check(case, "gluon-mma", 3)
    check(case, "gluon-mma", 1)


@mma_gpu
@pytest.mark.parametrize("T,H,P,layout", [(65, 8, 64, "contiguous"), (65, 8, 64, "mixed"), (33, 8, 128, "fragmented"),
                                          (16, 64, 64, "contiguous")])
def test_mma_over_page_layouts(T, H, P, layout):
    case = page_layout_case(T, H, P, layout)
    check(case, "gluon-mma", 8)
    check(case, "gluon-mma", 1)


@mma_gpu
@pytest.mark.parametrize("T,H,P", [(65, 8, 64), (17, 8, 64), (8, 8, 1), (16, 64, 64), (65, 8, 1)])
def test_mma_verify_mla_at_46k(T, H, P, monkeypatch):
    """``verify_mla`` under ``TRITREE_ARCH=sm_120`` (the H200; sm_120 natively) at the target shapes, two
    requests of 46,000 and 5,000 prefix keys, a fragmented pool with its unused slots NaN, the second tree
    shorter: routed as the sm_120 plan says (the mma kernel below 64-key pages, the Triton 16x64 tiles for
    bf16 pools of 64-key pages; ``test_mma_over_page_layouts`` runs the mma kernel there), against the
    reference into poisoned outputs."""
    monkeypatch.setenv("TRITREE_ARCH", "sm_120")
    case = poison_unused_slots(make_case(2, T, H, P, [46_000, 5_000 + 7], [T, T // 2 + 1], ("random", "chain"),
                                         torch.bfloat16, seed=T * H + P))
    q, kv, pt = case["q"], case["kv"], case["page_table"]
    assert policy.launch_of(q, kv, pt, None, None).route == ("triton" if P >= 64 else "gluon-mma")
    check_against_reference(case, torch.bfloat16)


@mma_gpu
def test_mma_in_a_cuda_graph_and_compiled(monkeypatch):
    """The mma kernel through ``verify_mla`` (``TRITREE_ARCH=sm_120``): captured in a CUDA graph and replayed
    into poisoned outputs (bit-equal to the eager call), and under torch.compile (its opaque op)."""
    from tritree import verify_mla

    monkeypatch.setenv("TRITREE_ARCH", "sm_120")
    case = make_case(2, 65, 8, 64, [20_000, 3_000], [65, 40], ("random", "wide"), torch.bfloat16, seed=77)
    ref = check_reference_then_graph_replay(case)
    args = (case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"])
    kw = dict(sm_scale=SM_SCALE, tree_lens=case["tree_lens"])
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: verify_mla(*a, **kw), fullgraph=True)(*args)
    assert ((compiled.float() - ref.float()).norm() / ref.float().norm()) < TOL[torch.bfloat16]


@mma_gpu
@pytest.mark.parametrize("T,H,P,L", [(8, 8, 64, 46_000), (65, 8, 64, 8_000), (16, 64, 1, 4_000), (17, 8, 16, 6_000),
                                     (33, 3, 128, 700)])
@pytest.mark.parametrize("headroom", [1.0, 4.0])
def test_mma_fp8_pool(T, H, P, L, headroom, monkeypatch):
    """bf16 queries over an fp8 (e4m3) pool with a per-tensor scale under the sm_120 tables (``TRITREE_ARCH``): the
    mma kernel, one split and several, against the float64 reference over the same fp8 values, unused slots NaN."""
    monkeypatch.setenv("TRITREE_ARCH", "sm_120")
    case = to_fp8_pool(make_case(2, T, H, P, [L, 300 + 7], [T - 1, T // 2 + 1], ("random", "chain"), torch.bfloat16,
                                 seed=L + P + T), headroom)
    assert policy.launch_of(case["q"], case["kv"], case["page_table"], None, None).route == "gluon-mma"
    check_against_reference(case, torch.bfloat16)
    check_against_reference(case, torch.bfloat16, num_splits=1)
    check_against_reference(case, torch.bfloat16, num_splits=7)


@st.composite
def mma_cases(draw):
    B = draw(st.integers(1, 3))
    T = draw(st.integers(1, 70))
    H = draw(st.integers(1, max(1, min(16, 160 // T))))
    P = draw(st.sampled_from([1, 2, 16, 32, 64, 128]))
    kv_lens = draw(st.lists(st.one_of(st.integers(0, 3_000), st.sampled_from([0, 1, 31, 32, 33, P, 2 * P - 1])),
                            min_size=B, max_size=B))
    padded = draw(st.booleans())
    tree_lens = draw(st.lists(st.integers(0, T), min_size=B, max_size=B)) if padded else None
    kinds = tuple(draw(st.lists(st.sampled_from(TREE_KINDS), min_size=1, max_size=B)))
    num_splits = draw(st.sampled_from([1, 2, 3, 9, 40]))
    return dict(B=B, T=T, H=H, P=P, kv_lens=kv_lens, tree_lens=tree_lens, kinds=kinds, num_splits=num_splits,
                fragmented=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)))


@mma_gpu
@settings(max_examples=40, deadline=None)
@given(mma_cases())
def test_mma_property(c):
    """Random batches, trees (chains, stars, random, wide; over 32 nodes), page sizes, prefix lengths (0, 1, tile
    and page boundaries), padding and split counts: the mma kernel (forced by its config) against the float64
    reference."""
    case = make_case(c["B"], c["T"], c["H"], c["P"], c["kv_lens"], c["tree_lens"], c["kinds"], torch.bfloat16,
                     seed=c["seed"], fragmented=c["fragmented"])
    check_against_reference(case, torch.bfloat16, config=MMA, num_splits=c["num_splits"])
