"""The Hopper Gluon verify kernels (``tritree.kernels._verify_gluon``, ``_verify_gluon_ws``) against the
float64 reference: bf16 inputs, outputs poisoned with NaN, one split and many, every schedule (plain,
overlapped, seesaw tile pairs, the warp-specialised seesaw by tiles and by column halves), fp32 and bf16
partials; token-granular and small-page pools (P = 1, 16: the cp.async gather path, fragmented page
tables) for the plain and seesaw schedules."""

import math

import pytest
import torch

from tritree.kernels import _verify_gluon as VG
from tritree.kernels import _verify_gluon_ws as VGWS
from tritree.kernels._splitkv import combine_splits, split_destinations

from ..conftest import HAS_GPU
from .test_verify_mla import SM_SCALE, assert_matches_reference, make_case, poison_unused_slots


def _gluon_ok():
    return HAS_GPU and VG.GLUON_AVAILABLE and torch.cuda.get_device_capability()[0] == 9


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _gluon_ok(), reason="needs an sm_90 GPU and triton's Gluon")]


VARIANTS = {"plain": dict(overlap=False, seesaw=False), "overlap": dict(overlap=True, seesaw=False),
            "seesaw": dict(overlap=False, seesaw=True)}


def run_gluon(case, num_splits, variant, partial_dtype=torch.float32):
    q = case["q"]
    B, T, H, _ = q.shape
    out = torch.full((B, T, H, 512), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((B, T, H), float("nan"), dtype=torch.float32, device=q.device)
    tree_lens = case["tree_lens"]
    if tree_lens is None:
        tree_lens = torch.full((B,), T, dtype=torch.int32, device=q.device)
    dst_o, dst_l, o_strides, l_strides = split_destinations(out, lse, num_splits, T * H)
    if num_splits > 1:  # partials poisoned too: every (split, row) must be written
        if dst_o.dtype != partial_dtype:
            dst_o = torch.empty_like(dst_o, dtype=partial_dtype)
            o_strides = (dst_o.stride(0), 0, dst_o.stride(2), dst_o.stride(1))
        dst_o.fill_(float("nan"))
        dst_l.fill_(float("nan"))
    args = (q, case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"], tree_lens, dst_o, dst_l, o_strides,
            l_strides, SM_SCALE, num_splits)
    if variant in ("ws", "wscs", "wscs-nopf"):
        VGWS.launch_verify_gluon_ws(*args, colsplit=variant != "ws", l2_prefetch=variant != "wscs-nopf")
    else:
        VG.launch_verify_gluon(*args, **VARIANTS[variant])
    if num_splits > 1:
        rows = T * H
        assert not torch.isnan(dst_o[:, :, :rows]).any(), "some partial outputs were not written"
        assert not torch.isnan(dst_l[:, :, :rows]).any(), "some partial lse were not written"
        combine_splits(dst_o.float(), dst_l, out, lse)
    torch.cuda.synchronize()
    return out, lse


def check(case, num_splits, variant, partial_dtype=torch.float32):
    out, lse = run_gluon(case, num_splits, variant, partial_dtype)
    assert_matches_reference(case, out, lse, torch.bfloat16)


def _splits_for(case, many):
    if not many:
        return 1
    P = case["kv"].shape[1]
    n = int(case["kv_lens"].max()) + case["q"].shape[1]
    return max(2, min(64, math.ceil(n / (4 * P))))


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

# The warp-specialised seesaw (``_verify_gluon_ws``, TMA pools): "wscs" = O += P V by column halves (what
# verify_mla runs above 64 rows), "wscs-nopf" = the same without the L2 prefetch (65..256 rows until
# session 11), "ws" = by tiles.
VARIANT_IDS = list(VARIANTS) + ["ws", "wscs", "wscs-nopf"]


@pytest.mark.parametrize("variant", VARIANT_IDS)
@pytest.mark.parametrize("many", [False, True], ids=["splits1", "splitsN"])
@pytest.mark.parametrize("c", CASES, ids=lambda c: f"B{c[0]}T{c[1]}H{c[2]}P{c[3]}L{c[4][0]}")
def test_gluon_matches_reference(c, many, variant):
    B, T, H, P, kv_lens, tree_lens, kinds = c
    case = make_case(B, T, H, P, kv_lens, tree_lens, kinds, torch.bfloat16, seed=sum(kv_lens) + T * H)
    check(case, _splits_for(case, many), variant)


@pytest.mark.parametrize("variant", VARIANT_IDS)
@pytest.mark.parametrize("num_splits", [2, 3, 5])
def test_gluon_split_parities(num_splits, variant):
    """Chunks with odd and even tile counts (and a remainder) in one launch."""
    case = make_case(1, 8, 8, 64, [21 * 64 + 17], None, ("random",), torch.bfloat16, seed=num_splits)
    check(case, num_splits, variant)


@pytest.mark.parametrize("variant", VARIANT_IDS)
def test_gluon_never_reads_garbage_outside_the_request(variant):
    """NaN in every pool slot no request uses: TMA reads whole tiles only inside the committed prefix,
    the tail is masked."""
    case = poison_unused_slots(make_case(2, 19, 8, 64, [3_000 + 37, 1_000 + 5], [19, 11], ("random", "chain"),
                                         torch.bfloat16, seed=5))
    check(case, 3, variant)
    check(case, 1, variant)


@pytest.mark.parametrize("variant", VARIANT_IDS)
@pytest.mark.parametrize("num_splits", [7, 200])
def test_gluon_many_splits_with_empty_chunks(num_splits, variant):
    """More splits than pages: some programs get empty key ranges (m = -inf, l = 0)."""
    case = make_case(1, 8, 8, 64, [500], None, ("random",), torch.bfloat16, seed=num_splits)
    check(case, num_splits, variant)


@pytest.mark.parametrize("variant", VARIANT_IDS)
def test_gluon_bf16_partials(variant):
    """Partials stored in bf16 (the kernel casts ``o / l`` to the destination's type; lse stays fp32)."""
    case = make_case(2, 19, 8, 64, [3_000, 1_000], [19, 11], ("random", "chain"), torch.bfloat16, seed=11)
    check(case, 4, variant, partial_dtype=torch.bfloat16)


@pytest.mark.parametrize("variant", VARIANT_IDS)
def test_gluon_9_box_fallback(variant, monkeypatch):
    """The 9-boxes-per-tile TMA path (used if the driver refuses the 3-D descriptor) stays correct."""
    monkeypatch.setattr(VG, "USE_TMA3D", False)
    case = make_case(1, 8, 8, 64, [5 * 64 + 10], None, ("random",), torch.bfloat16, seed=3)
    check(case, 1, variant)
    check(case, 2, variant)


# ---- gather path: P < 64 (cp.async row gathers instead of TMA), plain and seesaw -------------------
# "wscs" on pages below a tile: the producer partition gathers the rows (what verify_mla runs there).
GATHER_VARIANTS = ["plain", "seesaw", "wscs"]
GATHER_PAGE_SIZES = [1, 16]


@pytest.mark.parametrize("P", GATHER_PAGE_SIZES)
@pytest.mark.parametrize("variant", GATHER_VARIANTS)
@pytest.mark.parametrize("many", [False, True], ids=["splits1", "splitsN"])
@pytest.mark.parametrize("c", CASES, ids=lambda c: f"B{c[0]}T{c[1]}H{c[2]}L{c[4][0]}")
def test_gluon_gather_matches_reference(c, many, variant, P):
    """The cases above with a fragmented pool of page size P (the case's own P ignored)."""
    B, T, H, _, kv_lens, tree_lens, kinds = c
    case = make_case(B, T, H, P, kv_lens, tree_lens, kinds, torch.bfloat16, seed=sum(kv_lens) + T * H + P,
                     fragmented=True)
    check(case, _splits_for(case, many), variant)


@pytest.mark.parametrize("P", GATHER_PAGE_SIZES)
@pytest.mark.parametrize("variant", GATHER_VARIANTS)
@pytest.mark.parametrize("num_splits", [2, 3, 5])
def test_gluon_gather_split_parities(num_splits, variant, P):
    """Tile-aligned chunks with odd and even tile counts (and a remainder) in one launch."""
    case = make_case(1, 8, 8, P, [21 * 64 + 17], None, ("random",), torch.bfloat16, seed=num_splits + P)
    check(case, num_splits, variant)


@pytest.mark.parametrize("P", GATHER_PAGE_SIZES)
@pytest.mark.parametrize("variant", GATHER_VARIANTS)
def test_gluon_gather_never_reads_garbage_outside_the_request(variant, P):
    """NaN in every pool slot no request uses: full tiles gather only committed-prefix rows."""
    case = poison_unused_slots(make_case(2, 19, 8, P, [3_000 + 37, 1_000 + 5], [19, 11], ("random", "chain"),
                                         torch.bfloat16, seed=5 + P))
    check(case, 3, variant)
    check(case, 1, variant)


@pytest.mark.parametrize("P", GATHER_PAGE_SIZES)
@pytest.mark.parametrize("variant", GATHER_VARIANTS)
@pytest.mark.parametrize("num_splits", [7, 200])
def test_gluon_gather_many_splits_with_empty_chunks(num_splits, variant, P):
    """More splits than tiles: some programs get empty key ranges (m = -inf, l = 0)."""
    case = make_case(1, 8, 8, P, [500], None, ("random",), torch.bfloat16, seed=num_splits + P)
    check(case, num_splits, variant)


@pytest.mark.parametrize("P", GATHER_PAGE_SIZES)
def test_gluon_gather_bf16_partials_and_overlap_fallback(P):
    """bf16 partials on the gather path; ``overlap=True`` falls back to the plain schedule there."""
    case = make_case(2, 19, 8, P, [3_000, 1_000], [19, 11], ("random", "chain"), torch.bfloat16, seed=11 + P)
    check(case, 4, "seesaw", partial_dtype=torch.bfloat16)
    check(case, 4, "overlap")
    check(case, 1, "overlap")


def test_gluon_gather_page_size_check():
    """Page sizes the kernel takes: powers of two below 64 (gather) and multiples of 64 (TMA)."""
    if not VG.GLUON_AVAILABLE:
        pytest.skip("no Gluon")
    q = torch.zeros(1, 1, 1, 576, dtype=torch.bfloat16)
    for P in (1, 2, 4, 8, 16, 32, 64, 128):
        VG._check(q, torch.zeros(4, P, 576, dtype=torch.bfloat16), 1)
    for P in (3, 48, 96):
        with pytest.raises(ValueError):
            VG._check(q, torch.zeros(4, P, 576, dtype=torch.bfloat16), 1)
