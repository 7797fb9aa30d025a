"""The Hopper Gluon verify kernels: the plain one (``verify.gluon_plain``) and the warp-specialised one
(``verify.gluon_ws``), launched through the production launcher (``verify.launcher.VerifyPlan``, the kernel
picked by its ``config``).

On the CPU: the static launch rules (``verify.gluon_launch.plan_verify_gluon``: grid, the narrow block's split
count, the constexprs and launch options of a shape; ``descriptors_for``; which kernel and split count
``verify_mla`` picks for a shape on an H200). On an sm_90 GPU: the launches ``verify_mla`` makes (pages of 1, 16, 64 and
128; one split and several; a narrow last row block; masked pairs; wide copies; partials by TMA; row
gathers) against the float64 reference, bf16, the output, lse and split partials poisoned with NaN before
the launch and every element checked written."""

import math

import pytest
import torch

from tritree import verify_mla
from tritree.kernels.configs import AttnConfig
from tritree.kernels.verify import VerifyPlan, policy
from tritree.kernels.verify import gluon_launch as L

from ...conftest import HAS_GPU
from .test_verify_mla import SM_SCALE, assert_matches_reference, make_case, page_layout_case, poison_unused_slots

H200_SMS = 132


def _gluon_ok():
    return HAS_GPU and L.GLUON_AVAILABLE and torch.cuda.get_device_capability()[0] == 9


def sm90(test):
    """A GPU test that needs an sm_90 GPU and triton's Gluon."""
    return pytest.mark.gpu(pytest.mark.skipif(not _gluon_ok(), reason="needs an sm_90 GPU and triton's Gluon")(test))


# ---- static rules (CPU) --------------------------------------------------------------------------

def plan(kernel="gluon-ws", *, T, H, P=64, splits, B=1, sms=H200_SMS, pdl=True, **kw):
    return L.plan_verify_gluon(kernel=kernel, batch=B, T=T, H=H, page_size=P, num_splits=splits, num_sms=sms,
                               pdl_capable=pdl, **kw)


def cx(launch):
    return dict(launch.constexprs)


def test_plan_narrow_last_row_block():
    """T=65,H=8 (8 full row blocks and 8 rows) at P=64 with verify_mla's 15 splits on 132 SMs: a 1-D grid of
    the full blocks' 8 x 15 programs and the narrow block's 12, narrow rows 8, masked pairs, wide copies,
    partials by TMA, the wait for the prior grid with PDL, ptxas -O1."""
    g = plan(T=65, H=8, splits=15)
    assert g.kernel == "gluon-ws" and g.fn is L._verify_gluon_ws_kernel
    assert g.grid == (8 * 15 + 12, 1, 1) and g.num_splits == 15 and g.narrow_splits == 12
    c = cx(g)
    assert c["NARROW_ROWS"] == 8 and c["PAGE_SIZE"] == 64 and not c["SINGLE_SPLIT"]
    assert c["WIDE_COPIES"] and c["MASKED_PAIRS"] and c["WAIT_PRIOR"] and c["TMA_STORE"]
    assert c["PRODUCER_WARPS"] == 4 and c["PRODUCER_REGS"] == 24 and c["TIMELINE"] == 0
    assert (c["BLOCK_M"], c["BLOCK_N"], c["D_LAT"], c["D_PE"]) == (64, 64, 512, 64)
    assert g.launch_pdl and g.ptx_options == "-O1"
    assert g.options() == {"num_warps": 8, "launch_pdl": True, "ptx_options": "-O1"}
    assert g.wide_desc and g.pages_desc and g.partials_desc and not g.tma3d and g.partials_16bit
    # two requests: the full blocks' programs already fill the SMs, the narrow block gets one split
    assert plan(T=65, H=8, splits=15, B=2).grid == (8 * 15 + 1, 1, 2)
    # explicit splits below the SMs' share: the narrow block has as many as the full ones
    g = plan(T=65, H=8, splits=4)
    assert g.narrow_splits == 4 and g.grid == (8 * 4 + 4, 1, 1)


def test_plan_without_pdl():
    """A device without programmatic dependent launch: the same launch, no wait and no ``launch_pdl``."""
    g = plan(T=65, H=8, splits=15, pdl=False)
    assert not cx(g)["WAIT_PRIOR"] and not g.launch_pdl
    assert g.options() == {"num_warps": 8, "ptx_options": "-O1"}
    assert g.grid == (132, 1, 1) and cx(g)["MASKED_PAIRS"] and cx(g)["WIDE_COPIES"]


@pytest.mark.parametrize("T,H,rows", [(65, 8, 8), (33, 8, 8), (129, 8, 8), (65, 16, 16), (33, 12, 12)])
def test_plan_narrow_rows(T, H, rows):
    """At least 5 row blocks and at most 8 / 16 real rows in the last: narrow (8 / 16 rows)."""
    g = plan(T=T, H=H, splits=3)
    blocks = math.ceil(T * H / 64)
    assert cx(g)["NARROW_ROWS"] == (8 if rows <= 8 else 16)
    assert g.grid == ((blocks - 1) * 3 + g.narrow_splits, 1, 1) and g.narrow_splits == 3
    assert cx(g)["MASKED_PAIRS"] and cx(g)["WIDE_COPIES"] and cx(g)["WAIT_PRIOR"] and g.ptx_options == "-O1"


def test_plan_part_filled_last_block_is_plain():
    """T=17,H=8 (two full row blocks and 8 rows: fewer than 5 blocks): no narrow block, a 2-D grid, no masked
    pairs, no wide copies, no PDL, ptxas' default; partials still by TMA."""
    for splits in (1, 44):
        g = plan(T=17, H=8, splits=splits)
        c = cx(g)
        assert g.grid == (3, splits, 1) and g.narrow_splits == splits and c["NARROW_ROWS"] == 0
        assert not c["MASKED_PAIRS"] and not c["WIDE_COPIES"] and not c["WAIT_PRIOR"]
        assert not g.launch_pdl and g.ptx_options is None and g.options() == {"num_warps": 8}
        assert not g.wide_desc and not g.pages_desc
        assert c["TMA_STORE"] == (splits > 1) == g.partials_desc and c["SINGLE_SPLIT"] == (splits == 1)


@pytest.mark.parametrize("T,H", [(64, 8), (16, 64), (16, 8), (8, 64)])
def test_plan_full_row_blocks(T, H):
    """Rows that fill the last block: no narrow block (a 2-D grid), masked pairs, wide copies, PDL, -O1."""
    g = plan(T=T, H=H, splits=8, B=2)
    c = cx(g)
    assert g.grid == (T * H // 64, 8, 2) and c["NARROW_ROWS"] == 0
    assert c["MASKED_PAIRS"] and c["WIDE_COPIES"] and c["WAIT_PRIOR"] and g.launch_pdl and g.ptx_options == "-O1"
    g1 = plan(T=T, H=H, splits=1)
    assert not cx(g1)["TMA_STORE"] and not g1.partials_desc and cx(g1)["SINGLE_SPLIT"]


@pytest.mark.parametrize("P", [1, 16])
def test_plan_row_gathers(P):
    """Pages below a tile: the producer gathers rows (40 registers), no masked pairs, no wide copies, ptxas'
    default; the narrow block, PDL and partials by TMA follow the same rules as over TMA."""
    for (T, H), narrow, pdl in (((64, 8), 0, True), ((17, 8), 0, False), ((65, 8), 8, True), ((16, 8), 0, True)):
        g = plan(T=T, H=H, P=P, splits=6)
        c = cx(g)
        assert c["PRODUCER_REGS"] == 40 and c["PAGE_SIZE"] == P
        assert not c["MASKED_PAIRS"] and not c["WIDE_COPIES"] and g.ptx_options is None
        assert not g.wide_desc and not g.pages_desc
        assert c["NARROW_ROWS"] == narrow and c["WAIT_PRIOR"] == pdl == g.launch_pdl
        assert c["TMA_STORE"] and g.partials_desc and g.partials_16bit


@pytest.mark.parametrize("P", [64, 128])
def test_plan_plain_kernel_over_tma(P):
    """The plain kernel (up to 64 rows): grid ``(row blocks, splits, B)``, the 3-D latent box, bf16 partials
    re-laid out before their store with several splits; no PDL, no ptxas options."""
    for T, H in ((8, 8), (1, 8), (4, 16), (3, 5)):
        g1 = plan("gluon", T=T, H=H, P=P, splits=1, B=3)
        gn = plan("gluon", T=T, H=H, P=P, splits=66, B=3)
        assert g1.fn is L._verify_gluon_kernel and g1.grid == (1, 1, 3) and gn.grid == (1, 66, 3)
        assert g1.tma3d and cx(g1)["TMA3D"] and gn.tma3d and g1.partials_16bit and gn.partials_16bit
        assert not cx(g1)["COALESCED_STORE"] and cx(gn)["COALESCED_STORE"]
        assert cx(g1)["SINGLE_SPLIT"] and not cx(gn)["SINGLE_SPLIT"] and not cx(gn)["TIMELINE"]
        for g in (g1, gn):
            assert not g.launch_pdl and g.ptx_options is None and g.options() == {"num_warps": 8}
            assert "NARROW_ROWS" not in cx(g) and "WAIT_PRIOR" not in cx(g)
    assert plan("gluon", T=8, H=16, P=P, splits=4).grid == (2, 4, 1)


@pytest.mark.parametrize("P", [1, 16])
def test_plan_plain_kernel_row_gathers(P):
    """The plain kernel over pages below a tile (an explicit config: verify_mla's tables send them to the ws
    kernel): row gathers, fp32 partials, no 3-D box, nothing re-laid out."""
    g = plan("gluon", T=8, H=8, P=P, splits=8)
    assert not g.tma3d and not cx(g)["TMA3D"] and not cx(g)["COALESCED_STORE"] and not g.partials_16bit
    assert plan("gluon", T=8, H=8, P=P, splits=1).partials_16bit  # one split: the bf16 output itself


def test_plan_plain_kernel_9_box_fallback():
    g = plan("gluon", T=8, H=8, splits=2, tma3d=False)
    assert not g.tma3d and not cx(g)["TMA3D"] and cx(g)["COALESCED_STORE"]


def test_plan_rejects():
    with pytest.raises(ValueError, match="kernel must be one of"):
        plan("gluon-seesaw", T=8, H=8, splits=1)
    with pytest.raises(ValueError, match="num_splits"):
        plan(T=8, H=8, splits=0)
    with pytest.raises(TypeError, match="16-bit"):
        plan(T=65, H=8, splits=4, partials_dtype=torch.float32)
    # one split writes the bf16 output, whatever the partials' dtype
    assert plan(T=65, H=8, splits=1, partials_dtype=torch.float32).partials_16bit


def test_partials_narrow_for():
    """16-bit split partials for the ws kernel at every page size and the plain one over TMA; fp32 else."""
    for P in (1, 16, 64, 128):
        assert L.partials_narrow_for("gluon-ws", P) is True
    assert L.partials_narrow_for("gluon", 64) is True and L.partials_narrow_for("gluon", 128) is True
    for kernel, P in (("gluon", 1), ("gluon", 16), ("triton", 64)):
        assert L.partials_narrow_for(kernel, P) is None


def test_narrow_rows_and_splits():
    assert [L.narrow_rows(r) for r in (64, 72, 136, 264, 520, 1040, 396, 152, 512, 1032)] == [0, 0, 0, 8, 8, 16, 16,
                                                                                              0, 0, 8]
    assert L.choose_narrow_num_splits(batch=1, row_blocks=9, max_keys=46_080, block_n=64, sms=132) == 15
    assert L.narrow_splits_for(15, 1, 9, 132) == 12


def test_descriptors_for():
    """Which TMA descriptors a launch takes (an unused slot holds the 64-row one)."""
    kv = torch.zeros(10, 64, 576, dtype=torch.bfloat16)
    dst = torch.zeros(1, 15, 520, 512, dtype=torch.bfloat16)
    d = L.descriptors_for(plan(T=65, H=8, splits=15), kv, dst)
    assert [x.block_shape for x in d] == [[64, 64], [128, 64], [1, 64, 64], [1, 64, 64]]
    assert d[2].shape == [10, 64, 576] and d[3].shape == [15, 520, 512]
    with pytest.raises(ValueError, match="dst_o"):
        L.descriptors_for(plan(T=65, H=8, splits=15), kv)
    d = L.descriptors_for(plan(T=17, H=8, splits=1), kv)
    assert len(d) == 4 and all(x is d[0] for x in d) and d[0].block_shape == [64, 64]
    d = L.descriptors_for(plan("gluon", T=8, H=8, splits=1), kv)
    assert [x.block_shape for x in d] == [[64, 64], [8, 64, 64]] and d[1].shape == [9, 640, 64]
    kv1 = torch.zeros(10, 16, 576, dtype=torch.bfloat16)  # row gathers: slot 0 of each page, never read
    d = L.descriptors_for(plan(T=64, H=8, P=16, splits=1), kv1)
    assert d[0].shape == [10, 576] and all(x is d[0] for x in d)


@pytest.mark.parametrize("arch,major", [("sm_90", 9), ("sm_120", 12), ("sm_80", 8)])
def test_fp32_queries_take_tiles_that_fit(arch, major, monkeypatch):
    """fp32 queries run the Triton kernel with the ``"<arch>:fp32"`` table's tiles (``"<arch>:fp32:fp8"`` over
    fp8 pools where there is one) at every page size and row count (the 16-bit tables' tiles need up to 442 KB of shared memory at 4 bytes an element; the
    ahead-of-time audit compiles the fp32 tiles within each architecture's limit)."""
    monkeypatch.setenv("TRITREE_ARCH", arch)
    monkeypatch.setattr(policy, "num_sms", lambda device: H200_SMS)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
    tables = policy.VERIFY_MLA_CONFIGS
    for kv_dtype in (torch.float32, policy.KV_FP8):
        key = f"{arch}:fp32:fp8" if kv_dtype == policy.KV_FP8 and f"{arch}:fp32:fp8" in tables else f"{arch}:fp32"
        for T, H, P in [(8, 3, 1), (8, 3, 16), (65, 8, 1), (65, 8, 64), (16, 64, 128)]:
            launch = policy.plan_launch(device=torch.device("cuda"), q_dtype=torch.float32, kv_dtype=kv_dtype,
                                        batch=1, T=T, H=H, head_dim=576, page_size=P, max_pages=64,
                                        gluon_layout=True, tma_layout=True)
            assert launch.route == "triton" and launch.config == tables[key][1 << 30] and not launch.tma, launch


def test_policy_sends_the_hopper_kernels_what_they_serve(monkeypatch):
    """Which calls an explicit Hopper Gluon config runs its kernel for on an H200: bf16 at every page size the
    kernels take (powers of two below 64 by row gathers, multiples of 64 by TMA) with aligned rows; fp16, an
    unaligned layout or a GPU they do not run on: the Triton kernel with the config's tiles."""
    for kernel in ("gluon", "gluon-ws"):
        cfg = AttnConfig(64, 64, 8, 2, tma=True, split_scores=True, kernel=kernel)
        for P in (1, 2, 4, 8, 16, 32, 64, 128):
            assert h200_launch(monkeypatch, T=8, H=8, P=P, config=cfg).route == kernel
        assert h200_launch(monkeypatch, T=8, H=8, P=64, config=cfg, q_dtype=torch.float16).route == "triton"
        assert h200_launch(monkeypatch, T=8, H=8, P=64, config=cfg, layout=False).route == "triton"
        assert h200_launch(monkeypatch, T=8, H=8, P=64, config=cfg, major=12).route == "triton"


def h200_launch(monkeypatch, *, B=1, T, H, P, L_keys=46_000, config=None, q_dtype=torch.bfloat16, layout=True,
                major=9):
    """``verify_mla``'s launch decision (``plan_launch``) on an H200 (sm_90, 132 SMs; ``major``: another GPU
    with the sm_90 table), bf16 pool, ``q_dtype`` queries (the pool's too where it is 16-bit), rows aligned
    for the Gluon kernels unless ``layout`` is False."""
    if not L.GLUON_AVAILABLE:
        pytest.skip(f"this triton has no Gluon: {L._IMPORT_ERROR!r}")
    monkeypatch.setenv("TRITREE_ARCH", "sm_90")
    monkeypatch.setattr(policy, "num_sms", lambda device: H200_SMS)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
    max_pages = (L_keys + T + P - 1) // P + 1
    return policy.plan_launch(device=torch.device("cuda"), q_dtype=q_dtype, kv_dtype=q_dtype, batch=B, T=T, H=H,
                              head_dim=576, page_size=P, max_pages=max_pages, gluon_layout=layout,
                              tma_layout=layout, config=config)


@pytest.mark.parametrize("B,T,H,P,route,splits,grid", [
    (1, 65, 8, 64, "gluon-ws", 15, (8 * 15 + 12, 1, 1)),   # narrow: the SMs the full blocks leave
    (1, 65, 8, 1, "gluon-ws", 15, (8 * 15 + 12, 1, 1)),
    (2, 65, 8, 64, "gluon-ws", 7, (8 * 7 + 7, 1, 2)),
    (4, 65, 8, 64, "gluon-ws", 3, (8 * 3 + 3, 1, 4)),
    (1, 65, 16, 64, "gluon-ws", 7, (16 * 7 + 7, 1, 1)),
    (1, 33, 8, 64, "gluon-ws", 27, (4 * 27 + 24, 1, 1)),
    (1, 64, 8, 64, "gluon-ws", 16, (8, 16, 1)),
    (1, 16, 64, 64, "gluon-ws", 8, (16, 8, 1)),
    (1, 17, 8, 64, "gluon-ws", 44, (3, 44, 1)),
    (1, 8, 8, 16, "gluon-ws", 132, (1, 132, 1)),          # small pages above 16 rows: the ws kernel
    (1, 3, 8, 1, "gluon-ws", 132, (1, 132, 1)),
    (1, 8, 8, 64, "gluon", 132, (1, 132, 1)),             # up to 64 rows over TMA: the plain kernel
    (1, 8, 8, 128, "gluon", 132, (1, 132, 1)),
    (1, 1, 8, 64, "triton", 132, None),                   # up to 16 rows: Triton
    (1, 2, 8, 1, "triton", 132, None),
])
def test_verify_mla_launches_on_h200(B, T, H, P, route, splits, grid, monkeypatch):
    """The kernel, split count and grid verify_mla runs for a shape on an H200 (132 SMs, 46,000 prefix
    keys): one wave of programs; a narrow last row block's programs fill the SMs the full blocks leave."""
    launch = h200_launch(monkeypatch, B=B, T=T, H=H, P=P)
    assert (launch.route, launch.num_splits) == (route, splits)
    if grid is not None:
        assert launch.partials_dtype == torch.bfloat16
        g = plan(route, B=B, T=T, H=H, P=P, splits=splits, partials_dtype=launch.partials_dtype)
        assert g.grid == grid and g.grid[0] * g.grid[1] <= H200_SMS // B


# ---- GPU: the kernels against the reference -----------------------------------------------------

GLUON_CONFIGS = {"gluon": AttnConfig(64, 64, 8, 2, tma=True, split_scores=True, kernel="gluon"),
                 "gluon-ws": AttnConfig(64, 64, 8, 2, tma=True, split_scores=True, kernel="gluon-ws"),
                 "gluon-mma": AttnConfig(32, 32, 8, 2, kernel="gluon-mma")}


def run_kernel(case, kernel, num_splits):
    """``out, lse`` of one call of ``kernel`` with ``num_splits`` splits through the production launcher
    (``VerifyPlan`` with that kernel's config: the split kernel into the plan's partials, then its merge),
    the plan checked to run that kernel. Output, lse and the plan's partials poisoned with NaN first; every
    partial row of every split checked written."""
    q, kv = case["q"], case["kv"]
    B, T, H, _ = q.shape
    args = (q, kv, case["page_table"], case["kv_lens"], case["tree_mask"], case["tree_lens"])
    plan = VerifyPlan(*args, sm_scale=SM_SCALE, config=GLUON_CONFIGS[kernel], num_splits=num_splits)
    assert plan.launch.route == kernel and plan.launch.num_splits == num_splits, plan.launch
    out = torch.full((B, T, H, 512), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((B, T, H), float("nan"), dtype=torch.float32, device=q.device)
    if num_splits > 1:
        dst_o, dst_l = plan.split_kernel(*args)  # the plan's partials (this stream's), poisoned below
        assert dst_o.dtype == plan.launch.partials_dtype
        assert dst_o.dtype == (q.dtype if L.partials_narrow_for(kernel, kv.shape[1]) else torch.float32)
        dst_o.fill_(float("nan"))
        dst_l.fill_(float("nan"))
    plan.run(*args, out=out, lse=lse)
    if num_splits > 1:
        torch.cuda.synchronize()
        assert not torch.isnan(dst_o).any(), "some partial outputs were not written"
        assert not torch.isnan(dst_l).any(), "some partial lse were not written"
    torch.cuda.synchronize()
    return out, lse


def check(case, kernel, num_splits):
    out, lse = run_kernel(case, kernel, num_splits)
    assert_matches_reference(case, out, lse, torch.bfloat16)


def _splits_for(case, many):
    if not many:
        return 1
    P = case["kv"].shape[1]
    n = int(case["kv_lens"].max()) + case["q"].shape[1]
    return max(2, min(64, math.ceil(n / (4 * max(P, 64)))))


KERNELS = ["gluon", "gluon-ws"]
CASES = [
    # (B, T, H, P, kv_lens, tree_lens, kinds)
    (1, 8, 8, 64, [46_000], None, ("random",)),
    (2, 19, 8, 64, [3_000, 1_000], [19, 11], ("random", "chain")),
    (1, 16, 64, 128, [5_000], None, ("wide",)),
    (1, 5, 3, 64, [0], None, ("chain",)),         # kv_len 0, T*H = 15 (not a multiple of 64)
    (1, 7, 9, 64, [1], None, ("star",)),          # kv_len 1, T*H = 63
    (2, 33, 3, 64, [63, 64], [33, 20], ("random", "wide")),  # the tree straddles words and tiles; T*H = 99
    (1, 8, 8, 64, [5 * 64 + 10], None, ("random",)),   # odd full-tile count (5) + remainder
    (1, 8, 8, 64, [6 * 64], None, ("random",)),        # even full-tile count, no remainder
    (1, 40, 2, 64, [7 * 64], [37], ("random",)),       # odd count, tree of 37 keys over 2 words
    (2, 12, 5, 128, [3 * 128 + 64, 2 * 128], None, ("chain", "random")),  # P = 128, odd / even tiles
]

# The ws kernel's launches with a narrow last row block, full row blocks (masked pairs, wide copies) and a
# part-filled one, two requests (the second's tree shorter), at the page sizes verify_mla sends it.
WS_SHAPES = [
    # (T, H, P, kv_lens)
    (65, 8, 64, [46_000 + 45, 700 + 64 - 65]),   # the engine's budget-64 shape: narrow 8 rows
    (33, 8, 64, [20_000 + 3, 1_000]),            # 5 row blocks, narrow 8
    (65, 16, 64, [20_000 + 45, 3_000 + 7]),      # narrow 16
    (129, 8, 64, [8_000 + 63, 64]),              # 17 row blocks, narrow 8
    (64, 8, 64, [30_000 + 45, 3_000 + 7]),       # full row blocks
    (16, 64, 64, [30_000 + 45, 130]),            # full, 64 heads
    (17, 8, 64, [20_000 + 3, 3_000 + 7]),        # part-filled, not narrow
    (65, 8, 128, [30_000 + 100, 1_000 + 64]),    # P = 128, narrow
    (16, 8, 128, [10_000 + 48, 256]),            # P = 128, full: the last tile at slot 64 of a page
    (65, 8, 1, [20_000 + 45, 700]),              # row gathers, narrow
    (19, 8, 1, [20_000 + 45, 70]),               # row gathers, part-filled
    (64, 8, 16, [20_000 + 5, 1_000 + 3]),        # row gathers, full
]


@sm90
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("many", [False, True], ids=["splits1", "splitsN"])
@pytest.mark.parametrize("c", CASES, ids=lambda c: f"B{c[0]}T{c[1]}H{c[2]}P{c[3]}L{c[4][0]}")
def test_gluon_matches_reference(c, many, kernel):
    B, T, H, P, kv_lens, tree_lens, kinds = c
    case = make_case(B, T, H, P, kv_lens, tree_lens, kinds, torch.bfloat16, seed=sum(kv_lens) + T * H)
    check(case, kernel, _splits_for(case, many))


@sm90
@pytest.mark.parametrize("T,H,P,kv_lens", WS_SHAPES, ids=lambda v: str(v) if not isinstance(v, list) else f"L{v[0]}")
def test_ws_launches_of_verify_mla(T, H, P, kv_lens):
    """The ws kernel at verify_mla's split count for the shape on this GPU (the narrow block's own count
    where it has one), one split, and a few more splits than programs fit (the narrow block's surplus
    slots written empty), with the unused pool slots NaN."""
    case = poison_unused_slots(make_case(2, T, H, P, kv_lens, [T, T // 2 + 1], ("random", "chain"), torch.bfloat16,
                                         seed=T + H + P))
    q, kv, pt = case["q"], case["kv"], case["page_table"]
    launch = policy.plan_launch(device=q.device, q_dtype=q.dtype, kv_dtype=kv.dtype, batch=2, T=T, H=H, head_dim=576,
                            page_size=P, max_pages=pt.shape[1], gluon_layout=True, tma_layout=True)
    assert launch.route == "gluon-ws"
    for splits in sorted({launch.num_splits, 1, 9}):
        check(case, "gluon-ws", splits)


@sm90
@pytest.mark.parametrize("kernel,T,H", [("gluon", 8, 8), ("gluon-ws", 8, 8), ("gluon-ws", 64, 8),
                                        ("gluon-ws", 65, 8)])
@pytest.mark.parametrize("num_splits", [2, 3, 5])
def test_gluon_split_parities(num_splits, kernel, T, H):
    """Chunks with odd and even tile counts (and a remainder) in one launch; the ws kernel's masked pairs
    (full blocks, narrow block) of one, two and more tiles."""
    case = make_case(1, T, H, 64, [21 * 64 + 17], None, ("random",), torch.bfloat16, seed=num_splits + T)
    check(case, kernel, num_splits)


@sm90
@pytest.mark.parametrize("kernel,T", [("gluon", 19), ("gluon-ws", 19), ("gluon-ws", 64), ("gluon-ws", 65)])
def test_gluon_never_reads_garbage_outside_the_request(kernel, T):
    """NaN in every pool slot no request uses: TMA reads whole tiles only inside the committed prefix (a
    masked pair's tile moved back from the request's end), the tail is masked."""
    case = poison_unused_slots(make_case(2, T, 8, 64, [3_000 + 37, 1_000 + 5], [T, 11], ("random", "chain"),
                                         torch.bfloat16, seed=5 + T))
    check(case, kernel, 3)
    check(case, kernel, 1)


@sm90
@pytest.mark.parametrize("kernel,T", [("gluon", 8), ("gluon-ws", 8), ("gluon-ws", 65)])
@pytest.mark.parametrize("num_splits", [7, 200])
def test_gluon_many_splits_with_empty_chunks(num_splits, kernel, T):
    """More splits than pages: some programs get empty key ranges (m = -inf, l = 0)."""
    case = make_case(1, T, 8, 64, [500], None, ("random",), torch.bfloat16, seed=num_splits + T)
    check(case, kernel, num_splits)


@sm90
def test_gluon_9_box_fallback(monkeypatch):
    """The plain kernel's 9-boxes-per-tile TMA path (the launcher's plans after a driver refused the 3-D
    descriptor)."""
    from tritree.kernels.verify import launcher

    monkeypatch.setattr(launcher, "_TMA3D_REFUSED", True)
    case = make_case(1, 8, 8, 64, [5 * 64 + 10], None, ("random",), torch.bfloat16, seed=3)
    check(case, "gluon", 1)
    check(case, "gluon", 2)


@sm90
@pytest.mark.parametrize("T,H,P,layout", [(65, 8, 64, "contiguous"), (65, 8, 64, "mixed"), (129, 8, 64, "mixed"),
                                          (65, 16, 64, "contiguous"), (33, 8, 128, "fragmented"),
                                          (16, 8, 64, "mixed"), (16, 64, 64, "contiguous")])
def test_ws_wide_copies_over_page_layouts(T, H, P, layout):
    """Wide copies (a pair's two tiles as one 128-row box a column block where they are consecutive pool
    rows: adjacent pages, or one page of 128; two boxes elsewhere) over contiguous, mixed (adjacent runs
    broken by swapped pages) and fragmented page tables, unused pool slots NaN."""
    assert cx(plan(T=T, H=H, P=P, splits=4))["WIDE_COPIES"]
    case = page_layout_case(T, H, P, layout)
    check(case, "gluon-ws", 8)
    check(case, "gluon-ws", 1)


# ---- gather path: P < 64 (cp.async row gathers instead of TMA) ---------------------------------------
GATHER_PAGE_SIZES = [1, 16]


@sm90
@pytest.mark.parametrize("P", GATHER_PAGE_SIZES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("many", [False, True], ids=["splits1", "splitsN"])
@pytest.mark.parametrize("c", CASES, ids=lambda c: f"B{c[0]}T{c[1]}H{c[2]}L{c[4][0]}")
def test_gluon_gather_matches_reference(c, many, kernel, P):
    """The cases above with a fragmented pool of page size P (the case's own P ignored)."""
    B, T, H, _, kv_lens, tree_lens, kinds = c
    case = make_case(B, T, H, P, kv_lens, tree_lens, kinds, torch.bfloat16, seed=sum(kv_lens) + T * H + P,
                     fragmented=True)
    check(case, kernel, _splits_for(case, many))


@sm90
@pytest.mark.parametrize("P", GATHER_PAGE_SIZES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("num_splits", [2, 3, 5])
def test_gluon_gather_split_parities(num_splits, kernel, P):
    """Tile-aligned chunks with odd and even tile counts (and a remainder) in one launch."""
    case = make_case(1, 8, 8, P, [21 * 64 + 17], None, ("random",), torch.bfloat16, seed=num_splits + P)
    check(case, kernel, num_splits)


@sm90
@pytest.mark.parametrize("P", GATHER_PAGE_SIZES)
@pytest.mark.parametrize("kernel,T", [("gluon", 19), ("gluon-ws", 19), ("gluon-ws", 65)])
def test_gluon_gather_never_reads_garbage_outside_the_request(kernel, T, P):
    """NaN in every pool slot no request uses: full tiles gather only committed-prefix rows."""
    case = poison_unused_slots(make_case(2, T, 8, P, [3_000 + 37, 1_000 + 5], [T, 11], ("random", "chain"),
                                         torch.bfloat16, seed=5 + P + T))
    check(case, kernel, 3)
    check(case, kernel, 1)


@sm90
@pytest.mark.parametrize("P", GATHER_PAGE_SIZES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("num_splits", [7, 200])
def test_gluon_gather_many_splits_with_empty_chunks(num_splits, kernel, P):
    """More splits than tiles: some programs get empty key ranges (m = -inf, l = 0)."""
    case = make_case(1, 8, 8, P, [500], None, ("random",), torch.bfloat16, seed=num_splits + P)
    check(case, kernel, num_splits)


@sm90
def test_verify_mla_with_gluon_configs():
    """``verify_mla(config=...)`` with each Hopper Gluon kernel: its plan, launch and merge."""
    case = make_case(2, 65, 8, 64, [5_000 + 45, 700], [65, 33], ("random", "chain"), torch.bfloat16, seed=9)
    for kernel, splits in (("gluon-ws", 15), ("gluon-ws", 1), ("gluon", 4)):
        out, lse = verify_mla(case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"],
                              sm_scale=SM_SCALE, tree_lens=case["tree_lens"], config=GLUON_CONFIGS[kernel],
                              num_splits=splits, return_lse=True)
        torch.cuda.synchronize()
        assert_matches_reference(case, out, lse, torch.bfloat16)
