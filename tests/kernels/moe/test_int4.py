"""INT4 (W4A16) grouped routed experts against a float64 loop over the dequantised weights; the packed
layout against compressed-tensors' (quant.py); tensor- and expert-parallel shards against the whole layer."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree.kernels.moe.align import align_routing, min_blocks
from tritree.kernels.moe.int4 import (
    Int4Experts,
    moe_int4_reference,
    pack_int4,
    quantize_int4,
    routed_experts_int4,
    unpack_int4,
)
from tritree.kernels.moe.int4_triton import INT4_MOE_CONFIGS, Int4MoeConfig, Int4MoePlan, plan_int4_moe
from tritree.kernels.quant import dequant_int4_reference

from ..._quant_helpers import quantize_int4 as quantize_by_hand
from ...conftest import DEVICE

TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2}  # relative L2 error: weights and h rounded to x's dtype


def _experts(E, H, I, g):
    return Int4Experts.quantize(torch.randn(E, I, H, generator=g) / H**0.5, torch.randn(E, I, H, generator=g) / H**0.5,
                                torch.randn(E, H, I, generator=g) / I**0.5)


def _to(ex: Int4Experts, device) -> Int4Experts:
    return Int4Experts(*(t.to(device) for t in (ex.w13_packed, ex.w13_scale, ex.w2_packed, ex.w2_scale)))


def _routing(N, E, k, mode, g):
    """``topk_idx [N, k]`` int64: distinct experts per token (``mode`` "uniform"), all tokens' first choice
    on expert 0 ("one"), or with ids of other ranks (-1 and E..E+2, "foreign")."""
    scores = torch.rand(N, max(E, k), generator=g)
    if mode == "one":
        scores[:, 0] += 2
    idx = torch.topk(scores, k, dim=-1).indices
    if mode == "foreign":
        far = torch.randint(-1, 3, (N, k), generator=g)
        idx = torch.where(torch.rand(N, k, generator=g) < 0.4, torch.where(far < 0, far, E + far), idx)
    return idx


def _check(x, idx, w, ex, plan=None):
    out = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    got = routed_experts_int4(x, idx, w, ex, out=out, plan=plan)
    assert got.data_ptr() == out.data_ptr()
    assert not torch.isnan(out).any()
    ref = moe_int4_reference(x.cpu(), idx.cpu(), w.cpu(), _to(ex, "cpu"))
    err = (out.cpu().double() - ref).norm() / ref.norm().clamp_min(1e-12)
    assert err < TOL[x.dtype], float(err)
    return out


@settings(max_examples=14)
@given(N=st.integers(1, 130), k=st.integers(1, 8), E=st.integers(1, 6), H=st.sampled_from([32, 64, 96]),
       I=st.sampled_from([32, 64, 96]), mode=st.sampled_from(["uniform", "one", "foreign"]),
       dtype=st.sampled_from([torch.float16, torch.bfloat16]), seed=st.integers(0, 2**31 - 1))
def test_int4_experts_match_reference(N, k, E, H, I, mode, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    k = min(k, E) if mode != "foreign" else k
    ex = _to(_experts(E, H, I, g), DEVICE)
    x = torch.randn(N, H, generator=g).to(dtype).to(DEVICE)
    idx = _routing(N, E, k, mode, g).to(DEVICE)
    w = torch.rand(N, k, generator=g).to(DEVICE)
    _check(x, idx, w, ex)


SWAP = Int4MoeConfig(16, (32, 128, 4, 1), (64, 128, 4, 1), swap_ab=True)
PLAIN = Int4MoeConfig(32, (64, 128, 4, 1), (32, 128, 4, 1), swap_ab=False)


@pytest.mark.parametrize("cfg", [SWAP, PLAIN], ids=["swap_ab", "plain"])
@pytest.mark.parametrize("splits", [(1, 1), (3, 2)], ids=["unsplit", "split_k"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_kernel_variant(cfg, splits, dtype):
    """Swap-AB and plain tiles, unsplit and split-K (gate_up's SiLU-and-mul then in the down kernel's load),
    K tails (H = 160 and I = 96 are not multiples of the K tiles), skewed and foreign routing in one batch."""
    g = torch.Generator().manual_seed(1)
    N, k, E, H, I = 37, 4, 5, 160, 96
    ex = _to(_experts(E, H, I, g), DEVICE)
    idx = _routing(N, E, k, "foreign", g)
    idx[:20, 0] = 2  # a long run on expert 2; expert 4 left without tokens
    idx = torch.where(idx == 4, 3, idx).to(DEVICE)
    x = torch.randn(N, H, generator=g).to(dtype).to(DEVICE)
    w = torch.rand(N, k, generator=g).to(DEVICE)
    plan = Int4MoePlan(cfg, min_blocks(N * k, E, cfg.block_m), *splits)
    _check(x, idx, w, ex, plan)


def test_tokens_without_local_experts_get_zeros():
    g = torch.Generator().manual_seed(2)
    ex = _to(_experts(3, 32, 32, g), DEVICE)
    x = torch.randn(4, 32, generator=g).half().to(DEVICE)
    idx = torch.tensor([[0, 1], [5, -1], [2, 7], [-3, 3]], device=DEVICE)
    out = torch.full_like(x, float("nan"))
    routed_experts_int4(x, idx, torch.rand(4, 2, generator=g).to(DEVICE), ex, out=out)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.equal(out[3], torch.zeros_like(out[3]))
    assert (out[0] != 0).any() and (out[2] != 0).any()


def test_align_routing_blocks():
    """Grouped by expert in expert order, blocks of one expert each, unused blocks marked E, the bound never
    short."""
    E, bm = 4, 4
    idx = torch.tensor([[3, 0], [3, 9], [3, 1], [-1, 3], [3, 3]])
    A = idx.numel()
    nb = min_blocks(A, E, bm)
    sorted_idx, be, bs, bend, used = (t.tolist() for t in align_routing(idx.to(DEVICE), E, bm, nb))
    flat = idx.reshape(-1).tolist()
    assert sorted(sorted_idx) == list(range(A))  # a permutation of the assignments
    groups = [sorted_idx[:1], sorted_idx[1:2], sorted_idx[2:8], sorted_idx[8:]]
    assert [sorted(g) for g in groups] == [[1], [5], [0, 2, 4, 7, 8, 9], [3, 6]]  # 0, 1, 3 (x6), then 9 and -1
    owned = [(be[b], bs[b], min(bs[b] + bm, bend[b])) for b in range(nb) if be[b] < E]
    assert owned == [(0, 0, 1), (1, 1, 2), (3, 2, 6), (3, 6, 8)]
    assert used == [len(owned)] and all(e == E for e in be[len(owned):])
    for e, lo, hi in owned:
        assert all(flat[a] == e for a in sorted_idx[lo:hi])


def test_plan_once_per_shape_and_splits():
    """The plan comes from static shapes (cached); few output tiles get K splits, many get none."""
    p = plan_int4_moe(1, 8, 48, 7168, 2048, "sm_90", 132)
    assert p is plan_int4_moe(1, 8, 48, 7168, 2048, "sm_90", 132)
    assert p.config is INT4_MOE_CONFIGS["sm_90"][16] and p.config.swap_ab
    assert p.num_blocks == 8 // 16 + 1 + 8
    assert p.gate_up_split == 1 and p.down_split == 1  # 8 experts x 32 tiles, 8 x 112: SMs filled
    q = plan_int4_moe(1, 8, 384, 7168, 256, "sm_120", 188)  # TP8: 8 experts x 4 gate/up tiles
    assert q.gate_up_split > 1 and q.down_split == 1
    assert plan_int4_moe(4096, 8, 48, 7168, 2048, "sm_120", 188).config is INT4_MOE_CONFIGS["sm_120"][1 << 30]
    assert Int4MoePlan.from_ints(q.as_ints()) == q
    # An expert-parallel rank (48 of 384 experts): one token touches ~1 local expert, so its 32 gate/up
    # tiles are split over K to fill the SMs.
    ep = plan_int4_moe(1, 8, 48, 7168, 2048, "sm_90", 132, None, 384)
    assert ep.gate_up_split > 1 and ep.down_split > 1 and ep.num_blocks == p.num_blocks


def _check_align(idx, E, bm):
    """Every assignment placed once, each expert's rows contiguous in expert order, blocks covering them exactly,
    the blocks that own rows first."""
    A = idx.numel()
    nb = min_blocks(A, E, bm)
    sorted_idx, be, bs, bend, used = (t.cpu() for t in align_routing(idx.to(DEVICE), E, bm, nb))
    assert int(used) == int((be < E).sum()) and bool((be[: int(used)] < E).all())
    assert torch.equal(sorted_idx.sort().values, torch.arange(A, dtype=torch.int32))
    flat = idx.reshape(-1)
    key = torch.where((flat >= 0) & (flat < E), flat, E)
    assert torch.equal(key[sorted_idx.long()], key.sort().values)
    covered = torch.zeros(A, dtype=torch.int64)
    for b in range(nb):
        if be[b] < E:
            rows = torch.arange(int(bs[b]), min(int(bs[b]) + bm, int(bend[b])))
            assert len(rows) > 0 and bool((key[sorted_idx[rows].long()] == be[b]).all())
            covered[rows] += 1
    assert bool((covered[: int((key < E).sum())] == 1).all())


@settings(max_examples=10)
@given(A=st.integers(0, 1400), E=st.integers(1, 40), bm=st.sampled_from([16, 32, 64]), seed=st.integers(0, 2**31 - 1))
def test_align_routing_any_load(A, E, bm, seed):
    """Over more assignments than one chunk of the align kernel."""
    g = torch.Generator().manual_seed(seed)
    _check_align(torch.randint(-2, E + 2, (A, 1), generator=g), E, bm)


@pytest.mark.parametrize("A,E,bm,skewed", [(9000, 384, 8, False), (12000, 48, 8, True), (3000, 7, 16, True)])
def test_align_routing_many_blocks(A, E, bm, skewed):
    """More blocks than one chunk of the block -> expert pass (1024), a TP8 rank's 384 experts, and experts with
    hundreds of blocks each."""
    g = torch.Generator().manual_seed(A + E)
    idx = (torch.randint(0, 3, (A, 1), generator=g) * (E // 3 + 1) if skewed
           else torch.randint(-1, E + 1, (A, 1), generator=g))
    _check_align(idx, E, bm)


def test_packing_round_trip_against_compressed_tensors():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(3, 8, 96, generator=g)
    packed, scale = quantize_int4(w)
    assert packed.shape == (3, 8, 12) and packed.dtype == torch.int32
    assert scale.shape == (3, 8, 3) and scale.dtype == torch.bfloat16
    q = unpack_int4(packed)
    assert torch.equal(pack_int4(q), packed)
    assert int(q.min()) >= -8 and int(q.max()) <= 7
    for e in range(3):  # quant.py's compressed-tensors decoder reads the same weights
        assert torch.equal(dequant_int4_reference(packed[e], scale[e]), q[e].float() * scale[e].float().repeat_interleave(32, 1))
    # symmetric, amax / 7.5: the error is at most half a step, except the clamped top (+7.5 -> 7)
    deq = dequant_int4_reference(packed.reshape(-1, 12), scale.reshape(-1, 3)).reshape(w.shape)
    step = scale.float().repeat_interleave(32, -1)
    assert ((deq - w).abs() <= step * 0.5 + 1e-6 + (w.abs() > 7 * step) * step).all()
    # the checkpoint's tensors (packed by hand) stack into the same layout
    wg, wu, wd = torch.randn(2, 64, 32, generator=g), torch.randn(2, 64, 32, generator=g), torch.randn(2, 32, 64, generator=g)
    parts = [[quantize_by_hand(t[e]) for e in range(2)] for t in (wg, wu, wd)]
    ex = Int4Experts.from_checkpoint(*[[p[i] for p in ps] for ps in parts for i in (0, 1)])
    assert ex.w13_packed.shape == (2, 128, 4) and ex.w2_packed.shape == (2, 32, 8)
    dg, du, dd = ex.dequantize()
    assert torch.equal(dg, torch.stack([p[2] for p in parts[0]]))
    assert torch.equal(du, torch.stack([p[2] for p in parts[1]]))
    assert torch.equal(dd, torch.stack([p[2] for p in parts[2]]))
    with pytest.raises(ValueError, match="q must be in"):
        pack_int4(torch.full((1, 8), 8))


def test_tp_and_ep_shards_sum_to_the_layer():
    g = torch.Generator().manual_seed(4)
    N, k, E, H, I = 9, 3, 4, 64, 128
    ex = _to(_experts(E, H, I, g), DEVICE)
    x = torch.randn(N, H, generator=g).half().to(DEVICE)
    idx = _routing(N, E, k, "uniform", g).to(DEVICE)
    w = torch.rand(N, k, generator=g).to(DEVICE)
    full = routed_experts_int4(x, idx, w, ex).double()
    ref = moe_int4_reference(x, idx, w, ex)
    tp = sum(moe_int4_reference(x, idx, w, ex.shard_tp(r, 4)) for r in range(4))
    assert torch.allclose(tp, ref, rtol=1e-9, atol=1e-12)  # the shards are an exact split of the layer
    parts = []
    for r in range(2):
        shard, first = ex.shard_ep(r, 2)
        parts.append(routed_experts_int4(x, idx - first, w, shard).double())
    tp2 = [routed_experts_int4(x, idx, w, ex.shard_tp(r, 2)).double() for r in range(2)]
    for got in (sum(parts), sum(tp2)):
        assert (got - full).norm() / full.norm() < 2e-3
    with pytest.raises(ValueError, match="whole 32-column"):
        ex.shard_tp(0, 3)
    with pytest.raises(ValueError, match="equal parts"):
        ex.shard_ep(0, 3)


def test_bad_inputs_name_the_argument():
    g = torch.Generator().manual_seed(5)
    ex = _experts(2, 64, 32, g)
    x = torch.randn(3, 64).half()
    idx = torch.zeros(3, 2, dtype=torch.int64)
    w = torch.rand(3, 2)
    cases = [
        ((x.float(), idx, w, ex), TypeError, "x must have dtype"),
        ((x, idx.float(), w, ex), TypeError, "topk_idx must have dtype"),
        ((x, idx.to(torch.int16), w, ex), TypeError, "topk_idx must have dtype"),
        ((x, idx, w[:, :1], ex), ValueError, "topk_idx and topk_w"),
        ((x[:, :32], idx, w, ex), ValueError, "w13_packed must have shape"),
        ((torch.randn(3, 40).half(), idx, w, ex), ValueError, "multiple of the group size"),
        ((x, idx, w, Int4Experts(ex.w13_packed.float(), ex.w13_scale, ex.w2_packed, ex.w2_scale)), TypeError,
         "w13_packed must have dtype"),
        ((x, idx, w, Int4Experts(ex.w13_packed, ex.w13_scale[:, :, :1], ex.w2_packed, ex.w2_scale)), ValueError,
         "w13_scale must have shape"),
        ((x, idx, w, Int4Experts(ex.w13_packed, ex.w13_scale.half(), ex.w2_packed, ex.w2_scale)), TypeError,
         "w13_scale must have dtype"),
        ((x, idx, w, Int4Experts(ex.w13_packed, ex.w13_scale, ex.w2_packed[:, :, :2], ex.w2_scale)), ValueError,
         "w2_packed must have shape"),
        ((x, idx, w, Int4Experts(ex.w13_packed, ex.w13_scale, ex.w2_packed, ex.w2_scale[:1])), ValueError,
         "w2_scale must have shape"),
        ((x, idx, w, Int4Experts(ex.w13_packed[:, :48], ex.w13_scale[:, :48], ex.w2_packed, ex.w2_scale)), ValueError,
         "w13_packed: 2I"),
        ((x, idx, w, Int4Experts(ex.w13_packed.transpose(0, 1).contiguous().transpose(0, 1), ex.w13_scale,
                                 ex.w2_packed, ex.w2_scale)), ValueError, "w13_packed must be contiguous"),
        ((x, [[0, 1]], w, ex), TypeError, "topk_idx must be a torch.Tensor"),
    ]
    if DEVICE.type == "cuda":
        cases.append(((x.to(DEVICE), idx, w, _to(ex, DEVICE)), ValueError, "topk_idx must be on"))
    else:
        cases.append(((x, idx, w.to("meta"), ex), ValueError, "topk_w must be on"))
    for args, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            routed_experts_int4(*args)
    with pytest.raises(ValueError, match="out must have shape"):
        routed_experts_int4(x, idx, w, ex, out=torch.empty(3, 32).half())
    with pytest.raises(TypeError, match="out must have dtype"):
        routed_experts_int4(x, idx, w, ex, out=torch.empty(3, 64))
    with pytest.raises(ValueError, match="plan.num_blocks"):
        routed_experts_int4(x, idx, w, ex, plan=Int4MoePlan(SWAP, 1, 1, 1))


def test_fake_impl_traces():
    """The op's fake impl: shapes propagate without running a kernel (torch.compile's view of it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = torch.Generator().manual_seed(6)
    ex = _experts(2, 64, 32, g)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fx = mode.from_tensor(torch.randn(3, 64).half())
        fex = Int4Experts(*(mode.from_tensor(t) for t in (ex.w13_packed, ex.w13_scale, ex.w2_packed, ex.w2_scale)))
        out = torch.empty_like(fx)
        torch.ops.tritree.routed_experts_int4(fx, mode.from_tensor(torch.zeros(3, 2, dtype=torch.int64)),
                                              mode.from_tensor(torch.rand(3, 2)), fex.w13_packed, fex.w13_scale, fex.w2_packed,
                                              fex.w2_scale, out,
                                              plan_int4_moe(3, 2, 2, 64, 32, "sm_90", 132).as_ints())
    assert out.shape == (3, 64)


@pytest.mark.gpu
def test_cuda_graph_capture_replays():
    """No host sync: the whole layer captures into a CUDA graph and replays with new routing."""
    g = torch.Generator().manual_seed(7)
    N, k, E, H, I = 17, 8, 16, 256, 128
    ex = _to(_experts(E, H, I, g), "cuda")
    x = torch.randn(N, H, generator=g).bfloat16().cuda()
    idx = _routing(N, E, k, "uniform", g).cuda()
    w = torch.rand(N, k, generator=g).cuda()
    out = torch.empty_like(x)
    routed_experts_int4(x, idx, w, ex, out=out)  # warm (compiles)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        routed_experts_int4(x, idx, w, ex, out=out)
    idx.copy_(_routing(N, E, k, "one", g).cuda())
    graph.replay()
    torch.cuda.synchronize()
    ref = moe_int4_reference(x.cpu(), idx.cpu(), w.cpu(), _to(ex, "cpu"))
    assert (out.cpu().double() - ref).norm() / ref.norm() < TOL[torch.bfloat16]


def test_traced_by_torch_compile_and_empty_batches():
    """torch.compile traces the op in one graph (its fake impl); no tokens or no choices give zeros."""
    g = torch.Generator().manual_seed(8)
    ex = _to(_experts(2, 32, 32, g), DEVICE)
    x = torch.randn(3, 32, generator=g).half().to(DEVICE)
    idx = torch.tensor([[0, 1], [1, 1], [0, 5]], device=DEVICE)
    w = torch.rand(3, 2, generator=g).to(DEVICE)
    f = torch.compile(lambda x, i, w: routed_experts_int4(x, i, w, ex) * 2, backend="aot_eager", fullgraph=True)
    # (fp32 atomics add in any order on a GPU: equal up to the last bit)
    torch.testing.assert_close(f(x, idx, w), 2 * routed_experts_int4(x, idx, w, ex), rtol=2e-3, atol=1e-4)
    for n, k in ((0, 2), (3, 0)):
        got = routed_experts_int4(x[:n], idx[:n, :k], w[:n, :k], ex, out=torch.full_like(x[:n], float("nan")))
        assert torch.equal(got, torch.zeros_like(x[:n]))
